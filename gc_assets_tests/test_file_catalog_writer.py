"""format: file-catalog while a writer keeps changing the catalog (docs/design.md §6.5): every
step of a run reads one database snapshot (PostgreSQL's exported to every executor, SQLite's
copied in one read transaction), so the run finishes, agrees with the brute-force oracle
evaluated at that snapshot, and touches no row and no object the writer added.

The writer adds a row (naming an object it has just written) and soft-deletes an older row,
backdated past the row cutoff, ten times a second for the whole run: a reader that saw any
state but the snapshot would judge other rows and other objects.

Each run is gc_job, as the UI launches it: its one step reads the catalog's state before it
lists the objects, so every object a row of the snapshot names was written before the
listing began.
"""

from __future__ import annotations

import datetime as dt
from contextlib import ExitStack
from typing import Any

import pyarrow.parquet as pq
import pytest

from gc_assets.core.config import load_config
from gc_assets.core.time import AS_OF_TAG, partition_date_of
from gc_assets.defs.assets.collect import mode_run_config
from gc_assets.defs.build import build_definitions
from gc_assets.defs.partitions import REPOSITORIES, partition_key
from gc_assets.sources.file_catalog import parse_commit_id
from gc_assets_tests.file_catalogs import OBJECT_CUTOFF, CatalogWriter, oracle
from gc_assets_tests.postgres_server import postgres  # noqa: F401 - the fixture
from gc_assets_tests.sweep_runs import outcome_of
from gc_assets_tests.test_file_catalog import Lake


def _collected(lake: Lake, mode: str) -> dict[str, str]:
    """gc_job in `mode` at a new as-of; the stored asset partitions, by name."""
    lake.as_of = dt.datetime.now(dt.timezone.utc)
    jobs = build_definitions(load_config(lake.config), str(lake.config))
    lake.instance.add_dynamic_partitions(REPOSITORIES.name, ["iox"])
    run = {
        "instance": lake.instance,
        "partition_key": partition_key(partition_date_of(lake.as_of), "iox"),
        "tags": {AS_OF_TAG: lake.as_of.isoformat()},
        "raise_on_error": False,
    }
    result = jobs.resolve_job_def("gc_job").execute_in_process(run_config=mode_run_config(mode), **run)
    outcome = outcome_of(result, lake.instance, "iox", partition_date_of(lake.as_of), lake.as_of, mode)
    assert outcome.success, outcome.error
    return outcome.summary["outputs"]


def _expected(lake: Lake, writer: CatalogWriter, outputs: dict[str, str], listing: dict[str, dt.datetime]) -> Any:
    """The oracle at the mark's snapshot: the initial rows and every step of the writer its largest id holds."""
    (state,) = pq.read_table(outputs["retained_commits"]).to_pylist()
    max_id = parse_commit_id(state["commit_id"])[1]
    assert max_id is not None and max_id >= CatalogWriter.FIRST_ID  # the snapshot holds some of the writer's rows
    rows = writer.rows_seen_at(lake.catalog.rows, max_id)
    row_cutoff = state["threshold"].replace(tzinfo=dt.timezone.utc)
    return oracle(rows, listing, row_cutoff, lake.as_of - OBJECT_CUTOFF)


def _addresses(outputs: dict[str, str], name: str) -> set[str]:
    return {r["address"] for r in pq.read_table(outputs[name]).to_pylist()}


def _by_action(outputs: dict[str, str]) -> dict[str, set]:
    found: dict[str, set] = {}
    for receipt in pq.read_table(outputs["deletion_receipts"]).to_pylist():
        found.setdefault(receipt["action"], set()).add(receipt["row_id"] or receipt["address"])
    return found


@pytest.mark.parametrize(
    ("database", "modes"),
    [("sqlite", ("dry_run", "trash")), ("postgres", ("delete",))],
    ids=["sqlite-dry_run-trash", "postgres-delete"],
)
def test_a_catalog_written_all_along_is_collected_at_one_snapshot(database, modes, spark, tmp_path, request):
    with ExitStack() as stack:
        writers: list[CatalogWriter] = []

        def start_writing(lake: Lake) -> None:
            writers.append(stack.enter_context(CatalogWriter(lake.url, lake.put, lake.catalog, lake.pg)))

        lake = Lake(tmp_path, database, "local", request, seed=51, before_objects=start_writing)
        (writer,) = writers
        for mode in modes:
            writer.check()  # writing since before the objects: its first objects are past the object cutoff
            listing = lake.listing()
            outputs = _collected(lake, mode)
            expected = _expected(lake, writer, outputs, listing)
            assert expected.candidates and expected.removed_rows
            assert _addresses(outputs, "live_files") == expected.live
            assert _addresses(outputs, "orphan_candidates") == expected.candidates
            action, row_action = {
                "dry_run": ("would_delete", "would_delete_row"),
                "trash": ("trashed", "row_trashed"),
                "delete": ("deleted", "row_deleted"),
            }[mode]
            assert _by_action(outputs) == {action: expected.candidates, row_action: expected.removed_rows}
    assert writer.error is None, writer.error
    added_ids, added_keys = writer.added()
    remaining_rows, remaining = set(lake.rows()), set(lake.listing())
    assert added_ids <= remaining_rows and added_keys <= remaining  # nothing the writer added is touched
    assert not expected.removed_rows & remaining_rows and not expected.candidates & remaining
