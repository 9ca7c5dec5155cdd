"""Repository connectors, one module per format."""

from __future__ import annotations

import importlib

from gc_assets.core.config import RepositoryConfig
from gc_assets.sources.base import LIVE_ENTRY_SCHEMA, RepositorySource, SourceError

# format -> module and class; a connector's libraries (deltalake, pyiceberg) load only when used.
CONNECTORS = {
    "lakefs": ("lakefs.source", "LakeFSSource"),
    "lakefs-export": ("lakefs_export", "LakeFSExportSource"),
    "delta": ("delta", "DeltaSource"),
    "iceberg": ("iceberg", "IcebergSource"),
    "file-catalog": ("file_catalog", "FileCatalogSource"),
}


def source_for(repo: RepositoryConfig) -> RepositorySource:
    if repo.format not in CONNECTORS:
        raise SourceError(f"repository {repo.name!r}: format {repo.format!r} is not supported yet")
    module, name = CONNECTORS[repo.format]
    connector: type[RepositorySource] = getattr(importlib.import_module(f"gc_assets.sources.{module}"), name)
    return connector.from_config(repo)


__all__ = ["LIVE_ENTRY_SCHEMA", "RepositorySource", "SourceError", "source_for"]
