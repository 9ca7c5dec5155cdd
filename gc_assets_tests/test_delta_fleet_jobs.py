"""Many tables marked at once (mark/delta_tables, mark/iceberg_tables, mark/sets), beyond
test_delta_fleet's warehouse: the Spark jobs of a set's mark do not grow with its tables, Delta
and Iceberg alike, and tables that share files (shallow clones) keep each other's, against
delta-rs's own answer.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import Row

from gc_assets.core.config import GcConfig, load_config
from gc_assets.core.names import REPO
from gc_assets.mark.delta_tables import mark_tables
from gc_assets.mark.sets import candidates_of, witness_heads
from gc_assets.mark.shared import Referrers
from gc_assets.sources.file_catalog import parse_commit_id
from gc_assets.stores.local import LocalStore
from gc_assets.stores.many import list_many
from gc_assets.stores.state import LocalState
from gc_assets.sweep import together
from gc_assets_tests import delta_tables, iceberg_tables
from gc_assets_tests.cli_runs import run_cli_in_memory
from gc_assets_tests.conftest import jobs_started
from gc_assets_tests.file_catalogs import (
    OBJECT_CUTOFF,
    ROW_CUTOFF_HOURS,
    Catalog,
    catalog_entry,
    random_catalog,
    sqlite_catalog,
    write_file,
    write_objects_of,
)
from gc_assets_tests.file_catalogs import oracle as catalog_oracle
from gc_assets_tests.lakes import LakeOnDisk, export_entry, lake_on_disk, write_config
from gc_assets_tests.oracles import expected_candidates
from gc_assets_tests.test_delta_fleet import _lake
from gc_assets_tests.test_shared_live_set import SOURCES, cloned_warehouse, iceberg_candidates_alone


def test_the_spark_jobs_of_a_fleet_mark_do_not_grow_with_its_tables(spark, tmp_path, monkeypatch):
    """Three tables or twelve, each with two checkpoints and a retention window that needs the
    older one: the same number of Spark jobs, marking and deciding the candidates, and of
    listings of the records of who reaches into them (on an object store, requests)."""
    now = delta_tables.now_utc()
    listed: list[str] = []
    keys = LocalState.keys
    monkeypatch.setattr(LocalState, "keys", lambda state, prefix: listed.append(prefix) or keys(state, prefix))
    counts, listings = {}, {}
    for size in (3, 12):
        root = tmp_path / f"wh{size}"
        for i in range(size):
            built = delta_tables.checkpointed(root / f"t{i:02d}", now)
            (built.path / "junk.parquet").write_bytes(b"untracked")  # an inventory beyond the log
        (tmp_path / f"c{size}").mkdir()
        lake = _lake(root, tmp_path / f"c{size}", 5.5)
        before = jobs_started(spark)
        fleet = mark_tables(spark, lake.repositories, now)
        stores = {name: LocalStore(table.repo.storage_namespace) for name, table in fleet.tables.items()}
        held = spark.createDataFrame([], "repo string, address string")
        listed.clear()
        decided = candidates_of(spark, lake, fleet, now, now, list_many(spark, stores), held, list(fleet.repos))
        listings[size] = listed.count("_reaches/")
        fleet.retained.collect(), decided.live.collect(), decided.frame.collect()
        counts[size] = jobs_started(spark) - before
        assert not fleet.refused and not decided.refused
        assert {row[REPO] for row in fleet.live.collect()} == {repo.name for repo in lake.repositories}
    assert counts[3] == counts[12], counts
    assert listings[3] == listings[12] == 2, listings  # one to record what the mark found, one to read it


def test_the_spark_jobs_of_a_set_of_delta_and_iceberg_tables_do_not_grow_with_its_tables(spark, tmp_path):
    """Two tables of each format or six: the same number of Spark jobs, marking and deciding the
    candidates; each Iceberg table's candidates are pyiceberg's reading of it, each Delta table's
    delta-rs's full vacuum."""
    now = delta_tables.now_utc()
    window = 5
    rules = {"default_retention_days": window}
    counts = {}
    for size in (2, 6):
        root = tmp_path / f"set{size}"
        deltas = [delta_tables.merges(root / "delta" / f"t{i}", now) for i in range(size)]
        icebergs = [_iceberg_table(root, f"i{i}") for i in range(size)]
        repos = [
            {"name": f"t{i}", "format": "delta", "storage_namespace": table.uri, "rules": rules, **UNSAFE}
            for i, table in enumerate(deltas)
        ] + [lake.repo_config(rules=rules) for lake in icebergs]
        lake = load_config(write_config(root / "gc.yaml", repos, root / "state"))
        counts[size], _, found = _decided_as_one_set(spark, lake, now)
        vacuumed = (delta_tables.vacuum_candidates(table, dt.timedelta(days=window)) for table in deltas)
        expected = {
            f"t{i}": {_relative(table, item) for item in items}
            for i, (table, items) in enumerate(zip(deltas, vacuumed))
        }
        expected |= {lake.name: iceberg_candidates_alone(lake, rules, now) for lake in icebergs}
        assert found == expected
        assert all(found.values())
    assert counts[2] == counts[6], counts


UNSAFE = {"allow_unsafe_retention": True}  # a window shorter than Delta's week


def _decided_as_one_set(spark, lake: GcConfig, as_of: dt.datetime) -> tuple[int, list[Row], dict[str, set[str]]]:
    """Every repository of `lake` marked as one set, its listing checked and its candidates
    decided: the Spark jobs that took, the retained commits, and each repository's candidates."""
    before = jobs_started(spark)
    marked = together.mark_set(spark, lake.repositories, as_of)
    stores = {name: LocalStore(repo.storage_namespace) for name, repo in marked.repos.items()}
    held = spark.createDataFrame([], "repo string, address string")
    inventory = list_many(spark, stores)
    assert not marked.inventory_refusals(spark, inventory)
    decided = candidates_of(spark, lake, marked, as_of, as_of, inventory, held, list(marked.repos))
    retained, _, candidates = marked.retained.collect(), decided.live.collect(), decided.frame.collect()
    jobs = jobs_started(spark) - before
    assert not marked.refused and not decided.refused
    found: dict[str, set[str]] = {repo.name: set() for repo in lake.repositories}
    for row in candidates:
        found[row[REPO]].add(row["address"])
    return jobs, retained, found


def _relative(table: delta_tables.BuiltTable, item: str) -> str:
    """A file delta-rs's vacuum names, as a key of `table`."""
    return Path(item).relative_to(table.path).as_posix() if Path(item).is_absolute() else item


def _iceberg_table(root: Path, name: str) -> iceberg_tables.IcebergLake:
    """Three appends and an overwrite, days apart, its files aged: the overwritten ones expire."""
    lake = iceberg_tables.new_lake(root, name)
    for n in range(3):
        with iceberg_tables.clock_at(iceberg_tables.day(n)):
            lake.table().append(iceberg_tables.rows([n]))
    with iceberg_tables.clock_at(iceberg_tables.day(4)):
        lake.table().overwrite(iceberg_tables.rows([9]))
    lake.age_files()
    return lake


def test_a_fleet_keeps_what_another_table_of_it_needs_and_refuses_a_table_whose_referrer_it_did_not_read(
    spark, tmp_path
):
    """Shallow clones name their source's files by absolute URI: in one fleet, each source's
    candidates are delta-rs's minus what its clones' heads need (read by delta-rs from the
    clones' logs), the clones' candidates are delta-rs's own; a fleet that leaves the clones out
    refuses their sources instead of collecting blind."""
    now = delta_tables.now_utc()
    warehouse = cloned_warehouse(tmp_path, now, 20261126)
    lake = load_config(write_config(tmp_path / "gc.yaml", warehouse.repos, tmp_path / "state"))
    own, needs = warehouse.own, warehouse.needs
    no_holds = spark.createDataFrame([], "repo string, address string")

    def fleet_candidates(repositories) -> tuple[dict[str, set[str]], dict[str, str]]:
        fleet = mark_tables(spark, repositories, now)
        stores = {name: LocalStore(table.repo.storage_namespace) for name, table in fleet.tables.items()}
        decided = candidates_of(spark, lake, fleet, now, now, list_many(spark, stores), no_holds, list(fleet.repos))
        refused = decided.refused
        by_repo: dict[str, set[str]] = {name: set() for name in fleet.tables if name not in refused}
        for row in decided.frame.collect():
            by_repo[row[REPO]].add(row["address"])
        return by_repo, {**fleet.refused, **refused}

    found, refused = fleet_candidates(lake.repositories)

    assert not refused, refused
    assert found == {name: own[name] - needs.get(name, set()) for name in warehouse.tables}

    found, refused = fleet_candidates([lake.repository(name) for name in SOURCES])

    assert set(refused) == {"overwrites", "updates"}, refused
    assert "overwrites-0" in refused["overwrites"] and "not a table of this run" in refused["overwrites"]
    assert found == {"merges": own["merges"]}


@dataclass
class _ExportsAndCatalogs:
    """A gc.yaml of `size` lakeFS exports (x0, x1, ...) and as many SQLite file catalogs (c0, ...)."""

    config: Path
    exports: list[LakeOnDisk]
    catalogs: list[Catalog]
    roots: dict[str, Path]  # each catalog's objects

    def expected(self, as_of: dt.datetime, states: dict[str, str], listings: dict[str, dict]) -> dict[str, set[str]]:
        """Each export's candidates by the brute-force oracle, each catalog's by IOx's two cleanups
        evaluated literally at the row cutoff of the state its mark read (`states`)."""
        found = {
            f"x{i}": expected_candidates(export.lake, export.namespace.as_uri(), export.rules, as_of, as_of)
            for i, export in enumerate(self.exports)
        }
        return found | {
            name: catalog_oracle(
                catalog.rows,
                listings[name],
                parse_commit_id(states[name])[0] - dt.timedelta(hours=ROW_CUTOFF_HOURS),
                as_of - OBJECT_CUTOFF,
            ).candidates
            for name, catalog in zip(self.roots, self.catalogs)
        }


def _exports_and_catalogs(root: Path, sizes: tuple[int, ...]) -> tuple[dict[int, _ExportsAndCatalogs], dt.datetime]:
    """A lake of each size, and an as-of time at which every catalog's objects are old enough."""
    catalogs = {
        size: [random_catalog(100 * size + i, 60, delta_tables.now_utc()) for i in range(size)] for size in sizes
    }
    roots = {size: {f"c{i}": root / f"set{size}" / f"c{i}" for i in range(size)} for size in sizes}
    as_of = max(
        write_objects_of(
            [
                (catalog, partial(write_file, roots[size][f"c{i}"]))
                for size in sizes
                for i, catalog in enumerate(catalogs[size])
            ],
            OBJECT_CUTOFF,
        )
    )
    lakes = {}
    for size in sizes:
        folder = root / f"set{size}"
        exports = [lake_on_disk(folder / "exports", f"x{i}", churn=10, seed=size + i) for i in range(size)]
        repos = [export_entry(f"x{i}", lake.namespace.as_uri()) for i, lake in enumerate(exports)]
        repos += [
            catalog_entry(name, path.as_uri(), sqlite_catalog(folder / f"{name}.db", catalog))
            for (name, path), catalog in zip(roots[size].items(), catalogs[size])
        ]
        config = write_config(folder / "gc.yaml", repos, folder / "state")
        lakes[size] = _ExportsAndCatalogs(config, exports, catalogs[size], roots[size])
    return lakes, as_of


def test_the_spark_jobs_of_a_set_of_lakefs_exports_and_file_catalogs_do_not_grow_with_them(spark, tmp_path):
    """Two lakeFS exports and two SQLite file catalogs, or four of each, in one set: the same number
    of Spark jobs, marking, checking each catalog's listing against its clock and deciding the
    candidates; each export's candidates are the brute-force oracle's, each catalog's IOx's two
    cleanups evaluated literally."""
    lakes, as_of = _exports_and_catalogs(tmp_path, (2, 4))
    counts = {}
    for size, lake in lakes.items():
        listings = {name: _listing(path) for name, path in lake.roots.items()}
        counts[size], retained, found = _decided_as_one_set(spark, load_config(lake.config), as_of)
        states = {row[REPO]: row["commit_id"] for row in retained if row[REPO].startswith("c")}
        assert found == lake.expected(as_of, states, listings)
        assert all(found.values())
    assert counts[2] == counts[4], counts


def test_deleting_a_set_of_lakefs_exports_and_file_catalogs_runs_the_same_spark_jobs_for_twice_as_many(spark, tmp_path):
    """`run --all --mode delete` over two lakeFS exports and two SQLite file catalogs, then over four
    of each: the same number of Spark jobs from the mark to the receipts (re-validation, each
    catalog's cleanup and its rows still named included), and each repository's deleted objects
    exactly its oracle's candidates, every other object left."""
    lakes, as_of = _exports_and_catalogs(tmp_path, (2, 4))
    counts = {}
    for size, lake in lakes.items():
        namespaces = {f"x{i}": export.namespace for i, export in enumerate(lake.exports)} | lake.roots
        listings = {name: _listing(path) for name, path in namespaces.items()}
        before = jobs_started(spark)
        done = run_cli_in_memory(
            "run", "--config", str(lake.config), "--all", "--as-of", as_of.isoformat(), "--mode", "delete", "--json"
        )
        counts[size] = jobs_started(spark) - before
        assert done.returncode == 0, done.stderr[-3000:]
        summaries = {
            s["repo"]: s for s in (json.loads(line) for line in done.stdout.splitlines() if line.startswith("{"))
        }
        states = {
            name: pq.read_table(summaries[name]["outputs"]["retained_commits"]).column("commit_id")[0].as_py()
            for name in lake.roots
        }
        expected = lake.expected(as_of, states, listings)
        for name, namespace in namespaces.items():
            receipts = pq.read_table(summaries[name]["outputs"]["deletion_receipts"]).to_pylist()
            deleted = {r["address"] for r in receipts if r["action"] == "deleted"}
            assert deleted == expected[name] and deleted, name
            left = {key for key in _listing(namespace) if not key.startswith("_gc")}
            assert left == {key for key in listings[name] if not key.startswith("_gc")} - deleted, name
    assert counts[2] == counts[4], counts


def _listing(root: Path) -> dict[str, dt.datetime]:
    """Every file under `root` by key, with its modification time."""
    return {
        path.relative_to(root).as_posix(): dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)
        for path in root.rglob("*")
        if path.is_file()
    }


def test_the_witness_of_a_set_of_delta_and_iceberg_tables_reads_on_half_the_cores(spark, tmp_path):
    """The witness runs beside the run's phases (sweep.together): its reads of both formats' heads
    take at most half the cores, so that the phases' own jobs keep the rest; every head is read."""
    now = delta_tables.now_utc()
    deltas = [delta_tables.merges(tmp_path / "delta" / f"t{i}", now) for i in range(2)]
    icebergs = [_iceberg_table(tmp_path, f"i{i}") for i in range(2)]
    repos = [
        {"name": f"t{i}", "format": "delta", "storage_namespace": table.uri, **UNSAFE} for i, table in enumerate(deltas)
    ] + [lake.repo_config() for lake in icebergs]
    lake = load_config(write_config(tmp_path / "gc.yaml", repos, tmp_path / "state"))
    marked = together.mark_set(spark, lake.repositories, now)
    width = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "4")  # a session of four cores
    try:
        witness = witness_heads(spark, Referrers.read(lake), marked, list(marked.repos))
        assert witness.rdd.getNumPartitions() == 2
        assert {row[REPO] for row in witness.select(REPO).distinct().collect()} == set(marked.repos)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", width)
