"""The mark decides the candidates: inventory objects no live key names, old enough,
unprotected and not held. The sweep (group `sweep` in Dagster) only acts on them."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.addresses import matches_any_column, under_prefixes_column, with_relative_keys
from gc_assets.mark.partition import GcPartition, Mark, MarkRefusal, candidate_cutoff, untracked_cutoff


@dataclass(frozen=True)
class Bounds:
    """What candidates are judged against besides the live set: the same under any rules."""

    cutoff: dt.datetime  # no object modified at or after it is a candidate
    untracked_cutoff: dt.datetime  # nor an untracked one modified at or after this
    protected: tuple[str, ...]  # prefixes never collected
    committed: DataFrame  # relative keys of every commit's entries: expired versus untracked


@dataclass(frozen=True)
class Candidates:
    frame: DataFrame  # address, size, last_modified, reason
    bounds: Bounds


def candidates(
    spark: SparkSession,
    partition: GcPartition,
    inventory: DataFrame,
    live: DataFrame,
    mark: Callable[[], Mark],
    held: Callable[[], DataFrame],
) -> Candidates:
    """The partition's candidates from its inventory and live set. `mark` (the live set's mark)
    and `held` (the addresses restored and held) are read once the inventory is known usable.

    Refused when the inventory is empty (every live object would look missing) or the format
    finds it incomplete."""
    if inventory.isEmpty():
        raise MarkRefusal(
            f"namespace {partition.repo.storage_namespace} is empty: refusing to treat every live object as missing"
        )
    partition.source.check_inventory(spark, inventory)
    judged = bounds(spark, partition, mark())
    return Candidates(decide(partition, judged, inventory, live, held()), judged)


def bounds(spark: SparkSession, partition: GcPartition, mark: Mark) -> Bounds:
    """The cutoffs the mark's knowledge allows, the protected prefixes and the committed keys."""
    source, repo = partition.source, partition.repo
    cutoff = candidate_cutoff(partition, mark)
    untracked = untracked_cutoff(partition, mark, source.untracked_min_age(spark, repo))
    protected = partition.protected_prefixes(source.protected_prefixes)
    committed = with_relative_keys(source.committed_addresses(spark), repo.storage_namespace, repo.external_prefixes)
    return Bounds(cutoff, untracked, protected, committed)


def decide(partition: GcPartition, bounds: Bounds, inventory: DataFrame, live: DataFrame, held: DataFrame) -> DataFrame:
    """The candidates of `inventory` under `bounds`, given the live set and the held addresses."""
    source = partition.source
    return orphans(
        inventory,
        live,
        bounds.committed,
        bounds.cutoff,
        bounds.protected,
        source.protected_patterns,
        bounds.untracked_cutoff,
        source.collects_untracked,
    ).join(held, "address", "left_anti")


def orphans(
    inventory: DataFrame,
    live: DataFrame,
    committed: DataFrame,
    cutoff: dt.datetime,
    protected: tuple[str, ...],
    protected_patterns: tuple[str, ...] = (),
    untracked_cutoff: dt.datetime | None = None,
    collect_untracked: bool = True,
) -> DataFrame:
    """Inventory objects older than `cutoff`, outside `protected` prefixes and patterns,
    that no live key names.

    `committed` (relative keys of every commit's entries) tells expired from untracked.
    An untracked object may be a writer's file not yet committed, so it must also be
    older than `untracked_cutoff` (the format's own window for in-flight writers). When the
    format cannot see every writer (`collect_untracked` False: lakeFS's staged objects are in
    its key-value store only), an untracked object is never a candidate.
    """
    unreferenced = (
        inventory.select("address", "size", "last_modified")
        .filter(F.col("last_modified") < F.lit(cutoff))
        .filter(~under_prefixes_column("address", protected))
        .filter(~matches_any_column(F.col("address"), protected_patterns))
        .join(live.filter("in_namespace").select("address"), "address", "left_anti")
    )
    ever_committed = committed.filter("in_namespace").select("address").distinct().withColumn("committed", F.lit(True))
    judged = unreferenced.join(ever_committed, "address", "left").select(
        "address",
        "size",
        "last_modified",
        F.when(F.col("committed"), F.lit("expired")).otherwise(F.lit("untracked")).alias("reason"),
    )
    if not collect_untracked:
        return judged.filter(F.col("reason") == "expired")
    if untracked_cutoff is None or untracked_cutoff >= cutoff:
        return judged
    return judged.filter((F.col("reason") == "expired") | (F.col("last_modified") < F.lit(untracked_cutoff)))
