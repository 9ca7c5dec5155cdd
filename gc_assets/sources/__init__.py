"""Repository connectors, one module per format."""

from __future__ import annotations

from gc_assets.core.config import RepositoryConfig
from gc_assets.sources.base import LIVE_ENTRY_SCHEMA, RepositorySource, SourceError
from gc_assets.stores.s3.client import S3Settings


def metadata_s3(repo: RepositoryConfig) -> S3Settings:
    """Metadata is read with the repository's own S3 settings, like its objects."""
    return S3Settings.from_environment(repo.s3.endpoint_url, repo.s3.region)


def source_for(repo: RepositoryConfig) -> RepositorySource:
    if repo.format == "lakefs-export":
        from gc_assets.sources.lakefs_export import LakeFSExportSource

        return LakeFSExportSource(repo.source_uri, metadata_s3(repo))
    if repo.format == "delta":
        from gc_assets.sources.delta import DeltaSource

        return DeltaSource(repo.source_uri, repo.storage_namespace, metadata_s3(repo))
    if repo.format == "iceberg":
        from gc_assets.sources.iceberg import IcebergSource

        return IcebergSource(repo)
    raise SourceError(f"repository {repo.name!r}: format {repo.format!r} is not supported yet")


__all__ = ["LIVE_ENTRY_SCHEMA", "RepositorySource", "SourceError", "source_for"]
