"""Every trash and delete sweep: of a set of repositories at once (docs/design.md §9), and of
one partition's repository alone (a sweep of its stored mark, a set of one).

Each repository keeps every safety property of a sweep of its own: its fenced
lease, taken before anything acts and checked before each chunk that acts on it; re-validation
before each such chunk once its state moved from the mark's fingerprint; the holds a restore
placed since the mark, judged again; its rows of the journal, written before (intent) and after
(outcome) each action; the purge of its expired trash, never of what is live again or held;
a file catalog's rows cleaned first, under its lease, and what a row present then names kept.
What is shared is the work: the set's candidates go in chunks of a few store batches per Spark
task (sweeper.chunk_objects) whatever repositories they belong to, and each chunk is two Spark
jobs for all of them (one gathers its objects to the driver, one acts), its intent and outcome
small records the driver writes: the jobs grow with the objects, not with the repositories.

A repository refused on the way (a run of it in progress, its lease held or lost, the clocks
apart, a hold on a candidate, its storage failing) stops alone, named, and the others go on.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import reduce
from typing import Any, Callable, Optional, Sequence, Union

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from gc_assets.core.config import GcConfig
from gc_assets.core.names import REPO, Mode
from gc_assets.core.spark import local_frame, one_of, shuffle_partitions, task_error
from gc_assets.core.state import HOLDS_PREFIX, TRASH_RUNS_PREFIX, partition_at, sweep_journal_at, sweep_set_journal_at
from gc_assets.mark.partition import GcPartition
from gc_assets.stores.base import Store, with_listed_versions, with_version_id
from gc_assets.stores.many import delete_many, exists_many, listed_under, move_many
from gc_assets.stores.state import state_files
from gc_assets.sweep import catalog_rows, lease, trash
from gc_assets.sweep.holds import held_addresses
from gc_assets.sweep.journal import SweepJournal, attribute_absent
from gc_assets.sweep.receipts import receipts
from gc_assets.sweep.sweeper import chunk_objects, revived_now, state_fingerprint, unconfirmed

# A chunk's share of one repository: (repository, pieces it is cut into, this piece).
Share = tuple[str, int, int]
ADDRESSES_SCHEMA = f"{REPO} string, address string"  # revived or held objects of the set
RANK = "rank_in_repo"
LEASES_AT_ONCE = 8  # repositories whose leases are taken at once


def packed(counts: dict[str, int], size: int) -> list[list[Share]]:
    """The set's objects (`counts` per repository) in chunks of at most `size`: small repositories
    share a chunk, a large one is cut into equal pieces (by rank: in_chunk), each piece in one chunk.
    A chunk touches few repositories, so only their leases and fingerprints are checked before it."""
    chunks: list[list[Share]] = []
    current: list[Share] = []
    filled = 0
    for repo, count in sorted(counts.items()):
        pieces = max(1, math.ceil(count / size))
        share = math.ceil(count / pieces)
        for piece in range(pieces):
            if current and filled + share > size:
                chunks.append(current)
                current, filled = [], 0
            current.append((repo, pieces, piece))
            filled += share
    if current:
        chunks.append(current)
    return chunks


def ranked(todo: DataFrame) -> DataFrame:
    """`todo` with each object's RANK among its repository's (by address, from 0): in_chunk cuts a
    repository into pieces that differ by one object at most."""
    return todo.withColumn(RANK, F.row_number().over(Window.partitionBy(REPO).orderBy("address")) - 1)


def in_chunk(chunk: Sequence[Share]) -> Column:
    """The rows (repo, address, RANK) of `chunk`."""
    whole = [repo for repo, pieces, _ in chunk if pieces == 1]
    condition = one_of(REPO, whole)
    for repo, pieces, piece in chunk:
        if pieces > 1:
            condition = condition | ((F.col(REPO) == repo) & (F.pmod(F.col(RANK), F.lit(pieces)) == piece))
    return condition


@dataclass
class SetSwept:
    """What the set's sweep did: each swept repository's receipts and metadata, each refused one's reason."""

    receipts: DataFrame  # repo, address, action, error, run_id, at, size, version_id
    metadata: dict[str, dict[str, Any]]
    refused: dict[str, str] = field(default_factory=dict)


class SetSweep:
    """One trash or delete sweep of the repositories of `partitions` (each in `modes`), all of
    one mark and one date: the mark of this run (a set collected and swept in one run) or, for
    one repository, `mark_id`, an earlier run's (its sweep alone, deletion_receipts). A sweep of
    one repository's earlier mark keeps that repository's journal of the mark, sharing its rows
    of the set's journal of the mark: a set's sweep killed mid-way is resumed by it exactly, and
    a finished one's receipts are returned with nothing touched."""

    def __init__(
        self,
        spark: SparkSession,
        lake: GcConfig,
        partitions: dict[str, GcPartition],
        stores: dict[str, Store],
        modes: dict[str, Mode],
        run_id: str,
        log: Any,
        clock: Callable[[], dt.datetime],
        fingerprints: dict[str, str],
        mark_id: Optional[str] = None,
    ):
        """`fingerprints`: each repository's sweeper.state_fingerprint taken before the mark read
        it, where one is known and no two states share it; one missing is re-validated first."""
        self.spark, self.lake, self.partitions, self.stores, self.modes = spark, lake, partitions, stores, modes
        self.run_id, self.log, self.clock = run_id, log, clock
        self.mark_id = mark_id or run_id
        self.fingerprints = dict(fingerprints)
        self.date = next(iter(partitions.values())).date
        self.files = state_files(lake)
        of_set = sweep_set_journal_at(self.date, self.mark_id)
        if self.mark_id == run_id:
            self.journal = SweepJournal(spark, self.files, of_set, of_set=True)
        else:
            (name,) = partitions  # an earlier mark is swept one repository at a time
            own = sweep_journal_at(name, self.date, self.mark_id)
            self.journal = SweepJournal(spark, self.files, own, shared=(of_set, name), of_set=True)
        self.refused: dict[str, str] = {}
        self.checks: dict[str, list[Any]] = {name: [] for name in partitions}
        self.revived: list[DataFrame] = [local_frame(spark, [], ADDRESSES_SCHEMA)]
        self.waiting: Optional[DataFrame] = None  # (repo, address) deferred by confirm_days

    def going(self, names: Sequence[str]) -> list[str]:
        return [name for name in names if name not in self.refused]

    def refuse(self, refusals: dict[str, str]) -> None:
        for name, why in refusals.items():
            self.refused.setdefault(name, why)

    def run(self, retained: DataFrame, candidates: DataFrame, inventory: DataFrame, live: DataFrame) -> SetSwept:
        """Each repository's sweep; the frames carry `repo` and hold every repository of the set."""
        names = list(self.partitions)
        if self.mark_id != self.run_id:
            finished = self.journal.finished(names[0])
            if finished is not None:  # a rerun of a finished sweep: the same receipts, storage untouched
                self.log.info(f"the sweep of this mark finished earlier: its receipts are in {self.journal.where}")
                return SetSwept(finished[0], {names[0]: {**finished[1], "rerun_of_finished_sweep": True}})
        chunk_size = chunk_objects(shuffle_partitions(self.spark))  # a bad setting: no lease, no write
        self.refuse(self._held_since_mark(candidates, names))
        leases, skews = self._leases(self.going(names))
        heartbeats = lease.Heartbeats(self.stores, leases, self.clock)
        try:
            with heartbeats:
                rows, candidates = self._catalogs_first(retained, candidates, heartbeats)
                self._act_on(retained, candidates, inventory, heartbeats, chunk_size)
                purged = self._purge(inventory, live)
        finally:
            for name, held in heartbeats.leases.items():
                lease.release(self.stores[name], held)
        return self._finish(purged, skews, rows)

    def _catalogs_first(
        self, retained: DataFrame, candidates: DataFrame, heartbeats: lease.Heartbeats
    ) -> tuple[Optional[DataFrame], DataFrame]:
        """Each file catalog's rows cleaned (sweep.catalog_rows, journaled in its own journal as its
        own sweep does), then its candidates that a row present now names kept, every catalog's
        rows read together: the row receipts and those kept (`repo`, row_id), and the candidates
        left to act on. A catalog whose lease is lost or whose cleanup fails is refused alone."""
        catalogs = [n for n in self.going(list(self.partitions)) if self.partitions[n].repo.format == "file-catalog"]
        if not catalogs:
            return None, candidates
        self.refuse(self._lost(catalogs, heartbeats))
        repos = {name: self.partitions[name].repo for name in self.going(catalogs)}
        cleanups, refused = catalog_rows.cleanups(
            retained,
            repos,
            self.stores,
            self.modes,
            lambda name: SweepJournal(self.spark, self.files, sweep_journal_at(name, self.date, self.mark_id)),
        )
        self.refuse(refused)
        rows, stopped = catalog_rows.sweep_rows_together(self.spark, cleanups, self.run_id, self.clock())
        self.refuse({name: f"catalog cleanup: {task_error(why)}" for name, why in stopped.items()})
        cleaned = self.going(list(cleanups))
        kept, stopped = catalog_rows.still_named(
            self.spark, {name: repos[name] for name in cleaned}, candidates.filter(one_of(REPO, cleaned))
        )
        self.refuse({name: f"catalog cleanup: {task_error(why)}" for name, why in stopped.items()})
        kept = self.journal.write(kept, f"named-{self.run_id}")
        noted = receipts(kept, self.run_id, self.clock(), "skipped_revived", catalog_rows.NAMED_NOTE, keep=(REPO,))
        rows = with_version_id(rows).unionByName(with_version_id(noted).withColumn("row_id", F.lit(None).cast("long")))
        return rows, candidates.join(kept.select(REPO, "address"), [REPO, "address"], "left_anti")

    def _held_since_mark(self, candidates: DataFrame, names: list[str]) -> dict[str, str]:
        """Repositories with a candidate that a hold covers now (a restore since the mark)."""
        now = self.clock()
        held = []
        for name in names:
            store, repo = self.stores[name], self.partitions[name].repo
            records = store.keys(HOLDS_PREFIX)
            held += [(name, address) for address in held_addresses(store, records, now, repo.hold_days)]
        if not held:
            return {}
        found = candidates.join(local_frame(self.spark, held, ADDRESSES_SCHEMA), [REPO, "address"], "left_semi")
        counts = {r[REPO]: r["count"] for r in found.groupBy(REPO).count().collect()}
        return {
            name: f"sweep refused, storage untouched: candidates_not_held: {count} candidates are held by a restore"
            for name, count in counts.items()
        }

    def _leases(self, names: list[str]) -> tuple[dict[str, lease.Lease], dict[str, dt.timedelta]]:
        """Each repository's fenced lease and its storage's clock skew, LEASES_AT_ONCE repositories
        at a time (each is a few small durable writes, spent waiting on storage); a repository
        whose lease is held, or whose storage disagrees with the driver's clock, is refused alone."""

        def taken(name: str) -> tuple[Optional[lease.Lease], dt.timedelta, str]:
            store, repo = self.stores[name], self.partitions[name].repo
            try:
                held = lease.acquire(store, self.run_id, f"{self.date}|{name}", self.clock())
            except Exception as exc:  # noqa: BLE001 - this repository alone
                return None, dt.timedelta(0), str(exc)
            try:
                allowed = dt.timedelta(minutes=repo.max_clock_skew_minutes)
                return held, lease.check_clock(store, held.key, self.clock(), allowed), ""
            except Exception as exc:  # noqa: BLE001 - this repository alone
                lease.release(store, held)
                return None, dt.timedelta(0), str(exc)

        leases, skews = {}, {}
        with ThreadPoolExecutor(LEASES_AT_ONCE, thread_name_prefix="set-leases") as pool:
            for name, (held, skew, why) in zip(names, pool.map(taken, names)):
                if held is None:
                    self.refuse({name: why})
                else:
                    leases[name], skews[name] = held, skew
        return leases, skews

    def _lost(self, names: list[str], heartbeats: lease.Heartbeats) -> dict[str, str]:
        """Why each repository of `names` whose lease is lost must not be acted on, its lease
        verified LEASES_AT_ONCE repositories at a time (each a read of storage)."""
        with ThreadPoolExecutor(LEASES_AT_ONCE, thread_name_prefix="set-leases") as pool:
            lost = dict(zip(names, pool.map(heartbeats.lost_lease, names)))
        return {name: str(why) for name, why in lost.items() if why is not None}

    def _revalidated(self, names: list[str], retained: DataFrame, candidates: DataFrame) -> DataFrame:
        """Every address revived so far; first re-validating the repositories of `names` whose
        fingerprint moved since they were last read, all of them together (sweeper.revived_now),
        their revived addresses journaled in one write. One that cannot be re-read is refused."""
        now = dict(zip(names, self._fingerprints(names)))
        moved = [name for name in names if now[name] != self.fingerprints.get(name)]
        if not moved:
            return reduce(DataFrame.unionByName, self.revived)
        mine = one_of(REPO, moved)
        found = revived_now(
            self.spark,
            {name: self.partitions[name] for name in moved},
            retained.filter(mine),
            candidates.filter(mine),
        )
        self.refuse({name: f"re-validation failed: {why}" for name, why in found.refused.items()})
        for name, check in found.checks.items():
            self.checks[name].append(check)
            fingerprint = now[name]
            if isinstance(fingerprint, str):
                self.fingerprints[name] = fingerprint
            else:
                self.fingerprints.pop(name, None)
        self.revived.append(self.journal.write(found.revived, f"revived-{uuid.uuid4().hex}"))
        return reduce(DataFrame.unionByName, self.revived)

    def _fingerprints(self, names: list[str]) -> list[Union[str, Exception]]:
        """Each repository's sweeper.state_fingerprint now, LEASES_AT_ONCE at a time (each a
        listing of its state in storage); one that cannot be taken is its error, equal to no
        earlier fingerprint: the repository is re-validated, and refused if it cannot be re-read."""

        def taken(name: str) -> Union[str, Exception]:
            try:
                return state_fingerprint(self.spark, self.lake, self.partitions[name].repo)
            except Exception as exc:  # noqa: BLE001 - this repository alone
                return exc

        with ThreadPoolExecutor(LEASES_AT_ONCE, thread_name_prefix="set-fingerprints") as pool:
            return list(pool.map(taken, names))

    def _act_on(
        self,
        retained: DataFrame,
        candidates: DataFrame,
        inventory: DataFrame,
        heartbeats: lease.Heartbeats,
        chunk_size: int,
    ) -> None:
        """Act chunk by chunk, each object at the version it was listed as (a versioned bucket's;
        null elsewhere); before each chunk, the leases of the repositories it touches are verified
        and those that changed since they were last read are re-validated."""
        done = self.journal.outcomes().select(REPO, "address")
        revived = self._revalidated(self.going(list(self.partitions)), retained, candidates)
        going = self.going(list(self.partitions))
        listed = candidates.filter(one_of(REPO, going)).select(REPO, "address", "last_modified", "size")
        todo = (
            with_version_id(with_listed_versions(listed, inventory, (REPO, "address")))
            .join(done, [REPO, "address"], "left_anti")
            .join(revived, [REPO, "address"], "left_anti")
        )
        self.waiting = self._unconfirmed(candidates, going, revived)
        if self.waiting is not None:
            todo = todo.join(self.waiting, [REPO, "address"], "left_anti")
        todo = self.journal.write(ranked(todo), f"todo-{self.run_id}")
        for name in going:
            if self.modes[name] is Mode.TRASH:
                trash.record_trash_run(self.stores[name], self.run_id, self.clock())
        counts = {r[REPO]: r["count"] for r in todo.groupBy(REPO).count().collect()}
        decided = len(self.revived)  # what was revived so far is not in `todo`
        chunks = packed(counts, chunk_size)
        total, planned = sum(counts.values()), 0
        for number, chunk in enumerate(chunks, start=1):
            names = self.going(sorted({repo for repo, _, _ in chunk}))
            self.refuse(self._lost(names, heartbeats))
            revived = self._revalidated(self.going(names), retained, candidates)
            names = self.going(names)
            if not names:
                continue
            part = todo.filter(in_chunk(chunk) & one_of(REPO, names)).drop(RANK)
            if len(self.revived) > decided:  # revived since `todo` was decided (a join: one job more)
                part = part.join(revived, [REPO, "address"], "left_anti")
            objects = part.toArrow()  # one chunk: bounded
            planned += sum(math.ceil(counts[repo] / pieces) for repo, pieces, _ in chunk)
            if not objects.num_rows:
                continue
            chunk_id = f"{self.run_id}-{number:06d}"
            owners = objects.column(REPO).to_pylist()
            intent = {
                REPO: objects.column(REPO),
                "address": objects.column("address"),
                "run_id": pa.array([self.run_id] * len(owners), pa.string()),
                "mode": pa.array([self.modes[owner].value for owner in owners], pa.string()),
            }
            self.journal.keep(f"intent-{chunk_id}", pa.table(intent))
            self._journaled_act(self.spark.createDataFrame(objects), names, chunk_id)
            self.log.info(f"sweep chunk {number}/{len(chunks)} journaled (about {planned} of {total} objects)")

    def _unconfirmed(self, candidates: DataFrame, names: list[str], revived: DataFrame) -> Optional[DataFrame]:
        """(repo, address) of the candidates that were not already candidates `confirm_days`
        earlier in the repositories that set it (two-phase deletion), less the `revived`,
        journaled; None when none does."""
        waiting = []
        for name in names:
            days = self.partitions[name].repo.confirm_days
            if not days:
                continue
            earlier_date = (self.date - dt.timedelta(days=days)).isoformat()
            earlier = self.files.read(self.spark, partition_at("orphan_candidates", name, earlier_date))
            mine = candidates.filter(F.col(REPO) == name)
            waiting.append(unconfirmed(mine, earlier).select(F.lit(name).alias(REPO), "address"))
        if not waiting:
            return None
        return self.journal.write(
            reduce(DataFrame.unionByName, waiting).join(revived, [REPO, "address"], "left_anti"), "unconfirmed"
        )

    def _journaled_act(self, part: DataFrame, names: list[str], chunk_id: str) -> None:
        """Act on one chunk and journal its outcome; when its job fails, each repository of it acts
        alone, and one whose storage fails is refused: the others' outcomes are journaled."""
        try:
            self.journal.keep(f"chunk-{chunk_id}", self._act(part, names).toArrow())
        except Exception:  # noqa: BLE001 - find the repositories at fault
            for index, name in enumerate(names):
                try:
                    mine = part.filter(F.col(REPO) == name)
                    self.journal.keep(f"chunk-{chunk_id}-{index:06d}", self._act(mine, [name]).toArrow())
                except Exception as exc:  # noqa: BLE001 - this repository alone
                    self.refuse({name: f"sweep stopped: {task_error(exc)}"})

    def _act(self, part: DataFrame, names: list[str]) -> DataFrame:
        """Each repository's objects of `part` deleted or moved into its trash, in its mode: outcome rows."""
        deleting = [name for name in names if self.modes[name] is Mode.DELETE]
        trashing = [name for name in names if self.modes[name] is Mode.TRASH]
        actions = []
        if deleting:
            mine = part.filter(one_of(REPO, deleting))
            actions.append(delete_many(self.spark, {n: self.stores[n] for n in deleting}, mine))
        if trashing:
            mine = part.filter(one_of(REPO, trashing))
            moves = trash.trash_moves(mine, self.run_id, keep=(REPO,))
            moved = move_many(self.spark, {n: self.stores[n] for n in trashing}, moves)
            actions.append(trash.trash_receipts(moved))
        acted = reduce(DataFrame.unionByName, actions)
        return receipts(with_version_id(acted), self.run_id, self.clock(), keep=(REPO, "version_id")).drop("size")

    def _purge(self, inventory: DataFrame, live: DataFrame) -> Optional[DataFrame]:
        """Each repository's expired trash purged (trash.purge), for those whose trash run records
        name a run older than their trash_retention_days: the records are read on the driver first."""
        records = listed_under(inventory.filter(one_of(REPO, self.going(list(self.partitions)))), TRASH_RUNS_PREFIX)
        now, purged = self.clock(), []
        revived = reduce(DataFrame.unionByName, self.revived)
        for name, keys in sorted(records.items()):
            repo, store = self.partitions[name].repo, self.stores[name]
            keep = dt.timedelta(days=repo.trash_retention_days)
            if not any(at < now - keep for at in trash.recorded_runs(store, keys).values()):
                continue
            mine = F.col(REPO) == name
            needed = live.filter(mine & F.col("in_namespace")).select("address")
            needed = needed.unionByName(revived.filter(mine).select("address"))
            journal = SweepJournal(self.spark, self.files, sweep_journal_at(name, self.date, self.mark_id))
            try:
                rows = trash.purge(
                    self.spark,
                    store,
                    journal,
                    self.run_id,
                    repo,
                    inventory.filter(mine).drop(REPO),
                    needed,
                    self.clock,
                    self.log,
                )
            except Exception as exc:  # noqa: BLE001 - this repository alone
                self.refuse({name: f"purge of expired trash failed: {task_error(exc)}"})
                continue
            if rows is not None:
                purged.append(rows.select(F.lit(name).alias(REPO), *rows.columns))
        return reduce(DataFrame.unionByName, purged) if purged else None

    def _finish(
        self, purged: Optional[DataFrame], skews: dict[str, dt.timedelta], rows: Optional[DataFrame]
    ) -> SetSwept:
        """Journaled outcomes are the truth, whatever re-validation says now; what was not acted
        on is told as revived; `rows`: the file catalogs' row receipts and the objects their rows
        kept. Saved as the finished sweep's receipts of the repositories not refused."""
        swept = self.going(list(self.partitions))
        mine = one_of(REPO, swept)
        stores = {name: self.stores[name] for name in swept}
        keys = (REPO, "address")
        journaled = attribute_absent(
            self.journal.outcomes().filter(mine),
            self.journal.intents().filter(mine),
            lambda probes: exists_many(stores, probes),
            keys,
        )
        revived = reduce(DataFrame.unionByName, self.revived).filter(mine)
        untouched = revived.join(journaled.select(*keys), list(keys), "left_anti")
        noted = receipts(untouched, self.run_id, self.clock(), "skipped_revived", keep=(REPO,))
        actions = journaled.withColumn("size", F.lit(None).cast("long")).unionByName(with_version_id(noted))
        if self.waiting is not None:
            days = {name: self.partitions[name].repo.confirm_days for name in swept}
            notes = F.create_map(
                *[F.lit(x) for name in swept for x in (name, f"unconfirmed: not a candidate {days[name]} days earlier")]
            )
            waiting = self.waiting.filter(mine).join(revived, list(keys), "left_anti")
            told = receipts(waiting, self.run_id, self.clock(), "would_delete", keep=(REPO,))
            actions = actions.unionByName(with_version_id(told.withColumn("error", notes[F.col(REPO)])))
        if purged is not None:
            actions = actions.unionByName(purged.filter(mine))
        if rows is not None:
            actions = actions.unionByName(rows.filter(mine), allowMissingColumns=True)
        metadata = {
            name: {
                "repository_changed_since_mark": any(c.changed for c in self.checks[name]),
                "new_commits_since_mark": max((c.new_commits for c in self.checks[name]), default=0),
                "revalidations": len(self.checks[name]),
                "clock_skew_seconds": round(skews[name].total_seconds(), 3),
            }
            for name in swept
        }
        return SetSwept(self.journal.finish(actions, metadata), metadata, dict(self.refused))
