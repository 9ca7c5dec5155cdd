"""Dagster's instance on PostgreSQL (dagster-postgres), as docs/CLUSTERS.md advises for thousands of
partitions: a fleet run records each table's runs, materializations and check results there,
and the registry sensor keeps 1,000 repositories' partitions in it."""

from __future__ import annotations

import json
import time

import yaml
from dagster import AssetKey, DagsterInstance, build_sensor_context

from gc_assets import cli
from gc_assets.core.config import load_config
from gc_assets.defs.build import build_definitions
from gc_assets.defs.partitions import REPOSITORIES
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
    postgres.create_database("dagster")
    home = tmp_path / "dagster_home"
    home.mkdir()
    # dagster.yaml's documented block; SQLAlchemy 2.1 reads a bare `postgresql` scheme as psycopg 3,
    # whose server-side parameters break dagster-postgres's NOTIFY: the scheme names psycopg2.
    database = {"hostname": "127.0.0.1", "port": postgres.port, "username": "gc", "password": "", "db_name": "dagster"}
    storage = {"postgres": {"postgres_db": {**database, "scheme": "postgresql+psycopg2"}}}
    (home / "dagster.yaml").write_text(yaml.safe_dump({"storage": storage}))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    now = delta_tables.now_utc()
    date = now.date().isoformat()
    warehouse = tmp_path / "wh"
    delta_tables.merges(warehouse, now)
    delta_tables.deletes_and_updates(warehouse, now)
    entry = {"discover": {"format": "delta", "under": warehouse.as_uri()}, "max_delete_fraction": 1.0}
    config = write_config(tmp_path / "gc.yaml", [entry], tmp_path / "state")

    status = cli.main(["run", "--config", str(config), "--all", "--date", date, "--json"])

    summaries = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert status == 0 and [s["repo"] for s in summaries] == ["deletes_and_updates", "merges"]
    instance = DagsterInstance.get()
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    assert {run.run_id for run in instance.get_runs()} == {s["run_id"] for s in summaries}
    for asset in ("retained_commits", "live_files", "object_inventory", "orphan_candidates", "deletion_receipts"):
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
