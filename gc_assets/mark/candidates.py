"""The mark decides the candidates: inventory objects no live key names, old enough,
unprotected and not held. The sweep (group `sweep` in Dagster) only acts on them.

The rule is one query for a set of repositories, the repository a column, each judged by its
own cutoffs, prefixes and patterns (orphans_each); a partition alone is a set of one."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Optional, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.addresses import under_owned_prefixes_column, with_relative_keys
from gc_assets.core.names import REPO
from gc_assets.core.spark import ALONE, alone, local_frame
from gc_assets.mark.partition import GcPartition, Mark, candidate_cutoff, untracked_cutoff


@dataclass(frozen=True)
class Bounds:
    """What candidates are judged against besides the live set: the same under any rules."""

    cutoff: dt.datetime  # no object modified at or after it is a candidate
    untracked_cutoff: dt.datetime  # nor an untracked one modified at or after this
    protected: tuple[str, ...]  # prefixes never collected
    committed: DataFrame  # relative keys of every commit's entries: expired versus untracked


@dataclass(frozen=True)
class Judgement:
    """What one repository's candidates are judged against besides its live set and committed keys."""

    repo: str
    cutoff: dt.datetime
    untracked_cutoff: Optional[dt.datetime]
    collect_untracked: bool
    protected: tuple[str, ...]  # prefixes never collected
    patterns: tuple[str, ...]  # regular expressions of keys never collected


_KEY = [REPO, "address"]


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
        untracked_cutoff=bounds.untracked_cutoff,
        collect_untracked=source.collects_untracked,
        held=held,
    )


def orphans(
    inventory: DataFrame,
    live: DataFrame,
    committed: DataFrame,
    cutoff: dt.datetime,
    protected: Sequence[str],
    protected_patterns: Sequence[str] = (),
    untracked_cutoff: dt.datetime | None = None,
    collect_untracked: bool = True,
    held: Optional[DataFrame] = None,
) -> DataFrame:
    """(address, size, last_modified, reason) of one repository's candidates, none of `held`
    (orphans_each for a set of one)."""
    judgement = Judgement(
        ALONE, cutoff, untracked_cutoff, collect_untracked, tuple(protected), tuple(protected_patterns)
    )
    one = [alone(frame) for frame in (inventory, live, committed)]
    return orphans_each(*one, [judgement], None if held is None else alone(held)).drop(REPO)


def orphans_each(
    inventory: DataFrame,
    live: DataFrame,
    committed: DataFrame,
    judgements: Sequence[Judgement],
    held: Optional[DataFrame] = None,
) -> DataFrame:
    """(repo, address, size, last_modified, reason) of every repository of `judgements`: its
    inventory objects older than its cutoff, under none of its protected prefixes and patterns,
    that none of its live keys names and it does not hold.

    `inventory`, `live` and `committed` (both with `in_namespace`) and `held` carry `repo`.
    `committed` (relative keys of every commit's entries) tells expired from untracked. An
    untracked object may be a writer's file not yet committed, so it must also be older than
    the repository's untracked cutoff (the format's own window for in-flight writers). When the
    format cannot see every writer (`collect_untracked` False: lakeFS's staged objects are in
    its key-value store only), an untracked object is never a candidate.
    """
    spark = inventory.sparkSession
    # each repository's patterns as one regular expression (Java syntax, searched anywhere)
    bounds = local_frame(
        spark,
        [
            (
                j.repo,
                j.cutoff,
                j.untracked_cutoff,
                j.collect_untracked,
                "|".join(f"(?:{p})" for p in j.patterns) or None,
            )
            for j in judgements
        ],
        "repo string, cutoff timestamp, untracked_cutoff timestamp, collect_untracked boolean, pattern string",
    )
    protected = under_owned_prefixes_column(REPO, "address", {j.repo: j.protected for j in judgements})
    columns = (REPO, "address", "size", "last_modified")
    unreferenced = (
        inventory.select(*columns)
        .join(F.broadcast(bounds.select(REPO, "cutoff", "pattern")), REPO)
        .filter(F.col("last_modified") < F.col("cutoff"))
        .filter(~protected)
        .filter(F.col("pattern").isNull() | ~F.expr("address rlike pattern"))
        .select(*columns)  # only what the joins below need travels through their shuffles
        .join(live.filter("in_namespace").select(*_KEY), _KEY, "left_anti")
    )
    if held is not None:
        unreferenced = unreferenced.join(held.select(*_KEY), _KEY, "left_anti")
    ever_committed = committed.filter("in_namespace").select(*_KEY).distinct().withColumn("committed", F.lit(True))
    reason = F.when(F.col("committed"), F.lit("expired")).otherwise(F.lit("untracked"))
    judged = (
        unreferenced.join(ever_committed, _KEY, "left")
        .withColumn("reason", reason)
        .join(F.broadcast(bounds.select(REPO, "untracked_cutoff", "collect_untracked")), REPO)
    )
    untracked_old_enough = F.col("untracked_cutoff").isNull() | (F.col("last_modified") < F.col("untracked_cutoff"))
    keep = (F.col("reason") == "expired") | (F.col("collect_untracked") & untracked_old_enough)
    return judged.filter(keep).select(REPO, "address", "size", "last_modified", "reason")
