"""Materialization metadata: numeric values Dagster plots across partitions, and Markdown tables."""

from __future__ import annotations

from typing import Any

from dagster import MetadataValue
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

TOP_PREFIXES = 10
PREFIX_DEPTH = 2
_BYTES_ASSETS = {"live_files", "object_inventory", "orphan_candidates", "deletion_receipts"}
_PREFIX_ASSETS = {"orphan_candidates", "deletion_receipts"}


def prefix_column(address: str = "address", depth: int = PREFIX_DEPTH) -> Any:
    """The first `depth` directory levels of a key ('data/ab/' for 'data/ab/cd/x')."""
    parts = F.split(F.col(address), "/")
    directories = F.slice(parts, 1, F.least(F.lit(depth), F.size(parts) - 1))
    return F.when(F.size(parts) > 1, F.concat(F.array_join(directories, "/"), F.lit("/"))).otherwise(F.lit("(root)"))


def top_prefixes_markdown(frame: DataFrame) -> str:
    rows = (
        frame.groupBy(prefix_column().alias("prefix"))
        .agg(F.count("*").alias("objects"), F.sum(F.coalesce("size", F.lit(0))).alias("bytes"))
        .orderBy(F.desc("bytes"), "prefix")
        .limit(TOP_PREFIXES)
        .collect()
    )
    lines = ["| prefix | objects | bytes |", "|---|---:|---:|"]
    lines += [f"| `{r['prefix']}` | {r['objects']} | {r['bytes']} |" for r in rows]
    return "\n".join(lines)


def counts_by(frame: DataFrame, column: str) -> dict[str, int]:
    return {r[column]: r["n"] for r in frame.groupBy(column).agg(F.count("*").alias("n")).collect()}


def output_metadata(asset: str, frame: DataFrame) -> dict[str, Any]:
    """Metadata of one written asset partition, computed from what was written."""
    metadata: dict[str, Any] = {}
    if asset in _BYTES_ASSETS:
        row = frame.agg(F.count("*").alias("rows"), F.sum(F.coalesce("size", F.lit(0))).alias("bytes")).first()
        metadata["dagster/row_count"] = MetadataValue.int(int(row["rows"]))
        metadata["bytes"] = MetadataValue.int(int(row["bytes"] or 0))
    else:
        metadata["dagster/row_count"] = MetadataValue.int(frame.count())
    if asset in _PREFIX_ASSETS:
        metadata["top_prefixes"] = MetadataValue.md(top_prefixes_markdown(frame))
    if asset == "retained_commits":
        by_state = counts_by(frame, "retained")
        metadata["retained_commits"] = MetadataValue.int(by_state.get(True, 0))
        metadata["expired_commits"] = MetadataValue.int(by_state.get(False, 0))
    elif asset == "live_files":
        metadata["live_objects"] = MetadataValue.int(int(metadata["dagster/row_count"].value))
    elif asset == "orphan_candidates":
        metadata["orphan_candidates"] = MetadataValue.int(int(metadata["dagster/row_count"].value))
        metadata["reclaimable_bytes"] = MetadataValue.int(int(metadata["bytes"].value))
        for reason, n in sorted(counts_by(frame, "reason").items()):
            metadata[f"candidates_{reason}"] = MetadataValue.int(n)
    elif asset == "deletion_receipts":
        for action, n in sorted(counts_by(frame, "action").items()):
            metadata[f"receipts_{action}"] = MetadataValue.int(n)
    return metadata
