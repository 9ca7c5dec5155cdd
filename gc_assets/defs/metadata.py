"""Materialization metadata: numeric values Dagster plots across partitions, and Markdown tables."""

from __future__ import annotations

from typing import Any

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

TOP_PREFIXES = 10
PREFIX_DEPTH = 2
_BYTES_ASSETS = {"live_files", "object_inventory", "orphan_candidates", "deletion_receipts"}
_PREFIX_ASSETS = {"orphan_candidates", "deletion_receipts"}
_BY_CATEGORY = {"orphan_candidates": "by_reason", "deletion_receipts": "by_action"}
RECLAIMING = ("deleted", "trashed")  # receipts whose bytes left the namespace's live data
_CATEGORY = {"retained_commits": "retained", "orphan_candidates": "reason", "deletion_receipts": "action"}


def prefix_column(address: str = "address", depth: int = PREFIX_DEPTH) -> Any:
    """The first `depth` directory levels of a key ('data/ab/' for 'data/ab/cd/x')."""
    parts = F.split(F.col(address), "/")
    directories = F.slice(parts, 1, F.least(F.lit(depth), F.size(parts) - 1))
    return F.when(F.size(parts) > 1, F.concat(F.array_join(directories, "/"), F.lit("/"))).otherwise(F.lit("(root)"))


def _top_prefixes(frame: DataFrame) -> list[Any]:
    return (
        frame.groupBy(prefix_column().alias("prefix"))
        .agg(F.count("*").alias("objects"), F.sum(F.coalesce("size", F.lit(0))).alias("bytes"))
        .orderBy(F.desc("bytes"), "prefix")
        .limit(TOP_PREFIXES)
        .collect()
    )


def top_prefixes_markdown(frame: DataFrame, rows: list[Any] | None = None) -> str:
    rows = _top_prefixes(frame) if rows is None else rows
    lines = ["| prefix | objects | bytes |", "|---|---:|---:|"]
    lines += [f"| `{r['prefix']}` | {r['objects']} | {r['bytes']} |" for r in rows]
    return "\n".join(lines)


def count_table(first: str, rows: list[tuple[Any, int, int]]) -> Any:
    """A small table the UI draws: one row per prefix, reason or action, with objects and bytes."""
    schema = TableSchema(
        columns=[TableColumn(first, "string"), TableColumn("objects", "int"), TableColumn("bytes", "int")]
    )
    return MetadataValue.table(
        records=[TableRecord({first: str(name), "objects": int(n), "bytes": int(size)}) for name, n, size in rows],
        schema=schema,
    )


def totals(frame: DataFrame, category: str | None, with_bytes: bool) -> tuple[int, int, dict[Any, tuple[int, int]]]:
    """Rows, bytes and (rows, bytes) per value of `category`, all in one Spark job."""
    size = F.sum(F.coalesce("size", F.lit(0))) if with_bytes else F.lit(0)
    grouped = frame.groupBy(category) if category else frame.groupBy()
    rows = grouped.agg(F.count("*").alias("n"), size.alias("bytes")).collect()
    by_value = {r[category]: (int(r["n"]), int(r["bytes"] or 0)) for r in rows} if category else {}
    return sum(int(r["n"]) for r in rows), sum(int(r["bytes"] or 0) for r in rows), by_value


def output_metadata(asset: str, frame: DataFrame) -> dict[str, Any]:
    """Metadata of one written asset partition, computed from what was written."""
    rows, size, by_value = totals(frame, _CATEGORY.get(asset), asset in _BYTES_ASSETS)
    metadata: dict[str, Any] = {"dagster/row_count": MetadataValue.int(rows)}
    if asset in _BYTES_ASSETS:
        metadata["bytes"] = MetadataValue.int(size)
    if asset in _PREFIX_ASSETS:
        prefixes = _top_prefixes(frame)
        metadata["top_prefixes"] = MetadataValue.md(top_prefixes_markdown(frame, prefixes))
        metadata["bytes_by_prefix"] = count_table("prefix", [(r["prefix"], r["objects"], r["bytes"]) for r in prefixes])
    if asset in _BY_CATEGORY:
        metadata[_BY_CATEGORY[asset]] = count_table(_CATEGORY[asset], [(k, n, b) for k, (n, b) in sorted(by_value.items())])
    if asset == "retained_commits":
        metadata["retained_commits"] = MetadataValue.int(by_value.get(True, (0, 0))[0])
        metadata["expired_commits"] = MetadataValue.int(by_value.get(False, (0, 0))[0])
    elif asset == "live_files":
        metadata["live_objects"] = MetadataValue.int(rows)
    elif asset == "orphan_candidates":
        metadata["orphan_candidates"] = MetadataValue.int(rows)
        metadata["reclaimable_bytes"] = MetadataValue.int(size)
        for reason, (n, _) in sorted(by_value.items()):
            metadata[f"candidates_{reason}"] = MetadataValue.int(n)
    elif asset == "deletion_receipts":
        for action, (n, _) in sorted(by_value.items()):
            metadata[f"receipts_{action}"] = MetadataValue.int(n)
        metadata["bytes_reclaimed"] = MetadataValue.int(sum(b for action, (_, b) in by_value.items() if action in RECLAIMING))
    return metadata
