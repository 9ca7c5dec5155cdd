"""S3 namespaces: clients and retries, listing, actions on objects, inventory reports, the store."""
