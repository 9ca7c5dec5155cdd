"""Catalog cleanup of a file catalog (docs/design.md §6.5): rows soft-deleted before the row
cutoff are deleted from the table, chunk by chunk, and receipted beside the objects.

Each chunk is one transaction, `DELETE ... WHERE id IN (...) AND to_delete < cutoff`, so a
row whose soft delete was reverted (or renewed) since it was read stays. In trash mode the
deleted rows are written to the namespace's `_gc/catalog-rows/<run_id>/` before the
transaction commits, and `gc-assets restore` inserts them back. After the rows, every
object candidate that a row still present names is kept (`skipped_revived`): objects
are collected only when no remaining row names them.

Receipt actions of rows (`row_id` names the row; `address` its key):
`would_delete_row` (dry run), `row_deleted` (delete), `row_trashed` (trash: kept in the
journal), `row_skipped_revived` (its soft delete changed since the read: not deleted),
`row_restored` / `row_already_present` (restore).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from dataclasses import dataclass
from functools import partial, reduce
from typing import Any, Callable, Mapping, Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.config import RepositoryConfig
from gc_assets.core.names import REPO, Mode
from gc_assets.core.spark import arrow_rows, local_frame, one_of, task_error
from gc_assets.core.state import HOLDS_PREFIX, ROWS_PREFIX
from gc_assets.mark.connectors import together_or_each
from gc_assets.sources.base import SourceError
from gc_assets.sources.catalog_db import decode_row, encode_row
from gc_assets.sources.file_catalog import CatalogRead, FileCatalogSource, rows_of_many, shared_frames
from gc_assets.stores.base import Store
from gc_assets.sweep.holds import held_addresses
from gc_assets.sweep.journal import SweepJournal
from gc_assets.sweep.receipts import receipts

CHUNK_ROWS = 1000
ROWS_DONE = "catalog-rows"  # in the sweep journal: a finished cleanup's receipts
ROWS_CHUNKS = "catalog-rows-chunks"  # beside: each chunk's, kept as it commits
NAMED_NOTE = "a row present in the catalog names it"
REVIVED_NOTE = "soft delete reverted or renewed since the read: the row stays"
ROWS_PER_FETCH = 100_000  # rows past their cutoffs the driver takes in per Spark job
ROW_RECEIPTS = "address string, action string, error string, run_id string, at timestamp, size long, row_id long"


@dataclass(frozen=True)
class RowCleanup:
    """One catalog's cleanup: its repository, its store (holds; a trash run's rows), its mode,
    its row cutoff and its sweep journal (None: nothing kept)."""

    repo: RepositoryConfig
    store: Store
    mode: Mode
    cutoff: dt.datetime
    journal: Optional[SweepJournal]


def cleanups(
    retained_commits: DataFrame,
    repos: Mapping[str, RepositoryConfig],
    stores: Mapping[str, Store],
    modes: Mapping[str, Mode],
    journal_of: Callable[[str], Optional[SweepJournal]],
) -> tuple[dict[str, RowCleanup], dict[str, str]]:
    """Each catalog's cleanup of `repos` at the row cutoff of the state its mark read (its rows of
    `retained_commits`, with `repo`: one run, one cutoff), every catalog's cutoff read in one Spark
    job; and why each catalog with no retained state, so no cutoff, is refused."""
    states: dict[str, list[str]] = {}
    wanted = retained_commits.filter(F.col("retained") & one_of(REPO, list(repos)))
    for row in wanted.select(REPO, "commit_id").collect():
        states.setdefault(row[REPO], []).append(row["commit_id"])
    found, refused = {}, {}
    for name, repo in repos.items():
        if name not in states:
            refused[name] = f"catalog cleanup: repository {name!r}: no retained state to take the row cutoff from"
            continue
        cutoff = min(map(FileCatalogSource(repo).row_cutoff_of, states[name]))
        found[name] = RowCleanup(repo, stores[name], modes[name], cutoff, journal_of(name))
    return found, refused


def past_cutoff(
    spark: SparkSession, cleanups: Mapping[str, RowCleanup], reads: Mapping[str, DataFrame], now: dt.datetime
) -> DataFrame:
    """(repo, id, address) of the rows each catalog's cleanup removes: those soft-deleted before
    its cutoff, in the state whose rows (rows_of_many's) `reads` holds (the mark's, at its
    snapshot, in the run that marked; else a new state of the catalog), one filter of each frame
    the catalogs share.

    A row naming a held address stays: `gc-assets restore` put it back because it is needed,
    and its old soft-delete time must not take it again before the hold is released."""
    cutoff = F.create_map(*[F.lit(x) for name in reads for x in (name, cleanups[name].cutoff)])[F.col(REPO)]
    frames = [local_frame(spark, [], f"{REPO} string, id long, address string")]
    for rows, names in shared_frames(reads):
        frames.append(rows.filter(one_of(REPO, names) & (F.col("to_delete") < cutoff)).select(REPO, "id", "address"))
    past = reduce(DataFrame.unionByName, frames)
    held = [
        (name, address)
        for name in reads
        for store in [cleanups[name].store]
        for address in held_addresses(store, sorted(store.keys(HOLDS_PREFIX)), now, cleanups[name].repo.hold_days)
    ]
    if not held:
        return past
    return past.join(local_frame(spark, held, f"{REPO} string, address string"), [REPO, "address"], "left_anti")


def sweep_rows_together(
    spark: SparkSession, cleanups: Mapping[str, RowCleanup], run_id: str, now: dt.datetime
) -> tuple[DataFrame, dict[str, Exception]]:
    """Row receipts (repo, receipt columns, row_id) of each catalog's cleanup in its mode, and why
    each one that stopped did; dry run deletes nothing.

    The catalogs' rows are read together (rows_of_many) and those past their cutoffs come to the
    driver in Spark jobs of ROWS_PER_FETCH rows, whatever catalogs they belong to; each catalog's
    chunks are its own transactions. Its journal keeps each chunk's receipts as soon as its
    transaction commits, and a finished cleanup's receipts (without a Spark job): a retry after an
    interruption reports every row the earlier try removed, and the rerun of a finished sweep
    returns them and deletes nothing more."""
    finished, stopped, reads = [], {}, {}
    for name, cleanup in cleanups.items():
        done = cleanup.journal.read(ROWS_DONE) if cleanup.journal is not None else None
        if done is not None:
            finished.append(done.select(F.lit(name).alias(REPO), *done.columns))
            continue
        source = FileCatalogSource(cleanup.repo)
        try:
            reads[name] = (source, source.read_with_row_cutoff(spark, cleanup.cutoff))
        except SourceError as exc:
            stopped[name] = exc
    rows = _rows_together(spark, reads, stopped)
    past = past_cutoff(spark, cleanups, rows, now)
    dry = [name for name in rows if cleanups[name].mode == Mode.DRY_RUN]
    would = past.filter(one_of(REPO, dry)).select(
        REPO,
        "address",
        F.lit("would_delete_row").alias("action"),
        F.lit(None).cast("string").alias("error"),
        F.col("id").alias("row_id"),
    )
    acting = {name: cleanups[name] for name in rows if name not in dry}
    expected = sum(reads[name][1].past_row_cutoff for name in acting)
    sources = {name: reads[name][0] for name in acting}
    cleaned = (
        _cleaned(acting, sources, past.filter(one_of(REPO, list(acting))), expected, run_id, now, stopped)
        if acting
        else []
    )
    swept = receipts(would, run_id, now, keep=("row_id", REPO)).unionByName(
        local_frame(spark, cleaned, f"{REPO} string, {ROW_RECEIPTS}")
    )
    return reduce(DataFrame.unionByName, finished, swept), stopped


def _rows_together(
    spark: SparkSession, reads: Mapping[str, tuple[FileCatalogSource, CatalogRead]], stopped: dict[str, Exception]
) -> dict[str, DataFrame]:
    """The rows of each read (rows_of_many, each alone when the read of all fails); one that
    cannot be read is `stopped`."""
    rows = {}
    for name, found in together_or_each(partial(rows_of_many, spark), reads).items():
        if isinstance(found, Exception):
            stopped[name] = found
        else:
            rows[name] = found
    return rows


def _cleaned(
    cleanups: Mapping[str, RowCleanup],
    sources: Mapping[str, FileCatalogSource],
    past: DataFrame,
    expected: int,
    run_id: str,
    now: dt.datetime,
    stopped: dict[str, Exception],
) -> list[tuple[Any, ...]]:
    """(repo, ROW_RECEIPTS) of every catalog of `cleanups` that was not `stopped`: the rows of
    `past` (about `expected`) deleted CHUNK_ROWS of a catalog at a time, each chunk journaled."""
    attempt = uuid.uuid4().hex[:8]  # a retried step keeps its run id: its chunks must not overwrite the first try's
    chunks: dict[str, dict[int, str]] = {}
    numbers: dict[str, int] = {}
    handled: dict[str, list[tuple[Any, ...]]] = {name: [] for name in cleanups}

    def delete(name: str) -> None:
        chunk, number = chunks.pop(name), numbers.get(name, 0) + 1
        numbers[name] = number
        try:
            handled[name] += _deleted(cleanups[name], sources[name], chunk, f"{number:06d}-{attempt}", run_id)
        except Exception as exc:  # noqa: BLE001 - this catalog alone
            stopped[name] = RuntimeError(f"catalog cleanup stopped at chunk {number}: {task_error(exc)}")

    fetches = max(1, math.ceil(expected / ROWS_PER_FETCH))
    for row in past.coalesce(fetches).toLocalIterator():
        name = row[REPO]
        if name in stopped:
            continue
        chunk = chunks.setdefault(name, {})
        chunk[int(row["id"])] = row["address"]
        if len(chunk) == CHUNK_ROWS:
            delete(name)
    for name in sorted(chunks):
        if name not in stopped:
            delete(name)
    cleaned = []
    for name, cleanup in cleanups.items():
        if name in stopped:
            continue
        rows = handled[name]
        if cleanup.journal is not None:  # with the receipts of an interrupted earlier try, whose rows are gone now
            rows = [tuple(json.loads(line)) for line in cleanup.journal.kept_lines(ROWS_CHUNKS)]
        told = [(address, action, error, run_id, now, None, row_id) for address, action, error, row_id in rows]
        if cleanup.journal is not None:
            cleanup.journal.keep(ROWS_DONE, arrow_rows(told, ROW_RECEIPTS))
        cleaned += [(name, *receipt) for receipt in told]
    return cleaned


def _deleted(
    cleanup: RowCleanup, source: FileCatalogSource, chunk: dict[int, str], name: str, run_id: str
) -> list[tuple[Any, ...]]:
    """(address, action, error, row id) of each row of `chunk` that one transaction deleted or
    left (its soft delete changed since the read), journaled before the next chunk is deleted.
    `source` is the catalog's connector for all its chunks (its column kinds checked once)."""
    mode, id_column = cleanup.mode, cleanup.repo.file_catalog.id  # type: ignore[union-attr]

    def keep(deleted: list[dict[str, Any]]) -> None:
        if mode == Mode.TRASH and deleted:
            lines = [encode_row({"address": chunk[int(row[id_column])], "row": encode_row(row)}) for row in deleted]
            cleanup.store.write_text(f"{ROWS_PREFIX}{run_id}/{name}.jsonl", "\n".join(lines) + "\n")

    deleted = source.db.delete_rows(list(chunk), source.kinds(), cleanup.cutoff, keep)
    gone = {int(row[id_column]) for row in deleted}
    action = "row_trashed" if mode == Mode.TRASH else "row_deleted"
    handled = [
        (address, action if i in gone else "row_skipped_revived", None if i in gone else REVIVED_NOTE, i)
        for i, address in chunk.items()
    ]
    if cleanup.journal is not None:
        cleanup.journal.keep_lines(f"{ROWS_CHUNKS}/{name}.jsonl", [json.dumps(receipt) for receipt in handled])
    return handled


def still_named(
    spark: SparkSession, repos: Mapping[str, RepositoryConfig], candidates: DataFrame
) -> tuple[DataFrame, dict[str, Exception]]:
    """(repo, address) of the candidates a row present in its catalog now names, whatever its soft
    delete (rows that catalog cleanup kept, revived or new since the mark's snapshot), every
    catalog of `repos` read at a new snapshot, together: these objects are not collected. And why
    each catalog that cannot be read now is refused."""
    stopped: dict[str, Exception] = {}
    reads = {}
    for name, repo in repos.items():
        source = FileCatalogSource(repo)  # a new connector: a new snapshot
        try:
            reads[name] = (source, source.read(spark))
        except SourceError as exc:
            stopped[name] = exc
    frames = [local_frame(spark, [], f"{REPO} string, address string")]
    for rows, names in shared_frames(_rows_together(spark, reads, stopped)):
        frames.append(rows.filter(one_of(REPO, names)).select(REPO, "address").distinct())
    named = reduce(DataFrame.unionByName, frames)
    return candidates.select(REPO, "address").join(named, [REPO, "address"], "left_semi"), stopped


def restore_rows(
    spark: SparkSession, repo: RepositoryConfig, store: Store, run_id: str, now: dt.datetime
) -> list[tuple[str, str, Optional[str], int]]:
    """Insert back the rows a trash run removed: (address, action, error, row id) each,
    `row_restored`, or `row_already_present` when a row with its id is in the table."""
    source = FileCatalogSource(repo)
    entries = []
    for key in sorted(store.keys(f"{ROWS_PREFIX}{run_id}/")):
        text = store.read_text(key) or ""
        entries += [decode_row(line) for line in text.splitlines() if line.strip()]
    if not entries:
        return []
    id_column = repo.file_catalog.id  # type: ignore[union-attr]
    rows = [decode_row(entry["row"]) for entry in entries]
    inserted, _ = source.db.insert_rows(rows)
    back = set(inserted)
    return [
        (
            entry["address"],
            "row_restored" if int(row[id_column]) in back else "row_already_present",
            None,
            int(row[id_column]),
        )
        for entry, row in zip(entries, rows)
    ]
