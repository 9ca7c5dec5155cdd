"""Sensors and the daily schedule, evaluated on a real (SQLite) Dagster instance.

No Spark: the sensors read fingerprints, the schedule only builds run requests.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path

import pytest
from dagster import (
    AssetMaterialization,
    RunRequest,
    build_schedule_context,
    build_sensor_context,
    instance_for_test,
)
from hypothesis import given
from hypothesis import strategies as st

from gc_assets.core.config import load_config
from gc_assets.core.time import AS_OF_TAG, end_of_day, parse_timestamp
from gc_assets.defs import automation
from gc_assets.defs.automation import (
    MAX_MARKS_PER_TICK,
    mark_request,
    plan_registry,
    read_cursor,
    scan_commits,
)
from gc_assets.defs.build import build_definitions
from gc_assets.defs.partitions import REPOSITORIES
from gc_assets.demo.lakegen import write_lake
from gc_assets.sources import SourceError
from gc_assets.sources.lakefs_export import LakeFSExportSource
from gc_assets_tests.lakes import LakeOnDisk, lake_on_disk, write_config

REPOS = ("alpha", "beta", "gamma")


@pytest.fixture
def instance():
    with instance_for_test() as real_instance:
        yield real_instance


@pytest.fixture
def lakes(tmp_path: Path) -> dict[str, LakeOnDisk]:
    """Three small lakeFS repositories in one gc.yaml; beta is configured to delete."""
    built = {name: lake_on_disk(tmp_path / name, name=name, churn=3, seed=i) for i, name in enumerate(REPOS)}
    entries = []
    for name, lake in built.items():
        entry = load_config(lake.config_path).repository(name).model_dump(mode="json", exclude_none=True)
        entries.append({**entry, "mode": "delete" if name == "beta" else "dry_run"})
    write_config(tmp_path / "gc.yaml", entries, tmp_path / "state")
    return built


@pytest.fixture
def defs(lakes, tmp_path):
    path = str(tmp_path / "gc.yaml")
    return build_definitions(load_config(path), path)


def _tick(defs, instance, cursor=None, name="new_commits"):
    """One evaluation as the daemon does it: run requests are resolved against the job's partitions."""
    context = build_sensor_context(
        instance=instance, instance_ref=instance.get_ref(), cursor=cursor, repository_def=defs.get_repository_def()
    )
    return defs.get_sensor_def(name).evaluate_tick(context)


def _new_commit(lake: LakeOnDisk) -> str:
    commit_id = lake.lake.commit(
        "main", dt.datetime(2022, 3, 30, 12, tzinfo=dt.timezone.utc), put=["tables/new/part-0"]
    )
    write_lake(lake.lake, lake.namespace)
    return commit_id


def _covered(request: RunRequest) -> list[str]:
    """The repositories a fleet run request covers."""
    return request.run_config["ops"]["collect_fleet"]["config"]["repositories"]


def test_first_tick_requests_one_mark_run_covering_every_repository(defs, instance):
    result = _tick(defs, instance)
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    (request,) = result.run_requests
    assert _covered(request) == sorted(REPOS)
    assert request.run_config["ops"]["collect_fleet"]["config"]["mark_only"] is True
    assert request.partition_key == today
    cursor = json.loads(result.cursor)
    assert (
        request.run_key
        == mark_request({repo: cursor[repo] for repo in REPOS}, dt.datetime.now(dt.timezone.utc)).run_key
    )
    assert defs.get_sensor_def("new_commits").job_name == "fleet_job"


def test_cursor_round_trip_and_exactly_one_request_for_a_new_commit(defs, instance, lakes):
    first = _tick(defs, instance)
    unchanged = _tick(defs, instance, cursor=first.cursor)
    assert not unchanged.run_requests
    assert unchanged.skip_message == "no repository changed"
    assert json.loads(unchanged.cursor) == json.loads(first.cursor)

    _new_commit(lakes["beta"])
    changed = _tick(defs, instance, cursor=unchanged.cursor)
    assert [_covered(r) for r in changed.run_requests] == [["beta"]]
    before, after = json.loads(unchanged.cursor), json.loads(changed.cursor)
    assert after["beta"] != before["beta"]
    assert {k: v for k, v in after.items() if k != "beta"} == {k: v for k, v in before.items() if k != "beta"}
    # The same state again asks for nothing; the run key of the request is stable, so Dagster deduplicates.
    assert not _tick(defs, instance, cursor=changed.cursor).run_requests
    assert _tick(defs, instance, cursor=unchanged.cursor).run_requests[0].run_key == changed.run_requests[0].run_key


def test_a_broken_repository_does_not_block_the_others(defs, instance, lakes):
    first = _tick(defs, instance)
    export = lakes["alpha"].namespace / "_lakefs" / "export"
    hidden = export.with_name("export.hidden")
    shutil.move(export, hidden)
    _new_commit(lakes["gamma"])
    # alpha's export is gone; gamma changed; beta did not.
    result = _tick(defs, instance, cursor=first.cursor)
    assert [_covered(r) for r in result.run_requests] == [["gamma"]]
    assert json.loads(result.cursor)["alpha"] == json.loads(first.cursor)["alpha"]

    quiet = _tick(defs, instance, cursor=result.cursor)
    assert not quiet.run_requests
    assert "alpha: SourceError: export dataset 'commits' is missing" in quiet.skip_message

    shutil.move(hidden, export)
    restored = _tick(defs, instance, cursor=result.cursor)
    assert not restored.run_requests  # the same state as before it broke: nothing new to mark


def test_a_connector_whose_fingerprint_fails_is_an_error_for_its_repository_only(defs, instance, monkeypatch):
    real_source_for = automation.source_for

    class Unreadable:
        def fingerprint(self, spark):
            raise SourceError("the export's refs cannot be read")

    monkeypatch.setattr(
        automation, "source_for", lambda repo: Unreadable() if repo.name == "alpha" else real_source_for(repo)
    )
    result = _tick(defs, instance)
    assert [_covered(r) for r in result.run_requests] == [["beta", "gamma"]]
    assert "alpha" not in json.loads(result.cursor)
    quiet = _tick(defs, instance, cursor=result.cursor)
    assert "alpha: SourceError: the export's refs cannot be read" in quiet.skip_message


def test_fingerprint_sees_a_moved_branch_even_when_size_and_mtime_are_kept(tmp_path):
    lake = lake_on_disk(tmp_path, churn=0, fmt="jsonl")
    source = LakeFSExportSource((lake.namespace / "_lakefs" / "export").as_uri())
    before = source.fingerprint(None)
    assert source.fingerprint(None) == before
    refs = lake.namespace / "_lakefs" / "export" / "refs" / "part-00000.jsonl"
    stat = refs.stat()
    rows = [json.loads(line) for line in refs.read_text().splitlines()]
    main = next(r for r in rows if r["name"] == "main")
    other = next(c for c in lake.lake.commits if c != main["commit_id"] and len(c) == len(main["commit_id"]))
    refs.write_text(refs.read_text().replace(main["commit_id"], other, 1))
    os.utime(refs, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert refs.stat().st_size == stat.st_size and refs.stat().st_mtime_ns == stat.st_mtime_ns
    assert source.fingerprint(None) != before


fingerprints = st.dictionaries(
    st.sampled_from([f"r{i}" for i in range(15)]),
    st.one_of(st.sampled_from(["a", "b", "c"]), st.builds(OSError, st.just("unreadable"))),
)
previous_cursors = st.dictionaries(st.sampled_from([f"r{i}" for i in range(15)]), st.sampled_from(["a", "b"]))


@given(fingerprints, previous_cursors, st.integers(min_value=1, max_value=MAX_MARKS_PER_TICK))
def test_scan_commits_against_its_definition(current, previous, cap):
    scan = scan_commits(current, previous, cap)
    changed = [repo for repo, fp in current.items() if isinstance(fp, str) and previous.get(repo) != fp]
    assert scan.changed == changed[:cap] and scan.deferred == changed[cap:]
    assert set(scan.errors) == {repo for repo, fp in current.items() if isinstance(fp, Exception)}
    for repo, fp in current.items():
        if repo in scan.changed or (isinstance(fp, str) and previous.get(repo) == fp):
            assert scan.cursor[repo] == fp
        else:  # broken or deferred: the next tick sees it as changed again
            assert scan.cursor.get(repo) == previous.get(repo)
    assert set(scan.cursor) <= set(current)  # repositories gone from gc.yaml leave the cursor


def test_cursor_that_is_not_json_starts_afresh():
    assert read_cursor(None) == {} and read_cursor("not json") == {} and read_cursor("[1]") == {}
    assert read_cursor('{"a": "x"}') == {"a": "x"}


def test_registry_adds_new_drops_unused_and_keeps_materialized_removed_repositories(defs, instance):
    instance.add_dynamic_partitions(REPOSITORIES.name, ["alpha", "typo", "retired"])
    instance.report_runless_asset_event(AssetMaterialization("live_files", partition="2022-03-31|retired"))
    result = _tick(defs, instance, name="repository_registry")
    add, drop = result.dynamic_partitions_requests
    assert add.partition_keys == ["beta", "gamma"]
    assert drop.partition_keys == ["typo"]
    assert "kept retired (removed from gc.yaml, has materializations)" in result.skip_message
    assert plan_registry(["a"], ["a"], set()).add == [] and plan_registry(["a"], ["a"], set()).drop == []


def test_daily_schedule_runs_yesterday_for_every_registered_repository_in_one_fleet_run(defs, instance):
    instance.add_dynamic_partitions(REPOSITORIES.name, ["alpha", "beta"])  # gamma not registered yet
    schedule = defs.get_schedule_def("daily_gc")
    assert (schedule.cron_schedule, schedule.execution_timezone, schedule.job_name) == ("0 3 * * *", "UTC", "fleet_job")
    context = build_schedule_context(
        instance=instance,
        scheduled_execution_time=dt.datetime(2022, 4, 1, 3, tzinfo=dt.timezone.utc),
        repository_def=defs.get_repository_def(),
    )
    (request,) = schedule.evaluate_tick(context).run_requests
    assert request.partition_key == "2022-03-31" and request.run_key == "gc:2022-03-31"
    assert _covered(request) == ["alpha", "beta"]
    fleet = request.run_config["ops"]["collect_fleet"]["config"]
    assert fleet["mode"] == "" and fleet["mark_only"] is False  # each repository in its configured mode

    before_start = build_schedule_context(
        instance=instance,
        scheduled_execution_time=dt.datetime(2022, 1, 1, 3, tzinfo=dt.timezone.utc),
        repository_def=defs.get_repository_def(),
    )
    assert not schedule.evaluate_tick(before_start).run_requests


def test_sensor_and_schedule_fix_the_as_of_of_each_run_they_request(defs, instance):
    """The as-of tag is written when the run is requested, min(end of day, the tick's clock);
    every step of the run reads it (gc_assets_tests/test_one_clock.py)."""
    before = dt.datetime.now(dt.timezone.utc)
    requests = _tick(defs, instance).run_requests
    after = dt.datetime.now(dt.timezone.utc)
    assert len(requests) == 1
    for request in requests:
        day = dt.date.fromisoformat(request.partition_key)
        assert min(end_of_day(day), before) <= parse_timestamp(request.tags[AS_OF_TAG]) <= min(end_of_day(day), after)

    instance.add_dynamic_partitions(REPOSITORIES.name, list(REPOS))
    context = build_schedule_context(
        instance=instance,
        scheduled_execution_time=dt.datetime(2022, 4, 1, 3, tzinfo=dt.timezone.utc),
        repository_def=defs.get_repository_def(),
    )
    scheduled = list(defs.get_schedule_def("daily_gc").evaluate_tick(context).run_requests)
    assert [r.tags[AS_OF_TAG] for r in scheduled] == ["2022-04-01T00:00:00Z"]
