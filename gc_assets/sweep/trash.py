"""Trash mode and its undoing: moves into `_gc_trash/<run_id>/`, the purge of expired trash,
and restore (docs/design.md §5).

Each trash run leaves a record `_gc/trash/<run_id>.json` (when it trashed) that restore
checks and the purge reads; a run's record goes once its trash is purged or restored.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.addresses import trash_origin, trash_run
from gc_assets.core.config import RepositoryConfig
from gc_assets.core.state import TRASH_PREFIX, TRASH_RUNS_PREFIX, restore_at
from gc_assets.stores.base import Store, with_version_id
from gc_assets.stores.state import StateFiles
from gc_assets.sweep import lease
from gc_assets.sweep.catalog_rows import restore_rows
from gc_assets.sweep.holds import held_frame_of, record_hold
from gc_assets.sweep.journal import SweepJournal
from gc_assets.sweep.receipts import receipts
from gc_assets.sweep.run_ids import checked_run_id

RESTORED = ("restored", "row_restored")  # a restore that receipted only these is complete


def trash_moves(candidates: DataFrame, run_id: str, keep: tuple[str, ...] = ()) -> DataFrame:
    """Where trash mode moves each candidate: `_gc_trash/<run_id>/<address>` (its listed version,
    when it has one), with the columns of `keep` (a set's repository)."""
    return candidates.select(
        *keep,
        "address",
        F.concat(F.lit(f"{TRASH_PREFIX}/{run_id}/"), F.col("address")).alias("destination"),
        "last_modified",
        *listed_version(candidates),
    )


def listed_version(frame: DataFrame) -> list[str]:
    """["version_id"] when `frame` names listed versions (a versioned bucket), else []."""
    return ["version_id"] if "version_id" in frame.columns else []


def trash_receipts(actions: DataFrame) -> DataFrame:
    """A completed move into the trash is a `trashed` receipt."""
    return actions.withColumn("action", F.when(F.col("action") == "moved", F.lit("trashed")).otherwise(F.col("action")))


def record_trash_run(store: Store, run_id: str, at: dt.datetime) -> None:
    """The record of a trash run, written before it moves anything: restore checks it, the purge reads it."""
    store.write_text(f"{TRASH_RUNS_PREFIX}{run_id}.json", json.dumps({"run_id": run_id, "trashed_at": at.isoformat()}))


def trash_runs(store: Store, inventory: DataFrame) -> dict[str, dt.datetime]:
    """{run id: when it trashed} of the trash run records the inventory lists."""
    records = [
        r["address"]
        for r in inventory.filter(F.col("address").startswith(TRASH_RUNS_PREFIX)).select("address").collect()
    ]
    return recorded_runs(store, records)


def recorded_runs(store: Store, records: list[str]) -> dict[str, dt.datetime]:
    """{run id: when it trashed} of the trash run records at `records`."""
    runs: dict[str, dt.datetime] = {}
    for key in records:
        text = store.read_text(key)
        if text:
            record = json.loads(text)
            runs[record["run_id"]] = dt.datetime.fromisoformat(record["trashed_at"])
    return runs


def expired_trash(
    inventory: DataFrame, runs: dict[str, dt.datetime], now: dt.datetime, keep: dt.timedelta
) -> DataFrame:
    """Objects under `_gc_trash/<run_id>/` of trash runs older than `keep`."""
    old = [run for run, at in runs.items() if at < now - keep]
    return inventory.filter(
        F.col("address").startswith(f"{TRASH_PREFIX}/") & trash_run(F.col("address")).isin(old)
    ).select("address", "size", "last_modified", *listed_version(inventory))


def purge(
    spark: SparkSession,
    store: Store,
    journal: SweepJournal,
    run_id: str,
    repo: RepositoryConfig,
    inventory: DataFrame,
    live: DataFrame,
    clock: Callable[[], dt.datetime],
    log: Any,
) -> Optional[DataFrame]:
    """Delete trash runs older than trash_retention_days, except entries whose original
    address is live again or held: those stay in the trash (`skipped_revived`, naming the
    run to restore) and so does their run's record. Receipts journaled; None when nothing expired."""
    runs = trash_runs(store, inventory)
    now = clock()
    keep = dt.timedelta(days=repo.trash_retention_days)
    expired = expired_trash(inventory, runs, now, keep)
    if not runs or expired.isEmpty():
        return None
    needed = live.unionByName(held_frame_of(spark, store, inventory, now, repo.hold_days))
    origin = expired.withColumn("origin", trash_origin(F.col("address")))
    kept = origin.join(needed.select(F.col("address").alias("origin")), "origin", "left_semi")
    doomed = origin.join(kept.select("address"), "address", "left_anti").drop("origin")
    actions = store.delete(spark, doomed).join(doomed.select("address", "size"), "address")
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
        "address", F.lit("skipped_revived").alias("action"), restore_note.alias("error"), "size", *listed_version(kept)
    )
    acted = with_version_id(actions.select("address", "action", "error", "size", *listed_version(actions)))
    rows = journal.write(
        receipts(acted.unionByName(with_version_id(kept_rows)), run_id, now, keep=("version_id",)), f"purge-{run_id}"
    )
    unfinished = {
        r["address"].split("/")[1] for r in rows.filter(F.col("action") != "purged").select("address").collect()
    }
    for run, at in runs.items():
        if at < now - keep and run not in unfinished:
            store.remove(f"{TRASH_RUNS_PREFIX}{run}.json")
    log.info(f"purged trash of runs older than {keep}: {sorted(run for run, at in runs.items() if at < now - keep)}")
    return rows


def restore_run(spark: SparkSession, store: Store, run_id: str) -> DataFrame:
    """Move every object a trash run put under `_gc_trash/<run_id>/` back where it was.

    Receipts name the original address: `restored`, or `failed` (e.g. `destination_exists`
    when something was written there since; it is never overwritten).
    """
    prefix = f"{TRASH_PREFIX}/{run_id}/"
    trashed = store.list(spark, prefix=prefix.rstrip("/"))
    moves = trashed.select(
        F.col("address"),
        F.expr(f"substring(address, {len(prefix) + 1})").alias("destination"),
        "last_modified",
        *listed_version(trashed),
    )
    actions = store.move(spark, moves)
    return actions.select(
        F.expr(f"substring(address, {len(prefix) + 1})").alias("address"),
        F.when(F.col("action") == "moved", F.lit("restored")).otherwise(F.col("action")).alias("action"),
        "error",
    )


@dataclass(frozen=True)
class Restore:
    """What restoring a trash run did: one receipt per object (and per catalog row), stored at `location`."""

    rows: list[Any]  # each with address, action, error
    location: str  # a path, or a URI on an object store

    @property
    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row["action"]] = counts.get(row["action"], 0) + 1
        return counts

    @property
    def failed(self) -> list[str]:
        return [row["address"] for row in self.rows if row["action"] not in RESTORED]


def restore(
    store: Store,
    repo: RepositoryConfig,
    run_id: str,
    files: StateFiles,
    session: Callable[[], SparkSession],
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
) -> Restore:
    """Put trash run `run_id`'s objects back under the repository's lease and hold them; the
    receipts go to the state dir. A run restored whole loses its record.

    RunIdError, before `session` starts Spark, when `run_id` names no trash run."""
    checked_run_id(store, run_id, TRASH_RUNS_PREFIX)
    spark = session()
    now = clock()
    held = lease.acquire(store, f"restore-{run_id}", f"restore|{repo.name}", now)
    try:
        location = restore_at(repo.name, now.date(), run_id)
        rows = files.write(spark, restore_run(spark, store, run_id), location).collect()
        record_hold(store, run_id, [r["address"] for r in rows if r["action"] == "restored"], now)
        if repo.format == "file-catalog":  # and the catalog rows the run removed
            back = [
                dict(zip(("address", "action", "error", "row_id"), r))
                for r in restore_rows(spark, repo, store, run_id, now)
            ]
            rows += back  # a row put back is needed: hold what it names, or its old soft delete takes it again
            needed = {r["address"] for r in rows if r["action"] in ("restored", "row_restored", "row_already_present")}
            record_hold(store, run_id, sorted(needed), now)
    finally:
        lease.release(store, held)
    done = Restore(rows, files.uri(location))
    if rows and set(done.counts) <= set(RESTORED):
        store.remove(f"{TRASH_RUNS_PREFIX}{run_id}.json")
    return done
