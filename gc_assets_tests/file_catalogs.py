"""Random IOx-style file catalogs (a `parquet_file` table and the objects it names) and the
brute-force oracle of what collecting them must do, in plain Python.

Rows are soft-deleted at every age around the row cutoff (and never); objects are written
in two waves either side of the object cutoff; some objects no row names, and some rows
past the cutoff name objects already gone.
"""

from __future__ import annotations

import datetime as dt
import random
import sqlite3
import threading
import time
import uuid
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

PATH = "{namespace_id}/{table_id}/{partition_id}/{object_store_id}.parquet"
COLUMNS = ("id", "namespace_id", "table_id", "partition_id", "object_store_id", "to_delete", "created_at")
ROW_CUTOFF_HOURS = 48.0
# Offsets of soft-delete times from the row cutoff, both sides (None: in use).
DELETE_OFFSETS = [
    dt.timedelta(days=-30),
    dt.timedelta(hours=-10),
    dt.timedelta(hours=-1),
    dt.timedelta(minutes=-3),
    dt.timedelta(minutes=3),
    dt.timedelta(hours=1),
    dt.timedelta(hours=10),
    dt.timedelta(hours=47),
]


@dataclass
class Catalog:
    rows: list[dict[str, Any]]
    old_objects: set[str]  # written before the object cutoff
    young_objects: set[str]  # written after it
    extra: set[str] = field(default_factory=set)  # objects no row names

    def key(self, row: dict[str, Any]) -> str:
        return PATH.format_map(row)


def random_catalog(seed: int, rows: int, now: dt.datetime) -> Catalog:
    """`rows` rows, soft-deleted around now - ROW_CUTOFF_HOURS (or not at all)."""
    rng = random.Random(seed)
    cutoff = now - dt.timedelta(hours=ROW_CUTOFF_HOURS)
    out, old, young = [], set(), set()
    for i in range(1, rows + 1):
        row = {
            "id": i * 3,  # gaps, like a sequence after rollbacks
            "namespace_id": rng.randint(1, 3),
            "table_id": rng.randint(1, 4),
            "partition_id": rng.randint(1, 20),
            "object_store_id": str(uuid.UUID(int=rng.getrandbits(128))),
            "to_delete": None
            if rng.random() < 0.4
            else cutoff + rng.choice(DELETE_OFFSETS) + dt.timedelta(seconds=rng.randint(-20, 20)),
            "created_at": now - dt.timedelta(days=40),
        }
        out.append(row)
        key = PATH.format_map(row)
        if row["to_delete"] is not None and row["to_delete"] < cutoff and rng.random() < 0.3:
            continue  # an object already gone: only a removed row names it
        (old if rng.random() < 0.7 else young).add(key)
    catalog = Catalog(out, old, young)
    for n in range(rows // 5):
        key = f"{rng.randint(1, 3)}/{rng.randint(1, 4)}/{rng.randint(1, 20)}/stray-{n}.parquet"
        catalog.extra.add(key)
        (old if rng.random() < 0.6 else young).add(key)
    return catalog


def write_objects(
    root: Path, catalog: Catalog, object_cutoff: dt.timedelta, put: Optional[Callable[[str], None]] = None
) -> None:
    """The old wave, a pause longer than the object cutoff, then the young wave (times from the store's clock)."""
    write_objects_of([(catalog, put or (lambda key: write_file(root, key)))], object_cutoff)


def write_objects_of(
    writers: Sequence[tuple[Catalog, Callable[[str], None]]], object_cutoff: dt.timedelta
) -> list[dt.datetime]:
    """write_objects for several catalogs with one pause: every old wave, the pause, then each
    catalog's young wave; the moment after each young wave, from which it is within the cutoff."""
    for catalog, put in writers:
        for key in sorted(catalog.old_objects):
            put(key)
    time.sleep(object_cutoff.total_seconds() + 1.5)
    written = []
    for catalog, put in writers:
        for key in sorted(catalog.young_objects):
            put(key)
        time.sleep(0.3)
        written.append(dt.datetime.now(dt.timezone.utc))
    return written


def write_file(root: Path, key: str) -> None:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PAR1" + key.encode())


def sqlite_catalog(path: Path, catalog: Catalog) -> str:
    """The table in SQLite, soft-delete times as ISO 8601 text in two spellings; returns the gc.yaml URL."""
    connection = sqlite3.connect(path)
    connection.execute(
        "CREATE TABLE parquet_file (id INTEGER PRIMARY KEY, namespace_id INTEGER, table_id INTEGER, "
        "partition_id INTEGER, "
        "object_store_id TEXT NOT NULL, to_delete TEXT, created_at TEXT)"
    )

    def spelled(moment: Optional[dt.datetime], n: int) -> Optional[str]:
        if moment is None:
            return None
        return moment.isoformat() if n % 2 else moment.strftime("%Y-%m-%d %H:%M:%S.%f")  # with zone, or naive UTC

    connection.executemany(
        "INSERT INTO parquet_file VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (
                r["id"],
                r["namespace_id"],
                r["table_id"],
                r["partition_id"],
                r["object_store_id"],
                spelled(r["to_delete"], r["id"]),
                spelled(r["created_at"], 0),
            )
            for r in catalog.rows
        ],
    )
    connection.commit()
    connection.close()
    return f"sqlite:///{path}"


def postgres_catalog(postgres: Any, database: str, catalog: Catalog) -> str:
    """The table in PostgreSQL, as IOx declares it (timestamptz soft-delete times, uuid ids); returns the URL."""
    url = postgres.create_database(database)
    with postgres.connect(database) as connection:
        connection.execute(
            "CREATE TABLE parquet_file (id BIGSERIAL PRIMARY KEY, namespace_id BIGINT, table_id BIGINT, "
            "partition_id BIGINT, "
            "object_store_id UUID NOT NULL, to_delete TIMESTAMPTZ, created_at TIMESTAMPTZ)"
        )
        with connection.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO parquet_file VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [tuple(r[c] for c in COLUMNS) for r in catalog.rows],
            )
    return url


@dataclass(frozen=True)
class Expected:
    removed_rows: set[int]  # ids catalog cleanup deletes
    live: set[str]  # keys of the remaining rows
    candidates: set[str]
    missing_live: set[str]


def oracle(
    rows: list[dict[str, Any]], listing: dict[str, dt.datetime], row_cutoff: dt.datetime, object_cutoff: dt.datetime
) -> Expected:
    """IOx's two cleanups, brute force: rows soft-deleted before the row cutoff go; objects older
    than the object cutoff that no remaining row names go (the product's own prefixes aside)."""
    removed = {r["id"] for r in rows if r["to_delete"] is not None and r["to_delete"] < row_cutoff}
    live = {PATH.format_map(r) for r in rows if r["id"] not in removed}
    candidates = {
        key
        for key, modified in listing.items()
        if key not in live and modified < object_cutoff and not key.startswith(("_gc/", "_gc_trash/"))
    }
    return Expected(removed, live, candidates, live - set(listing))


def table_rows(url: str, postgres: Any = None) -> dict[int, tuple[Any, ...]]:
    """{id: the row's other columns} as the table holds them now."""
    if url.startswith("sqlite"):
        connection = sqlite3.connect(url.split(":///", 1)[1])
        found = connection.execute("SELECT * FROM parquet_file").fetchall()
        connection.close()
    else:
        with postgres.connect(url.rsplit("/", 1)[1]) as connection:
            found = connection.execute("SELECT * FROM parquet_file").fetchall()
    return {int(r[0]): tuple(r[1:]) for r in found}


class CatalogWriter:
    """A writer that keeps changing the catalog while gc runs, as an IOx ingester does: each step
    writes a new object, then in one transaction adds the row naming it and soft-deletes one of
    the catalog's first rows in use, backdated past the row cutoff (so that whichever state a
    reader sees changes what it must judge). Steps commit one after another, each adding the
    largest id so far: the largest id a snapshot holds tells exactly which steps it saw."""

    FIRST_ID = 10**6
    BACKDATED = dt.timedelta(days=30)

    def __init__(self, url: str, put: Callable[[str], None], catalog: Catalog, postgres: Any = None, seed: int = 3):
        self.url, self.put, self.postgres = url, put, postgres
        self.rng = random.Random(seed)
        self.targets = [r["id"] for r in catalog.rows if r["to_delete"] is None]
        self.rng.shuffle(self.targets)
        self.steps: list[tuple[dict[str, Any], Optional[int], dt.datetime]] = []  # (row added, id soft-deleted, time)
        self.stop = threading.Event()
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="catalog-writer", daemon=True)

    def __enter__(self) -> "CatalogWriter":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(timeout=60)

    def check(self) -> None:
        assert self.error is None, f"the writer failed: {self.error!r}"
        assert self.thread.is_alive() and len(self.steps) > 3, "the writer is not writing"

    def _run(self) -> None:
        try:
            if self.url.startswith("sqlite"):
                connection = sqlite3.connect(self.url.split(":///", 1)[1], timeout=60, isolation_level=None)
            else:
                connection = self.postgres.connect(self.url.rsplit("/", 1)[1])
            with closing(connection):
                while not self.stop.wait(0.1):
                    self._step(connection)
        except BaseException as exc:  # noqa: BLE001 - reported by check()
            self.error = exc

    def _step(self, connection: Any) -> None:
        number = len(self.steps)
        row = {
            "id": self.FIRST_ID + number,
            "namespace_id": 1 + number % 3,
            "table_id": 1 + number % 4,
            "partition_id": 1 + number % 20,
            "object_store_id": str(uuid.UUID(int=self.rng.getrandbits(128))),
            "to_delete": None,
            "created_at": dt.datetime.now(dt.timezone.utc),
        }
        self.put(PATH.format_map(row))  # the object first, then the row naming it (as IOx does)
        target = self.targets.pop() if self.targets else None
        when = dt.datetime.now(dt.timezone.utc) - self.BACKDATED
        if self.url.startswith("sqlite"):
            connection.execute("BEGIN IMMEDIATE")
            connection.execute(
                "INSERT INTO parquet_file VALUES (?, ?, ?, ?, ?, NULL, ?)",
                (*(row[c] for c in COLUMNS[:5]), row["created_at"].isoformat()),
            )
            if target is not None:
                connection.execute("UPDATE parquet_file SET to_delete = ? WHERE id = ?", (when.isoformat(), target))
            connection.execute("COMMIT")
        else:
            with connection.transaction():
                connection.execute(
                    "INSERT INTO parquet_file VALUES (%s, %s, %s, %s, %s, NULL, %s)",
                    (*(row[c] for c in COLUMNS[:5]), row["created_at"]),
                )
                if target is not None:
                    connection.execute("UPDATE parquet_file SET to_delete = %s WHERE id = %s", (when, target))
        self.steps.append((row, target, when))

    def rows_seen_at(self, initial: list[dict[str, Any]], max_id: int) -> list[dict[str, Any]]:
        """The catalog's rows at a snapshot whose largest id is `max_id`: the initial rows with every
        step that committed before it."""
        rows = {r["id"]: dict(r) for r in initial}
        for row, target, when in list(self.steps):
            if row["id"] > max_id:
                break
            rows[row["id"]] = row
            if target is not None:
                rows[target]["to_delete"] = when
        return list(rows.values())

    def added(self) -> tuple[set[int], set[str]]:
        """The ids and keys of every row this writer added."""
        steps = list(self.steps)
        return {row["id"] for row, _, _ in steps}, {PATH.format_map(row) for row, _, _ in steps}


OBJECT_CUTOFF = dt.timedelta(seconds=2)


def catalog_entry(name: str, namespace: str, url: str, **extra: Any) -> dict[str, Any]:
    """The gc.yaml entry of the catalog at `url` (IOx's parquet_file) over `namespace`: objects
    older than OBJECT_CUTOFF that no remaining row names are collected."""
    return {
        "name": name,
        "format": "file-catalog",
        "storage_namespace": namespace,
        "catalog": {
            "url": url,
            "table": "parquet_file",
            "path": PATH,
            "to_delete": "to_delete",
            "created_at": "created_at",
        },
        "row_cutoff_hours": ROW_CUTOFF_HOURS,
        "object_cutoff_hours": OBJECT_CUTOFF.total_seconds() / 3600,
        "min_object_age_hours": 0,
        "allow_unsafe_min_age": True,
        "max_delete_fraction": 0.95,
        **extra,
    }
