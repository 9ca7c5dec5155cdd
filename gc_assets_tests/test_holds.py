"""Holds after restore, release and run-id validation (docs/design.md §5)."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest
from dagster import DagsterInstance

from gc_assets import cli
from gc_assets.runner import run_partition
from gc_assets_tests.lakes import GC_DATE, lake_on_disk
from gc_assets_tests.test_sweep_safety import _expected, _snapshot

UTC = dt.timezone.utc


def _run(lake, mode):
    return run_partition(
        str(lake.config_path), lake.lake.name, GC_DATE, mode=mode, instance=DagsterInstance.ephemeral()
    )


def _cli(lake, command, run_id):
    return cli.main([command, "--config", str(lake.config_path), "--repo", lake.lake.name, "--run-id", run_id])


def test_restored_objects_are_held_until_released(tmp_path, spark, capsys):
    lake = lake_on_disk(tmp_path)
    expected = _expected(lake)
    trashed = _run(lake, "trash")
    assert trashed.summary["receipts"] == {"trashed": len(expected)}
    assert _cli(lake, "restore", trashed.summary["run_id"]) == 0
    hold = json.loads((lake.namespace / "_gc" / "holds" / f"{trashed.summary['run_id']}.json").read_text())
    assert set(hold["addresses"]) == expected

    again = _run(lake, "trash")
    assert again.success, again.error
    assert again.summary["orphan_candidates"] == 0 and again.summary["receipts"] == {}
    assert expected <= set(_snapshot(lake.namespace))

    capsys.readouterr()
    assert _cli(lake, "release", trashed.summary["run_id"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["released"] == len(expected)
    released = _run(lake, "trash")
    assert released.summary["receipts"] == {"trashed": len(expected)}
    assert _cli(lake, "release", trashed.summary["run_id"]) == 2  # the hold is gone: nothing to release


def test_holds_expire_after_hold_days(tmp_path, spark):
    hold_days = 0.0001  # 8.64 s
    lake = lake_on_disk(tmp_path, hold_days=hold_days)
    trashed = _run(lake, "trash")
    assert _cli(lake, "restore", trashed.summary["run_id"]) == 0
    time.sleep(hold_days * 86400 + 1)  # a fast run must not reach the candidates while the hold still holds
    again = _run(lake, "dry_run")
    assert again.summary["orphan_candidates"] == len(_expected(lake))


@pytest.fixture(scope="module")
def trashed_lake(tmp_path_factory, spark):
    """One lake after a trash run, shared by the refusals below: each asserts it left storage as it found it."""
    lake = lake_on_disk(tmp_path_factory.mktemp("trashed"))
    return lake, _run(lake, "trash")


@pytest.mark.parametrize("run_id", ["", "..", ".", "a/b", "../x", "unknown-run"])
def test_restore_and_release_refuse_what_is_not_one_known_run(trashed_lake, run_id, capsys):
    lake, trashed = trashed_lake
    before = _snapshot(lake.namespace)
    assert _cli(lake, "restore", run_id) == 2
    assert _cli(lake, "release", run_id) == 2
    assert _snapshot(lake.namespace) == before
    assert "run id" in capsys.readouterr().err
    assert trashed.summary["run_id"] in {k.split("/")[1] for k in before if k.startswith("_gc_trash/")}
