"""Repository connectors, one module per format."""

from __future__ import annotations

import datetime as dt
from typing import Sequence

from pyspark.sql import SparkSession

from gc_assets import retention
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


def evaluate_retention(
    source: RepositorySource,
    spark: SparkSession,
    repo: RepositoryConfig,
    commits: Sequence[retention.Commit],
    refs: Sequence[retention.Ref],
    as_of: dt.datetime,
) -> dict[str, retention.Retention]:
    """Retention of every commit: the lakeFS rules, or the format's own semantics where a
    connector brings them (Iceberg's `retention: iceberg`). The mark and the sweep's
    re-validation both judge through here, so they always agree."""
    own = getattr(source, "evaluate_retention", None)
    return (own or retention.evaluate)(commits, refs, source.retention_rules(spark, repo), as_of)


__all__ = ["LIVE_ENTRY_SCHEMA", "RepositorySource", "SourceError", "evaluate_retention", "source_for"]
