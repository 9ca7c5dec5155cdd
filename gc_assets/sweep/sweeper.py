"""What every sweep shares (sweep.set_sweep, for one repository or many): the chunk size,
re-validation of a repository against its state now, its fingerprint, and deferred deletion.

The sweep works through the candidates in chunks of CHUNK_BATCHES_PER_TASK store batches per
Spark task, or of GC_ASSETS_SWEEP_CHUNK_OBJECTS objects: between two chunks it checks its lease
and, when the repository's fingerprint moved, re-validates (revived_now): the repositories of a
chunk together, those of each connector in one read.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from functools import reduce
from typing import Mapping, Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core import retention
from gc_assets.core.addresses import with_relative_keys
from gc_assets.core.config import GcConfig, RepositoryConfig
from gc_assets.core.names import REPO
from gc_assets.core.spark import local_frame, one_of, task_error
from gc_assets.mark.connectors import commit_graphs_of, live_entries_of
from gc_assets.mark.partition import GcPartition
from gc_assets.mark.sets import read_together
from gc_assets.mark.shared import needed_by_others, referrers_of
from gc_assets.sources import RepositorySource, source_for
from gc_assets.sources.base import LiveRead
from gc_assets.stores.base import DELETE_BATCH_SIZE

CHUNK_OBJECTS_ENV = "GC_ASSETS_SWEEP_CHUNK_OBJECTS"
# Store batches each Spark task acts on in one chunk. A chunk's fixed cost (two Spark jobs, its
# intent and outcome made durable, the leases and fingerprints of its repositories) is about
# 0.4 s on 2 local cores, where a batch of 1,000 checked local deletes takes about 0.1 s of a
# core; at four batches a task, the chunk's re-validation is at most four store calls per task old.
CHUNK_BATCHES_PER_TASK = 4


def chunk_objects(tasks: int) -> int:
    """Objects per sweep chunk: GC_ASSETS_SWEEP_CHUNK_OBJECTS, else CHUNK_BATCHES_PER_TASK store
    batches per Spark task.

    Smaller chunks check the lease and the repository more often and leave less work in
    flight when a sweep dies, at a few Spark jobs per chunk.
    """
    value = os.environ.get(CHUNK_OBJECTS_ENV)
    if value is None or value == "":
        return DELETE_BATCH_SIZE * CHUNK_BATCHES_PER_TASK * tasks
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"{CHUNK_OBJECTS_ENV}={value!r}: expected a whole number of objects, at least 1")
    return int(value)


@dataclass(frozen=True)
class Revalidation:
    changed: bool
    new_commits: int


@dataclass(frozen=True)
class Revalidated:
    """A set's re-validation: each re-read repository's Revalidation, the (repo, address) of the
    candidates needed again, and why each repository that could not be re-read is refused."""

    checks: dict[str, Revalidation]
    revived: DataFrame
    refused: dict[str, str]


def revalidated(
    spark: SparkSession,
    repos: Mapping[str, RepositoryConfig],
    as_of: dt.datetime,
    marked_commits: DataFrame,
    candidates: DataFrame,
) -> Revalidated:
    """Each repository of `repos` re-read now, those of each connector together (its
    commit_graphs and live_entries_together); the candidates its current state keeps alive are
    revived. `marked_commits` and `candidates` carry `repo`.

    Retention is evaluated again on the current graph with the same as-of time. Commits
    the mark already retained kept their objects out of the candidates, so only the
    changed part is read: commits retained now but not at the mark (new commits, a
    branch created from an old commit, a moved tag, a revert), plus staged entries. A
    repository that cannot be re-read is refused: what its state needs now is unknown.
    """
    refused: dict[str, str] = {}
    sources: dict[str, RepositorySource] = {}
    for name, repo in repos.items():
        try:
            sources[name] = source_for(repo)  # a new connector: a cached one would re-read nothing
        except Exception as exc:  # noqa: BLE001 - this repository alone
            refused[name] = task_error(exc)
    graphs = commit_graphs_of(spark, sources)
    marked: dict[str, dict[str, tuple[bool, bool]]] = {}
    for row in (
        marked_commits.filter(one_of(REPO, list(sources))).select(REPO, "commit_id", "retained", "ref_head").collect()
    ):
        marked.setdefault(row[REPO], {})[row["commit_id"]] = (row["retained"], row["ref_head"])
    checks: dict[str, Revalidation] = {}
    reads: dict[str, tuple[str, LiveRead]] = {}
    for name, source in sources.items():
        try:
            graph = graphs[name]
            if isinstance(graph, Exception):
                raise graph
            commits, refs = graph
            verdicts = source.evaluate_retention(spark, repos[name], commits, refs, as_of)
        except Exception as exc:  # noqa: BLE001 - this repository alone
            refused[name] = task_error(exc)
            continue
        was, heads = marked.get(name, {}), retention.ref_heads(refs)
        newly_retained = [c for c, v in verdicts.items() if v.retained and not was.get(c, (False, False))[0]]
        changed = (
            bool(newly_retained) or {c for c, (_, head) in was.items() if head} != heads or set(was) != set(verdicts)
        )
        checks[name] = Revalidation(changed, len(set(verdicts) - set(was)))
        reads[name] = (name, LiveRead(source, verdicts, newly_retained, sorted(heads)))

    def keyed(some: dict[str, tuple[str, LiveRead]]) -> DataFrame:
        entries = live_entries_of(spark, {name: read for name, (_, read) in some.items()})
        return with_relative_keys(entries, {name: repos[name].storage_namespace for name in some})

    unread: dict[str, str] = {}
    frames = read_together(keyed, reads, unread, lambda named: f"repository {named[0]!r}")
    refused |= unread
    wanted = candidates.select(REPO, "address")
    revived = [
        wanted.join(f.filter("in_namespace").select(REPO, "address"), [REPO, "address"], "left_semi") for f in frames
    ]
    empty = local_frame(spark, [], f"{REPO} string, address string")
    checks = {name: check for name, check in checks.items() if name not in refused}
    return Revalidated(checks, reduce(DataFrame.unionByName, revived, empty), refused)


def revived_now(
    spark: SparkSession, partitions: Mapping[str, GcPartition], marked_commits: DataFrame, candidates: DataFrame
) -> Revalidated:
    """The repositories of `partitions` re-validated now (revalidated), and the (repo, address)
    of their candidates that their current state, or another repository's
    (mark.shared.needed_by_others), needs again. One whose referrer cannot be read is refused."""
    if not partitions:
        return Revalidated({}, local_frame(spark, [], f"{REPO} string, address string"), {})
    as_of = next(iter(partitions.values())).as_of
    found = revalidated(spark, {n: p.repo for n, p in partitions.items()}, as_of, marked_commits, candidates)
    again, refused = [found.revived], dict(found.refused)
    for name in found.checks:
        try:
            others = needed_by_others(spark, partitions[name])  # what other repositories need here now
        except Exception as exc:  # noqa: BLE001 - this repository alone
            refused[name] = task_error(exc)
            continue
        if others is not None:
            mine = candidates.filter(F.col(REPO) == name).select("address").join(others, "address", "left_semi")
            again.append(mine.select(F.lit(name).alias(REPO), "address"))
    checks = {name: check for name, check in found.checks.items() if name not in refused}
    return Revalidated(checks, reduce(DataFrame.unionByName, again).distinct(), refused)


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
