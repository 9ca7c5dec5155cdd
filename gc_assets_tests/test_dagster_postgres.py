"""Dagster's instance on PostgreSQL (dagster-postgres, its event log defs.postgres_instance's), as
docs/CLUSTERS.md advises for thousands of partitions: a fleet run records each table's runs,
materializations and check results there, a batch of check evaluations at once, and the
registry sensor keeps 1,000 repositories' partitions in it. The witness of the batches is
dagster-postgres's own event log, given the same events one at a time."""

from __future__ import annotations

import json
import time
import traceback

import psutil
import pytest
import sqlalchemy
from dagster import AssetKey, DagsterEvent, DagsterEventType, DagsterInstance, EventRecordsFilter, build_sensor_context
from dagster_postgres.event_log import PostgresEventLogStorage

from gc_assets import cli
from gc_assets.core.config import load_config
from gc_assets.core.names import ASSETS
from gc_assets.defs.build import build_definitions
from gc_assets.defs.partitions import REPOSITORIES
from gc_assets.defs.postgres_instance import CheckBatchingPostgresEventLogStorage
from gc_assets.defs.set_records import EVENT_BATCH_SIZE_ENV
from gc_assets_tests import delta_tables
from gc_assets_tests.event_log_answers import ASSETS as JUDGED_ASSETS
from gc_assets_tests.event_log_answers import CHECKED, answers, checks, materializations, planned
from gc_assets_tests.lakes import write_config
from gc_assets_tests.postgres_server import Postgres, postgres  # noqa: F401 - the fixture

TABLES = 1000


def test_a_fleet_run_and_a_registry_of_a_thousand_tables_on_a_postgres_instance(
    tmp_path,
    postgres,  # noqa: F811 - the fixture
    spark,
    monkeypatch,
    capsys,
):
    home = postgres.dagster_home("dagster", tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    now = delta_tables.now_utc()
    date = now.date().isoformat()
    warehouse = tmp_path / "wh"
    delta_tables.merges(warehouse, now)
    delta_tables.deletes_and_updates(warehouse, now)
    entry = {"discover": {"format": "delta", "under": warehouse.as_uri()}, "max_delete_fraction": 1.0}
    config = write_config(tmp_path / "gc.yaml", [entry], tmp_path / "state")

    # Witnesses outside gc_assets: what the event log was asked to store as one batch, and
    # each connection SQLAlchemy opened to store an event.
    batches = []
    store_batch = CheckBatchingPostgresEventLogStorage.store_event_batch

    def storing(self, events):
        kinds = sorted({(e.dagster_event_type, _asset(e.get_dagster_event())) for e in events})
        batches.append((kinds, len(events)))
        return store_batch(self, events)

    monkeypatch.setattr(CheckBatchingPostgresEventLogStorage, "store_event_batch", storing)
    connections = []

    def connected(*_):
        """A connection opened to store an event (not to create or migrate the instance)."""
        if any(frame.name == "handle_new_event" for frame in traceback.extract_stack()):
            connections.append(1)

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "connect", connected)
    monkeypatch.setenv(EVENT_BATCH_SIZE_ENV, "unset below, restored to unset after the test")
    monkeypatch.delenv(EVENT_BATCH_SIZE_ENV)
    try:
        status = cli.main(["run", "--config", str(config), "--all", "--date", date, "--json"])
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "connect", connected)

    summaries = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert status == 0 and [s["repo"] for s in summaries] == ["deletes_and_updates", "merges"]
    instance = DagsterInstance.get()
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    assert {run.run_id for run in instance.get_runs()} == {s["run_id"] for s in summaries}
    stored = len(instance.all_logs(summaries[0]["run_id"]))
    print(f"{stored} events stored, {len(connections)} connections opened to store them")
    # Each asset's materializations in one batch (a statement); one connection kept from the fleet
    # step on, not two an event (the run's first dozen events, before the step, open their own).
    materialization = DagsterEventType.ASSET_MATERIALIZATION
    materialized = [(kinds, n) for kinds, n in batches if any(kind == materialization for kind, _ in kinds)]
    assert sorted(materialized) == sorted(([(materialization, asset)], 2) for asset in ASSETS)
    evaluation = DagsterEventType.ASSET_CHECK_EVALUATION
    evaluated = [n for kinds, n in batches if {kind for kind, _ in kinds} == {evaluation}]
    stored_checks = len(instance.all_logs(summaries[0]["run_id"], of_type=evaluation))
    assert len(evaluated) >= 2 and sum(evaluated) == stored_checks, (evaluated, stored_checks)
    assert len(connections) < stored / 2, (len(connections), stored)
    for asset in ASSETS:
        assert instance.get_materialized_partitions(AssetKey(asset)) == {
            f"{date}|deletes_and_updates",
            f"{date}|merges",
        }, asset
    with postgres.connect("dagster") as connection:
        checks = connection.execute(
            "select partition, count(*) from asset_check_executions group by partition order by partition"
        ).fetchall()
    per_repo = len(summaries[0]["checks"])
    assert checks == [(f"{date}|deletes_and_updates", per_repo), (f"{date}|merges", per_repo)]

    # The registry of a gc.yaml listing 1,000 tables, against the same instance.
    listed = [
        {"name": f"team-{i // 100}/table-{i}", "format": "delta", "storage_namespace": (warehouse / f"t{i}").as_uri()}
        for i in range(TABLES)
    ]
    fleet = write_config(tmp_path / "fleet.yaml", listed, tmp_path / "state")
    defs = build_definitions(load_config(fleet), str(fleet))
    started = time.monotonic()
    context = build_sensor_context(
        instance=instance, instance_ref=instance.get_ref(), repository_def=defs.get_repository_def()
    )
    result = defs.get_sensor_def("repository_registry").evaluate_tick(context)
    for request in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    print(f"registry tick of {TABLES} repositories on PostgreSQL: {time.monotonic() - started:.2f} s")
    registered = instance.get_dynamic_partitions(REPOSITORIES.name)
    assert len(registered) == TABLES + 2, "the fleet run's two tables keep their partitions: they materialized"
    assert set(registered) >= {entry["name"] for entry in listed}


def _asset(event: DagsterEvent) -> str:
    """The asset of a materialization or of a check evaluation."""
    key = event.asset_key if event.asset_key is not None else event.asset_check_evaluation_data.asset_key
    return key.path[-1]


def _event_log(postgres: Postgres, name: str, kind: type) -> PostgresEventLogStorage:  # noqa: F811
    """An event log of `kind` on a new database `name` of the tests' server."""
    url = postgres.create_database(name).replace("postgresql+psycopg:", "postgresql+psycopg2:")
    return kind(url)


def test_a_batch_of_check_evaluations_answers_as_dagster_postgres_given_them_one_at_a_time(
    postgres,  # noqa: F811 - the fixture
):
    dagsters = _event_log(postgres, "events_one_at_a_time", PostgresEventLogStorage)
    ours = _event_log(postgres, "events_in_batches", CheckBatchingPostgresEventLogStorage)
    statements: list[str] = []  # what our log asked PostgreSQL to do, the first three words of each
    sqlalchemy.event.listen(
        ours._engine, "before_cursor_execute", lambda *args: statements.append(" ".join(args[2].split()[:3]))
    )
    for storage in (dagsters, ours):  # dagster-postgres's own batch of materializations, on both
        for asset in JUDGED_ASSETS:
            storage.store_event_batch(materializations(asset))
        storage.store_event(planned())
    for event in checks(dagsters):
        dagsters.store_event(event)
    evaluations = checks(ours)
    statements.clear()
    ours.store_event_batch(evaluations)
    stored_with = list(statements)

    assert answers(ours) == answers(dagsters)
    # One INSERT of the event rows, the lookup of the rows already there, an UPDATE of each
    # planned one's (every third partition was planned), one INSERT of the others.
    planned_rows = ["UPDATE asset_check_executions SET"] * len(CHECKED[::3])
    assert stored_with == [
        "INSERT INTO event_logs",
        "SELECT asset_check_executions.run_id, asset_check_executions.asset_key,",
        *planned_rows,
        "INSERT INTO asset_check_executions",
    ]


def test_a_batch_of_check_evaluations_that_fails_part_way_stores_none_of_it(postgres, monkeypatch):  # noqa: F811
    ours = _event_log(postgres, "events_failing", CheckBatchingPostgresEventLogStorage)
    for asset in JUDGED_ASSETS:
        ours.store_event_batch(materializations(asset))
    evaluations = checks(ours)
    monkeypatch.setattr(
        "gc_assets.defs.postgres_instance._rows_there",
        lambda *_: (_ for _ in ()).throw(sqlalchemy.exc.OperationalError("SELECT", {}, Exception("server closed"))),
    )
    with pytest.raises(sqlalchemy.exc.OperationalError):
        ours.store_event_batch(evaluations)
    assert ours.get_event_records(EventRecordsFilter(DagsterEventType.ASSET_CHECK_EVALUATION), limit=100) == []
    monkeypatch.undo()
    for event in evaluations:  # as Dagster does next, one at a time
        ours.store_event(event)
    stored = ours.get_event_records(EventRecordsFilter(DagsterEventType.ASSET_CHECK_EVALUATION), limit=100)
    assert len(stored) == len(evaluations)


def test_the_bench_counts_the_cpu_of_the_servers_backends_after_their_connections_closed(postgres):  # noqa: F811
    """bench.fleet puts Dagster's PostgreSQL server in a run's CPU split from two readings: a run's
    connections close before the second, so a backend's work must stay counted once it ended."""
    before = postgres.server_seconds()
    with postgres.connect() as connection:
        backend = connection.execute("SELECT pg_backend_pid()").fetchone()[0]
        started = time.monotonic()
        connection.execute("SELECT count(*) FROM generate_series(1, 5000000)").fetchone()
    deadline = time.monotonic() + 10
    while psutil.pid_exists(backend) and time.monotonic() < deadline:
        time.sleep(0.05)  # the postmaster reaps the backend that served the connection
    assert not psutil.pid_exists(backend)
    spent = postgres.server_seconds() - before
    assert 0.2 <= spent <= 2 * (time.monotonic() - started) + 0.5
