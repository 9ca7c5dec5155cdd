"""What every sweep shares (sweep.set_sweep, for one repository or many): the chunk size,
re-validation of a repository against its state now, its fingerprint, and deferred deletion.

The sweep works through the candidates in chunks of one store batch per Spark task, or of
GC_ASSETS_SWEEP_CHUNK_OBJECTS objects: between two chunks it checks its lease and, when the
repository's fingerprint moved, re-validates (revived_now).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from typing import Optional

from pyspark.sql import DataFrame, SparkSession

from gc_assets.core import retention
from gc_assets.core.addresses import with_relative_keys
from gc_assets.core.config import GcConfig, RepositoryConfig
from gc_assets.core.spark import local_frame
from gc_assets.mark.partition import GcPartition
from gc_assets.mark.shared import needed_by_others, referrers_of
from gc_assets.sources import RepositorySource, source_for
from gc_assets.sources.base import retained_frame
from gc_assets.stores.base import DELETE_BATCH_SIZE

CHUNK_OBJECTS_ENV = "GC_ASSETS_SWEEP_CHUNK_OBJECTS"


def chunk_objects(tasks: int) -> int:
    """Objects per sweep chunk: GC_ASSETS_SWEEP_CHUNK_OBJECTS, else one store batch per Spark task.

    Smaller chunks check the lease and the repository more often and leave less work in
    flight when a sweep dies, at a few Spark jobs per chunk.
    """
    value = os.environ.get(CHUNK_OBJECTS_ENV)
    if value is None or value == "":
        return DELETE_BATCH_SIZE * tasks
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"{CHUNK_OBJECTS_ENV}={value!r}: expected a whole number of objects, at least 1")
    return int(value)


@dataclass(frozen=True)
class Revalidation:
    changed: bool
    new_commits: int
    revived: DataFrame  # address of candidates the current state references again


def revalidate(
    spark: SparkSession,
    source: RepositorySource,
    repo: RepositoryConfig,
    as_of: dt.datetime,
    marked_commits: DataFrame,
    candidates: DataFrame,
) -> Revalidation:
    """Re-read the repository now; candidates that its current state keeps alive are revived.

    Retention is evaluated again on the current graph with the same as-of time. Commits
    the mark already retained kept their objects out of the candidates, so only the
    changed part is read: commits retained now but not at the mark (new commits, a
    branch created from an old commit, a moved tag, a revert), plus staged entries.
    """
    commits, refs = source.commit_graph(spark)
    verdicts = source.evaluate_retention(spark, repo, commits, refs, as_of)
    marked = {
        r["commit_id"]: (r["retained"], r["ref_head"])
        for r in marked_commits.select("commit_id", "retained", "ref_head").collect()
    }
    heads = retention.ref_heads(refs)
    newly_retained = [c for c, v in verdicts.items() if v.retained and not marked.get(c, (False, False))[0]]
    changed = (
        bool(newly_retained) or {c for c, (_, head) in marked.items() if head} != heads or set(marked) != set(verdicts)
    )
    heads_frame = local_frame(spark, [(c,) for c in heads], "commit_id string")
    entries = with_relative_keys(
        source.live_entries(spark, retained_frame(spark, verdicts, newly_retained), heads_frame), repo.storage_namespace
    )
    revived = candidates.select("address").join(
        entries.filter("in_namespace").select("address"), "address", "left_semi"
    )
    return Revalidation(changed, len(set(verdicts) - set(marked)), revived)


def revived_now(
    spark: SparkSession, partition: GcPartition, retained_commits: DataFrame, candidates: DataFrame
) -> tuple[Revalidation, DataFrame]:
    """The repository re-validated now (revalidate) and the addresses of candidates that its
    current state, or another repository's (mark.shared.needed_by_others), needs again."""
    repo = partition.repo
    source = source_for(repo)  # a new connector: a cached one would re-read nothing
    check = revalidate(spark, source, repo, partition.as_of, retained_commits, candidates)
    again = check.revived
    others = needed_by_others(spark, partition)  # what other repositories need here now
    if others is not None:
        again = again.unionByName(candidates.select("address").join(others, "address", "left_semi"))
    return check, again.distinct()


def state_fingerprint(spark: SparkSession, config: GcConfig, repo: RepositoryConfig) -> str:
    """The repository's fingerprint with those of every repository whose needs reach into it
    (declared, and found by a mark: mark.shared.referrers_of), each from a new connector: it
    changes whenever any of them commits, or a referrer comes or goes."""
    others = referrers_of(config, repo.name)
    return "|".join(source_for(one).fingerprint(spark) for one in [repo, *others])


def unconfirmed(candidates: DataFrame, earlier_candidates: Optional[DataFrame]) -> DataFrame:
    """Candidates that were not already candidates `confirm_days` earlier (two-phase deletion)."""
    if earlier_candidates is None:
        return candidates.select("address")
    return candidates.select("address").join(earlier_candidates.select("address"), "address", "left_anti")
