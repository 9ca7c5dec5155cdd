"""Holds after restore, release and run-id validation (docs/design.md §5).

Every test begins from one trash sweep of a lake marked once for the module, put back in place."""

from __future__ import annotations

import json
import time

import pytest
from dagster import DagsterInstance

from gc_assets import cli
from gc_assets_tests.cli_runs import summary_of
from gc_assets_tests.marked_lakes import (  # noqa: F401 - the fixtures
    TRASHED,
    expected_of,
    mark,
    namespace_snapshot,
    saved,
    trashed,
    whole_run,
)


def _cli(lake, command, run_id):
    return cli.main([command, "--config", str(lake.config_path), "--repo", lake.lake.name, "--run-id", run_id])


def test_restored_objects_are_held_until_released(saved, trashed, capsys):
    lake = saved.restore(TRASHED)
    expected = expected_of(lake)
    run_id = trashed.outcome.summary["run_id"]
    assert trashed.outcome.summary["receipts"] == {"trashed": len(expected)}
    assert _cli(lake, "restore", run_id) == 0
    hold = json.loads((lake.namespace / "_gc" / "holds" / f"{run_id}.json").read_text())
    assert set(hold["addresses"]) == expected

    again = whole_run(lake, "trash")
    assert again.success, again.error
    assert again.summary["orphan_candidates"] == 0 and again.summary["receipts"] == {}
    assert expected <= set(namespace_snapshot(lake.namespace))

    capsys.readouterr()
    assert _cli(lake, "release", run_id) == 0
    assert summary_of(capsys.readouterr().out)["released"] == len(expected)
    released = whole_run(lake, "trash")
    assert released.summary["receipts"] == {"trashed": len(expected)}
    assert _cli(lake, "release", run_id) == 2  # the hold is gone: nothing to release


def test_holds_expire_after_hold_days(saved, trashed):
    hold_days = 0.00003  # 2.6 s
    lake = saved.restore(TRASHED, hold_days=hold_days)
    assert _cli(lake, "restore", trashed.outcome.summary["run_id"]) == 0
    time.sleep(hold_days * 86400 + 1)  # a fast mark must not reach the candidates while the hold still holds
    again = mark(lake, DagsterInstance.ephemeral())
    assert again.summary["orphan_candidates"] == len(expected_of(lake))


@pytest.mark.parametrize("run_id", ["", "..", ".", "a/b", "../x", "unknown-run"])
def test_restore_and_release_refuse_what_is_not_one_known_run(saved, trashed, run_id, capsys):
    """Each refusal leaves storage as it found it."""
    lake = saved.restore(TRASHED)
    before = namespace_snapshot(lake.namespace)
    assert _cli(lake, "restore", run_id) == 2
    assert _cli(lake, "release", run_id) == 2
    assert namespace_snapshot(lake.namespace) == before
    assert "run id" in capsys.readouterr().err
    assert trashed.outcome.summary["run_id"] in {k.split("/")[1] for k in before if k.startswith("_gc_trash/")}
