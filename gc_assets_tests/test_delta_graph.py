"""Delta tables through the whole graph: a real delete leaves every version inside the
window readable by delta-rs, bad logs stop the run before anything is touched, and
the `gc-assets` command (run in this process) exits cleanly on a Delta repository."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance
from deltalake import DeltaTable, QueryBuilder

from gc_assets.runner import run_partition
from gc_assets_tests import delta_tables
from gc_assets_tests.cli_runs import run_cli, summary_of
from gc_assets_tests.lakes import write_config

WINDOW_DAYS = 5  # shorter than the tables' default 7 days, so some removals expire


def _config(tmp_path: Path, table: delta_tables.BuiltTable, **options) -> Path:
    repo = {
        "name": table.name.replace("_", "-"),
        "format": "delta",
        "storage_namespace": table.uri,
        "rules": {"default_retention_days": WINDOW_DAYS},
        "allow_unsafe_retention": True,
        "max_delete_fraction": 0.9,
        **options,
    }
    return write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")


def _rows(path: Path, version: int) -> list[tuple]:
    """Every row of `version` as read by delta-rs: fails if any file it needs is gone.

    Selects the rows themselves, since `count(*)` is answered from log statistics
    without opening a single data file."""
    result = QueryBuilder().register("t", DeltaTable(path, version=version)).execute("select * from t")
    return sorted((tuple(row.values()) for row in pa.table(result.read_all()).to_pylist()), key=repr)


def test_delete_removes_exactly_vacuums_files_and_retained_versions_stay_readable(tmp_path, spark):
    now = delta_tables.now_utc()
    table = delta_tables.awkward_partitions(tmp_path / "lake", now)
    window = dt.timedelta(days=WINDOW_DAYS)
    expected = delta_tables.vacuum_candidates(table, window)
    history = DeltaTable(table.path).history()
    threshold_ms = (now - window).timestamp() * 1000
    inside = [h["version"] for h in history if h["timestamp"] > threshold_ms]
    state_at_cutoff = max(h["version"] for h in history if h["timestamp"] <= threshold_ms)
    rows_before = {v: _rows(table.path, v) for v in inside + [state_at_cutoff]}
    before = table.files()
    assert expected and inside and state_at_cutoff > 0

    config = _config(tmp_path, table)
    outcome = run_partition(
        str(config), "awkward-partitions", now.date(), mode="delete", instance=DagsterInstance.ephemeral()
    )
    assert outcome.success, outcome.error
    assert outcome.summary["receipts"] == {"deleted": len(expected)}
    assert table.files() == before - expected
    receipts = pq.read_table(outcome.summary["outputs"]["deletion_receipts"]).to_pylist()
    assert {r["address"] for r in receipts} == expected
    # delta-rs names expired tombstones without checking storage, so compare with what is left on disk.
    assert not delta_tables.vacuum_candidates(table, window) & table.files()

    # delta-rs still reads the latest version and every version inside the window, unchanged.
    assert {v: _rows(table.path, v) for v in rows_before} == rows_before
    # The deletion was real: the oldest version, whose files were all collected, cannot be read any more.
    with pytest.raises(Exception, match=r"Object at location \S+ not found"):  # delta-rs raises a bare Exception
        _rows(table.path, 0)


def test_a_bad_log_fails_the_partition_and_deletes_nothing(tmp_path, spark):
    table = delta_tables.deletes_and_updates(tmp_path / "lake", delta_tables.now_utc())
    log_file = table.path / "_delta_log" / "00000000000000000003.json"
    log_file.write_text(log_file.read_text() + "{not json\n")
    before = {p: os.stat(table.path / p).st_mtime_ns for p in table.files()}
    config = _config(tmp_path, table, name="bad-log")
    outcome = run_partition(
        str(config), "bad-log", delta_tables.now_utc().date(), mode="delete", instance=DagsterInstance.ephemeral()
    )
    assert not outcome.success
    lines = len(log_file.read_text().splitlines())
    assert f"00000000000000000003.json line {lines}: not a valid Delta action" in (outcome.error or "")
    assert "deletion_receipts" not in outcome.summary["outputs"]
    assert {p: os.stat(table.path / p).st_mtime_ns for p in table.files()} == before


def test_cli_run_json_on_a_delta_repository_exits_cleanly(tmp_path, spark, capfd, monkeypatch):
    table = delta_tables.merges(tmp_path / "lake", delta_tables.now_utc())
    expected = delta_tables.vacuum_candidates(table, dt.timedelta(days=WINDOW_DAYS))
    config = _config(tmp_path, table)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)  # an ephemeral instance
    finished = run_cli(capfd, "run", "--config", str(config), "--repo", "merges", "--json")
    assert finished.returncode == 0, finished.stderr[-3000:]
    summary = summary_of(finished.stdout)
    assert summary["repo"] == "merges" and summary["mode"] == "dry_run"
    assert summary["orphan_candidates"] == len(expected) > 0
    assert summary["receipts"] == {"would_delete": len(expected)}
    assert set(summary["checks"].values()) == {"passed"}
