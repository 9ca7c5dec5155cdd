"""Orphan candidates: inventory objects no live key names, old enough, unprotected."""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gc_assets.core.addresses import matches_any_column, under_prefixes_column


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
        .filter(~under_prefixes_column(F.col("address"), protected))
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
