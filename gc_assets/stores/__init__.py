"""Storage backends, one module per store, chosen by the namespace's scheme."""

from __future__ import annotations

from typing import Callable

from gc_assets.core.config import RepositoryConfig
from gc_assets.stores.base import Store, StoreError


def _local(repo: RepositoryConfig) -> Store:
    from gc_assets.stores.local import LocalStore

    return LocalStore(repo.storage_namespace)


def _s3(repo: RepositoryConfig) -> Store:
    from gc_assets.stores.s3.client import S3Settings
    from gc_assets.stores.s3.store import S3Store

    return S3Store(repo.storage_namespace, S3Settings.of_override(repo.s3), inventory=repo.inventory)


def _azure(repo: RepositoryConfig) -> Store:
    from gc_assets.stores.azure import azure_store

    return azure_store(repo.storage_namespace, repo.azure)


def _gcs(repo: RepositoryConfig) -> Store:
    from gc_assets.stores.gcs import gcs_store

    return gcs_store(repo.storage_namespace, repo.gcs)


# The namespace's scheme -> its store (imported on first use: a run loads only the SDKs it needs).
STORES: dict[str, Callable[[RepositoryConfig], Store]] = {
    "file": _local,
    "s3": _s3,
    "abfss": _azure,
    "gs": _gcs,
}


def store_for(repo: RepositoryConfig) -> Store:
    """The store of the repository's namespace, by its scheme."""
    scheme, separator, _ = repo.storage_namespace.partition("://")
    make = STORES.get(scheme) if separator else None
    if make is None:
        raise StoreError(f"repository {repo.name!r}: no store for namespace {repo.storage_namespace!r}")
    return make(repo)


def store_at(uri: str) -> Store:
    """A store of `uri` outside every repository (the state directory's), with settings from the
    environment only (AWS_ENDPOINT_URL, AZURE_STORAGE_*, STORAGE_EMULATOR_HOST, ...)."""
    scheme = uri.partition("://")[0].lower()
    if scheme == "s3":
        from gc_assets.stores.s3.client import S3Settings
        from gc_assets.stores.s3.store import S3Store

        return S3Store(uri, S3Settings.from_environment())
    if scheme == "abfss":
        from gc_assets.stores.azure import azure_store

        return azure_store(uri)
    if scheme == "gs":
        from gc_assets.stores.gcs import gcs_store

        return gcs_store(uri)
    raise StoreError(f"{uri!r}: not an object store URI (s3://, abfss://, gs://)")


__all__ = ["STORES", "Store", "StoreError", "store_at", "store_for"]
