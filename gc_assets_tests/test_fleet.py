"""Many repositories in one `gc-assets run` (docs/design.md §9): --all, several --repo, a glob.

One process reads gc.yaml and discovers its tables once, judges every repository at one
as-of, and gives each its own summary; a broken table fails alone, named on stderr.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance

from gc_assets import cli
from gc_assets.core.config import ConfigError, GcConfig
from gc_assets.core.guards import Verdict
from gc_assets.core.time import as_of_tags
from gc_assets.defs.build import build_definitions
from gc_assets.defs.partitions import partition_key
from gc_assets.defs.set_runs import collected_failure, fleet_run_config
from gc_assets.runner import stored_location
from gc_assets.sources import discovery
from gc_assets.sources.discovery import load_lake
from gc_assets.sweep.together import Collected
from gc_assets_tests import delta_tables

WINDOW_DAYS = 5


def _fleet_config(tmp_path: Path, now: dt.datetime) -> tuple[Path, dict[str, delta_tables.BuiltTable]]:
    warehouse = tmp_path / "wh"
    tables = {
        "team/merges": delta_tables.merges(warehouse / "team", now),
        "deletes_and_updates": delta_tables.deletes_and_updates(warehouse, now),
    }
    broken = warehouse / "team" / "broken" / "_delta_log"
    broken.mkdir(parents=True)
    (broken / "00000000000000000000.json").write_text("{not json\n")
    entry = {
        "discover": {"format": "delta", "under": warehouse.as_uri()},
        "rules": {"default_retention_days": WINDOW_DAYS},
        "allow_unsafe_retention": True,
        "max_delete_fraction": 0.9,
    }
    document = {"state_dir": str(tmp_path / "state"), "partitions_start_date": "2022-01-01", "repositories": [entry]}
    path = tmp_path / "gc.yaml"
    path.write_text(yaml.safe_dump(document))
    return path, tables


def _candidates(summary: dict) -> set[str]:
    return {row["address"] for row in pq.read_table(summary["outputs"]["orphan_candidates"]).to_pylist()}


def test_run_all_collects_every_discovered_table_in_one_process_and_a_broken_one_fails_alone(
    tmp_path, spark, capsys, monkeypatch
):
    now = delta_tables.now_utc()
    config, tables = _fleet_config(tmp_path, now)
    readings = []
    discovered = discovery.discovered
    monkeypatch.setattr(discovery, "discovered", lambda entry: readings.append(entry) or discovered(entry))

    status = cli.main(["run", "--config", str(config), "--all", "--date", now.date().isoformat(), "--json"])

    out, err = capsys.readouterr()
    summaries = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert status == 1, out
    assert [s["repo"] for s in summaries] == ["deletes_and_updates", "team/broken", "team/merges"]
    assert len(readings) == 1, "gc.yaml is read and its tables discovered once for the whole fleet run"
    assert len({s["as_of"] for s in summaries}) == 1, "every repository is judged at one as-of"
    assert len({s["run_id"] for s in summaries}) == 1, "one fleet run dry-runs every Delta table together"
    failed = [line for line in err.splitlines() if line.startswith("gc-assets: ")]
    assert len(failed) == 1 and "team/broken" in failed[0] and "00000000000000000000.json" in failed[0], err
    for summary in summaries:
        if summary["repo"] == "team/broken":
            assert "orphan_candidates" not in summary["outputs"]
            continue
        table = tables[summary["repo"]]
        expected = {
            Path(item).relative_to(table.path).as_posix() if Path(item).is_absolute() else item
            for item in delta_tables.vacuum_candidates(table, dt.timedelta(days=WINDOW_DAYS))
        }
        assert expected and _candidates(summary) == expected, summary["repo"]
        assert summary["receipts"] == {"would_delete": len(expected)}
        assert set(summary["checks"].values()) == {"passed"}


def test_several_repos_and_globs_choose_in_configured_order_once_each():
    names = ["sales/orders", "sales/items", "ops/events", "ops"]
    config = GcConfig.model_validate(
        {
            "repositories": [
                {"name": name, "format": "delta", "storage_namespace": f"file:///lake/{name.replace('/', '_')}"}
                for name in names
            ]
        }
    )
    assert config.selected(["sales/*"]) == ["sales/orders", "sales/items"]
    assert config.selected(["ops", "sales/items", "ops*"]) == ["ops", "sales/items", "ops/events"]
    assert config.selected(["s?les/[io]*"]) == ["sales/orders", "sales/items"]
    with pytest.raises(ConfigError, match=r"no repository matches 'billing/\*' \(configured: sales/orders"):
        config.selected(["billing/*"])
    with pytest.raises(ConfigError, match="no repository named 'sales'"):
        config.selected(["sales"])


def test_a_glob_that_matches_nothing_or_no_repository_option_is_refused(tmp_path, capsys):
    now = delta_tables.now_utc()
    config, _ = _fleet_config(tmp_path, now)
    assert cli.main(["run", "--config", str(config), "--repo", "nothing/*"]) == 2
    assert "no repository matches 'nothing/*'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--config", str(config)])
    assert exited.value.code == 2
    with pytest.raises(SystemExit):
        cli.main(["run", "--config", str(config), "--all", "--repo", "team/merges"])


def test_a_fleet_run_covers_each_table_and_fails_naming_the_broken_one(tmp_path, spark):
    """fleet_job, as the daily schedule and backfills launch it: one run per date that dry-runs
    its Delta tables together at its as-of, a failed one named at the end; in a mode that
    touches storage, its tables collected together the same way, each swept in the fleet run;
    and mark only, as the new-commit sensor launches it, a mark_job run per repository that
    does not go together."""
    now = delta_tables.now_utc()
    path, tables = _fleet_config(tmp_path, now)
    defs = build_definitions(load_lake(str(path)), str(path))
    instance = DagsterInstance.ephemeral()
    fleet = defs.resolve_job_def("fleet_job")
    date = now.date()
    tags = as_of_tags(date, now)

    result = fleet.execute_in_process(
        instance=instance,
        partition_key=date.isoformat(),
        run_config=fleet_run_config(),
        tags=tags,
        raise_on_error=False,
    )

    assert not result.success
    (failure,) = [event for event in result.all_events if event.is_step_failure]
    assert "1 of 3 repositories failed: team/broken: " in str(failure.step_failure_data.user_failure_data)
    assert _only_fleet_runs(instance)
    for name, table in tables.items():
        stored = stored_location(str(path), "orphan_candidates", date, name)
        expected = delta_tables.vacuum_candidates(table, dt.timedelta(days=WINDOW_DAYS))
        assert expected and {row["address"] for row in pq.read_table(stored).to_pylist()} == expected, name

    swept = fleet.execute_in_process(
        instance=instance,
        partition_key=date.isoformat(),
        run_config=fleet_run_config(["team/*"], mode="trash"),
        tags=tags,
        raise_on_error=False,
    )

    assert not swept.success
    # Both tables went together: marked and judged in the fleet run, the healthy one trashed in
    # it, the broken one named in its failure. No run of their own.
    assert _only_fleet_runs(instance)
    (failure,) = [event for event in swept.all_events if event.is_step_failure]
    assert "1 of 2 repositories failed: team/broken: " in str(failure.step_failure_data.user_failure_data)
    marks = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("live_files"), asset_partitions=[partition_key(date, "team/merges")]),
        limit=3,
    ).records
    assert [mark.run_id for mark in marks] == [swept.run_id, result.run_id]
    receipts = pq.read_table(stored_location(str(path), "deletion_receipts", date, "team/merges")).to_pylist()
    expected = delta_tables.vacuum_candidates(tables["team/merges"], dt.timedelta(days=WINDOW_DAYS))
    assert {(row["address"], row["action"], row["run_id"]) for row in receipts} == {
        (address, "trashed", swept.run_id) for address in expected
    }

    marked = fleet.execute_in_process(
        instance=instance,
        partition_key=date.isoformat(),
        run_config=fleet_run_config(["team/m*"], mark_only=True),
        tags=tags,
    )

    # One table marked only is a set of one: in the fleet run itself, no run of its own.
    assert _only_fleet_runs(instance)
    mark_only = instance.get_records_for_run(marked.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION).records
    assert {(record.asset_key.path[-1], record.partition_key) for record in mark_only} == {
        ("retained_commits", partition_key(date, "team/merges")),
        ("live_files", partition_key(date, "team/merges")),
    }

    # Two tables marked only, as the new-commit sensor asks: together, in the fleet run itself,
    # mark_job's two assets and its check for each, storage not listed; the broken one named.
    together = fleet.execute_in_process(
        instance=instance,
        partition_key=date.isoformat(),
        run_config=fleet_run_config(["team/*"], mark_only=True),
        tags=tags,
        raise_on_error=False,
    )

    assert not together.success and _only_fleet_runs(instance)
    (failure,) = [event for event in together.all_events if event.is_step_failure]
    assert "1 of 2 repositories failed: team/broken: " in str(failure.step_failure_data.user_failure_data)
    stored = instance.get_records_for_run(together.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION).records
    merges = partition_key(date, "team/merges")
    assert sorted((r.asset_key.path[-1], r.partition_key) for r in stored) == [
        ("live_files", merges),
        ("retained_commits", merges),
    ]
    checked = instance.get_records_for_run(together.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION).records
    evaluations = [r.event_log_entry.get_dagster_event().asset_check_evaluation_data for r in checked]
    assert [(e.check_name, e.partition, e.passed) for e in evaluations] == [("heads_and_tags_retained", merges, True)]


def test_a_table_collected_together_fails_when_refused_or_any_check_did_not_pass():
    """The fleet run's failure names each table it collected together that it refused (the asset
    and why) or whose checks did not all pass: one that failed, one that only warned, and one
    never judged (skipped) all fail; one whose every check passed does not."""
    names = ["live_objects_present", "blast_radius"]
    collected = Collected()
    collected.refuse("object_inventory", {"refused": "s3://b/t: cannot be listed"})
    collected.verdicts = {
        "refused": [Verdict("live_objects_present", True, "")],
        "passed": [Verdict(name, True, "") for name in names],
        "warned": [Verdict("live_objects_present", False, "", "WARN"), Verdict("blast_radius", True, "")],
        "failed": [Verdict("live_objects_present", True, ""), Verdict("blast_radius", False, "")],
        "unjudged": [Verdict("live_objects_present", True, "")],
    }

    failures = {repo: collected_failure(collected, repo, names) for repo in collected.verdicts}

    assert failures == {
        "refused": "object_inventory: s3://b/t: cannot be listed",
        "passed": None,
        "warned": "checks not passed: live_objects_present warning",
        "failed": "checks not passed: blast_radius failed",
        "unjudged": "checks not passed: blast_radius skipped",
    }


def _only_fleet_runs(instance: DagsterInstance) -> bool:
    """Whether every run of `instance` is a fleet run: none of a repository of its own."""
    return {run.job_name for run in instance.get_runs()} == {"fleet_job"}
