"""Dagster's instance on PostgreSQL (dagster-postgres), as docs/CLUSTERS.md advises for thousands of
partitions: a fleet run records each table's runs, materializations and check results there,
and the registry sensor keeps 1,000 repositories' partitions in it."""

from __future__ import annotations

import json
import time
import traceback

import sqlalchemy
from dagster import AssetKey, DagsterEventType, DagsterInstance, build_sensor_context
from dagster_postgres.event_log import PostgresEventLogStorage

from gc_assets import cli
from gc_assets.core.config import load_config
from gc_assets.core.names import ASSETS
from gc_assets.defs.build import build_definitions
from gc_assets.defs.partitions import REPOSITORIES
from gc_assets.defs.set_records import EVENT_BATCH_SIZE_ENV
from gc_assets_tests import delta_tables
from gc_assets_tests.lakes import write_config
from gc_assets_tests.postgres_server import postgres  # noqa: F401 - the fixture

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

    # Witnesses outside gc_assets: what dagster-postgres was asked to store as one batch, and
    # each connection SQLAlchemy opened to store an event.
    batches = []
    store_batch = PostgresEventLogStorage.store_event_batch

    def storing(self, events):
        kinds = sorted({(e.dagster_event_type, e.dagster_event.asset_key.path[-1]) for e in events})
        batches.append((kinds, len(events)))
        return store_batch(self, events)

    monkeypatch.setattr(PostgresEventLogStorage, "store_event_batch", storing)
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
