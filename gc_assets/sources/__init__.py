"""Repository connectors, one module per format."""

from __future__ import annotations

from gc_assets.config import RepositoryConfig
from gc_assets.sources.base import LIVE_ENTRY_SCHEMA, RepositorySource, SourceError


def source_for(repo: RepositoryConfig) -> RepositorySource:
    if repo.format == "lakefs-export":
        from gc_assets.sources.lakefs_export import LakeFSExportSource

        return LakeFSExportSource(repo.source_uri)
    if repo.format == "delta":
        from gc_assets.sources.delta import DeltaSource

        return DeltaSource(repo.source_uri, repo.storage_namespace)
    if repo.format == "iceberg":
        from gc_assets.sources.iceberg import IcebergSource

        return IcebergSource(repo)
    raise SourceError(f"repository {repo.name!r}: format {repo.format!r} is not supported yet")


__all__ = ["LIVE_ENTRY_SCHEMA", "RepositorySource", "SourceError", "source_for"]
