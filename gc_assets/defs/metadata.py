"""Materialization metadata: numeric values Dagster plots across partitions, and Markdown tables."""

from __future__ import annotations

from typing import Any, Optional

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from gc_assets.defs.schemas import CANDIDATE_REASONS, RECEIPT_ACTIONS

ROW_COUNT = "dagster/row_count"  # Dagster's own metadata key for a stored partition's rows
TOP_PREFIXES = 10
PREFIX_DEPTH = 2
READABLE_PREFIXES = 100  # directories at one level; more are generated names
_BYTES_ASSETS = {"live_files", "object_inventory", "orphan_candidates", "deletion_receipts"}
PREFIX_ASSETS = {"orphan_candidates", "deletion_receipts"}
_BY_CATEGORY = {"orphan_candidates": "by_reason", "deletion_receipts": "by_action"}
RECLAIMING = ("deleted", "trashed")  # receipts whose bytes left the namespace's live data
_CATEGORY = {"retained_commits": "retained", "orphan_candidates": "reason", "deletion_receipts": "action"}
_CATEGORY_VALUES: dict[str, list[Any]] = {
    "retained_commits": [True, False],
    "orphan_candidates": CANDIDATE_REASONS,
    "deletion_receipts": RECEIPT_ACTIONS,
}


def prefix_column(address: str = "address", depth: int = PREFIX_DEPTH) -> Any:
    """The first `depth` directory levels of a key ('data/ab/' for 'data/ab/cd/x')."""
    parts = F.split(F.col(address), "/")
    directories = F.slice(parts, 1, F.least(F.lit(depth), F.size(parts) - 1))
    return F.when(F.size(parts) > 1, F.concat(F.array_join(directories, "/"), F.lit("/"))).otherwise(F.lit("(root)"))


def _top_prefixes(frame: DataFrame) -> list[Any]:
    return top_prefixes_by(frame, ()).get((), [])


def top_prefixes_by(frame: DataFrame, by: tuple[str, ...]) -> dict[tuple[Any, ...], list[Any]]:
    """The largest prefixes at the deepest level, up to PREFIX_DEPTH, that a person can read, for
    each value of the columns `by` (a repository's partition of a fleet's frame).

    A level with more than READABLE_PREFIXES directories holds generated names (lakeFS
    writes `data/<random>/`), whose top ten would be ten single objects: the level above
    is shown instead. Both levels of every group are ranked in one query.
    """
    levels = F.array(*[prefix_column(depth=depth) for depth in range(1, PREFIX_DEPTH + 1)])
    by_level = Window.partitionBy(*by, "level")
    ranked = (
        frame.select(*by, F.posexplode(levels).alias("level", "prefix"), F.coalesce("size", F.lit(0)).alias("size"))
        .groupBy(*by, "level", "prefix")
        .agg(F.count("*").alias("objects"), F.sum("size").alias("bytes"))
        .withColumn("prefixes", F.count("*").over(by_level))
        .withColumn("rank", F.row_number().over(by_level.orderBy(F.desc("bytes"), "prefix")))
        .filter(F.col("rank") <= TOP_PREFIXES)
        .collect()
    )
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for row in ranked:
        groups.setdefault(tuple(row[c] for c in by), []).append(row)
    top = {}
    for group, rows in groups.items():
        level = max((r["level"] for r in rows if r["prefixes"] <= READABLE_PREFIXES), default=0)
        top[group] = sorted((r for r in rows if r["level"] == level), key=lambda r: r["rank"])
    return top


def top_prefixes_markdown(frame: Optional[DataFrame], rows: list[Any] | None = None) -> str:
    if rows is None:
        assert frame is not None
        rows = _top_prefixes(frame)
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


def measures(asset: str, rules: dict[str, Column]) -> list[Column]:
    """Aggregates the write of `asset` collects as it writes (DataFrame.observe): rows, bytes,
    rows per category value and rows breaking each schema rule, without another pass."""
    columns = [F.count(F.lit(1)).alias("rows")]
    if asset in _BYTES_ASSETS:
        columns.append(F.sum(F.coalesce("size", F.lit(0))).alias("bytes"))
    category = _CATEGORY.get(asset)
    if category:
        for value in _CATEGORY_VALUES[asset]:
            match = F.col(category) == F.lit(value)
            columns.append(F.count_if(match).alias(f"{category}={value}"))
            if asset in _BYTES_ASSETS:
                columns.append(
                    F.sum(F.when(match, F.coalesce("size", F.lit(0))).otherwise(0)).alias(f"bytes:{category}={value}")
                )
    columns += [F.count_if(rule).alias(f"rule:{label}") for label, rule in rules.items()]
    return columns


def breaking_rows(measured: dict[str, Any]) -> dict[str, int]:
    return {key.removeprefix("rule:"): int(n) for key, n in measured.items() if key.startswith("rule:")}


def output_metadata(
    asset: str, measured: dict[str, Any], written: Optional[DataFrame], prefixes: Optional[list[Any]] = None
) -> dict[str, Any]:
    """Metadata of one written asset partition: the write's own measures, and for the sweep's
    assets its top prefixes (`prefixes`, else one more job over what was written)."""
    rows, size = int(measured["rows"]), int(measured.get("bytes") or 0)
    category = _CATEGORY.get(asset)
    # (rows, bytes) per value of the asset's category, for the values it has
    by_value = {
        v: (int(measured[f"{category}={v}"]), int(measured.get(f"bytes:{category}={v}") or 0))
        for v in _CATEGORY_VALUES.get(asset, [])
        if measured[f"{category}={v}"]
    }
    metadata: dict[str, Any] = {ROW_COUNT: MetadataValue.int(rows)}
    if asset in _BYTES_ASSETS:
        metadata["bytes"] = MetadataValue.int(size)
    if asset in PREFIX_ASSETS:
        if prefixes is None:
            assert written is not None
            prefixes = _top_prefixes(written)
        metadata["top_prefixes"] = MetadataValue.md(top_prefixes_markdown(written, prefixes))
        metadata["bytes_by_prefix"] = count_table("prefix", [(r["prefix"], r["objects"], r["bytes"]) for r in prefixes])
    if asset in _BY_CATEGORY:
        metadata[_BY_CATEGORY[asset]] = count_table(
            _CATEGORY[asset], [(k, n, b) for k, (n, b) in sorted(by_value.items())]
        )
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
        metadata["bytes_reclaimed"] = MetadataValue.int(
            sum(b for action, (_, b) in by_value.items() if action in RECLAIMING)
        )
    return metadata
