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
import uuid
from typing import Any, Iterator, Mapping, Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.config import RepositoryConfig
from gc_assets.core.names import REPO, Mode
from gc_assets.core.state import HOLDS_PREFIX, ROWS_PREFIX
from gc_assets.sources.base import SourceError
from gc_assets.sources.catalog_db import CatalogError, decode_row, encode_row
from gc_assets.sources.file_catalog import FileCatalogSource
from gc_assets.stores.base import Store
from gc_assets.sweep.holds import held_addresses
from gc_assets.sweep.journal import SweepJournal
from gc_assets.sweep.receipts import receipts

CHUNK_ROWS = 1000
ROWS_DONE = "catalog-rows"  # in the sweep journal: a finished cleanup's receipts
ROWS_CHUNKS = "catalog-rows-chunks"  # beside: each chunk's, kept as it commits
ROW_RECEIPT_SCHEMA = "address string, action string, error string, row_id long"
NAMED_NOTE = "a row present in the catalog names it"
REVIVED_NOTE = "soft delete reverted or renewed since the read: the row stays"


def row_cutoffs(retained_commits: DataFrame, repos: Mapping[str, RepositoryConfig]) -> dict[str, dt.datetime]:
    """The row cutoff of each catalog of `repos`: that of the state its mark read (its rows of
    `retained_commits`, with `repo`: one run, one cutoff), every catalog's read in one Spark job.
    A catalog with no retained state has none, and its cleanup is refused."""
    states: dict[str, list[str]] = {}
    wanted = retained_commits.filter(F.col("retained") & F.col(REPO).isin(list(repos)))
    for row in wanted.select(REPO, "commit_id").collect():
        states.setdefault(row[REPO], []).append(row["commit_id"])
    return {name: min(map(FileCatalogSource(repos[name]).row_cutoff_of, commits)) for name, commits in states.items()}


def row_cutoff(cutoffs: Mapping[str, dt.datetime], name: str) -> dt.datetime:
    if name not in cutoffs:
        raise SourceError(f"repository {name!r}: no retained state to take the row cutoff from")
    return cutoffs[name]


def past_cutoff(
    spark: SparkSession, source: FileCatalogSource, cutoff: dt.datetime, store: Store, now: dt.datetime
) -> DataFrame:
    """(id, address) of the rows catalog cleanup removes: those of the state whose row cutoff this
    is (the mark's, at its snapshot, in the run that marked; else a new state of the catalog).

    A row naming a held address stays: `gc-assets restore` put it back because it is needed,
    and its old soft-delete time must not take it again before the hold is released."""
    rows = source.rows_of(spark, source.read_with_row_cutoff(spark, cutoff))
    past = rows.filter(F.col("to_delete") < F.lit(cutoff)).select("id", "address")
    held = held_addresses(store, sorted(store.keys(HOLDS_PREFIX)), now, source.repo.hold_days)
    if not held:
        return past
    return past.join(spark.createDataFrame([(a,) for a in sorted(held)], "address string"), "address", "left_anti")


def _with_row_ids(frame: DataFrame, run_id: str, at: dt.datetime) -> DataFrame:
    """Receipt rows (receipts' own columns) plus the row's id."""
    return receipts(frame, run_id, at, keep=("row_id",))


def sweep_rows(
    spark: SparkSession,
    repo: RepositoryConfig,
    store: Store,
    mode: Mode,
    run_id: str,
    cutoff: dt.datetime,
    journal: Optional[SweepJournal],
    now: dt.datetime,
) -> DataFrame:
    """Row receipts of catalog cleanup in `mode`; dry run deletes nothing.

    `journal` (the sweep's journal) keeps each chunk's receipts as soon as its
    transaction commits and a finished cleanup's receipts, so a retry after an interruption
    reports every row the earlier try removed, and the rerun of a finished sweep returns them
    and deletes nothing more."""
    done = journal.read(ROWS_DONE) if journal is not None else None
    if done is not None:
        return done
    source = FileCatalogSource(repo)
    past = past_cutoff(spark, source, cutoff, store, now)
    if mode == Mode.DRY_RUN:
        dry = past.select(
            "address",
            F.lit("would_delete_row").alias("action"),
            F.lit(None).cast("string").alias("error"),
            F.col("id").alias("row_id"),
        )
        return _with_row_ids(dry, run_id, now)
    kinds, rows = source.kinds(), []
    attempt = uuid.uuid4().hex[:8]  # a retried step keeps its run id: its chunks must not overwrite the first try's
    for number, chunk in enumerate(_chunks(past), start=1):
        name = f"{number:06d}-{attempt}"

        def keep(deleted: list[dict[str, Any]], name: str = name, chunk: dict[int, str] = chunk) -> None:
            if mode == Mode.TRASH and deleted:
                lines = [
                    encode_row({"address": chunk[int(row[repo.file_catalog.id])], "row": encode_row(row)})
                    for row in deleted
                ]  # type: ignore[union-attr]
                store.write_text(f"{ROWS_PREFIX}{run_id}/{name}.jsonl", "\n".join(lines) + "\n")

        try:
            deleted = source.db.delete_rows(list(chunk), kinds, cutoff, keep)
        except CatalogError as exc:
            raise RuntimeError(f"catalog cleanup stopped at chunk {number}: {exc}") from None
        gone = {int(row[repo.file_catalog.id]) for row in deleted}  # type: ignore[union-attr]
        action = "row_trashed" if mode == Mode.TRASH else "row_deleted"
        handled = [
            (address, action if i in gone else "row_skipped_revived", None if i in gone else REVIVED_NOTE, i)
            for i, address in chunk.items()
        ]
        if journal is not None:  # durable before the next chunk is deleted
            journal.keep_lines(f"{ROWS_CHUNKS}/{name}.jsonl", [json.dumps(receipt) for receipt in handled])
        rows += handled
    if journal is not None:  # with the receipts of an interrupted earlier try, whose rows are gone from the table now
        rows = [tuple(json.loads(line)) for line in journal.kept_lines(ROWS_CHUNKS)]
    frame = _with_row_ids(spark.createDataFrame(rows, ROW_RECEIPT_SCHEMA), run_id, now)
    return frame if journal is None else journal.write(frame, ROWS_DONE)


def _chunks(past: DataFrame) -> Iterator[dict[int, str]]:
    """{id: address} of CHUNK_ROWS rows at a time, streamed from the executors."""
    chunk: dict[int, str] = {}
    for row in past.toLocalIterator():
        chunk[int(row["id"])] = row["address"]
        if len(chunk) == CHUNK_ROWS:
            yield chunk
            chunk = {}
    if chunk:
        yield chunk


def still_named(spark: SparkSession, repo: RepositoryConfig, candidates: DataFrame) -> DataFrame:
    """`address` of the candidates a row present in the table now names, whatever its soft delete
    (rows that catalog cleanup kept, revived or new since the mark's snapshot, read at a new one):
    these objects are not collected."""
    rows = FileCatalogSource(repo).rows(spark).select("address").distinct()
    return candidates.select("address").join(rows, "address", "left_semi")


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
