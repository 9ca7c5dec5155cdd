"""The live set (the second half of the mark): connector entries of the retained commits keyed
by their key in the namespace, one row per key, and the refusal of live addresses that lie
nowhere the product can see."""

from __future__ import annotations

import datetime as dt
from typing import Optional, Sequence

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.addresses import with_relative_keys
from gc_assets.core.config import RepositoryConfig
from gc_assets.core.guards import SAMPLE
from gc_assets.mark.partition import GcPartition
from gc_assets.mark.shared import needed_by_others, record_outside_references
from gc_assets.sources import RepositorySource, SourceError

_SOURCE_PRIORITY = {"staged": 0, "committed": 1, "metadata": 2}


def live(spark: SparkSession, partition: GcPartition, retained_commits: DataFrame) -> tuple[DataFrame, dt.datetime]:
    """One row per key the retained commits, staging areas and format metadata keep alive, and
    the time the source state read was current (the mark's source_time, docs/design.md §10).

    Refused (SourceError) when a live address lies outside the namespace and every external prefix.
    """
    source = partition.source
    retained = retained_commits.filter("retained").select("commit_id", "threshold")
    heads = retained_commits.filter("ref_head").select("commit_id")
    # Computed once and kept with the executors (a local checkpoint, not a cache: Spark
    # matches cached plans by their file paths, and the next run in this session reads the
    # same paths with new content); the refusal below and the result both read it.
    keyed = live_keys(spark, partition, retained, heads).localCheckpoint()
    outside = {row["folder"]: row["spelled"] for row in outside_folders(keyed)}
    record_outside_references(partition.config, partition.as_of, {partition.repo.name: outside})
    if outside:
        refuse_unlisted_outside(spark, source, partition.repo, keyed, retained)
    return deduplicated(keyed, needed_by_others(spark, partition)), source.source_time(spark)


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


def refuse_unlisted_outside(
    spark: SparkSession, source: RepositorySource, repo: RepositoryConfig, keyed: DataFrame, retained: DataFrame
) -> None:
    """An address outside the namespace and under no external prefix is refused (docs/design.md §10).

    It is either an alias of the namespace the product cannot see through (a second
    mount, another endpoint) or an object of another location: either way what it
    names is unknown, and objects it may keep alive could be collected.
    """
    outside = keyed.filter(~F.col("in_namespace") & ~F.col("external")).select("address", "spelled").distinct()
    sample = outside.limit(SAMPLE).collect()
    if not sample:
        return
    spellings = spark.createDataFrame([(r["spelled"],) for r in sample], "address string")
    try:
        holders = sorted({r["commit_id"] for r in source.commits_referencing(spark, retained, spellings).collect()})
    except Exception:  # naming the commit is a courtesy; the refusal stands either way
        holders = []
    raise SourceError(outside_refusal(repo, outside.count(), sample[0]["spelled"], holders))


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
