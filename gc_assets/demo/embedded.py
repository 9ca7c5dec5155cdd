"""`gc-assets demo`: demo repositories built from scratch, each GC'd end to end in dry run.

Each builder writes one repository under the demo directory and returns its gc.yaml
entry and the partition date to collect; every repository shares one gc.yaml.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from gc_assets.demo.lakegen import (
    DOCS_GC_DATE,
    DOCS_RULES,
    add_churn,
    docs_example,
    write_native_lake,
)
from gc_assets.runner import format_summary, run_partition
from gc_assets.stores.local import TRUST_MTIME_ENV_VAR
from gc_assets.terminal import Progress, log_path, quiet


@dataclass(frozen=True)
class DemoRepository:
    config: dict[str, Any]  # its gc.yaml entry
    gc_date: dt.date


def lakefs_demo(directory: Path, churn_commits: int = 400) -> DemoRepository:
    """The lakeFS documentation example plus random churn, as lakeFS stores it: SSTable
    metaranges and ranges, a refs dump, lakeFS's binary rules file (the feature-branch pattern,
    which lakeFS's rules cannot say, is in gc.yaml's rules)."""
    name = "example-repo"
    namespace = directory / "lake" / name
    lake = docs_example(name)
    add_churn(
        lake,
        churn_commits,
        dt.datetime(2022, 1, 15, tzinfo=dt.timezone.utc),
        dt.datetime(2022, 3, 30, tzinfo=dt.timezone.utc),
    )
    manifest = write_native_lake(lake, namespace, rules=DOCS_RULES)
    rules = {**DOCS_RULES, "branches": DOCS_RULES["branches"] + [{"pattern": "feature/*", "retention_days": 3}]}
    config = {
        "name": name,
        "format": "lakefs",
        "storage_namespace": namespace.as_uri(),
        "refs_dump": manifest.as_uri(),
        "rules": rules,
        "mode": "dry_run",
    }
    return DemoRepository(config, DOCS_GC_DATE)


def iceberg_demo(directory: Path) -> DemoRepository:
    """A small Iceberg table (SQLite catalog) with a tag, a branch and an abandoned write, under
    Iceberg's own retention: every branch keeps its two newest snapshots, tags their own."""

    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    name = "iceberg-table"
    namespace = directory / "lake" / name
    catalog_uri = f"sqlite:///{directory / 'lake' / 'iceberg-catalog.db'}"
    catalog = SqlCatalog("demo", uri=catalog_uri, warehouse=(directory / "lake").as_uri())
    catalog.create_namespace_if_not_exists("demo")
    properties = {"history.expire.min-snapshots-to-keep": "2", "history.expire.max-snapshot-age-ms": "1"}
    schema = pa.schema([("id", pa.int64()), ("city", pa.string())])
    table = catalog.create_table("demo.cities", schema=schema, location=namespace.as_uri(), properties=properties)
    table.append(pa.table({"id": [1, 2, 3], "city": ["Oslo", "Lima", "Pune"]}, schema=schema))
    table.manage_snapshots().create_tag(table.metadata.current_snapshot_id, "v1").commit()
    table.append(pa.table({"id": [4], "city": ["Kyiv"]}, schema=schema))
    table.manage_snapshots().create_branch(table.metadata.current_snapshot_id, "dev").commit()
    table.append(pa.table({"id": [5], "city": ["Accra"]}, schema=schema), branch="dev")
    table.delete("city == 'Lima'")
    table.overwrite(pa.table({"id": [6], "city": ["Quito"]}, schema=schema))
    (namespace / "data" / "abandoned-write.parquet").write_bytes(b"an uncommitted write")
    two_days_ago = time.time() - 2 * 86400
    for path in namespace.rglob("*"):
        os.utime(path, (two_days_ago, two_days_ago))  # old enough for the minimum object age
    config = {
        "name": name,
        "format": "iceberg",
        "storage_namespace": namespace.as_uri(),
        "catalog": {"type": "sql", "uri": catalog_uri, "name": "demo", "table": "demo.cities"},
        "retention": "iceberg",
        "max_delete_fraction": 0.9,
        "mode": "dry_run",
    }
    return DemoRepository(config, dt.datetime.now(dt.timezone.utc).date())


def delta_demo(directory: Path) -> DemoRepository:
    """A small Delta table written by delta-rs (appends, an update, a delete, an overwrite) and an
    uncommitted write, its versions dated three days apart: the table's default 7-day retention
    expires the older removals and keeps the newer ones."""

    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    name = "delta-table"
    table = directory / "lake" / name
    write_deltalake(table, pa.table({"id": [1, 2, 3], "city": ["Oslo", "Lima", "Pune"]}))
    write_deltalake(table, pa.table({"id": [4], "city": ["Kyiv"]}), mode="append")
    DeltaTable(table).update(updates={"city": "'Lisbon'"}, predicate="id = 2")
    DeltaTable(table).delete("id = 3")
    write_deltalake(table, pa.table({"id": [5, 6], "city": ["Accra", "Quito"]}), mode="overwrite")
    write_deltalake(table, pa.table({"id": [7], "city": ["Hanoi"]}), mode="append")
    DeltaTable(table).delete("id = 5")
    (table / "abandoned-write.parquet").write_bytes(b"an uncommitted write")
    now = dt.datetime.now(dt.timezone.utc)
    _redate_delta_log(table, lambda version, head: now - dt.timedelta(hours=12, days=3 * (head - version)))
    os.utime(table / "abandoned-write.parquet", (now.timestamp() - 2 * 86400,) * 2)
    config = {
        "name": name,
        "format": "delta",
        "storage_namespace": table.as_uri(),
        "max_delete_fraction": 0.9,
        "mode": "dry_run",
    }
    return DemoRepository(config, now.date())


def _redate_delta_log(table: Path, stamp: Callable[[int, int], dt.datetime]) -> None:
    """Move a Delta table's history in time: commit and action timestamps, and its files' modification times."""
    from urllib.parse import unquote

    commits = sorted((table / "_delta_log").glob("*.json"))
    for log_file in commits:
        millis = int(stamp(int(log_file.name[:20]), int(commits[-1].name[:20])).timestamp() * 1000)
        actions = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
        touched = [log_file]
        for action in actions:
            for kind, field in (
                ("commitInfo", "timestamp"),
                ("add", "modificationTime"),
                ("remove", "deletionTimestamp"),
            ):
                if kind in action:
                    action[kind][field] = millis
            touched += [table / unquote(action[kind]["path"]) for kind in ("add", "cdc") if kind in action]
        log_file.write_text("".join(json.dumps(action) + "\n" for action in actions))
        for path in touched:
            os.utime(path, (millis / 1000, millis / 1000))


def file_catalog_demo(directory: Path) -> DemoRepository:
    """An IOx-style catalog in SQLite: Parquet files listed in a `parquet_file` table, some
    soft-deleted three days ago (past the 48 h row cutoff), some yesterday, and files no row
    names, old and new, dated around the 720 h object cutoff."""
    import sqlite3

    name = "iox-catalog"
    namespace = directory / "lake" / name
    database = directory / "lake" / "iox-catalog.db"
    now = dt.datetime.now(dt.timezone.utc)
    database.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(database)
    connection.execute(
        "CREATE TABLE parquet_file (id INTEGER PRIMARY KEY, namespace_id INTEGER, table_id INTEGER, "
        "object_store_id TEXT NOT NULL, to_delete TEXT, created_at TEXT)"
    )
    rows = []
    for n in range(1, 41):
        soft_deleted = {0: now - dt.timedelta(days=3), 1: now - dt.timedelta(days=1)}.get(n % 4)
        rows.append(
            (
                n,
                1,
                n % 3,
                f"file-{n:04d}",
                soft_deleted.isoformat() if soft_deleted else None,
                (now - dt.timedelta(days=40)).isoformat(),
            )
        )
    connection.executemany("INSERT INTO parquet_file VALUES (?, ?, ?, ?, ?, ?)", rows)
    connection.commit()
    connection.close()
    ages = {f"1/{table}/{store_id}.parquet": 40 for _, _, table, store_id, _, _ in rows}
    ages.update(
        {"1/0/compacted-away-0001.parquet": 45, "1/1/compacted-away-0002.parquet": 25, "1/2/just-written.parquet": 2}
    )
    for key, days in ages.items():
        path = namespace / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"PAR1 " + key.encode())
        os.utime(path, (now.timestamp() - days * 86400,) * 2)
    config = {
        "name": name,
        "format": "file-catalog",
        "storage_namespace": namespace.as_uri(),
        "catalog": {
            "url": f"sqlite:///{database}",
            "table": "parquet_file",
            "path": "{namespace_id}/{table_id}/{object_store_id}.parquet",
            "to_delete": "to_delete",
            "created_at": "created_at",
        },
        "row_cutoff_hours": 48,
        "object_cutoff_hours": 720,
        "max_delete_fraction": 0.9,
        "mode": "dry_run",
    }
    return DemoRepository(config, now.date())


# One builder per demo repository; the demo collects each in this order.
DEMO_BUILDERS: list[Callable[[Path], DemoRepository]] = [lakefs_demo, iceberg_demo, delta_demo, file_catalog_demo]


def build_demo(directory: Path) -> tuple[Path, list[DemoRepository]]:
    """Write every demo repository and the shared gc.yaml; returns the gc.yaml path."""
    directory = directory.resolve()
    if (directory / "lake").exists():
        shutil.rmtree(directory / "lake")
    directory.mkdir(parents=True, exist_ok=True)
    repositories = [build(directory) for build in DEMO_BUILDERS]
    config = {
        "state_dir": str(directory / ".gc_state"),
        "partitions_start_date": "2022-01-01",
        "repositories": [repo.config for repo in repositories],
    }
    config_path = directory / "gc.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return config_path, repositories


def run_demo(directory: Path, verbose: bool = False) -> int:
    started = time.monotonic()
    # The demo's history is simulated by back-dated modification times on files written
    # seconds ago; on a real lake their ctime would (rightly) keep them young.
    os.environ[TRUST_MTIME_ENV_VAR] = "1"
    config_path, repositories = build_demo(directory)
    print(f"demo lake written under {directory.resolve()} (config {config_path})", flush=True)
    status = 0
    with quiet(log_path(directory.resolve() / ".gc_state" / "logs", "demo"), verbose):
        for repo in repositories:
            repo_started = time.monotonic()
            print(f"{repo.config['name']} ({repo.config['format']}), partition {repo.gc_date}:", flush=True)
            with Progress() as progress:
                outcome = run_partition(
                    str(config_path), repo.config["name"], repo.gc_date, mode="dry_run", progress=progress
                )
            print(format_summary(outcome, time.monotonic() - repo_started), flush=True)
            print(json.dumps(outcome.summary), flush=True)
            status = status or (0 if outcome.success else 1)
    print(f"demo finished in {time.monotonic() - started:.1f}s", flush=True)
    return status
