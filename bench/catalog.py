"""Benchmark of format file-catalog: an IOx-style `parquet_file` table in SQLite and its namespace.

Most rows are soft-deleted long ago and their objects are already gone (as a catalog looks
after years of compaction); the rest are in use, each with its file, and some files no row
names are left over. The reference is a brute-force pass in one process (sqlite3 and
os.scandir); its candidates and removed rows must equal the graph's.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow.parquet as pq

CATALOG_SIZES = {"2k": 2_000, "100k": 100_000, "1M": 1_000_000}
IN_USE_FRACTION = 10  # one row in ten is in use
STRAYS_PER_IN_USE = 10  # one stray file per ten files in use
PATH = "{namespace_id}/{table_id}/{object_store_id}.parquet"


@dataclass
class CatalogResult:
    size: str
    rows: int
    files: int
    generate_seconds: float
    graph_seconds: float
    steps: dict[str, float]
    reference_seconds: float
    candidates: int
    removed_rows: int
    agree: bool
    load_average: list[float] = field(default_factory=list)


def _key(row_id: int) -> str:
    return f"{row_id % 7}/{row_id % 97}/{row_id:012d}.parquet"


def prepare_catalog(work: Path, label: str, rows: int) -> tuple[Path, Path, float]:
    """The table and the namespace (cached: a dry run changes neither)."""
    root = work / "catalogs" / label
    database, namespace = root / "catalog.db", root / "namespace"
    if (root / "_DONE").exists():
        return database, namespace, 0.0
    started = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    database.unlink(missing_ok=True)
    old = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=60)).timestamp()
    deleted_at = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=10)).strftime("%Y-%m-%d %H:%M:%S")
    connection = sqlite3.connect(database)
    connection.execute(
        "CREATE TABLE parquet_file (id INTEGER PRIMARY KEY, namespace_id INTEGER, table_id INTEGER, "
        "object_store_id TEXT, to_delete TEXT)"
    )
    connection.executemany(
        "INSERT INTO parquet_file VALUES (?, ?, ?, ?, ?)",
        ((i, i % 7, i % 97, f"{i:012d}", None if i % IN_USE_FRACTION == 0 else deleted_at) for i in range(1, rows + 1)),
    )
    connection.commit()
    connection.close()
    in_use = [i for i in range(1, rows + 1) if i % IN_USE_FRACTION == 0]
    keys = [_key(i) for i in in_use] + [
        f"{n % 7}/{n % 97}/stray-{n:09d}.parquet" for n in range(len(in_use) // STRAYS_PER_IN_USE)
    ]
    for key in keys:
        path = namespace / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        os.utime(path, (old, old))
    (root / "_DONE").write_text("")
    return database, namespace, time.perf_counter() - started


def catalog_repository(name: str, database: Path, namespace: Path) -> dict[str, Any]:
    return {
        "name": name,
        "format": "file-catalog",
        "storage_namespace": namespace.as_uri(),
        "catalog": {"url": f"sqlite:///{database}", "table": "parquet_file", "path": PATH, "to_delete": "to_delete"},
        "max_delete_fraction": 0.9,
    }


def reference(database: Path, namespace: Path) -> tuple[float, set[str], int]:
    """Brute force in one process: removed rows and candidates (objects no remaining row names, all old)."""
    started = time.perf_counter()
    cutoff = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=48)).strftime("%Y-%m-%d %H:%M:%S")
    connection = sqlite3.connect(database)
    live, removed = set(), 0
    for namespace_id, table_id, store_id, to_delete in connection.execute(
        "SELECT namespace_id, table_id, object_store_id, to_delete FROM parquet_file"
    ):
        if to_delete is not None and to_delete < cutoff:
            removed += 1
        else:
            live.add(f"{namespace_id}/{table_id}/{store_id}.parquet")
    connection.close()
    found: set[str] = set()
    stack = [namespace]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                else:
                    found.add(Path(entry.path).relative_to(namespace).as_posix())
    return time.perf_counter() - started, found - live, removed


def bench_catalog(
    work: Path, label: str, run_graph: Callable[..., Any], write_config: Callable[..., Path]
) -> CatalogResult:
    database, namespace, generate_seconds = prepare_catalog(work, label, CATALOG_SIZES[label])
    name = f"catalog-{label.lower()}"
    state = work / "state" / name
    config = write_config(work / "config" / f"{name}.yaml", state, [catalog_repository(name, database, namespace)])
    graph = run_graph(config, name, dt.datetime.now(dt.timezone.utc).date())
    if not graph.success:
        raise RuntimeError(f"file catalog {label}: {graph.error}")
    reference_seconds, expected, removed = reference(database, namespace)
    found = {
        r["address"]
        for r in pq.read_table(graph.summary["outputs"]["orphan_candidates"], columns=["address"]).to_pylist()
    }
    rows_receipted = graph.summary["receipts"].get("would_delete_row", 0)
    return CatalogResult(
        label,
        CATALOG_SIZES[label],
        int(graph.summary["inventory_objects"]),
        generate_seconds,
        graph.seconds,
        graph.steps,
        reference_seconds,
        len(found),
        rows_receipted,
        found == expected and rows_receipted == removed,
        list(os.getloadavg()),
    )


def format_catalog_table(results: list[CatalogResult]) -> str:
    if not results:
        return ""
    lines = [
        "| file catalog (SQLite) | " + " | ".join(r.size for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    for step in dict.fromkeys(step for r in results for step in r.steps):
        lines.append(f"| {step} (s) | " + " | ".join(f"{r.steps.get(step, 0):.1f}" for r in results) + " |")
    rows = [
        ("rows / files", lambda r: f"{r.rows:,} / {r.files:,}"),
        ("**total (s)**", lambda r: f"**{r.graph_seconds:.1f}**"),
        ("rows per second", lambda r: f"{r.rows / r.graph_seconds:,.0f}"),
        ("reference, one process (s)", lambda r: f"{r.reference_seconds:.1f}"),
        ("candidates / rows removed", lambda r: f"{r.candidates:,} / {r.removed_rows:,}"),
        ("agrees with the reference", lambda r: "yes" if r.agree else "**NO**"),
        ("load average (1, 5, 15 min)", lambda r: ", ".join(f"{x:.1f}" for x in r.load_average)),
    ]
    lines += [f"| {label} | " + " | ".join(cell(r) for r in results) + " |" for label, cell in rows]
    return "\n".join(lines)
