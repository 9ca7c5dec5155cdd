"""Acting on candidates: re-validation, deferred deletion, journaled chunks, trash and purge.

The sweep works through the candidates in chunks of one store batch per Spark task.
After each chunk its receipts are written to a journal beside the receipts asset, so
a sweep killed mid-way leaves a record of everything it did; the re-execution of the
same sweep (same mark) takes journaled receipts as they are and acts only on the rest.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets import lease, retention
from gc_assets.addresses import with_relative_keys
from gc_assets.config import RepositoryConfig
from gc_assets.sources import RepositorySource
from gc_assets.stores.base import DELETE_BATCH_SIZE, Store

TRASH_PREFIX = "_gc_trash"
TRASH_RUNS_PREFIX = "_gc/trash/"
HOLDS_PREFIX = "_gc/holds/"
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


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
    """Restoring says "these objects are needed": hold them until released (DESIGN §5)."""
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
    return [r["address"] for r in inventory.filter(F.col("address").startswith(HOLDS_PREFIX)).select("address").collect()]
JOURNAL_SCHEMA = "address string, action string, error string, run_id string, at timestamp"


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
    marked = {r["commit_id"]: (r["retained"], r["ref_head"]) for r in marked_commits.select("commit_id", "retained", "ref_head").collect()}
    heads = retention.ref_heads(refs)
    newly_retained = [c for c, v in verdicts.items() if v.retained and not marked.get(c, (False, False))[0]]
    changed = bool(newly_retained) or {c for c, (_, head) in marked.items() if head} != heads or set(marked) != set(verdicts)
    retained_frame = spark.createDataFrame([(c,) for c in newly_retained], "commit_id string")
    heads_frame = spark.createDataFrame([(c,) for c in heads], "commit_id string")
    entries = with_relative_keys(source.live_entries(spark, retained_frame, heads_frame), repo.storage_namespace)
    revived = candidates.select("address").join(entries.filter("in_namespace").select("address"), "address", "left_semi")
    return Revalidation(changed, len(set(verdicts) - set(marked)), revived)


def unconfirmed(candidates: DataFrame, earlier_candidates: Optional[DataFrame]) -> DataFrame:
    """Candidates that were not already candidates `confirm_days` earlier (two-phase deletion)."""
    if earlier_candidates is None:
        return candidates.select("address")
    return candidates.select("address").join(earlier_candidates.select("address"), "address", "left_anti")


def read_journal(spark: SparkSession, journal: Path) -> DataFrame:
    """Receipts journaled so far by every attempt of this sweep (complete chunks only)."""
    paths = [f"file://{p.parent}" for p in sorted(journal.glob("chunk-*/_SUCCESS"))] if journal.is_dir() else []
    if not paths:
        return spark.createDataFrame([], JOURNAL_SCHEMA)
    return spark.read.schema(JOURNAL_SCHEMA).parquet(*paths)


def act_in_chunks(
    spark: SparkSession,
    todo: DataFrame,
    act: Callable[[DataFrame], DataFrame],
    journal: Path,
    progress: Callable[[int, int, int], None],
) -> None:
    """Apply `act` to `todo` chunk by chunk, journaling each chunk's receipts before the next.

    `act` returns rows in JOURNAL_SCHEMA; a chunk counts as journaled once its _SUCCESS exists.
    """
    total = todo.count()
    if total == 0:
        return
    tasks = int(spark.conf.get("spark.sql.shuffle.partitions"))
    chunks = max(1, math.ceil(total / (DELETE_BATCH_SIZE * tasks)))
    bucketed = todo.withColumn("_chunk", F.pmod(F.xxhash64("address"), F.lit(chunks)))
    done = 0
    for chunk in range(chunks):
        part = bucketed.filter(F.col("_chunk") == chunk).drop("_chunk")
        target = journal / f"chunk-{uuid.uuid4().hex}"
        act(part).write.parquet(f"file://{target}")
        done += spark.read.parquet(f"file://{target}").count()
        progress(chunk + 1, chunks, done)


def trash_moves(candidates: DataFrame, run_id: str) -> DataFrame:
    """Where trash mode moves each candidate: `_gc_trash/<run_id>/<address>`."""
    return candidates.select(
        "address", F.concat(F.lit(f"{TRASH_PREFIX}/{run_id}/"), F.col("address")).alias("destination"), "last_modified"
    )


def trash_receipts(actions: DataFrame) -> DataFrame:
    """A completed move into the trash is a `trashed` receipt."""
    return actions.withColumn("action", F.when(F.col("action") == "moved", F.lit("trashed")).otherwise(F.col("action")))


def expired_trash(inventory: DataFrame, runs: dict[str, dt.datetime], now: dt.datetime, keep: dt.timedelta) -> DataFrame:
    """Objects under `_gc_trash/<run_id>/` of trash runs older than `keep`."""
    old = [run for run, at in runs.items() if at < now - keep]
    run_column = F.split(F.col("address"), "/").getItem(1)
    return inventory.filter(F.col("address").startswith(f"{TRASH_PREFIX}/") & run_column.isin(old)).select(
        "address", "size", "last_modified"
    )


class Sweep:
    """One trash or delete sweep of one partition: lease, re-validation, deferral, journaled
    chunks, and purge of expired trash. Dry runs never get here."""

    def __init__(self, spark: SparkSession, partition: Any, store: Store, mode: str, run_id: str, journal: Path, log: Any):
        self.spark, self.partition, self.store, self.mode = spark, partition, store, mode
        self.run_id, self.journal, self.log = run_id, journal, log

    def run(
        self,
        retained_commits: DataFrame,
        candidates: DataFrame,
        inventory: DataFrame,
        earlier: Optional[DataFrame],
    ) -> tuple[DataFrame, dict[str, Any]]:
        """Receipts (address, action, error, run_id, at, size) and metadata of the sweep."""
        from gc_assets.assets.common import utc_now

        spark, repo = self.spark, self.partition.repo
        held = lease.acquire(self.store, self.run_id, f"{self.partition.date}|{repo.name}", utc_now())
        try:
            skew = lease.check_clock(self.store, utc_now(), dt.timedelta(minutes=repo.max_clock_skew_minutes))
            source = self.partition.source
            check = revalidate(spark, source, repo, self.partition.as_of, retained_commits, candidates)
            revived = self._materialize(check.revived.distinct(), "revived")  # judged once, then fixed
            done = read_journal(spark, self.journal).select("address")
            todo = (
                candidates.select("address", "last_modified", "size")
                .join(done, "address", "left_anti")
                .join(revived, "address", "left_anti")
            )
            waiting = None
            if repo.confirm_days:
                waiting = self._materialize(unconfirmed(candidates, earlier).join(revived, "address", "left_anti"), "unconfirmed")
                todo = todo.join(waiting, "address", "left_anti")
            if self.mode == "trash":
                self.store.write_text(
                    f"{TRASH_RUNS_PREFIX}{self.run_id}.json", json.dumps({"run_id": self.run_id, "trashed_at": utc_now().isoformat()})
                )

            def progress(chunk: int, chunks: int, handled: int) -> None:
                nonlocal held
                held = lease.renew(self.store, held, utc_now())
                self.log.info(f"sweep chunk {chunk}/{chunks} journaled ({handled} objects handled)")

            act_in_chunks(spark, todo, self._act, self.journal, progress)
            purged = self._purge(inventory, utc_now())
        finally:
            lease.release(self.store, held)

        # What the journal says was done is the truth, whatever re-validation says now.
        journaled = read_journal(spark, self.journal)
        settled = journaled.select("address")
        now = F.lit(utc_now())

        def noted(frame: DataFrame, action: str, note: Optional[str]) -> DataFrame:
            return frame.join(settled, "address", "left_anti").select(
                "address", F.lit(action).alias("action"), F.lit(note).cast("string").alias("error"),
                F.lit(self.run_id).alias("run_id"), now.alias("at"), F.lit(None).cast("long").alias("size"),
            )

        actions = journaled.withColumn("size", F.lit(None).cast("long")).unionByName(noted(revived, "skipped_revived", None))
        if waiting is not None:
            actions = actions.unionByName(noted(waiting, "would_delete", f"unconfirmed: not a candidate {repo.confirm_days} days earlier"))
        if purged is not None:
            actions = actions.unionByName(purged)
        metadata = {
            "repository_changed_since_mark": check.changed,
            "new_commits_since_mark": check.new_commits,
            "clock_skew_seconds": round(skew.total_seconds(), 3),
        }
        return actions, metadata

    def _materialize(self, frame: DataFrame, name: str) -> DataFrame:
        """Write a decision beside the journal and read it back, so it is evaluated exactly once."""
        target = self.journal / f"{name}-{uuid.uuid4().hex}"
        frame.select("address").write.parquet(f"file://{target}")
        return self.spark.read.parquet(f"file://{target}")

    def _act(self, part: DataFrame) -> DataFrame:
        from gc_assets.assets.common import utc_now

        if self.mode == "delete":
            actions = self.store.delete(self.spark, part)
        else:
            actions = trash_receipts(self.store.move(self.spark, trash_moves(part, self.run_id)))
        return actions.select("address", "action", "error", F.lit(self.run_id).alias("run_id"), F.lit(utc_now()).alias("at"))

    def _purge(self, inventory: DataFrame, now: dt.datetime) -> Optional[DataFrame]:
        """Delete trash runs older than trash_retention_days; `purged` receipts name the trash keys."""
        records = [r["address"] for r in inventory.filter(F.col("address").startswith(TRASH_RUNS_PREFIX)).select("address").collect()]
        runs: dict[str, dt.datetime] = {}
        for key in records:
            text = self.store.read_text(key)
            if text:
                record = json.loads(text)
                runs[record["run_id"]] = dt.datetime.fromisoformat(record["trashed_at"])
        keep = dt.timedelta(days=self.partition.repo.trash_retention_days)
        expired = expired_trash(inventory, runs, now, keep)
        if not runs or expired.isEmpty():
            return None
        actions = self.store.delete(self.spark, expired).join(expired.select("address", "size"), "address")
        actions = actions.withColumn("action", F.when(F.col("action") == "deleted", F.lit("purged")).otherwise(F.col("action")))
        target = self.journal / f"purge-{uuid.uuid4().hex}"
        actions.select("address", "action", "error", F.lit(self.run_id).alias("run_id"), F.lit(now).alias("at"), "size").write.parquet(f"file://{target}")
        rows = self.spark.read.parquet(f"file://{target}")
        failed_runs = {r["address"].split("/")[1] for r in rows.filter(F.col("action") == "failed").select("address").collect()}
        for run, at in runs.items():
            if at < now - keep and run not in failed_runs:
                self.store.remove(f"{TRASH_RUNS_PREFIX}{run}.json")
        self.log.info(f"purged trash of runs older than {keep}: {sorted(run for run, at in runs.items() if at < now - keep)}")
        return rows


def restore_run(spark: SparkSession, store: Store, run_id: str) -> DataFrame:
    """Move every object a trash run put under `_gc_trash/<run_id>/` back where it was.

    Receipts name the original address: `restored`, or `failed` (e.g. `destination_exists`
    when something was written there since; it is never overwritten).
    """
    prefix = f"{TRASH_PREFIX}/{run_id}/"
    trashed = store.list(spark, prefix=prefix.rstrip("/"))
    moves = trashed.select(F.col("address"), F.expr(f"substring(address, {len(prefix) + 1})").alias("destination"), "last_modified")
    actions = store.move(spark, moves)
    return actions.select(
        F.expr(f"substring(address, {len(prefix) + 1})").alias("address"),
        F.when(F.col("action") == "moved", F.lit("restored")).otherwise(F.col("action")).alias("action"),
        "error",
    )
