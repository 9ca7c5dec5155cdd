"""Discovery (docs/design.md §6.6): a gc.yaml entry that stands for many tables.

Delta tables below a directory and below an S3 prefix (moto), Iceberg tables of a SQL
catalog on SQLite and on PostgreSQL; each table a repository with the entry's settings,
collected exactly as delta-rs says, and a broken table failing alone, naming itself.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, build_sensor_context, instance_for_test

from gc_assets.core.config import ConfigError, load_config
from gc_assets.defs.build import build_definitions
from gc_assets.defs.partitions import REPOSITORIES
from gc_assets.runner import run_partition
from gc_assets.sources.discovery import load_lake
from gc_assets_tests import delta_tables
from gc_assets_tests.postgres_server import postgres  # noqa: F401 - the fixture
from gc_assets_tests.s3_server import s3  # noqa: F401 - the fixture

WINDOW_DAYS = 5
# Directories below the warehouse: tables, and what discovery must pass by.
TABLES = ["deep/er/t", "events", "sales/orders"]
NOT_TABLES = [
    "sales/orders/nested",  # a directory with a log inside a table is the table's, not a table
    "_staging/x",  # hidden, as Delta hides names starting with '_' or '.'
    ".trash/y",
    "has space",  # cannot name a repository: reported and left out
]


def _warehouse(root: Path) -> Path:
    for relative in TABLES + NOT_TABLES:
        log = root / relative / "_delta_log"
        log.mkdir(parents=True)
        (log / "00000000000000000000.json").write_text("{}\n")
    (root / "sales" / "empty").mkdir()
    return root


def _config(path: Path, entries: list[dict], state: Path) -> Path:
    document = {"state_dir": str(state), "partitions_start_date": "2022-01-01", "repositories": entries}
    path.write_text(yaml.safe_dump(document))
    return path


def _discover_delta(under: str, **settings) -> dict:
    return {"discover": {"format": "delta", "under": under}, "rules": {"default_retention_days": 9}, **settings}


def test_every_delta_table_below_a_directory_is_a_repository_with_the_entrys_settings(tmp_path):
    warehouse = _warehouse(tmp_path / "wh")
    config_path = _config(tmp_path / "gc.yaml", [_discover_delta(warehouse.as_uri(), mode="trash")], tmp_path / "s")

    assert load_config(config_path).repositories == ()  # parsing alone lists nothing
    lake = load_lake(config_path)
    assert [r.name for r in lake.repositories] == TABLES
    for repo in lake.repositories:
        assert repo.format == "delta" and repo.mode == "trash"
        assert repo.rules is not None and repo.rules.default_retention_days == 9
        assert repo.storage_namespace == (warehouse / repo.name).as_uri()
    assert lake.repository("sales/orders").storage_namespace.endswith("/wh/sales/orders")


def test_discovered_tables_inside_another_repositorys_namespace_are_protected_there(tmp_path):
    warehouse = _warehouse(tmp_path / "wh")
    outer = {"name": "whole", "format": "delta", "storage_namespace": warehouse.as_uri()}
    config_path = _config(tmp_path / "gc.yaml", [outer, _discover_delta(warehouse.as_uri())], tmp_path / "s")
    lake = load_lake(config_path)
    assert [r.name for r in lake.repositories] == ["whole", *TABLES]
    assert lake.nested_in("whole") == {f"{name}/": name for name in TABLES}
    assert all(lake.nested_in(name) == {} for name in TABLES)


def test_a_discover_entry_is_judged_when_loaded_naming_the_entry_and_field(tmp_path):
    cases = {
        "field discover: format delta is discovered below `under`": {"discover": {"format": "delta"}},
        "name, storage_namespace cannot be set for discovered tables": {
            **_discover_delta("file:///wh"),
            "name": "x",
            "storage_namespace": "file:///y",
        },
        "field min_object_age_hours: below 1 hour": _discover_delta("file:///wh", min_object_age_hours=0.5),
        "unknown setting(s) retention_dayz": _discover_delta("file:///wh", retention_dayz=3),
        "in a `catalog` and its `namespaces`": {"discover": {"format": "iceberg", "under": "file:///wh"}},
    }
    for message, entry in cases.items():
        config_path = _config(tmp_path / "gc.yaml", [entry], tmp_path / "s")
        with pytest.raises(ConfigError, match="discover entry #1: ") as refused:
            load_config(config_path)
        assert message in str(refused.value)


def test_a_missing_directory_or_an_unsupported_store_is_refused_by_name(tmp_path):
    config_path = _config(tmp_path / "gc.yaml", [_discover_delta((tmp_path / "nowhere").as_uri())], tmp_path / "s")
    with pytest.raises(ConfigError, match=r"cannot list .*nowhere"):
        load_lake(config_path)
    config_path = _config(tmp_path / "gc.yaml", [_discover_delta("gs://bucket/wh")], tmp_path / "s")
    with pytest.raises(ConfigError, match=r"only file:// and s3:// locations"):
        load_lake(config_path)


def test_delta_tables_below_an_s3_prefix_are_found_level_by_level(s3, tmp_path):
    s3.create_bucket("lake")
    s3.upload_tree(_warehouse(tmp_path / "wh"), "lake", "warehouse")
    config_path = _config(tmp_path / "gc.yaml", [_discover_delta("s3://lake/warehouse/")], tmp_path / "s")
    lake = load_lake(config_path)
    assert [r.name for r in lake.repositories] == TABLES
    assert lake.repository("deep/er/t").storage_namespace == "s3://lake/warehouse/deep/er/t"


def _iceberg_catalog(uri: str, warehouse: Path) -> dict:
    from pyiceberg.catalog.sql import SqlCatalog

    from gc_assets_tests.iceberg_tables import rows

    catalog = SqlCatalog("lake", uri=uri, warehouse=warehouse.as_uri())
    for namespace, table in [("sales", "orders"), ("sales", "customers"), ("ops", "logs")]:
        catalog.create_namespace_if_not_exists(namespace)
        catalog.create_table(f"{namespace}.{table}", schema=rows([1]).schema).append(rows([1, 2]))
    return {"type": "sql", "uri": uri, "name": "lake", "warehouse": warehouse.as_uri()}


def _assert_iceberg_discovered(tmp_path: Path, catalog: dict, warehouse: Path) -> None:
    entry = {"discover": {"format": "iceberg", "catalog": catalog, "namespaces": ["sales"]}, "hold_days": 3}
    lake = load_lake(_config(tmp_path / "gc.yaml", [entry], tmp_path / "s"))
    assert [r.name for r in lake.repositories] == ["sales.customers", "sales.orders"]
    for repo in lake.repositories:
        assert repo.format == "iceberg" and repo.hold_days == 3
        assert repo.catalog is not None and repo.catalog.table == repo.name and repo.catalog.uri == catalog["uri"]
        namespace, table = repo.name.split(".")
        assert repo.storage_namespace == (warehouse / namespace / table).as_uri()  # pyiceberg's layout


def test_every_table_of_an_iceberg_sql_catalogs_namespaces_on_sqlite_is_a_repository(tmp_path):
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    _assert_iceberg_discovered(tmp_path, _iceberg_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", warehouse), warehouse)


def test_every_table_of_an_iceberg_sql_catalogs_namespaces_on_postgresql_is_a_repository(postgres, tmp_path):
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    uri = postgres.create_database("iceberg_catalog")
    _assert_iceberg_discovered(tmp_path, _iceberg_catalog(uri, warehouse), warehouse)


def test_the_registry_sensor_adds_each_discovered_table_as_it_appears(tmp_path):
    warehouse = _warehouse(tmp_path / "wh")
    config_path = str(_config(tmp_path / "gc.yaml", [_discover_delta(warehouse.as_uri())], tmp_path / "s"))
    defs = build_definitions(load_lake(config_path), config_path)
    with instance_for_test() as instance:

        def tick():
            context = build_sensor_context(instance=instance, repository_def=defs.get_repository_def())
            result = defs.get_sensor_def("repository_registry").evaluate_tick(context)
            for request in result.dynamic_partitions_requests:
                instance.add_dynamic_partitions(REPOSITORIES.name, list(request.partition_keys))
            return instance.get_dynamic_partitions(REPOSITORIES.name)

        assert sorted(tick()) == TABLES
        (warehouse / "late" / "_delta_log").mkdir(parents=True)
        assert sorted(tick()) == sorted([*TABLES, "late"])


def test_discovered_delta_tables_are_collected_as_delta_rs_says_and_a_broken_one_fails_alone(tmp_path, spark):
    now = delta_tables.now_utc()
    warehouse = tmp_path / "wh"
    tables = [delta_tables.merges(warehouse / "team", now), delta_tables.deletes_and_updates(warehouse, now)]
    broken = warehouse / "team" / "broken" / "_delta_log"
    broken.mkdir(parents=True)
    (broken / "00000000000000000000.json").write_text("{not json\n")
    entry = _discover_delta(warehouse.as_uri(), allow_unsafe_retention=True, max_delete_fraction=0.9)
    entry["rules"] = {"default_retention_days": WINDOW_DAYS}
    config_path = str(_config(tmp_path / "gc.yaml", [entry], tmp_path / "state"))
    assert [r.name for r in load_lake(config_path).repositories] == [
        "deletes_and_updates",
        "team/broken",
        "team/merges",
    ]

    instance = DagsterInstance.ephemeral()
    failed = run_partition(config_path, "team/broken", now.date(), instance=instance)
    assert not failed.success and "team/broken/_delta_log/00000000000000000000.json" in (failed.error or "")
    for table, name in zip(tables, ["team/merges", "deletes_and_updates"]):
        expected = delta_tables.vacuum_candidates(table, dt.timedelta(days=WINDOW_DAYS))
        outcome = run_partition(config_path, name, now.date(), instance=instance)
        assert outcome.success, outcome.error
        assert outcome.summary["repo"] == name
        assert outcome.summary["receipts"] == {"would_delete": len(expected)} and expected
