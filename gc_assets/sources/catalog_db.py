"""A file catalog's table through plain DB-API: PostgreSQL with psycopg, SQLite with sqlite3
(docs/design.md §6.5).

Everything the product asks of the database is here, in both dialects: the table's
columns and the kind of its soft-delete column, the database's clock, the state's
counters, rows by id range (for the executors' parallel read), the rows still in use
(for the independent witness), and the chunked conditional DELETE and its undo.

A catalog takes writes all day, so every read of one state goes through a CatalogSnapshot:
on PostgreSQL a REPEATABLE READ transaction that exports its snapshot and stays open while
every other connection (the executors', Spark's JDBC tasks) imports it before reading, the
way `pg_dump -j` reads in parallel; on SQLite, which cannot share a snapshot between
processes, a copy of the database made in one read transaction, which every reader opens.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import decimal
import hashlib
import json
import os
import re
import shutil
import sqlite3
import tempfile
import uuid
from contextlib import closing, suppress
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional, Sequence
from urllib.parse import unquote, urlsplit

from gc_assets.core.config import FileCatalogSettings

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
# An integer soft-delete time is nanoseconds since the epoch (IOx's own); a smaller one
# (seconds, milliseconds) would read as 1970 and make every row look long deleted.
EARLIEST_NS = int((dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc) - EPOCH).total_seconds()) * 10**9
CONNECT_TIMEOUT_SECONDS = 10
SNAPSHOT_ID = re.compile(r"^[0-9A-Fa-f]+(-[0-9A-Fa-f]+)+$")  # pg_export_snapshot()'s, e.g. 00000003-0000001B-1
TIME_KINDS = ("timestamptz", "timestamp", "integer_ns", "text_iso")


class CatalogError(ValueError):
    """The catalog is unreachable, or its table is not what gc.yaml says; the message names both."""


@dataclass(frozen=True)
class CatalogState:
    """Counters of the table at one snapshot, current at `at` by the database's clock."""

    at: dt.datetime
    rows: int
    soft_deleted: int
    min_id: Optional[int]
    max_id: Optional[int]


def parse_time(value: Any, kind: str) -> Optional[dt.datetime]:
    """A soft-delete or creation time as the database returned it, in UTC; None stays None.

    Naive times are UTC. Raises ValueError for what cannot be a time of this kind."""
    if value is None:
        return None
    if kind == "integer_ns":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{value!r} is not an integer of nanoseconds")
        if value < EARLIEST_NS:
            raise ValueError(f"{value} is before 2000 as nanoseconds since the epoch (seconds or milliseconds?)")
        return EPOCH + dt.timedelta(microseconds=value // 1000)
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.strip())
    if not isinstance(value, dt.datetime):
        raise ValueError(f"{value!r} is not a timestamp")
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class CatalogDatabase:
    """One catalog table of gc.yaml, reached by its URL; a connection per call site, never shared."""

    def __init__(self, settings: FileCatalogSettings, repo_name: str):
        self.settings, self.repo_name = settings, repo_name
        parts = urlsplit(settings.url)
        scheme = parts.scheme.split("+", 1)[0]
        self.dialect = "sqlite" if scheme == "sqlite" else "postgresql"
        if self.dialect == "sqlite":
            path = settings.url.split("://", 1)[1]
            self.sqlite_path = unquote(path[1:] if path.startswith("/") else path)
        else:
            self.conninfo = "postgresql://" + settings.url.split("://", 1)[1]
        schema, _, name = settings.table.rpartition(".")
        self.schema, self.table_name = schema or None, name
        self.table = ".".join(_identifier(part) for part in settings.table.split("."))
        self.param = "?" if self.dialect == "sqlite" else "%s"
        self.snapshot: Optional[str] = None  # read at this snapshot (PostgreSQL's id) or copy (SQLite's file)

    def at_snapshot(self, snapshot: str) -> "CatalogDatabase":
        """The same catalog, every read of it at `snapshot` (CatalogSnapshot's)."""
        pinned = copy.copy(self)
        pinned.snapshot = snapshot
        return pinned

    def snapshot_statements(self) -> list[str]:
        """What a PostgreSQL connection runs first to read at this database's snapshot."""
        if self.snapshot is None:
            return []
        if not SNAPSHOT_ID.match(self.snapshot):
            raise CatalogError(f"{self.where}: {self.snapshot!r} is not a snapshot id")
        return [
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY",
            f"SET TRANSACTION SNAPSHOT '{self.snapshot}'",
        ]

    def jdbc_options(self) -> dict[str, str]:
        """Spark JDBC source options of a PostgreSQL catalog (the password, if any, from PGPASSWORD);
        at a snapshot, each task's session imports it before reading: Spark runs sessionInitStatement
        after turning autocommit off, which it does for PostgreSQL when fetchsize is set."""
        parts = urlsplit(self.conninfo)
        url = f"jdbc:postgresql://{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path}"
        options = {"url": url + (f"?{parts.query}" if parts.query else ""), "driver": "org.postgresql.Driver"}
        if parts.username:
            options["user"] = unquote(parts.username)
        if os.environ.get("PGPASSWORD"):
            options["password"] = os.environ["PGPASSWORD"]
        options["fetchsize"] = "50000"
        if self.snapshot is not None:
            options["sessionInitStatement"] = "; ".join(self.snapshot_statements())
        return options

    @property
    def where(self) -> str:
        """Names the catalog in messages, never with credentials (there are none in the URL)."""
        return f"repository {self.repo_name!r}: catalog table {self.settings.table} at {self.settings.url}"

    # connections

    def connect(self, writable: bool = False) -> Any:
        """A new connection, reading at this database's snapshot if it has one; an unreachable
        catalog, or a snapshot no longer there, is a CatalogError."""
        assert not (writable and self.snapshot), "a snapshot is read, never written"
        try:
            if self.dialect == "sqlite":
                path, mode = self.sqlite_path, "rw" if writable else "ro"
                if self.snapshot is not None:
                    path, mode = _snapshot_copy(self.snapshot), "ro&immutable=1"
                connection = sqlite3.connect(
                    f"file:{path}?mode={mode}", uri=True, timeout=30, detect_types=0, isolation_level=None
                )
                connection.execute("PRAGMA busy_timeout = 30000")
                return connection
            import psycopg

            connection = psycopg.connect(self.conninfo, connect_timeout=CONNECT_TIMEOUT_SECONDS, autocommit=False)
            for statement in self.snapshot_statements():
                connection.execute(statement)
            return connection
        except CatalogError:
            raise
        except Exception as exc:  # noqa: BLE001 - sqlite3's or psycopg's errors, named
            raise CatalogError(f"{self.where} is unreachable: {type(exc).__name__}: {exc}") from None

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with closing(self.connect()) as connection:
            try:
                cursor = connection.execute(sql, tuple(params))
                rows = cursor.fetchall()
            except Exception as exc:  # noqa: BLE001 - the drivers' errors, named
                raise CatalogError(f"{self.where}: {type(exc).__name__}: {exc}".strip()) from None
            finally:
                if self.dialect == "postgresql":
                    connection.rollback()
        return rows

    # the table's shape

    def columns(self) -> dict[str, str]:
        """The table's columns and their declared types (lower case); a missing table is a CatalogError."""
        if self.dialect == "sqlite":
            rows = self._query(f"PRAGMA table_info({self.table})")
            found = {str(r[1]): str(r[2]).lower() for r in rows}
        else:
            rows = self._query(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s "
                "AND table_schema = coalesce(%s, current_schema())",
                (self.table_name, self.schema),
            )
            found = {str(r[0]): str(r[1]).lower() for r in rows}
        if not found:
            raise CatalogError(f"{self.where}: the table does not exist")
        return found

    def time_kind(self, column: str, declared: str) -> str:
        """How `column` spells times: timestamptz, timestamp (UTC), integer_ns or text_iso (SQLite)."""
        if self.dialect == "postgresql":
            kinds = {
                "timestamp with time zone": "timestamptz",
                "timestamp without time zone": "timestamp",
                "bigint": "integer_ns",
            }
            if declared not in kinds:
                raise CatalogError(
                    f"{self.where}: column {column} is {declared}, not a timestamp or bigint of nanoseconds"
                )
            return kinds[declared]
        stored = {r[0] for r in self._query(f"SELECT DISTINCT typeof({_identifier(column)}) FROM {self.table}")} - {
            "null"
        }
        if stored <= {"text"}:
            return "text_iso"
        if stored == {"integer"}:
            return "integer_ns"
        raise CatalogError(
            f"{self.where}: column {column} holds {sorted(stored)}: expected ISO 8601 text or integer nanoseconds"
        )

    def checked_kinds(self) -> dict[str, str]:
        """Every configured column exists and the id is an integer; {time column: kind}."""
        found = self.columns()
        s = self.settings
        wanted = [s.id, s.to_delete, *([s.created_at] if s.created_at else []), *s.path_columns]
        missing = [c for c in dict.fromkeys(wanted) if c not in found]
        if missing:
            raise CatalogError(f"{self.where}: column(s) {missing} missing (the table has {sorted(found)})")
        if "int" not in found[s.id]:
            raise CatalogError(f"{self.where}: id column {s.id} is {found[s.id]}, not an integer")
        kinds = {s.to_delete: self.time_kind(s.to_delete, found[s.to_delete])}
        if s.created_at:
            kinds[s.created_at] = self.time_kind(s.created_at, found[s.created_at])
        return kinds

    # time in the column's own spelling

    def now(self) -> dt.datetime:
        """The database's clock (SQLite's is the host's)."""
        if self.dialect == "sqlite":
            text = self._query("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")[0][0]
            return dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc)
        return parse_time(self._query("SELECT clock_timestamp()")[0][0], "timestamptz")  # type: ignore[return-value]

    def before(self, column: str, kind: str, moment: dt.datetime) -> tuple[str, Any]:
        """SQL `column < moment` for the column's kind, and its parameter (NULL is never before)."""
        quoted = _identifier(column)
        if kind == "integer_ns":
            delta = moment - EPOCH
            ns = (delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1000
            return f"{quoted} < {self.param}", ns
        if kind == "text_iso":
            return f"julianday({quoted}) < julianday({self.param})", moment.astimezone(dt.timezone.utc).strftime(
                "%Y-%m-%d %H:%M:%S.%f"
            )
        if kind == "timestamp":
            return f"{quoted} < {self.param}", moment.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return f"{quoted} < {self.param}", moment

    # reading

    def state(self, kinds: dict[str, str], at: dt.datetime, cutoff: dt.datetime) -> tuple[CatalogState, int]:
        """The table's counters (read at this database's snapshot, current at `at`), and how many
        rows are soft-deleted before `cutoff`, in one query."""
        s = self.settings
        predicate, param = self.before(s.to_delete, kinds[s.to_delete], cutoff)
        row = self._query(
            f"SELECT count(*), count({_identifier(s.to_delete)}), min({_identifier(s.id)}), "
            f"max({_identifier(s.id)}), sum(CASE WHEN {predicate} THEN 1 ELSE 0 END) "
            f"FROM {self.table}",
            [param],
        )[0]
        return CatalogState(at, int(row[0]), int(row[1]), row[2], row[3]), int(row[4] or 0)

    def _select(self) -> str:
        s = self.settings
        columns = [s.id, s.to_delete, s.created_at or s.to_delete, *s.path_columns]
        return "SELECT " + ", ".join(_identifier(c) for c in columns) + f" FROM {self.table}"

    def rows_in_range(self, low: int, high: int, batch: int = 50_000) -> Iterator[list[tuple[Any, ...]]]:
        """Raw rows (id, to_delete, created_at, *path columns) with low <= id < high, in batches."""
        s = self.settings
        sql = self._select() + f" WHERE {_identifier(s.id)} >= {self.param} AND {_identifier(s.id)} < {self.param}"
        with closing(self.connect()) as connection:
            try:
                cursor = connection.cursor()
                cursor.execute(sql, (low, high))
                while True:
                    rows = cursor.fetchmany(batch)
                    if not rows:
                        break
                    yield rows
            except CatalogError:
                raise
            except Exception as exc:  # noqa: BLE001 - the drivers' errors, named
                raise CatalogError(f"{self.where}: {type(exc).__name__}: {exc}") from None
            finally:
                if self.dialect == "postgresql":
                    connection.rollback()

    def rows_in_use(self, kinds: dict[str, str], cutoff: dt.datetime, max_id: int) -> list[dict[str, Any]]:
        """Every row with id <= max_id not soft-deleted before `cutoff`, as column mappings, by a
        plain SELECT whose condition the database judges (the witness's path, not the executors')."""
        s = self.settings
        predicate, param = self.before(s.to_delete, kinds[s.to_delete], cutoff)
        names = list(dict.fromkeys(s.path_columns))
        sql = (
            "SELECT "
            + ", ".join(_identifier(c) for c in names)
            + f" FROM {self.table} WHERE {_identifier(s.id)} <= {self.param} "
            f"AND ({_identifier(s.to_delete)} IS NULL OR NOT ({predicate}))"
        )
        return [dict(zip(names, row)) for row in self._query(sql, (max_id, param))]

    def fingerprint(self) -> str:
        """A digest of every row's id and soft-delete time: any revert or new soft delete changes it."""
        s = self.settings
        ident, mark = _identifier(s.id), _identifier(s.to_delete)
        if self.dialect == "postgresql":
            sql = (
                f"SELECT count(*), max({ident}), "
                f"sum(hashtextextended({ident}::text || ':' || coalesce({mark}::text, '-'), 0)::numeric) "
                f"FROM {self.table}"
            )
            return hashlib.sha256(repr(self._query(sql)[0]).encode()).hexdigest()
        with closing(self.connect()) as connection:
            connection.create_function("gc_row_hash", 2, _row_hash, deterministic=True)
            try:
                row = connection.execute(
                    f"SELECT count(*), max({ident}), sum(gc_row_hash({ident}, {mark})) FROM {self.table}"
                ).fetchone()
            except sqlite3.Error as exc:
                raise CatalogError(f"{self.where}: {type(exc).__name__}: {exc}") from None
        return hashlib.sha256(repr(row).encode()).hexdigest()

    # deleting and restoring rows

    def delete_rows(
        self, ids: Sequence[int], kinds: dict[str, str], cutoff: dt.datetime, keep: Any = None
    ) -> list[dict[str, Any]]:
        """Delete, in one transaction, the rows of `ids` still soft-deleted before `cutoff`;
        returns them whole. `keep(rows)` runs before the commit (the trash journal): when it
        raises, nothing is deleted. A row revived or soft-deleted again since it was read
        fails the condition and stays."""
        s = self.settings
        predicate, param = self.before(s.to_delete, kinds[s.to_delete], cutoff)
        if self.dialect == "sqlite":
            marks = ", ".join("?" for _ in ids)
            sql = f"DELETE FROM {self.table} WHERE {_identifier(s.id)} IN ({marks}) AND {predicate} RETURNING *"
            params: tuple[Any, ...] = (*ids, param)
        else:
            sql = f"DELETE FROM {self.table} WHERE {_identifier(s.id)} = ANY(%s) AND {predicate} RETURNING *"
            params = (list(ids), param)
        with closing(self.connect(writable=True)) as connection:
            try:
                if self.dialect == "sqlite":
                    connection.execute("BEGIN IMMEDIATE")
                cursor = connection.execute(sql, params)
                names = [d[0] for d in cursor.description]
                rows = [dict(zip(names, row)) for row in cursor.fetchall()]
                if keep is not None:
                    keep(rows)
                connection.execute("COMMIT") if self.dialect == "sqlite" else connection.commit()
                return rows
            except BaseException as exc:
                connection.execute("ROLLBACK") if self.dialect == "sqlite" and connection.in_transaction else None
                if self.dialect == "postgresql":
                    connection.rollback()
                if (
                    isinstance(exc, Exception)
                    and not isinstance(exc, CatalogError)
                    and type(exc).__module__.startswith(("sqlite3", "psycopg"))
                ):
                    raise CatalogError(f"{self.where}: {type(exc).__name__}: {exc}") from None
                raise

    def insert_rows(self, rows: Iterable[dict[str, Any]]) -> tuple[list[int], list[int]]:
        """Put journaled rows back, in one transaction: (ids inserted, ids already present)."""
        s = self.settings
        inserted: list[int] = []
        present: list[int] = []
        with closing(self.connect(writable=True)) as connection:
            try:
                if self.dialect == "sqlite":
                    connection.execute("BEGIN IMMEDIATE")
                for row in rows:
                    names = list(row)
                    columns = ", ".join(_identifier(n) for n in names)
                    marks = ", ".join(self.param for _ in names)
                    verb = "INSERT OR IGNORE INTO" if self.dialect == "sqlite" else "INSERT INTO"
                    tail = "" if self.dialect == "sqlite" else f" ON CONFLICT ({_identifier(s.id)}) DO NOTHING"
                    cursor = connection.execute(
                        f"{verb} {self.table} ({columns}) VALUES ({marks}){tail}", tuple(row[n] for n in names)
                    )
                    (inserted if cursor.rowcount == 1 else present).append(int(row[s.id]))
                connection.execute("COMMIT") if self.dialect == "sqlite" else connection.commit()
            except Exception as exc:  # noqa: BLE001 - the drivers' errors, named
                if self.dialect == "sqlite" and connection.in_transaction:
                    connection.execute("ROLLBACK")
                elif self.dialect == "postgresql":
                    connection.rollback()
                raise CatalogError(f"{self.where}: restoring rows failed: {type(exc).__name__}: {exc}") from None
        return inserted, present


class CatalogSnapshot:
    """One state of the catalog that every reader of it sees, held until closed.

    PostgreSQL: a REPEATABLE READ, READ ONLY transaction that exports its snapshot
    (pg_export_snapshot) and stays open, so that connections opened later import it. SQLite:
    a copy made by the backup API in one step (one read transaction), opened immutable by
    every reader; `spark`, when given, ships it to the executors (SparkContext.addFile), which
    need not share the driver's disk. `at` is the database's clock no later than the snapshot:
    every write committed before it is seen. A catalog that cannot export or copy a snapshot
    (a standby, a pooler in transaction mode, an unreadable file) is a CatalogError: no
    consistent read across executors is possible there."""

    def __init__(self, db: CatalogDatabase, spark: Any = None):
        self.holder: Any = None
        self.copy_dir: Optional[str] = None
        if db.dialect == "postgresql":
            self.holder = db.connect()
            try:
                self.holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                snapshot, at = self.holder.execute("SELECT pg_export_snapshot(), transaction_timestamp()").fetchone()
            except Exception as exc:  # noqa: BLE001 - psycopg's errors, named
                self.close()
                raise CatalogError(
                    f"{db.where}: cannot export a snapshot ({type(exc).__name__}: {exc}): the executors "
                    "cannot read one consistent state; refusing (connect to the primary, not through a pooler)"
                ) from None
            self.at = parse_time(at, "timestamptz")
        else:
            self.at = db.now()  # before the copy's read transaction starts
            self.copy_dir = tempfile.mkdtemp(prefix="gc-catalog-")
            snapshot = os.path.join(self.copy_dir, f"snapshot-{uuid.uuid4().hex}.db")
            try:
                with closing(db.connect()) as source, closing(sqlite3.connect(snapshot)) as copy_:
                    source.backup(copy_)  # every page in one step: one read transaction
                    copy_.execute("PRAGMA journal_mode = DELETE")  # readers open it read-only, no -wal beside it
            except Exception as exc:  # noqa: BLE001 - sqlite3's errors, named
                self.close()
                raise CatalogError(f"{db.where}: cannot copy a snapshot: {type(exc).__name__}: {exc}") from None
            if spark is not None:
                spark.sparkContext.addFile(snapshot)
        self.db = db.at_snapshot(snapshot)

    @property
    def closed(self) -> bool:
        return self.holder is None and self.copy_dir is None

    def close(self) -> None:
        if self.holder is not None:
            holder, self.holder = self.holder, None
            # Ends the transaction, and the snapshot with it, before this returns: closing alone does
            # not wait for the server, whose backend may still export it to a new reader. A broken
            # connection's transaction ends with it.
            with suppress(Exception):
                holder.rollback()
            holder.close()
        if self.copy_dir is not None:
            shutil.rmtree(self.copy_dir, ignore_errors=True)
            self.copy_dir = None


def _snapshot_copy(path: str) -> str:
    """Where this process finds the SQLite snapshot copied to `path` on the driver: there, or
    where Spark shipped it."""
    if os.path.exists(path):
        return path
    from pyspark import SparkFiles

    return SparkFiles.get(os.path.basename(path))


def _row_hash(ident: Any, mark: Any) -> int:
    return int.from_bytes(hashlib.blake2b(f"{ident}:{mark}".encode(), digest_size=6).digest(), "big")


def encode_row(row: dict[str, Any]) -> str:
    """One row as a JSON line that decode_row turns back into the same values."""

    def value(v: Any) -> Any:
        if isinstance(v, dt.datetime):
            return {"$datetime": v.isoformat()}
        if isinstance(v, dt.date):
            return {"$date": v.isoformat()}
        if isinstance(v, (bytes, bytearray, memoryview)):
            return {"$bytes": base64.b64encode(bytes(v)).decode()}
        if isinstance(v, decimal.Decimal):
            return {"$decimal": str(v)}
        if isinstance(v, uuid.UUID):
            return {"$uuid": str(v)}
        return v

    return json.dumps({k: value(v) for k, v in row.items()}, sort_keys=True)


def decode_row(line: str) -> dict[str, Any]:
    decoders = {
        "$datetime": dt.datetime.fromisoformat,
        "$date": dt.date.fromisoformat,
        "$bytes": base64.b64decode,
        "$decimal": decimal.Decimal,
        "$uuid": uuid.UUID,
    }

    def value(v: Any) -> Any:
        if isinstance(v, dict) and len(v) == 1 and next(iter(v)) in decoders:
            tag, text = next(iter(v.items()))
            return decoders[tag](text)
        return v

    return {k: value(v) for k, v in json.loads(line).items()}
