"""The live set (the second half of the mark): connector entries of the retained commits keyed
by their key in the namespace, one row per key, and the refusal of live addresses that lie
nowhere the product can see."""

from __future__ import annotations

from typing import Optional, Sequence

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.addresses import with_relative_keys
from gc_assets.core.config import RepositoryConfig
from gc_assets.mark.partition import GcPartition

_SOURCE_PRIORITY = {"staged": 0, "committed": 1, "metadata": 2}


def outside_folders(keyed: DataFrame, *by: str) -> list[Row]:
    """(*by, folder, spelled): each folder of the live addresses outside the namespace and every
    external prefix (per repository of the `by` columns), with one address as its source spelled it."""
    outside = keyed.filter(~F.col("in_namespace") & ~F.col("external"))
    folder = F.regexp_replace("address", "/[^/]*$", "").alias("folder")
    return outside.groupBy(*by, folder).agg(F.min("spelled").alias("spelled")).collect()


def live_keys(spark: SparkSession, partition: GcPartition, retained: DataFrame, heads: DataFrame) -> DataFrame:
    """The connector's live entries of the `retained` commits (and `heads`), keyed relative to the
    namespace (several rows per key: deduplicated makes one)."""
    repo = partition.repo
    entries = partition.source.live_entries(spark, retained, heads)
    return with_relative_keys(entries, repo.storage_namespace, repo.external_prefixes)


def deduplicated(keyed: DataFrame, others: Optional[DataFrame] = None, by: tuple[str, ...] = ("address",)) -> DataFrame:
    """One row per key (`by`: per repository and key in a fleet) of with_relative_keys' output and
    of what `others` (other repositories, mark.shared) need, with `needed_by` naming one of those
    repositories; rows that already name theirs keep it.

    An entry staged anywhere counts as staged; any head reference makes it at_head.
    """
    if "needed_by" not in keyed.columns:
        keyed = keyed.withColumn("needed_by", F.lit(None).cast("string"))
    if others is not None:
        keyed = keyed.unionByName(others)
    priority = F.create_map(*[F.lit(x) for pair in _SOURCE_PRIORITY.items() for x in pair])
    return keyed.groupBy(*by).agg(
        F.max("size").alias("size"),
        F.min_by("source", priority[F.col("source")]).alias("source"),
        F.max("at_head").alias("at_head"),
        F.max("in_namespace").alias("in_namespace"),
        F.max("required").alias("required"),
        F.min("needed_by").alias("needed_by"),
    )


def outside_refusal(repo: RepositoryConfig, count: int, example: str, holders: Sequence[str]) -> str:
    """Why a repository whose live set names `count` addresses outside its namespace and every
    external prefix (`example` one of them, `holders` the commits naming it) is refused."""
    held_by = (
        f"held by commit(s) {sorted(holders)[:5]}"
        if holders
        else "held by a retained commit, staging area or the format's metadata"
    )
    return (
        f"repository {repo.name!r}: {count} live address(es) lie outside the storage namespace "
        f"{repo.storage_namespace} and under no external_prefixes, e.g. {example!r}; {held_by}. "
        "If they belong to another location on purpose, list its prefix under external_prefixes; if they are "
        "another spelling of the namespace (a second mount, another endpoint), refusing is the only safe answer."
    )
