"""The candidates of many repositories at once, the repository a column: mark.candidates.orphans
for each, with its own cutoffs, protected prefixes and patterns, in one set of Spark jobs."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Optional, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.names import REPO

_KEY = [REPO, "address"]


@dataclass(frozen=True)
class Judgement:
    """What one repository's candidates are judged against besides its live set (candidates.Bounds)."""

    repo: str
    cutoff: dt.datetime
    untracked_cutoff: Optional[dt.datetime]
    collect_untracked: bool
    protected: tuple[str, ...]  # prefixes never collected
    patterns: tuple[str, ...]  # regular expressions of keys never collected


def orphans(
    spark: SparkSession,
    inventory: DataFrame,
    live: DataFrame,
    committed: DataFrame,
    judgements: Sequence[Judgement],
    held: DataFrame,
) -> DataFrame:
    """(repo, address, size, last_modified, reason) of every repository of `judgements`: its
    inventory objects older than its cutoff, under none of its protected prefixes and patterns,
    that none of its live keys names and it does not hold; `reason` from its committed keys, an
    untracked one also older than its untracked cutoff, and none when it collects no untracked.

    `inventory`, `live` (with `in_namespace`), `committed` (with `in_namespace`) and `held` carry
    `repo`; a key lies under a prefix when one of its ancestors is the prefix without its '/'."""
    bounds = spark.createDataFrame(
        [(j.repo, j.cutoff, j.untracked_cutoff, j.collect_untracked) for j in judgements],
        "repo string, cutoff timestamp, untracked_cutoff timestamp, collect_untracked boolean",
    )
    prefixes = spark.createDataFrame(
        sorted({(j.repo, p.rstrip("/")) for j in judgements for p in j.protected}), "repo string, ancestor string"
    )
    patterns = spark.createDataFrame(
        sorted({(j.repo, p) for j in judgements for p in j.patterns}), "repo string, pattern string"
    )
    old = (
        inventory.select(REPO, "address", "size", "last_modified")
        .join(F.broadcast(bounds), REPO)
        .filter(F.col("last_modified") < F.col("cutoff"))
    )
    parts = F.split("address", "/")
    ancestors = F.transform(F.sequence(F.lit(1), F.size(parts)), lambda n: F.array_join(F.slice(parts, 1, n), "/"))
    protected = (
        old.select(REPO, "address", F.explode(ancestors).alias("ancestor"))
        .join(F.broadcast(prefixes), [REPO, "ancestor"], "left_semi")
        .select(*_KEY)
    )
    hidden = old.join(F.broadcast(patterns), REPO).filter(F.expr("address rlike pattern")).select(*_KEY)
    unreferenced = (
        old.join(protected, _KEY, "left_anti")
        .join(hidden, _KEY, "left_anti")
        .join(live.filter("in_namespace").select(*_KEY), _KEY, "left_anti")
        .join(held.select(*_KEY), _KEY, "left_anti")
    )
    ever_committed = committed.filter("in_namespace").select(*_KEY).distinct().withColumn("committed", F.lit(True))
    reason = F.when(F.col("committed"), F.lit("expired")).otherwise(F.lit("untracked"))
    judged = unreferenced.join(ever_committed, _KEY, "left").withColumn("reason", reason)
    untracked_old_enough = F.col("untracked_cutoff").isNull() | (F.col("last_modified") < F.col("untracked_cutoff"))
    keep = (F.col("reason") == "expired") | (F.col("collect_untracked") & untracked_old_enough)
    return judged.filter(keep).select(REPO, "address", "size", "last_modified", "reason")
