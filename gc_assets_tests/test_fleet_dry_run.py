"""The dry run of many Delta tables in one fleet_job run (sweep.together, defs.set_records).

Each table's partitions are stored and recorded as its own: one materialization per asset
and partition, one check evaluation per guard naming its partition and the materialization it
judged, the times `plan` and `explain` read. Each table's candidates are delta-rs's. Tables
discovered on S3 (moto) go together with tables on disk, each with the candidates delta-rs's
vacuum finds there. A failed blocking guard, a mark that offers a live file (caught by the
independent witness, delta-rs, and the plain-Python live set), a namespace that cannot be
listed and a head file missing from storage each stop their own table alone, all in one run;
a crash fails every table; the run reports how many events Dagster stored for it and in how
long; the Spark jobs do not grow with the tables. A run that trashes or deletes several tables
collects them together too: test_fleet_sweep.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import pyarrow.parquet as pq
import pytest
import yaml
from dagster import AssetCheckKey, AssetCheckSeverity, AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance
from dagster._core.event_api import PartitionKeyFilter
from deltalake import DeltaTable

from gc_assets.defs.partitions import partition_key
from gc_assets.mark import sets
from gc_assets.runner import run_partitions, stored_location, stored_mark
from gc_assets.sources.delta import DeltaSource
from gc_assets.sources.discovery import load_lake
from gc_assets.stores import store_for
from gc_assets.stores.local import LocalReader, LocalStore
from gc_assets.stores.state import stored_schema
from gc_assets.sweep import together
from gc_assets.sweep.guard_table import GUARDS
from gc_assets_tests import delta_tables
from gc_assets_tests.conftest import jobs_started
from gc_assets_tests.lakes import write_config
from gc_assets_tests.s3_server import FAKE_CREDENTIALS, s3  # noqa: F401 - the fixture

WINDOW = dt.timedelta(days=5)
ASSETS = ("retained_commits", "live_files", "object_inventory", "orphan_candidates", "deletion_receipts")
BUILDERS = (delta_tables.merges, delta_tables.deletes_and_updates, delta_tables.appends_and_overwrites)


def _lake(
    tmp_path: Path, now: dt.datetime, copies: int = 1, builders: tuple[Callable, ...] = BUILDERS, **options
) -> tuple[Path, dict]:
    """`copies` of each builder's table, configured one by one; `options[name]` adds settings to one."""
    tables = {}
    for copy in range(copies):
        for build in builders:
            table = build(tmp_path / "wh" / f"c{copy}", now)
            tables[f"c{copy}/{table.name}"] = table
    repos = [
        {
            "name": name,
            "format": "delta",
            "storage_namespace": table.path.as_uri(),
            "rules": {"default_retention_days": WINDOW.days},
            "allow_unsafe_retention": True,
            "max_delete_fraction": 0.9,
            **options.get(name, {}),
        }
        for name, table in tables.items()
    ]
    return write_config(tmp_path / "gc.yaml", repos, tmp_path / "state"), tables


def _dry_run(path: Path, now: dt.datetime, instance: DagsterInstance):
    lake = load_lake(str(path))
    return {
        o.summary["repo"]: o
        for o in run_partitions(lake, [r.name for r in lake.repositories], now.date(), instance=instance)
    }


def _stored(path: Path, asset: str, date: dt.date, name: str) -> list[dict]:
    return pq.read_table(stored_location(str(path), asset, date, name)).to_pylist()


def _expected(table: delta_tables.BuiltTable) -> set[str]:
    return {
        Path(item).relative_to(table.path).as_posix() if Path(item).is_absolute() else item
        for item in delta_tables.vacuum_candidates(table, WINDOW)
    }


class _FleetRun(NamedTuple):
    path: Path
    tables: dict[str, delta_tables.BuiltTable]  # on disk, by repository name
    on_s3: dict[str, delta_tables.BuiltTable]  # uploaded under s3://fleet/wh/, by the name discovery gives them
    now: dt.datetime
    instance: DagsterInstance
    outcomes: dict
    spark_jobs: int


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory, spark, s3) -> _FleetRun:
    """One dry run of six healthy tables, three on disk and three discovered on S3: what it stores
    and records, and the Spark jobs it started."""
    root = tmp_path_factory.mktemp("fleet")
    now = delta_tables.now_utc()
    path, tables = _lake(root, now)
    s3.create_bucket("fleet")
    on_s3 = {table.name: table for table in (build(root / "for-s3", now) for build in BUILDERS)}
    for table in on_s3.values():
        s3.upload_tree(table.path, "fleet", f"wh/{table.name}")
    config = yaml.safe_load(path.read_text())
    config["repositories"].append(
        {
            "discover": {"format": "delta", "under": "s3://fleet/wh/"},
            "rules": {"default_retention_days": WINDOW.days},
            "allow_unsafe_retention": True,
            "max_delete_fraction": 0.9,
            "min_object_age_hours": 0,  # S3 stamps every object with its upload time: now
            "allow_unsafe_min_age": True,
        }
    )
    path.write_text(yaml.safe_dump(config))
    time.sleep(1.1)  # S3 times are whole seconds: every upload is now strictly before the as-of
    instance = DagsterInstance.ephemeral()
    before = jobs_started(spark)
    outcomes = _dry_run(path, now, instance)
    return _FleetRun(path, tables, on_s3, now, instance, outcomes, jobs_started(spark) - before)


def test_each_table_of_a_fleet_dry_run_is_stored_recorded_and_checked_as_its_own_partition(tmp_path, fleet_run):
    path, tables, on_s3, now, instance, outcomes, _ = fleet_run

    assert set(outcomes) == set(tables) | set(on_s3) and all(o.success for o in outcomes.values()), outcomes
    assert len({o.summary["run_id"] for o in outcomes.values()}) == 1, "one run for the fleet, on disk and on S3"
    run_id = next(iter(outcomes.values())).summary["run_id"]
    check_keys = [AssetCheckKey(AssetKey(g.asset), g.name) for g in GUARDS if g.is_check]
    for name in outcomes:  # the candidates of those on S3: the test below, by delta-rs there
        key = partition_key(now.date(), name)
        candidates = {row["address"] for row in _stored(path, "orphan_candidates", now.date(), name)}
        assert candidates and (name not in tables or candidates == _expected(tables[name])), name
        receipts = _stored(path, "deletion_receipts", now.date(), name)
        assert sorted(r["address"] for r in receipts) == sorted(candidates)
        assert {(r["action"], r["run_id"], r["mark_id"]) for r in receipts} == {("would_delete", run_id, run_id)}
        summary = outcomes[name].summary
        assert summary["orphan_candidates"] == len(candidates) and summary["receipts"] == {
            "would_delete": len(candidates)
        }
        assert set(summary["checks"].values()) == {"passed"} and len(summary["checks"]) == len(check_keys)
        for asset in ASSETS:
            (record,) = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[key]), limit=5
            ).records
            assert record.run_id == run_id
        for check_key in check_keys:
            execution = instance.event_log_storage.get_latest_asset_check_execution_by_key(
                [check_key], partition_filter=PartitionKeyFilter(key=key)
            )[check_key]
            assert execution.partition == key and execution.evaluation.passed, (name, check_key)
            (judged,) = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=check_key.asset_key, asset_partitions=[key]), limit=5
            ).records
            assert execution.evaluation.target_materialization_data.storage_id == judged.storage_id
        as_of, mark = stored_mark(str(path), now.date(), name)  # what plan and explain hold constant
        assert mark.run_id == run_id and as_of.isoformat().startswith(summary["as_of"][:19])

    # The run reports Dagster's own cost: every event it stored for the partitions, and the time.
    logs = instance.all_logs(run_id)
    recorded = [
        e
        for e in logs
        if e.dagster_event_type in (DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_CHECK_EVALUATION)
    ]
    assert len(recorded) == len(outcomes) * (len(ASSETS) + len(check_keys))
    (reported,) = [e.user_message for e in logs if e.user_message.startswith("events: ")]
    assert reported.startswith(f"events: {len(recorded)} stored by Dagster in "), reported

    # Each partition's file is as a table's own run writes it: its columns, their types (INT96
    # times) and Spark's schema in the footer (read by read_parquet, `export` and later steps).
    name = "c0/merges"
    entry = next(repo for repo in yaml.safe_load(path.read_text())["repositories"] if repo.get("name") == name)
    alone_path = write_config(tmp_path / "alone.yaml", [entry], tmp_path / "alone-state")
    (outcome,) = _dry_run(alone_path, now, DagsterInstance.ephemeral()).values()
    assert outcome.success and outcome.summary["run_id"] != run_id
    for asset in ASSETS:
        fleet_part, own_part = (Path(stored_location(str(p), asset, now.date(), name)) for p in (path, alone_path))
        fleet_types, own_types = (
            [(f.name, f.type) for f in pq.read_schema(min(d.glob("*.parquet")))] for d in (fleet_part, own_part)
        )
        assert fleet_types == own_types, asset
        assert stored_schema(fleet_part) == stored_schema(own_part), asset


@dataclass(frozen=True)
class _UnlistableReader(LocalReader):
    def listed(self, client: None):  # raised on the executor that lists it
        raise PermissionError(f"[Errno 13] Permission denied: {self.root!r}")


class _UnlistableStore(LocalStore):
    def reader(self) -> LocalReader:
        return _UnlistableReader(self.root, self.trust_mtime)


BLOCKED, OFFERED, UNLISTABLE, LOST = "c0/merges", "c0/deletes_and_updates", "c0/appends_and_overwrites", "c1/merges"
TRUNCATED = "c2/merges"


def test_each_broken_table_of_a_fleet_dry_run_fails_alone(tmp_path, spark, monkeypatch):
    """Five faults, each in a table of its own, in one run; the tables beside them pass every guard
    with delta-rs's candidates and get their receipts. BLOCKED fails a blocking guard (blast radius).
    OFFERED's newest data file is injected into its candidates: delta-rs (the witness) and the live
    set recomputed in plain Python must both see it. UNLISTABLE's namespace cannot be listed. LOST's
    head needs a file storage no longer holds: live_objects_present fails (an ERROR: the listing or
    the mark cannot be trusted), and its candidates are neither stored nor judged, nor its heads
    read by the witness (here they cannot be: the witness read ahead for every table going on
    fails, and is read again for those judged). None of the four gets receipts. TRUNCATED lost a file only its
    retained version before the head reads: a WARN naming that version (the commits are found in
    the log the fleet's mark parsed, in one query for every such table, never by reading a table's
    log again), which does not stop the table."""
    now = delta_tables.now_utc()
    path, tables = _lake(tmp_path, now, copies=3, **{BLOCKED: {"max_delete_fraction": 0.01}})
    healthy = set(tables) - {BLOCKED, OFFERED, UNLISTABLE, LOST, TRUNCATED}
    victim = tables[OFFERED]
    live_file = max((p for p in victim.path.glob("*.parquet")), key=lambda p: p.stat().st_mtime).name
    lost = tables[LOST]
    (lost.path / min(Path(uri).name for uri in DeltaTable(str(lost.path)).file_uris())).unlink()
    truncated = tables[TRUNCATED].path
    older = DeltaTable(str(truncated), version=DeltaTable(str(truncated)).version() - 1)
    gone = min(
        {Path(uri).name for uri in older.file_uris()}
        - {Path(uri).name for uri in DeltaTable(str(truncated)).file_uris()}
    )
    (truncated / gone).unlink()
    decided = sets.candidates_of

    def offering_a_live_file(spark, *args, **kwargs):
        found = decided(spark, *args, **kwargs)
        held = (victim.path / live_file).stat()
        row = {
            "repo": OFFERED,
            "address": live_file,
            "size": held.st_size,
            "last_modified": dt.datetime.fromtimestamp(held.st_mtime, dt.timezone.utc),
            "reason": "untracked",
        }
        # A row of its own, not one taken from the candidates: that would compute them twice.
        offered = spark.createDataFrame([tuple(row[f.name] for f in found.frame.schema)], found.frame.schema)
        found.frame = found.frame.unionByName(offered)
        return found

    monkeypatch.setattr(together, "candidates_of", offering_a_live_file)
    read_witness, witness_reads = together._witness_keys, []

    def unreadable_when_lost_is_asked(spark, referrers, fleet, names):
        witness_reads.append((threading.current_thread().name.split("_")[0], LOST in names))
        if LOST in names:
            raise OSError(f"{LOST}: a head the format's reader cannot read")
        return read_witness(spark, referrers, fleet, names)

    monkeypatch.setattr(together, "_witness_keys", unreadable_when_lost_is_asked)

    def read_alone(*args, **kwargs):
        raise AssertionError("a table's log read again, alone")

    monkeypatch.setattr(DeltaSource, "commits_referencing", read_alone)
    monkeypatch.setattr(
        together,
        "store_for",
        lambda repo: _UnlistableStore(repo.storage_namespace) if repo.name == UNLISTABLE else store_for(repo),
    )

    instance = DagsterInstance.ephemeral()
    outcomes = _dry_run(path, now, instance)

    assert witness_reads == [("witness", True), ("MainThread", False)], "read ahead on its own thread, then again"
    blocked = outcomes.pop(BLOCKED)
    assert not blocked.success and "blast_radius" in blocked.error
    assert blocked.summary["checks"]["blast_radius"] == "failed"
    assert not Path(stored_location(str(path), "deletion_receipts", now.date(), BLOCKED)).exists()
    caught = outcomes.pop(OFFERED)
    assert not caught.success, caught.summary
    assert caught.summary["checks"]["independent_witness"] == "failed"
    assert caught.summary["checks"]["candidates_not_live"] == "failed"
    unlisted = outcomes.pop(UNLISTABLE)
    assert not unlisted.success and "cannot be listed" in unlisted.error and "Permission denied" in unlisted.error
    assert "object_inventory" not in unlisted.summary["outputs"]
    missing = outcomes.pop(LOST)
    assert not missing.success and missing.summary["checks"]["live_objects_present"] == "failed", missing.summary
    # A blocking check stops its table as it stops the assets after its own in a run of one partition.
    assert "orphan_candidates" not in missing.summary["outputs"], missing.summary
    assert missing.summary["checks"]["candidates_not_live"] == "skipped", missing.summary
    for failed in (blocked, caught, unlisted, missing):
        assert "deletion_receipts" not in failed.summary["outputs"], failed.summary
    warned = outcomes.pop(TRUNCATED)
    assert warned.summary["checks"]["live_objects_present"] == "warning", warned.summary
    assert "deletion_receipts" in warned.summary["outputs"], warned.summary
    checked = instance.get_records_for_run(warned.summary["run_id"], of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    (history,) = [
        evaluation
        for evaluation in (r.event_log_entry.get_dagster_event().asset_check_evaluation_data for r in checked.records)
        if evaluation.check_name == "live_objects_present"
        and evaluation.partition == partition_key(now.date(), TRUNCATED)
    ]
    assert (history.passed, history.severity) == (False, AssetCheckSeverity.WARN)
    assert history.metadata["missing_history"].value == [gone]
    assert f"{older.version():020d}" in history.metadata["affected_commits"].value
    assert set(outcomes) == healthy and len(healthy) >= 2
    for name, outcome in outcomes.items():
        assert outcome.success and set(outcome.summary["checks"].values()) == {"passed"}, outcome.summary
        candidates = {row["address"] for row in _stored(path, "orphan_candidates", now.date(), name)}
        assert candidates == _expected(tables[name]) and candidates, name
        assert outcome.summary["receipts"] == {"would_delete": len(candidates)}, name


def test_a_fleet_dry_run_that_breaks_fails_every_table_it_covers(tmp_path, spark, monkeypatch, capsys):
    now = delta_tables.now_utc()
    path, tables = _lake(tmp_path, now)

    def broken(*args, **kwargs):
        raise RuntimeError("the candidates broke")

    monkeypatch.setattr(together, "candidates_of", broken)

    outcomes = _dry_run(path, now, DagsterInstance.ephemeral())

    assert set(outcomes) == set(tables)
    assert all(not o.success and "the candidates broke" in o.error for o in outcomes.values()), outcomes


def test_delta_tables_on_s3_are_dry_run_together_with_the_candidates_delta_rs_vacuums_there(s3, fleet_run):
    """The module's run: the tables discovered on S3 went in it beside those on disk (one run
    for all, shown above), each with the candidates delta-rs vacuums where it lies."""
    outcomes = fleet_run.outcomes
    assert set(fleet_run.on_s3) <= set(outcomes) and all(o.success for o in outcomes.values()), outcomes
    assert len({o.summary["run_id"] for o in outcomes.values()}) == 1, "one fleet run for the tables on S3"
    # The oracle: delta-rs's own full vacuum of each table where it lies, by S3's object times.
    options = {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": s3.url, "AWS_ALLOW_HTTP": "true"}
    for name in fleet_run.on_s3:
        uri = f"s3://fleet/wh/{name}"
        vacuumed = DeltaTable(uri, storage_options=options).vacuum(
            retention_hours=WINDOW.days * 24, dry_run=True, full=True, enforce_retention_duration=False
        )
        expected = {item.removeprefix(uri + "/") for item in vacuumed}
        candidates = {
            row["address"] for row in _stored(fleet_run.path, "orphan_candidates", fleet_run.now.date(), name)
        }
        assert candidates == expected and candidates, name
        summary = outcomes[name].summary
        assert set(summary["checks"].values()) == {"passed"}, summary["checks"]
        assert summary["inventory_objects"] == len(s3.keys("fleet", f"wh/{name}/"))


def test_the_spark_jobs_of_a_fleet_dry_run_do_not_grow_with_its_tables(tmp_path, spark, fleet_run):
    """The module's six-table run against one of two, the fewest a fleet run collects together."""
    now = delta_tables.now_utc()
    path, tables = _lake(tmp_path, now, builders=BUILDERS[:2])
    before = jobs_started(spark)
    outcomes = _dry_run(path, now, DagsterInstance.ephemeral())
    jobs = {len(fleet_run.outcomes): fleet_run.spark_jobs, len(tables): jobs_started(spark) - before}
    assert len(outcomes) == len(tables) == 2 < len(fleet_run.outcomes) and all(o.success for o in outcomes.values())
    assert len({o.summary["run_id"] for o in outcomes.values()}) == 1, "the two went together"
    assert all(o.success for o in fleet_run.outcomes.values())
    assert len(set(jobs.values())) == 1, jobs
