"""Benchmark: a lake of Delta and Iceberg tables, lakeFS repositories and file catalogs
dry-run in one `gc-assets run --all`, against each format's own loop.

For each count N, N Delta tables of about `--files` data files (bench.fleet's, made once with
delta-rs) and N/2 Iceberg tables of `--iceberg-files` data files each (made once with pyiceberg
in one SQLite catalog: one file per append, then a delete of a quarter of the rows, so the
older snapshots' files expire) are found by two `discover:` entries, and N/10 lakeFS graph
exports of bench.run's 2k shape and N/10 file catalogs of bench.catalog's 2k size (made once)
are configured. In one run the bench times:
- the loops a user would write: delta-rs's `vacuum(dry_run=True, full=True)` over every Delta
  table, and for every Iceberg table (pyiceberg removes no orphans) the files of its table
  directory that its current snapshot does not need, as pyiceberg's scan planning finds them;
  and for every lakeFS repository bench.run's scandir reference (its retention written apart
  from gc_assets, the live set read with pyarrow, the namespace walked with os.scandir), and for
  every file catalog bench.catalog's brute-force reference (sqlite3 and os.scandir);
- `gc-assets run --config F --all --mode dry-run --json` in a subprocess, cold, and its Spark jobs.
Every table's candidates must equal its loop's; a count that disagrees fails the bench. The Spark
jobs of a set do not grow with any of its formats (each format's repositories are read together):
the bench prints them for each count, and fails when they differ between counts.

With `--delete`, the same lake is deleted by `run --all --mode delete` (measure_delete): every
repository's removed files must be its loop's candidates, and the Spark jobs less the sweep's
chunks (two jobs each: a chunk holds CHUNK_OBJECTS objects, however many repositories they
belong to) must not differ between counts.

Usage: python -m bench.mixed_lake [--tables 20,40] [--files 270] [--iceberg-files 40] [--lakefs-per 10]
       [--catalogs-per 10] [--work-dir bench/results] [--delete]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from bench.catalog import CATALOG_SIZES, catalog_repository, prepare_catalog, reference
from bench.fleet import fleet_run, fleet_tables, require_delta_rs_candidates, warm
from bench.run import RULES, SIZES, delta_rs_vacuum, prepare_lake, scandir_baseline
from gc_assets.core.time import end_of_day
from gc_assets.stores.local import TRUST_MTIME_ENV_VAR
from gc_assets.sweep.sweeper import CHUNK_OBJECTS_ENV, chunk_objects

NAMESPACE = "bench"  # the Iceberg namespace of the bench's catalog
HIDDEN = ("_", ".")  # Iceberg's orphan-file rule: a hidden name is never an orphan
LAKEFS_SHAPE = SIZES["2k"]
CHUNK_OBJECTS = chunk_objects(2)  # --delete: objects per sweep chunk (the default on 2 cores)


def iceberg_catalog(work: Path) -> dict[str, str]:
    """The bench's SQLite catalog's properties (pyiceberg's; gc.yaml's add its name)."""
    (work / "iceberg").mkdir(parents=True, exist_ok=True)
    return {
        "type": "sql",
        "uri": f"sqlite:///{work / 'iceberg' / 'catalog.db'}",
        "warehouse": (work / "iceberg").as_uri(),
    }


def iceberg_tables(work: Path, tables: int, files: int) -> list[str]:
    """N tables `bench.t<N>_<i>` of `files` one-row appends and a delete of a quarter of the rows;
    made once, reused by every later run."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("bench", **iceberg_catalog(work))
    catalog.create_namespace_if_not_exists(NAMESPACE)
    names = [f"{NAMESPACE}.t{tables}_{i:04d}" for i in range(tables)]
    schema = pa.schema([("id", pa.int64())])
    for name in names:
        if catalog.table_exists(name):
            continue
        location = (work / "iceberg" / name.replace(".", "/")).as_uri()
        table = catalog.create_table(name, schema=schema, location=location)
        for row in range(files):
            table.append(pa.table({"id": [row]}, schema=schema))
        table.delete(f"id < {files // 4}")
    return names


def pyiceberg_loop(work: Path, names: list[str]) -> tuple[float, dict[str, set[str]]]:
    """Seconds, and each table's files its current snapshot does not need, by pyiceberg: the
    loop a user of pyiceberg writes, and the oracle of the run's Iceberg candidates."""
    from pyiceberg.catalog import load_catalog

    found = {}
    started = time.perf_counter()
    catalog = load_catalog("bench", **iceberg_catalog(work))
    for name in names:
        table = catalog.load_table(name)
        snapshot = table.current_snapshot()
        manifests = snapshot.manifests(table.io)
        needed = {snapshot.manifest_list, table.metadata_location}
        needed |= {manifest.manifest_path for manifest in manifests}
        needed |= {task.file.file_path for task in table.scan().plan_files()}
        needed |= {entry.metadata_file for entry in table.metadata.metadata_log}
        root = Path(table.metadata.location.removeprefix("file://"))
        files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
        kept = {Path(uri.removeprefix("file://")).relative_to(root).as_posix() for uri in needed}
        found[name] = {f for f in files - kept if not any(part.startswith(HIDDEN) for part in f.split("/"))}
    return time.perf_counter() - started, found


def lakefs_exports(work: Path, count: int) -> dict[str, tuple[Path, Path]]:
    """`count` lakeFS graph exports of LAKEFS_SHAPE, made once: name -> (namespace, export)."""
    return {f"lakefs_{i:03d}": prepare_lake(work, f"mixed-{i:03d}", LAKEFS_SHAPE)[:2] for i in range(count)}


def scandir_loop(exports: dict[str, tuple[Path, Path]]) -> tuple[float, dict[str, set[str]]]:
    """Seconds, and each lakeFS repository's candidates by bench.run's scandir reference, as of
    the end of today (the run's date)."""
    as_of = end_of_day(dt.date.today())
    started = time.perf_counter()
    found = {
        name: scandir_baseline(namespace, export, RULES, as_of)[1] for name, (namespace, export) in exports.items()
    }
    return time.perf_counter() - started, found


def file_catalogs(work: Path, count: int) -> dict[str, tuple[Path, Path]]:
    """`count` file catalogs of bench.catalog's 2k size, made once: name -> (database, namespace)."""
    return {f"catalog_{i:03d}": prepare_catalog(work, f"mixed-{i:03d}", CATALOG_SIZES["2k"])[:2] for i in range(count)}


def reference_loop(catalogs: dict[str, tuple[Path, Path]]) -> tuple[float, dict[str, set[str]]]:
    """Seconds, and each file catalog's candidates by bench.catalog's brute-force reference."""
    started = time.perf_counter()
    found = {name: reference(database, namespace)[1] for name, (database, namespace) in catalogs.items()}
    return time.perf_counter() - started, found


def mixed_config(
    delta_under: Path,
    work: Path,
    exports: dict[str, tuple[Path, Path]],
    catalogs: dict[str, tuple[Path, Path]],
    name: str = "gc",
) -> Path:
    """`<work>/<name>.yaml`, whose two `discover:` entries find the Delta tables below `delta_under`
    and the Iceberg tables of the catalog in `work`, and an entry for each lakeFS export and file
    catalog; its state directory `<work>/state-<name>`, emptied."""
    settings = {
        "rules": {"default_retention_days": 0},
        "allow_unsafe_retention": True,
        "min_object_age_hours": 0,  # the tables were just made
        "allow_unsafe_min_age": True,
    }
    delta = {"discover": {"format": "delta", "under": delta_under.as_uri()}, **settings}
    catalog = {**iceberg_catalog(work), "name": "bench"}
    iceberg = {"discover": {"format": "iceberg", "catalog": catalog, "namespaces": [NAMESPACE]}, **settings}
    lakefs = [
        {
            "name": name,
            "format": "lakefs-export",
            "storage_namespace": namespace.as_uri(),
            "source": export.as_uri(),
            "rules": RULES,
        }
        for name, (namespace, export) in exports.items()
    ]
    path, state = work / f"{name}.yaml", work / f"state-{name}"
    shutil.rmtree(state, ignore_errors=True)
    document = {"state_dir": str(state), "partitions_start_date": "2022-01-01"}
    listed = [catalog_repository(name, database, namespace) for name, (database, namespace) in catalogs.items()]
    path.write_text(yaml.safe_dump({**document, "repositories": [delta, iceberg, *lakefs, *listed]}))
    return path


def measure(
    work: Path, tables: int, files: int, iceberg_files: int, lakefs_per: int, catalogs_per: int
) -> dict[str, Any]:
    paths = fleet_tables(work, tables, files)
    iceberg_work = work / f"mixed-{tables}"
    names = iceberg_tables(iceberg_work, tables // 2, iceberg_files)
    exports = lakefs_exports(work, tables // lakefs_per)
    catalogs = file_catalogs(work, tables // catalogs_per)
    namespaces = [*(namespace for namespace, _ in exports.values()), *(ns for _, ns in catalogs.values())]
    warm(paths + [iceberg_work / "iceberg", *namespaces])
    started = time.perf_counter()
    expected = {path.name: delta_rs_vacuum(path)[1] for path in paths}
    delta_rs_seconds = time.perf_counter() - started
    pyiceberg_seconds, by_pyiceberg = pyiceberg_loop(iceberg_work, names)
    expected |= by_pyiceberg
    scandir_seconds, by_scandir = scandir_loop(exports)
    expected |= by_scandir
    reference_seconds, by_reference = reference_loop(catalogs)
    expected |= by_reference
    config = mixed_config(paths[0].parent, iceberg_work, exports, catalogs)
    run = fleet_run(config)
    require_delta_rs_candidates(expected, run.found)
    return {
        "delta": tables,
        "iceberg": len(names),
        "lakefs": len(exports),
        "catalogs": len(catalogs),
        "candidates": sum(map(len, expected.values())),
        "delta_rs_s": delta_rs_seconds,
        "pyiceberg_s": pyiceberg_seconds,
        "scandir_s": scandir_seconds,
        "reference_s": reference_seconds,
        "run_s": run.seconds,
        "spark_jobs": run.jobs,
        "events": run.events,
        "events_s": run.events_seconds,
        "phases": run.phases,
        "cpu": run.cpu,
    }


def linked(source: Path, copy: Path) -> Path:
    """A copy of the tree `source` whose files are hard links, but for SQLite databases (copied:
    a sweep changes them in place). A sweep of the copy removes files of the copy only."""

    def one(src: str, dst: str) -> object:
        return shutil.copy2(src, dst) if src.endswith(".db") else os.link(src, dst)

    shutil.rmtree(copy, ignore_errors=True)
    return Path(shutil.copytree(source, copy, copy_function=one))


def files_under(root: Path) -> set[str]:
    """Every file below `root` as a key, but gc_assets' own (`_gc`)."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and not p.name.startswith("_gc")}


def measure_delete(
    work: Path, tables: int, files: int, iceberg_files: int, lakefs_per: int, catalogs_per: int
) -> dict[str, Any]:
    """The mixed lake deleted by `gc-assets run --all --mode delete`, cold: the Delta tables,
    lakeFS namespaces and file catalogs on copies of hard links (their databases copied), the
    Iceberg tables (whose metadata names absolute paths) in place, put back from such a copy
    afterwards. The files each repository lost must be its loop's candidates, taken on the
    copies before the run. The sweep's chunks are CHUNK_OBJECTS objects (two Spark jobs each):
    the jobs less those of the chunks must not grow with the lake."""
    from gc_assets.sweep.set_sweep import packed

    paths = fleet_tables(work, tables, files)
    iceberg_work = work / f"mixed-{tables}"
    names = iceberg_tables(iceberg_work, tables // 2, iceberg_files)
    copy = work / f"mixed-delete-{tables}"
    delta = [linked(path, copy / "delta" / path.name) for path in paths]
    exports = {
        name: (linked(namespace, copy / "lakefs" / name), copy / "lakefs" / name / export.relative_to(namespace))
        for name, (namespace, export) in lakefs_exports(work, tables // lakefs_per).items()
    }
    catalogs = {
        name: (Path(shutil.copy2(database, copy / f"{name}.db")), linked(namespace, copy / "catalogs" / name))
        for name, (database, namespace) in file_catalogs(work, tables // catalogs_per).items()
    }
    warehouse = iceberg_work / "iceberg"
    pristine = linked(warehouse, iceberg_work / "iceberg-pristine")
    try:
        roots = {path.name: path for path in delta} | {name: ns for name, (ns, _) in exports.items()}
        roots |= {name: namespace for name, (_, namespace) in catalogs.items()}
        expected = {path.name: delta_rs_vacuum(path)[1] for path in delta}
        expected |= pyiceberg_loop(iceberg_work, names)[1]
        expected |= scandir_loop(exports)[1] | reference_loop(catalogs)[1]
        roots |= iceberg_roots(iceberg_work, names)
        before = {name: files_under(root) for name, root in roots.items()}
        os.environ[CHUNK_OBJECTS_ENV] = str(CHUNK_OBJECTS)
        config = mixed_config(copy / "delta", iceberg_work, exports, catalogs, name="delete")
        run = fleet_run(config, mode="delete")
        lost = {name: before[name] - files_under(root) for name, root in roots.items()}
    finally:
        os.environ.pop(CHUNK_OBJECTS_ENV, None)
        shutil.rmtree(warehouse)
        pristine.rename(warehouse)
    differ = sorted(name for name in expected if lost.get(name) != expected[name])
    if differ:
        raise SystemExit(f"mixed lake of {tables} deleted: the files removed differ from the loops' for {differ[:5]}")
    chunks = len(packed({name: len(found) for name, found in expected.items() if found}, CHUNK_OBJECTS))
    return {
        "delta": tables,
        "iceberg": len(names),
        "lakefs": len(exports),
        "catalogs": len(catalogs),
        "deleted": sum(map(len, lost.values())),
        "run_s": run.seconds,
        "spark_jobs": run.jobs,
        "chunks": chunks,
        "events": run.events,
        "events_s": run.events_seconds,
        "phases": run.phases,
        "cpu": run.cpu,
    }


def iceberg_roots(work: Path, names: list[str]) -> dict[str, Path]:
    """Each Iceberg table's directory, from its metadata."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("bench", **iceberg_catalog(work))
    return {name: Path(catalog.load_table(name).metadata.location.removeprefix("file://")) for name in names}


def _table(header: str, columns: int, rows: list[str], largest: dict[str, Any]) -> list[str]:
    """A Markdown table of `rows` under `header`, then the phases of the largest count's run and
    where its processor time went."""
    phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in largest["phases"].items())
    return [header, "|---:" * columns + "|", *rows, f"phases at the largest count: {phases}", largest["cpu"].line()]


def delete_report(rows: list[dict[str, Any]]) -> list[str]:
    header = (
        "| Delta tables | Iceberg tables | lakeFS repositories | file catalogs | files deleted | run --all --mode "
        "delete, cold (s) | Spark jobs | sweep chunks | jobs less two a chunk | Dagster events (s) |"
    )
    lines = [
        f"| {r['delta']:,} | {r['iceberg']:,} | {r['lakefs']:,} | {r['catalogs']:,} | {r['deleted']:,} "
        f"| {r['run_s']:.1f} | {r['spark_jobs']} | {r['chunks']} | {r['spark_jobs'] - 2 * r['chunks']} "
        f"| {r['events']:,} ({r['events_s']:.1f}) |"
        for r in rows
    ]
    return _table(header, 10, lines, rows[-1])


def report(rows: list[dict[str, Any]]) -> list[str]:
    header = (
        "| Delta tables | Iceberg tables | lakeFS repositories | file catalogs | candidates | delta-rs loop (s) "
        "| pyiceberg loop (s) | lakeFS scandir loop (s) | catalog reference loop (s) | run --all, cold (s) "
        "| ratio to the loops | Spark jobs | Dagster events (s) |"
    )
    lines = []
    for r in rows:
        loops = r["delta_rs_s"] + r["pyiceberg_s"] + r["scandir_s"] + r["reference_s"]
        lines.append(
            f"| {r['delta']:,} | {r['iceberg']:,} | {r['lakefs']:,} | {r['catalogs']:,} | {r['candidates']:,} "
            f"| {r['delta_rs_s']:.2f} | {r['pyiceberg_s']:.2f} | {r['scandir_s']:.2f} | {r['reference_s']:.2f} "
            f"| {r['run_s']:.1f} | {r['run_s'] / loops:.1f}× "
            f"| {r['spark_jobs']} | {r['events']:,} ({r['events_s']:.1f}) |"
        )
    return _table(header, 13, lines, rows[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="20,40", help="Delta table counts (half as many Iceberg tables)")
    parser.add_argument("--files", default=270, type=int, help="data files per Delta table")
    parser.add_argument("--iceberg-files", default=40, type=int, help="data files per Iceberg table")
    parser.add_argument("--lakefs-per", default=10, type=int, help="Delta tables per lakeFS repository")
    parser.add_argument("--catalogs-per", default=10, type=int, help="Delta tables per file catalog")
    parser.add_argument("--work-dir", default="bench/results", type=Path)
    parser.add_argument("--delete", action="store_true", help="delete copies of the lake instead of a dry run")
    args = parser.parse_args()
    os.environ[TRUST_MTIME_ENV_VAR] = "1"  # the lakeFS lakes back-date their objects' modification times
    work = (args.work_dir / "fleet").absolute()
    sizes = [int(n) for n in args.tables.split(",")]
    counts = (args.files, args.iceberg_files, args.lakefs_per, args.catalogs_per)
    rows = [(measure_delete if args.delete else measure)(work, n, *counts) for n in sizes]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = delete_report(rows) if args.delete else report(rows)
    print("\n".join([*lines, f"load average (1, 5, 15 min) at the end: {load}"]), flush=True)
    jobs = {row["delta"]: row["spark_jobs"] - 2 * row.get("chunks", 0) for row in rows}
    if len(set(jobs.values())) > 1:
        raise SystemExit(f"the Spark jobs grew with the lake: {jobs} (Delta tables: jobs, less two a chunk)")


if __name__ == "__main__":
    main()
