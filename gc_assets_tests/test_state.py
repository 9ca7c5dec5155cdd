"""Where gc_assets keeps its own things (gc_assets.core.state): the namespace prefixes and the state dir's layout."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from gc_assets.core import state


def test_the_products_prefixes_are_all_under_its_own_two():
    assert state.GC_OWN_PREFIXES == ("_gc/", "_gc_trash/")
    for prefix in (state.TRASH_RUNS_PREFIX, state.HOLDS_PREFIX, state.LEASE_PREFIX, state.ROWS_PREFIX):
        assert prefix.startswith(state.GC_PREFIX) and prefix.endswith("/")
    assert f"{state.TRASH_PREFIX}/".startswith(state.GC_OWN_PREFIXES[1])


def test_state_dir_layout():
    assert state.partition_at("live_files", "r", "2022-03-31") == "live_files/repo=r/date=2022-03-31"
    assert (
        state.partition_at("live_files", "r", "2022-03-31", state.TIMES_FILE)
        == "live_files/repo=r/date=2022-03-31/_gc_times.json"
    )
    day = dt.date(2022, 3, 31)
    assert state.restore_at("r", day, "run-1") == "restores/repo=r/date=2022-03-31/run_id=run-1"
    assert state.sweep_journal_at("r", day, "m") == "_sweeps/repo=r/date=2022-03-31/mark=m"
    assert state.reaches_at("team/a b", "x/y") == "_reaches/team%2Fa%20b/x%2Fy"
    assert state.reach_of(state.reaches_at("team/a b", "x/y")) == ("team/a b", "x/y")


def test_spark_path_is_an_absolute_file_url_not_percent_encoded(tmp_path):
    assert state.spark_path(tmp_path / "a b") == f"file://{tmp_path.resolve()}/a b"
    assert state.spark_path("relative").startswith(f"file://{Path.cwd().resolve()}/")
