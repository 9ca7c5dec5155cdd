"""Storage backends, one module per store, chosen by the namespace's scheme."""

from __future__ import annotations

from gc_assets.core.config import RepositoryConfig
from gc_assets.stores.base import Store, StoreError


def store_for(repo: RepositoryConfig) -> Store:
    if repo.storage_namespace.startswith("file://"):
        from gc_assets.stores.local import LocalStore

        return LocalStore(repo.storage_namespace)
    if repo.storage_namespace.startswith("s3://"):
        from gc_assets.stores.s3.client import S3Settings
        from gc_assets.stores.s3.store import S3Store

        return S3Store(repo.storage_namespace, S3Settings.of_override(repo.s3), inventory=repo.inventory)
    if repo.storage_namespace.startswith("abfss://"):
        from gc_assets.stores.azure import azure_store

        return azure_store(repo.storage_namespace, repo.azure)
    if repo.storage_namespace.startswith("gs://"):
        from gc_assets.stores.gcs import gcs_store

        return gcs_store(repo.storage_namespace, repo.gcs)
    raise StoreError(f"repository {repo.name!r}: no store for namespace {repo.storage_namespace!r}")


__all__ = ["Store", "StoreError", "store_for"]
