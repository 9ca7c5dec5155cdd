"""Acting on candidates: re-validation, deferred deletion, journaled chunks, trash and purge.

The sweep works through the candidates in chunks of one store batch per Spark task, or of
GC_ASSETS_SWEEP_CHUNK_OBJECTS objects: between two chunks it checks its lease and re-validates.
Each chunk's intent is journaled before it acts and its receipts after, in a journal
per mark that no asset write replaces, so a sweep killed mid-way leaves a record of
everything it did or was doing: the rerun of the same mark takes journaled receipts as
they are, acts only on the rest and tells objects an earlier attempt moved or deleted
as that attempt's work. A finished sweep's rerun returns its receipts unchanged.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import uuid
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any, Callable, Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core import retention
from gc_assets.core.addresses import (
    TRASH_PREFIX,
    trash_origin,
    trash_run,
    with_relative_keys,
)
from gc_assets.core.config import RepositoryConfig
from gc_assets.mark.partition import GcPartition
from gc_assets.sources import RepositorySource, source_for
from gc_assets.sources.base import retained_frame
from gc_assets.stores.base import DELETE_BATCH_SIZE, Store
from gc_assets.sweep import lease

TRASH_RUNS_PREFIX = "_gc/trash/"
HOLDS_PREFIX = "_gc/holds/"
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
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


class RunIdError(ValueError):
    """A run id given to restore or release is not one plain segment naming a known record."""


def checked_run_id(store: Store, run_id: str, records: str) -> str:
    """`run_id` when it is one plain path segment with a record under `records`; else RunIdError.

    An empty id, `..` or `a/b` would name every run's trash, or a place outside it.
    """
    if not RUN_ID_PATTERN.match(run_id) or run_id in (".", ".."):
        raise RunIdError(f"run id {run_id!r} is not one plain segment (letters, digits, '_', '.', '-')")
    if store.read_text(f"{records}{run_id}.json") is None:
        raise RunIdError(f"no record {records}{run_id}.json in {store.namespace}: unknown run id {run_id!r}")
    return run_id


def record_hold(store: Store, run_id: str, addresses: list[str], now: dt.datetime) -> None:
    """Restoring says "these objects are needed": hold them until released (docs/design.md §5)."""
    record = {"run_id": run_id, "held_at": now.isoformat(), "addresses": sorted(addresses)}
    store.write_text(f"{HOLDS_PREFIX}{run_id}.json", json.dumps(record))


def held_addresses(store: Store, record_keys: list[str], now: dt.datetime, hold_days: Optional[float]) -> set[str]:
    """Addresses under a hold that has not expired (holds last until released, or `hold_days`)."""
    held: set[str] = set()
    for key in record_keys:
        text = store.read_text(key)
        if text is None:
            continue
        record = json.loads(text)
        placed = dt.datetime.fromisoformat(record["held_at"])
        if hold_days is not None and placed + dt.timedelta(days=hold_days) <= now:
            continue
        held.update(record["addresses"])
    return held


def hold_records(inventory: DataFrame) -> list[str]:
    """Keys of the hold records the inventory lists."""
    return [
        r["address"] for r in inventory.filter(F.col("address").startswith(HOLDS_PREFIX)).select("address").collect()
    ]


JOURNAL_SCHEMA = "address string, action string, error string, run_id string, at timestamp"


def receipts(
    frame: DataFrame, run_id: str, at: dt.datetime, action: Optional[str] = None, note: Optional[str] = None
) -> DataFrame:
    """Receipt rows (address, action, error, run_id, at, size), built here only.

    Without `action`, the frame's own action and error columns are kept; with it, every row
    gets that action and `note` as its error. A frame without sizes gets null sizes.
    """
    return frame.select(
        "address",
        F.col("action") if action is None else F.lit(action).alias("action"),
        F.col("error") if action is None else F.lit(note).cast("string").alias("error"),
        F.lit(run_id).alias("run_id"),
        F.lit(at).alias("at"),
        F.col("size") if "size" in frame.columns else F.lit(None).cast("long").alias("size"),
    )


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
    heads_frame = spark.createDataFrame([(c,) for c in heads], "commit_id string")
    entries = with_relative_keys(
        source.live_entries(spark, retained_frame(spark, verdicts, newly_retained), heads_frame), repo.storage_namespace
    )
    revived = candidates.select("address").join(
        entries.filter("in_namespace").select("address"), "address", "left_semi"
    )
    return Revalidation(changed, len(set(verdicts) - set(marked)), revived)


def unconfirmed(candidates: DataFrame, earlier_candidates: Optional[DataFrame]) -> DataFrame:
    """Candidates that were not already candidates `confirm_days` earlier (two-phase deletion)."""
    if earlier_candidates is None:
        return candidates.select("address")
    return candidates.select("address").join(earlier_candidates.select("address"), "address", "left_anti")


class SweepJournal:
    """What one mark's sweep intends and did, kept outside the receipts partition (which is
    rewritten on every materialization): `<state_dir>/_sweeps/repo=R/date=D/mark=M/`.

    Before a chunk acts, its intent (address, run_id, mode) is written; after, its outcome
    receipts. Each is complete once its `_SUCCESS` exists. The finished sweep's receipts
    are written last: a rerun of the same mark returns them and touches nothing.
    """

    def __init__(self, spark: SparkSession, root: Path):
        self.spark, self.root = spark, root

    def _complete(self, pattern: str) -> list[str]:
        return (
            [f"file://{p.parent}" for p in sorted(self.root.glob(f"{pattern}/_SUCCESS"))] if self.root.is_dir() else []
        )

    def _read(self, pattern: str, schema: str) -> DataFrame:
        paths = self._complete(pattern)
        return self.spark.read.schema(schema).parquet(*paths) if paths else self.spark.createDataFrame([], schema)

    def write(self, frame: DataFrame, name: str) -> DataFrame:
        """Write `frame` under `name` and read it back: decided exactly once, whatever reads it later."""
        target = self.root / name
        frame.write.mode("overwrite").parquet(f"file://{target}")
        return self.spark.read.schema(frame.schema).parquet(f"file://{target}")  # its own schema: no job to infer it

    def intents(self) -> DataFrame:
        return self._read("intent-*", INTENT_SCHEMA)

    def outcomes(self) -> DataFrame:
        """Receipts of every complete chunk of every attempt, as the stores reported them."""
        return self._read("chunk-*", JOURNAL_SCHEMA)

    def finished(self) -> Optional[tuple[DataFrame, dict[str, Any]]]:
        if not self._complete("receipts"):
            return None
        return self.spark.read.parquet(f"file://{self.root / 'receipts'}"), json.loads(
            (self.root / "metadata.json").read_text()
        )

    def finish(self, actions: DataFrame, metadata: dict[str, Any]) -> DataFrame:
        (self.root / "metadata.json").write_text(json.dumps(metadata))  # before the receipts: they mark the end
        return self.write(actions, "receipts")


INTENT_SCHEMA = "address string, run_id string, mode string"


def attribute_absent(outcomes: DataFrame, intents: DataFrame, trashed: Callable[[DataFrame], DataFrame]) -> DataFrame:
    """Outcomes with each `already_absent` that an earlier attempt of this sweep caused told truthfully.

    A crash (or a killed run) between acting and journaling leaves an intent without an
    outcome; the rerun then finds the object gone. It was trashed by that attempt when it
    is in that attempt's trash (`trashed` answers which probes exist), deleted by an
    earlier run when that run meant to delete it.
    """
    earlier = intents.select("address", F.col("run_id").alias("by"), F.col("mode").alias("by_mode"))
    absent = outcomes.filter(F.col("action") == "already_absent").select("address", "run_id", "at")
    pairs = absent.join(earlier, "address")
    # In some run's trash, it was moved by that run (a retried Spark task of this run included);
    # a deletion is told as such only for an earlier run: within one run, absence is ambiguous.
    probes = pairs.filter(F.col("by_mode") == "trash").withColumn(
        "probe", F.concat(F.lit(f"{TRASH_PREFIX}/"), F.col("by"), F.lit("/"), F.col("address"))
    )
    found = (
        trashed(probes.select(F.col("probe").alias("address"))).filter("exists").select(F.col("address").alias("probe"))
    )
    moved = probes.join(found, "probe", "left_semi").select("address", F.lit("trashed").alias("action"), "by", "at")
    removed = pairs.filter((F.col("by_mode") == "delete") & (F.col("by") != F.col("run_id"))).select(
        "address", F.lit("deleted").alias("action"), "by", "at"
    )
    told = (
        moved.unionByName(removed)
        .groupBy("address")
        .agg(F.min(F.struct((F.col("action") != "trashed").alias("rank"), "action", "by", "at")).alias("pick"))
        .select(
            "address",
            "pick.action",
            F.lit(None).cast("string").alias("error"),
            F.col("pick.by").alias("run_id"),
            "pick.at",
        )
    )
    return outcomes.join(told.select("address"), "address", "left_anti").unionByName(told)


def chunked(todo: DataFrame, chunks: int) -> list[DataFrame]:
    bucketed = todo.withColumn("_chunk", F.pmod(F.xxhash64("address"), F.lit(chunks)))
    return [bucketed.filter(F.col("_chunk") == chunk).drop("_chunk") for chunk in range(chunks)]


def trash_moves(candidates: DataFrame, run_id: str) -> DataFrame:
    """Where trash mode moves each candidate: `_gc_trash/<run_id>/<address>`."""
    return candidates.select(
        "address", F.concat(F.lit(f"{TRASH_PREFIX}/{run_id}/"), F.col("address")).alias("destination"), "last_modified"
    )


def trash_receipts(actions: DataFrame) -> DataFrame:
    """A completed move into the trash is a `trashed` receipt."""
    return actions.withColumn("action", F.when(F.col("action") == "moved", F.lit("trashed")).otherwise(F.col("action")))


def expired_trash(
    inventory: DataFrame, runs: dict[str, dt.datetime], now: dt.datetime, keep: dt.timedelta
) -> DataFrame:
    """Objects under `_gc_trash/<run_id>/` of trash runs older than `keep`."""
    old = [run for run, at in runs.items() if at < now - keep]
    return inventory.filter(
        F.col("address").startswith(f"{TRASH_PREFIX}/") & trash_run(F.col("address")).isin(old)
    ).select("address", "size", "last_modified")


class Sweep:
    """One trash or delete sweep of one partition: fenced lease, re-validation before every
    chunk when the repository changed, deferral, journaled intents and outcomes, and a purge
    of expired trash that never purges what is live again. Dry runs never get here."""

    def __init__(
        self,
        spark: SparkSession,
        partition: GcPartition,
        store: Store,
        mode: str,
        run_id: str,
        journal: SweepJournal,
        log: Any,
        clock: Callable[[], dt.datetime],
    ):
        self.spark, self.partition, self.store, self.mode = spark, partition, store, mode
        self.run_id, self.journal, self.log, self.clock = run_id, journal, log, clock
        self.waiting: Optional[DataFrame] = None  # candidates deferred by confirm_days

    def run(
        self,
        retained_commits: DataFrame,
        candidates: DataFrame,
        inventory: DataFrame,
        live: DataFrame,
        earlier: Optional[DataFrame],
    ) -> tuple[DataFrame, dict[str, Any]]:
        """Receipts (address, action, error, run_id, at, size) and metadata of the sweep."""
        finished = self.journal.finished()
        if finished is not None:  # a rerun of a finished sweep: the same receipts, storage untouched
            self.log.info(f"the sweep of this mark finished earlier: returning its receipts from {self.journal.root}")
            return finished[0], {**finished[1], "rerun_of_finished_sweep": True}
        repo = self.partition.repo
        chunk_size = chunk_objects(
            int(self.spark.conf.get("spark.sql.shuffle.partitions"))
        )  # a bad setting: no lease, no write
        held = lease.acquire(self.store, self.run_id, f"{self.partition.date}|{repo.name}", self.clock())
        heartbeat = lease.Heartbeat(self.store, held, self.clock)
        try:
            skew = lease.check_clock(
                self.store, held.key, self.clock(), dt.timedelta(minutes=repo.max_clock_skew_minutes)
            )
            with heartbeat:
                revived, changes = self._act_on(retained_commits, candidates, earlier, heartbeat, chunk_size)
                heartbeat.check()
                purged = self._purge(inventory, live.filter("in_namespace").select("address").unionByName(revived))
        finally:
            lease.release(self.store, heartbeat.lease)
        return self._finish(revived, purged, changes, skew)

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
        revived: list[DataFrame] = []
        fingerprint: Optional[str] = None

        def revalidated() -> DataFrame:
            nonlocal fingerprint
            source = source_for(repo)  # a new connector: a cached one would re-read nothing
            now = source.fingerprint(spark)
            if now != fingerprint:
                check = revalidate(spark, source, repo, self.partition.as_of, retained_commits, candidates)
                checks.append(check)
                revived.append(self.journal.write(check.revived.distinct(), f"revived-{uuid.uuid4().hex}"))
                fingerprint = now
            return reduce(DataFrame.unionByName, revived)

        done = self.journal.outcomes().select("address")
        todo = candidates.select("address", "last_modified", "size").join(done, "address", "left_anti")
        todo = todo.join(revalidated(), "address", "left_anti")
        if repo.confirm_days:
            self.waiting = self.journal.write(
                unconfirmed(candidates, earlier).join(revalidated(), "address", "left_anti"), "unconfirmed"
            )
            todo = todo.join(self.waiting, "address", "left_anti")
        todo = self.journal.write(todo, f"todo-{self.run_id}")
        if self.mode == "trash":
            self.store.write_text(
                f"{TRASH_RUNS_PREFIX}{self.run_id}.json",
                json.dumps({"run_id": self.run_id, "trashed_at": self.clock().isoformat()}),
            )
        total = todo.count()
        chunks = max(1, math.ceil(total / chunk_size)) if total else 0
        handled = 0
        for number, part in enumerate(chunked(todo, chunks) if chunks else [], start=1):
            heartbeat.check()
            part = part.join(revalidated(), "address", "left_anti")
            chunk_id = f"{self.run_id}-{number:06d}"
            self.journal.write(
                part.select("address", F.lit(self.run_id).alias("run_id"), F.lit(self.mode).alias("mode")),
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
            return receipts(
                frame.select("address").join(settled, "address", "left_anti"), self.run_id, now, action, note
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
        if self.mode == "delete":
            actions = self.store.delete(self.spark, part)
        else:
            actions = trash_receipts(self.store.move(self.spark, trash_moves(part, self.run_id)))
        return receipts(actions, self.run_id, self.clock()).drop("size")  # sizes join the receipts at the end

    def _purge(self, inventory: DataFrame, live: DataFrame) -> Optional[DataFrame]:
        """Delete trash runs older than trash_retention_days, except entries whose original
        address is live again or held: those stay in the trash (`skipped_revived`, naming the
        run to restore) and so does their run's record."""
        records = [
            r["address"]
            for r in inventory.filter(F.col("address").startswith(TRASH_RUNS_PREFIX)).select("address").collect()
        ]
        runs: dict[str, dt.datetime] = {}
        for key in records:
            text = self.store.read_text(key)
            if text:
                record = json.loads(text)
                runs[record["run_id"]] = dt.datetime.fromisoformat(record["trashed_at"])
        now = self.clock()
        keep = dt.timedelta(days=self.partition.repo.trash_retention_days)
        expired = expired_trash(inventory, runs, now, keep)
        if not runs or expired.isEmpty():
            return None
        needed = live.unionByName(held_frame_of(self.spark, self.store, inventory, now, self.partition.repo.hold_days))
        origin = expired.withColumn("origin", trash_origin(F.col("address")))
        kept = origin.join(needed.select(F.col("address").alias("origin")), "origin", "left_semi")
        doomed = origin.join(kept.select("address"), "address", "left_anti").drop("origin")
        actions = self.store.delete(self.spark, doomed).join(doomed.select("address", "size"), "address")
        actions = actions.withColumn(
            "action", F.when(F.col("action") == "deleted", F.lit("purged")).otherwise(F.col("action"))
        )
        restore_note = F.concat(
            F.lit("live again at "),
            F.col("origin"),
            F.lit(": kept in the trash; gc-assets restore --run-id "),
            trash_run(F.col("address")),
        )
        kept_rows = kept.select(
            "address", F.lit("skipped_revived").alias("action"), restore_note.alias("error"), "size"
        )
        rows = self.journal.write(
            receipts(actions.select("address", "action", "error", "size").unionByName(kept_rows), self.run_id, now),
            f"purge-{self.run_id}",
        )
        unfinished = {
            r["address"].split("/")[1] for r in rows.filter(F.col("action") != "purged").select("address").collect()
        }
        for run, at in runs.items():
            if at < now - keep and run not in unfinished:
                self.store.remove(f"{TRASH_RUNS_PREFIX}{run}.json")
        self.log.info(
            f"purged trash of runs older than {keep}: {sorted(run for run, at in runs.items() if at < now - keep)}"
        )
        return rows


def held_frame_of(
    spark: SparkSession, store: Store, inventory: DataFrame, now: dt.datetime, hold_days: Optional[float]
) -> DataFrame:
    """Addresses restored and held (`_gc/holds/`) as a frame of `address`."""
    held = held_addresses(store, hold_records(inventory), now, hold_days)
    return spark.createDataFrame([(a,) for a in sorted(held)], "address string")


def restore_run(spark: SparkSession, store: Store, run_id: str) -> DataFrame:
    """Move every object a trash run put under `_gc_trash/<run_id>/` back where it was.

    Receipts name the original address: `restored`, or `failed` (e.g. `destination_exists`
    when something was written there since; it is never overwritten).
    """
    prefix = f"{TRASH_PREFIX}/{run_id}/"
    trashed = store.list(spark, prefix=prefix.rstrip("/"))
    moves = trashed.select(
        F.col("address"), F.expr(f"substring(address, {len(prefix) + 1})").alias("destination"), "last_modified"
    )
    actions = store.move(spark, moves)
    return actions.select(
        F.expr(f"substring(address, {len(prefix) + 1})").alias("address"),
        F.when(F.col("action") == "moved", F.lit("restored")).otherwise(F.col("action")).alias("action"),
        "error",
    )
