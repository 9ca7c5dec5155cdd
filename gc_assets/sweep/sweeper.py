"""Acting on candidates: re-validation, deferred deletion, chunks under a lease, each journaled.

The sweep works through the candidates in chunks of one store batch per Spark task, or of
GC_ASSETS_SWEEP_CHUNK_OBJECTS objects: between two chunks it checks its lease and re-validates.
Each chunk's intent is journaled before it acts and its receipts after, in a journal
per mark that no asset write replaces, so a sweep killed mid-way leaves a record of
everything it did or was doing: the rerun of the same mark takes journaled receipts as
they are, acts only on the rest and tells objects an earlier attempt moved or deleted
as that attempt's work. A finished sweep's rerun returns its receipts unchanged.
The journal is gc_assets.sweep.journal; the trash and its purge, gc_assets.sweep.trash.

Where the inventory names each object's version (a versioned S3 bucket), the candidates carry
the version that was listed and judged: the store deletes or moves exactly that version, and
every receipt names it (`version_id`, null where no version was listed).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import uuid
from dataclasses import dataclass
from functools import reduce
from typing import Any, Callable, Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core import retention
from gc_assets.core.addresses import with_relative_keys
from gc_assets.core.config import GcConfig, RepositoryConfig
from gc_assets.core.names import Mode
from gc_assets.core.spark import local_frame, shuffle_partitions
from gc_assets.core.state import partition_at, sweep_journal_at, sweep_set_journal_at
from gc_assets.mark.partition import GcPartition
from gc_assets.mark.shared import needed_by_others, referrers_of
from gc_assets.sources import RepositorySource, source_for
from gc_assets.sources.base import retained_frame
from gc_assets.stores.base import DELETE_BATCH_SIZE, Store, with_listed_versions, with_version_id
from gc_assets.stores.state import state_files
from gc_assets.sweep import catalog_rows, lease, trash
from gc_assets.sweep.journal import SweepJournal, attribute_absent
from gc_assets.sweep.receipts import receipts, stored

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


def with_receipt_versions(stored_rows: DataFrame, actions: DataFrame) -> DataFrame:
    """deletion_receipts' rows (receipts.stored) with the version each object's receipt names; a
    file catalog's row receipts (row_id) name none."""
    versions = actions.select("address", "version_id").filter(F.col("version_id").isNotNull())
    named = stored_rows.join(versions.dropDuplicates(["address"]), "address", "left")
    if "row_id" not in stored_rows.columns:
        return named
    return named.withColumn("version_id", F.when(F.col("row_id").isNull(), F.col("version_id")))


def chunked(todo: DataFrame, chunks: int) -> list[DataFrame]:
    bucketed = todo.withColumn("_chunk", F.pmod(F.xxhash64("address"), F.lit(chunks)))
    return [bucketed.filter(F.col("_chunk") == chunk).drop("_chunk") for chunk in range(chunks)]


class Sweep:
    """One sweep of one partition in its mode.

    A dry run acts on nothing: every candidate gets a would_delete receipt, with no lease, no
    journal and storage untouched. A trash or delete sweep takes the fenced lease,
    re-validates before every chunk when the repository changed, defers what confirm_days
    has not confirmed, journals intents and outcomes, and purges expired trash without ever
    purging what is live again. A file catalog's rows are cleaned first (in every mode; when
    trashing or deleting, under the lease, as in a set)."""

    def __init__(
        self,
        spark: SparkSession,
        partition: GcPartition,
        store: Store,
        mode: Mode,
        run_id: str,
        mark_id: str,
        log: Any,
        clock: Callable[[], dt.datetime],
        marked_fingerprint: Optional[str] = None,
    ):
        """`marked_fingerprint`: the state_fingerprint taken before the mark read the repository,
        when known and when no two states ever share one (a Delta log's version, no referrers):
        while it still holds, nothing has changed since the mark to re-validate."""
        self.spark, self.partition, self.store, self.mode = spark, partition, store, mode
        self.run_id, self.mark_id, self.log, self.clock = run_id, mark_id, log, clock
        self.marked_fingerprint = marked_fingerprint
        self.files, repo = state_files(partition.config), partition.repo
        shared = (sweep_set_journal_at(partition.date, mark_id), repo.name)  # the mark may have been swept in a set
        self.journal = SweepJournal(spark, self.files, sweep_journal_at(repo.name, partition.date, mark_id), shared)
        self.waiting: Optional[DataFrame] = None  # candidates deferred by confirm_days

    def run(
        self, retained_commits: DataFrame, candidates: DataFrame, inventory: DataFrame, live: DataFrame
    ) -> tuple[DataFrame, dict[str, Any]]:
        """The stored receipts (gc_assets.sweep.receipts.stored) and the sweep's metadata."""
        candidates = with_listed_versions(candidates, inventory)
        if self.mode == Mode.DRY_RUN:
            rows = self._catalog_rows(retained_commits) if self._is_catalog else None
            would = with_version_id(candidates).select("address", "version_id")
            actions, metadata = receipts(would, self.run_id, self.clock(), "would_delete", keep=("version_id",)), {}
        else:
            actions, metadata, rows = self._sweep(retained_commits, candidates, inventory, live, self._earlier())
        return with_receipt_versions(stored(actions, candidates, self.mark_id, rows), actions), metadata

    @property
    def _is_catalog(self) -> bool:
        return self.partition.repo.format == "file-catalog"

    def _rows_first(
        self, retained_commits: DataFrame, candidates: DataFrame
    ) -> tuple[Optional[DataFrame], DataFrame, Optional[DataFrame]]:
        """A file catalog's rows cleaned (journaled), then its candidates that a row present now
        names kept out, since objects go only when no row names them: (row receipts, candidates
        to act on, receipts of those kept). Other formats: (None, candidates, None)."""
        if not self._is_catalog:
            return None, candidates, None
        rows = self._catalog_rows(retained_commits)
        named = catalog_rows.still_named(self.spark, self.partition.repo, candidates)
        kept = self.journal.write(named, f"named-{self.run_id}")
        kept_receipts = receipts(kept, self.run_id, self.clock(), "skipped_revived", catalog_rows.NAMED_NOTE)
        return rows, candidates.join(kept, "address", "left_anti"), with_version_id(kept_receipts)

    def _catalog_rows(self, retained_commits: DataFrame) -> DataFrame:
        """Catalog cleanup of a file catalog, journaled beside the objects' sweep unless a dry run."""
        journal = None if self.mode == Mode.DRY_RUN else self.journal
        repo = self.partition.repo
        return catalog_rows.cleaned(
            self.spark, repo, self.store, self.mode, self.run_id, retained_commits, journal, self.clock()
        )

    def _earlier(self) -> Optional[DataFrame]:
        """With confirm_days, the candidates of the partition that many days earlier, when stored."""
        repo = self.partition.repo
        if not repo.confirm_days:
            return None
        date = self.partition.date - dt.timedelta(days=repo.confirm_days)
        return self.files.read(self.spark, partition_at("orphan_candidates", repo.name, date.isoformat()))

    def _sweep(
        self,
        retained_commits: DataFrame,
        candidates: DataFrame,
        inventory: DataFrame,
        live: DataFrame,
        earlier: Optional[DataFrame],
    ) -> tuple[DataFrame, dict[str, Any], Optional[DataFrame]]:
        """Receipts (address, action, error, run_id, at, size) and metadata of a trash or delete
        sweep, and a file catalog's row receipts (_rows_first, under the lease)."""
        finished = self.journal.finished()
        if finished is not None:  # a rerun of a finished sweep: the same receipts, storage untouched
            self.log.info(f"the sweep of this mark finished earlier: returning its receipts from {self.journal.where}")
            rows, _, kept = self._rows_first(retained_commits, candidates)  # its rows' receipts, from the journal
            return self._with_kept(finished[0], kept), {**finished[1], "rerun_of_finished_sweep": True}, rows
        spark, repo = self.spark, self.partition.repo
        chunk_size = chunk_objects(shuffle_partitions(self.spark))  # a bad setting: no lease, no write
        held = lease.acquire(self.store, self.run_id, f"{self.partition.date}|{repo.name}", self.clock())
        heartbeat = lease.Heartbeat(self.store, held, self.clock)
        try:
            skew = lease.check_clock(
                self.store, held.key, self.clock(), dt.timedelta(minutes=repo.max_clock_skew_minutes)
            )
            with heartbeat:
                rows, candidates, kept = self._rows_first(retained_commits, candidates)
                heartbeat.check()
                revived, changes = self._act_on(retained_commits, candidates, earlier, heartbeat, chunk_size)
                heartbeat.check()
                needed = live.filter("in_namespace").select("address").unionByName(revived)
                purged = trash.purge(
                    spark, self.store, self.journal, self.run_id, repo, inventory, needed, self.clock, self.log
                )
        finally:
            lease.release(self.store, heartbeat.lease)
        actions, metadata = self._finish(revived, purged, changes, skew)
        return self._with_kept(actions, kept), metadata, rows

    @staticmethod
    def _with_kept(actions: DataFrame, kept: Optional[DataFrame]) -> DataFrame:
        return actions if kept is None else actions.unionByName(kept)

    def _act_on(
        self,
        retained_commits: DataFrame,
        candidates: DataFrame,
        earlier: Optional[DataFrame],
        heartbeat: lease.Heartbeat,
        chunk_size: int,
    ) -> tuple[DataFrame, dict[str, Any]]:
        """Act chunk by chunk; before each, the lease is verified and, when the repository's
        fingerprint moved, the candidates are re-validated. Returns the revived addresses."""
        spark, repo = self.spark, self.partition.repo
        checks: list[Revalidation] = []
        revived: list[DataFrame] = [local_frame(spark, [], "address string")]
        fingerprint = self.marked_fingerprint  # None: what the mark read is unknown, so re-read first

        def revalidated() -> DataFrame:
            nonlocal fingerprint
            now = state_fingerprint(spark, self.partition.config, repo)
            if now != fingerprint:
                check, again = revived_now(spark, self.partition, retained_commits, candidates)
                checks.append(check)
                revived.append(self.journal.write(again, f"revived-{uuid.uuid4().hex}"))
                fingerprint = now
            return reduce(DataFrame.unionByName, revived)

        done = self.journal.outcomes().select("address")
        listed = ["address", "last_modified", "size"] + (["version_id"] if "version_id" in candidates.columns else [])
        todo = candidates.select(*listed).join(done, "address", "left_anti")
        todo = todo.join(revalidated(), "address", "left_anti")
        if repo.confirm_days:
            self.waiting = self.journal.write(
                unconfirmed(candidates, earlier).join(revalidated(), "address", "left_anti"), "unconfirmed"
            )
            todo = todo.join(self.waiting, "address", "left_anti")
        todo = self.journal.write(todo, f"todo-{self.run_id}")
        if self.mode == Mode.TRASH:
            trash.record_trash_run(self.store, self.run_id, self.clock())
        total = todo.count()
        chunks = max(1, math.ceil(total / chunk_size)) if total else 0
        handled = 0
        for number, part in enumerate(chunked(todo, chunks) if chunks else [], start=1):
            heartbeat.check()
            part = part.join(revalidated(), "address", "left_anti")
            chunk_id = f"{self.run_id}-{number:06d}"
            self.journal.write(
                part.select("address", F.lit(self.run_id).alias("run_id"), F.lit(self.mode.value).alias("mode")),
                f"intent-{chunk_id}",
            )
            handled += self.journal.write(self._act(part), f"chunk-{chunk_id}").count()
            self.log.info(f"sweep chunk {number}/{chunks} journaled ({handled} of {total} objects handled)")
        changes = {
            "repository_changed_since_mark": any(c.changed for c in checks),
            "new_commits_since_mark": max((c.new_commits for c in checks), default=0),
            "revalidations": len(checks),
        }
        return reduce(DataFrame.unionByName, revived).distinct(), changes

    def _finish(
        self, revived: DataFrame, purged: Optional[DataFrame], changes: dict[str, Any], skew: dt.timedelta
    ) -> tuple[DataFrame, dict[str, Any]]:
        """Journaled outcomes are the truth, whatever re-validation says now; what was not acted
        on is told as revived or unconfirmed. Saved as the finished sweep's receipts."""
        journaled = attribute_absent(
            self.journal.outcomes(), self.journal.intents(), lambda probes: self.store.exists(self.spark, probes)
        )
        settled = journaled.select("address")
        now = self.clock()

        def noted(frame: DataFrame, action: str, note: Optional[str]) -> DataFrame:
            return with_version_id(
                receipts(frame.select("address").join(settled, "address", "left_anti"), self.run_id, now, action, note)
            )

        actions = journaled.withColumn("size", F.lit(None).cast("long")).unionByName(
            noted(revived, "skipped_revived", None)
        )
        if self.waiting is not None:
            note = f"unconfirmed: not a candidate {self.partition.repo.confirm_days} days earlier"
            actions = actions.unionByName(
                noted(self.waiting.join(revived, "address", "left_anti"), "would_delete", note)
            )
        if purged is not None:
            actions = actions.unionByName(purged)
        metadata = {**changes, "clock_skew_seconds": round(skew.total_seconds(), 3)}
        return self.journal.finish(actions, metadata), metadata

    def _act(self, part: DataFrame) -> DataFrame:
        if self.mode == Mode.DELETE:
            actions = self.store.delete(self.spark, part)
        else:
            actions = trash.trash_receipts(self.store.move(self.spark, trash.trash_moves(part, self.run_id)))
        # sizes join the receipts at the end
        return receipts(with_version_id(actions), self.run_id, self.clock(), keep=("version_id",)).drop("size")
