"""The names other programs see: the graph's assets, in the order a run materializes them."""

ASSETS = ("retained_commits", "live_files", "object_inventory", "orphan_candidates", "deletion_receipts")
