"""File catalog: a database table lists the namespace's files, the InfluxDB IOx way (docs/design.md §6.5).

Each row names one object through the `path` template of its columns; `to_delete` is a
nullable soft-delete time. The catalog has no history, so the graph is one commit, the
state read: its id carries the database's clock at that read and the largest row id then
(`catalog@<time>/<max id>`), and every later step of the run derives the same row cutoff
(that time minus row_cutoff_hours) from it. Live = every row not soft-deleted before the
row cutoff: the rows that remain after catalog cleanup. Every candidate is `untracked`
(no remaining row names it) and must be older than object_cutoff_hours by the store's
own clock.

Catalogs take writes all day, so the state is one database snapshot (catalog_db.CatalogSnapshot):
the counters, the commit id's time (the mark's source_time) and every row the mark reads, on
the executors and in the witness, come from it. The process holds the snapshot of its
latest read of each repository until it reads the repository again: the steps of one run
(the mark, its checks, catalog cleanup) find the snapshot of the state they judge by its
commit id; a step that finds it closed (a sweep-only run, a new read since) reads a new one.
Re-validation and the sweep's last look at the rows read new snapshots: a row added after
the mark's still keeps its object.

The table is read on executors, never through the driver: PostgreSQL by Spark's JDBC source
partitioned on the id when the session has the driver, else (and SQLite) in ranges of ids,
one plain DB-API query per task (psycopg or sqlite3).
"""

from __future__ import annotations

import atexit
import datetime as dt
import re
from dataclasses import dataclass
from functools import reduce
from typing import Iterator, Mapping, Optional, Sequence, Union, cast

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F

from gc_assets.core.config import RepositoryConfig, Rules
from gc_assets.core.names import REPO
from gc_assets.core.retention import Commit, Ref, Retention
from gc_assets.core.spark import POSTGRESQL_JDBC_JAR, local_frame, task_count
from gc_assets.sources.base import (
    LIVE_ENTRY_SCHEMA,
    LIVE_SCHEMA,
    LiveRead,
    RepositorySource,
    SourceError,
    witness_on_executors,
)
from gc_assets.sources.catalog_db import (
    EARLIEST_NS,
    CatalogDatabase,
    CatalogError,
    CatalogSnapshot,
    CatalogState,
    parse_time,
)

REF = "catalog"
COMMIT_ID = re.compile(r"^catalog@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6})Z/(-?\d+|none)$")
ROWS_PER_TASK = 50_000
SAMPLE = 5  # rows named when a catalog is refused for them
ROW_SCHEMA = "id long, address string, to_delete timestamp, created_at timestamp"
ROW_ARROW = pa.schema(
    [
        ("id", pa.int64()),
        ("address", pa.string()),
        ("to_delete", pa.timestamp("us", tz="UTC")),
        ("created_at", pa.timestamp("us", tz="UTC")),
    ]
)


def commit_id_of(at: dt.datetime, max_id: Optional[int]) -> str:
    return f"catalog@{at.astimezone(dt.timezone.utc):%Y-%m-%dT%H:%M:%S.%f}Z/{'none' if max_id is None else max_id}"


def parse_commit_id(commit_id: str) -> tuple[dt.datetime, Optional[int]]:
    """(database time of the read, largest row id then) of a catalog state's commit id."""
    found = COMMIT_ID.match(commit_id)
    if not found:
        raise SourceError(f"{commit_id!r} is not a file catalog state (catalog@<time>Z/<max id>)")
    at = dt.datetime.fromisoformat(found.group(1)).replace(tzinfo=dt.timezone.utc)
    return at, None if found.group(2) == "none" else int(found.group(2))


def whole_milliseconds(moment: dt.datetime) -> dt.datetime:
    """SQLite compares ISO text times to the millisecond: a cutoff on one compares the same everywhere."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


@dataclass
class CatalogRead:
    """One state of a repository's catalog: its snapshot, counters and commit id."""

    snapshot: CatalogSnapshot
    state: CatalogState
    past_row_cutoff: int
    commit_id: str
    rows: Optional[DataFrame] = None  # with `repo`, read on the executors and checked once (rows_of_many)
    partitions: int = 1  # of its own read, before its rows joined the others'


_HELD: dict[tuple[str, str], CatalogRead] = {}  # (repository, url): the latest read, its snapshot open


def _hold(key: tuple[str, str], read: CatalogRead) -> None:
    """Keep `read` open for this process's later steps; the repository's earlier read closes."""
    earlier = _HELD.pop(key, None)
    if earlier is not None:
        earlier.snapshot.close()
    _HELD[key] = read


@atexit.register
def _close_held() -> None:
    while _HELD:
        _HELD.popitem()[1].snapshot.close()


def key_builder(template: str) -> list[tuple[bool, str]]:
    """The path template as (is_column, text) parts, for the executors' read."""
    parts: list[tuple[bool, str]] = []
    for piece in re.split(r"(\{[A-Za-z_][A-Za-z0-9_]*\})", template):
        if piece.startswith("{") and piece.endswith("}"):
            parts.append((True, piece[1:-1]))
        elif piece:
            parts.append((False, piece))
    return parts


class FileCatalogSource(RepositorySource):
    protected_prefixes: tuple[str, ...] = ()
    protected_patterns: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, repo: RepositoryConfig) -> "FileCatalogSource":
        return cls(repo)

    def __init__(self, repo: RepositoryConfig):
        assert (
            repo.file_catalog is not None and repo.row_cutoff_hours is not None and repo.object_cutoff_hours is not None
        )
        self.repo = repo
        self.db = CatalogDatabase(repo.file_catalog, repo.name)
        self.row_cutoff = dt.timedelta(hours=repo.row_cutoff_hours)
        self.object_cutoff = dt.timedelta(hours=repo.object_cutoff_hours)
        self.skew = dt.timedelta(minutes=repo.max_clock_skew_minutes)
        self._kinds: Optional[dict[str, str]] = None
        self._read: Optional[CatalogRead] = None  # this connector's own state, once read
        self._live_read: Optional[CatalogRead] = None  # the state live_entries read

    # ------------------------------------------------------------------ the catalog

    def kinds(self) -> dict[str, str]:
        """The configured columns, checked: a missing one, or an unreachable catalog, is refused."""
        if self._kinds is None:
            try:
                self._kinds = self.db.checked_kinds()
            except CatalogError as exc:
                raise SourceError(str(exc)) from None
        return self._kinds

    def row_cutoff_of(self, commit_id: str) -> dt.datetime:
        """Rows soft-deleted before this are removed by catalog cleanup."""
        return whole_milliseconds(parse_commit_id(commit_id)[0] - self.row_cutoff)

    def read(self, spark: Optional[SparkSession] = None, commit_id: Optional[str] = None) -> CatalogRead:
        """The state `commit_id` names while this process holds its snapshot, else this connector's
        own state, read at a new snapshot the first time (and held)."""
        held = _HELD.get(self._held_key)
        if commit_id is not None and held is not None and held.commit_id == commit_id:
            return held
        if self._read is None or self._read.snapshot.closed:
            self._read = self._new_read(spark)
        return self._read

    @property
    def _held_key(self) -> tuple[str, str]:
        return (self.repo.name, self.db.settings.url)

    def _new_read(self, spark: Optional[SparkSession]) -> CatalogRead:
        kinds = self.kinds()
        try:
            snapshot = CatalogSnapshot(self.db, spark)
            at = whole_milliseconds(snapshot.at)
            try:
                state, past = snapshot.db.state(kinds, at, whole_milliseconds(at - self.row_cutoff))
            except CatalogError:
                snapshot.close()
                raise
        except CatalogError as exc:
            raise SourceError(str(exc)) from None
        read = CatalogRead(snapshot, state, past, commit_id_of(at, state.max_id))
        _hold(self._held_key, read)
        return read

    def read_with_row_cutoff(self, spark: SparkSession, cutoff: dt.datetime) -> CatalogRead:
        """The held state whose row cutoff is `cutoff` (the mark's, in the run that marked), else a new one."""
        held = _HELD.get(self._held_key)
        if held is not None and self.row_cutoff_of(held.commit_id) == cutoff:
            return held
        return self.read(spark)

    def state(self) -> tuple[CatalogState, int]:
        """The catalog's counters at this connector's state and how many rows are past its row cutoff."""
        read = self.read()
        return read.state, read.past_row_cutoff

    def rows(self, spark: SparkSession, commit_id: Optional[str] = None) -> DataFrame:
        """Every row (id, address, to_delete, created_at) of the state `commit_id` names (see read),
        read on executors at its snapshot. Refused when the executors read another number of rows
        than the snapshot's count: then they did not all read the snapshot."""
        return self.rows_of(spark, self.read(spark, commit_id))

    def rows_of(self, spark: SparkSession, read: CatalogRead) -> DataFrame:
        """The rows of `read`, as rows() describes (rows_of_many of this one)."""
        rows = rows_of_many(spark, {self.repo.name: (self, read)})[self.repo.name]
        if isinstance(rows, SourceError):
            raise rows
        # As many partitions as its own read had: a sweep streams them to the driver one job each.
        return rows.filter(F.col(REPO) == self.repo.name).drop(REPO).coalesce(read.partitions)

    def _read_on_executors(
        self, spark: SparkSession, db: CatalogDatabase, state: CatalogState, kinds: dict[str, str]
    ) -> DataFrame:
        """PostgreSQL through Spark's JDBC source when the session has the driver, else (SQLite)
        ranges of ids, one DB-API query per range on the executors; every task at `db`'s snapshot."""
        if state.min_id is None or state.max_id is None:
            return local_frame(spark, [], ROW_SCHEMA)
        if db.dialect == "postgresql" and POSTGRESQL_JDBC_JAR in spark.conf.get("spark.jars", ""):
            return self._read_with_jdbc(spark, db, state, kinds)
        low, high = int(state.min_id), int(state.max_id) + 1
        pieces = max(task_count(spark, state.rows), -(-state.rows // ROWS_PER_TASK))
        step = max(1, -(-(high - low) // pieces))
        ranges = [(start, min(start + step, high)) for start in range(low, high, step)]
        settings = self.repo.file_catalog
        assert settings is not None
        parts = key_builder(settings.path)
        to_delete_kind = kinds[settings.to_delete]
        created_kind = kinds.get(settings.created_at or "", to_delete_kind)
        has_created = settings.created_at is not None

        def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for start, end in zip(batch.column("low").to_pylist(), batch.column("high").to_pylist()):
                    for rows in db.rows_in_range(start, end):
                        ids, keys, deletes, created = [], [], [], []
                        for row in rows:
                            values = dict(zip(settings.path_columns, row[3:]))
                            key = []
                            for is_column, text in parts:
                                if not is_column:
                                    key.append(text)
                                    continue
                                value = values[text]
                                if value is None:
                                    raise CatalogError(
                                        f"{db.where}: row {settings.id}={row[0]} has no {text}: its path is unknown"
                                    )
                                key.append(str(value))
                            try:
                                deletes.append(parse_time(row[1], to_delete_kind))
                                created.append(parse_time(row[2], created_kind) if has_created else None)
                            except ValueError as exc:
                                raise CatalogError(f"{db.where}: row {settings.id}={row[0]}: {exc}") from None
                            ids.append(row[0])
                            keys.append("".join(key))
                        yield pa.RecordBatch.from_arrays(
                            [
                                pa.array(ids, pa.int64()),
                                pa.array(keys, pa.string()),
                                pa.array(deletes, ROW_ARROW.field(2).type),
                                pa.array(created, ROW_ARROW.field(3).type),
                            ],
                            schema=ROW_ARROW,
                        )

        frame = local_frame(spark, ranges, "low long, high long")
        return frame.repartition(task_count(spark, len(ranges))).mapInArrow(read, ROW_SCHEMA)

    def _read_with_jdbc(
        self, spark: SparkSession, db: CatalogDatabase, state: CatalogState, kinds: dict[str, str]
    ) -> DataFrame:
        """Spark's JDBC source, partitioned on the id: keys and times are built in Spark SQL.

        A path column that is null, or an integer time before 2000, is refused as on the DB-API path."""
        settings = self.repo.file_catalog
        assert settings is not None and state.min_id is not None and state.max_id is not None
        partitions = max(task_count(spark, state.rows), -(-state.rows // ROWS_PER_TASK))
        reader = spark.read.format("jdbc").options(**db.jdbc_options())
        frame = (
            reader.option("dbtable", db.table)
            .option("partitionColumn", settings.id)
            .option("lowerBound", str(state.min_id))
            .option("upperBound", str(int(state.max_id) + 1))
            .option("numPartitions", str(partitions))
            .load()
        )

        def as_time(column: str) -> Column:
            if kinds[column] == "integer_ns":
                before_2000 = F.raise_error(
                    F.lit(f"{self.db.where}: column {column} holds a time before 2000 as nanoseconds since the epoch")
                )
                return (
                    F.when(F.col(column).isNull(), F.lit(None).cast("timestamp"))
                    .when(F.col(column) >= F.lit(EARLIEST_NS), F.timestamp_micros(F.floor(F.col(column) / 1000)))
                    .otherwise(before_2000.cast("timestamp"))
                )
            return F.col(column).cast("timestamp")

        key = F.concat(
            *[
                F.col(text).cast("string") if is_column else F.lit(text)
                for is_column, text in key_builder(settings.path)
            ]
        )
        missing = " OR ".join(f"`{c}` IS NULL" for c in settings.path_columns)
        checked = F.when(
            F.expr(missing),
            F.raise_error(F.lit(f"{self.db.where}: a row has no value in a path column: its path is unknown")),
        ).otherwise(key)
        return frame.select(
            F.col(settings.id).cast("long").alias("id"),
            checked.alias("address"),
            as_time(settings.to_delete).alias("to_delete"),
            (as_time(settings.created_at) if settings.created_at else F.lit(None).cast("timestamp")).alias(
                "created_at"
            ),
        )

    # ------------------------------------------------------------------ the connector

    def retention_rules(self, spark: SparkSession, repo: RepositoryConfig) -> Optional[Rules]:
        return None

    def commit_graph(self, spark: SparkSession) -> tuple[list[Commit], list[Ref]]:
        read = self.read(spark)
        return [Commit(read.commit_id, (), read.state.at)], [Ref(REF, "branch", read.commit_id)]

    def evaluate_retention(
        self,
        spark: SparkSession,
        repo: RepositoryConfig,
        commits: Sequence[Commit],
        refs: Sequence[Ref],
        as_of: dt.datetime,
    ) -> dict[str, Retention]:
        """The state read is retained; its threshold is the row cutoff."""
        return {c.commit_id: Retention(True, REF, self.row_cutoff_of(c.commit_id)) for c in commits}

    def state_columns(self) -> dict[str, int]:
        state, past = self.state()
        return {"rows": state.rows, "soft_deleted": state.soft_deleted, "past_row_cutoff": past}

    def live_entries(self, spark: SparkSession, retained: DataFrame, heads: DataFrame) -> DataFrame:
        """Rows not soft-deleted before the row cutoff of the retained state (the earliest, when several)."""
        states = [r["commit_id"] for r in retained.select("commit_id").collect()]
        read = LiveRead(self, {}, states, [r["commit_id"] for r in heads.select("commit_id").collect()])
        return self.live_entries_together(spark, {self.repo.name: read}).select(*LIVE_ENTRY_SCHEMA.fieldNames())

    @classmethod
    def live_entries_together(cls, spark: SparkSession, reads: Mapping[str, LiveRead]) -> DataFrame:
        """Every catalog's live entries, their rows read together (rows_of_many)."""
        wanted: dict[str, tuple[FileCatalogSource, CatalogRead]] = {}
        cutoffs: dict[str, tuple[dt.datetime, bool]] = {}
        for name, live in reads.items():
            source = cast(FileCatalogSource, live.source)
            if not live.retained:
                continue
            earliest = min(live.retained, key=source.row_cutoff_of)
            source._live_read = source.read(spark, earliest)
            wanted[name] = (source, source._live_read)
            cutoffs[name] = (source.row_cutoff_of(earliest), bool(set(live.heads) & set(live.retained)))
        found = rows_of_many(spark, wanted)
        for rows in found.values():
            if isinstance(rows, SourceError):
                raise rows

        def by_repo(values: Mapping[str, object]) -> Column:
            return F.create_map(*[F.lit(x) for name, value in values.items() for x in (name, value)])[F.col(REPO)]

        cutoff, at_head = (
            by_repo({n: c for n, (c, _) in cutoffs.items()}),
            by_repo({n: h for n, (_, h) in cutoffs.items()}),
        )
        live = [local_frame(spark, [], LIVE_SCHEMA)]
        for rows, names in shared_frames(cast(Mapping[str, DataFrame], found)):
            kept = rows.filter(F.col(REPO).isin(names) & (F.col("to_delete").isNull() | (F.col("to_delete") >= cutoff)))
            live.append(
                kept.select(
                    REPO,
                    "address",
                    F.lit(None).cast("long").alias("size"),
                    F.lit("committed").alias("source"),
                    at_head.alias("at_head"),
                )
            )
        return reduce(DataFrame.unionByName, live)

    def committed_addresses(self, spark: SparkSession) -> DataFrame:
        """None: an object only removed rows named is as untracked as any, and waits the object cutoff (as IOx)."""
        return local_frame(spark, [], "address string")

    def commits_referencing(self, spark: SparkSession, retained: DataFrame, addresses: DataFrame) -> DataFrame:
        states = [r["commit_id"] for r in retained.select("commit_id").collect()]
        return (
            self.rows(spark, min(states, key=self.row_cutoff_of) if states else None)
            .select("address")
            .distinct()
            .join(addresses.select("address").distinct(), "address")
            .crossJoin(retained.select("commit_id"))
        )

    def fingerprint(self, spark: Optional[SparkSession]) -> str:
        """A digest of every row's id and soft-delete time (the database hashes, nothing is fetched)."""
        self.kinds()
        try:
            return self.db.fingerprint()
        except CatalogError as exc:
            raise SourceError(str(exc)) from None

    def source_time(self, spark: SparkSession) -> dt.datetime:
        """The database's clock at the snapshot of the live rows (no later: every write committed
        before it is in them)."""
        return (self._live_read or self.read(spark)).state.at

    def untracked_min_age(self, spark: SparkSession, repo: RepositoryConfig) -> dt.timedelta:
        """IOx's OBJECTSTORE_CUTOFF: backups name files their rows no longer do."""
        return self.object_cutoff

    def check_inventory(self, spark: SparkSession, inventory: DataFrame) -> None:
        """Objects modified ahead of the database's clock mean the store's and the catalog's clocks
        disagree, and every age judged against the catalog is suspect: refused."""
        name = self.repo.name
        refused = self.check_inventories(spark, {name: self}, inventory.drop(REPO).select(F.lit(name).alias(REPO), "*"))
        if refused:
            raise SourceError(refused[name])

    @classmethod
    def check_inventories(
        cls, spark: SparkSession, sources: Mapping[str, RepositorySource], inventory: DataFrame
    ) -> dict[str, str]:
        """check_inventory of every catalog of `sources`, their listings (`inventory`, with `repo`) in one Spark job."""
        refused, limits = {}, {}
        for name, source in sources.items():
            catalog = cast(FileCatalogSource, source)
            try:
                limits[name] = (catalog.db.now(), catalog.skew)
            except CatalogError as exc:
                refused[name] = str(exc)
        if not limits:
            return refused
        limit = F.create_map(*[F.lit(x) for name, (now, skew) in limits.items() for x in (name, now + skew)])
        ahead = inventory.filter(F.col(REPO).isin(list(limits)) & (F.col("last_modified") > limit[F.col(REPO)]))
        first = F.row_number().over(Window.partitionBy(REPO).orderBy("last_modified", "address"))
        found: dict[str, list[Row]] = {}
        for row in ahead.withColumn("n", first).filter(F.col("n") <= SAMPLE).collect():
            found.setdefault(row[REPO], []).append(row)
        for name, rows in found.items():
            catalog, now = cast(FileCatalogSource, sources[name]), limits[name][0]
            refused[name] = (
                f"{catalog.db.where}: object(s) modified after the database's clock {now.isoformat()} (beyond "
                f"max_clock_skew_minutes), e.g. {rows[0]['address']} at {rows[0]['last_modified']}: "
                "clocks disagree, refusing"
            )
        return refused

    def witness_heads(self, spark: SparkSession, head_ids: Sequence[str]) -> DataFrame:
        """The rows in use at each state, by a plain SELECT whose condition the database itself
        judges (ids up to the state's largest, not soft-deleted before its row cutoff) at the
        state's snapshot (see read), keys built with str.format_map: no code shared with the
        executors' read."""
        kinds, template = self.kinds(), self.repo.file_catalog.path  # type: ignore[union-attr]
        bounds = {
            head: (self.read(spark, head).snapshot.db, self.row_cutoff_of(head), parse_commit_id(head)[1])
            for head in head_ids
        }

        def open_reader():  # type: ignore[no-untyped-def]
            def addresses_of(head: str) -> list[str]:
                db, cutoff, max_id = bounds[head]
                if max_id is None:
                    return []
                return [template.format_map(row) for row in db.rows_in_use(kinds, cutoff, max_id)]

            return addresses_of

        return witness_on_executors(spark, list(head_ids), open_reader)


def shared_frames(rows: Mapping[str, DataFrame]) -> list[tuple[DataFrame, list[str]]]:
    """Each frame of `rows` (rows_of_many's) with the catalogs whose rows it holds: the catalogs
    read together share one, filtered once for all of them, not once each (a union of one
    filter per catalog has the frame's partitions as many times)."""
    frames: dict[int, tuple[DataFrame, list[str]]] = {}
    for name, frame in rows.items():
        frames.setdefault(id(frame), (frame, []))[1].append(name)
    return list(frames.values())


def rows_of_many(
    spark: SparkSession, reads: Mapping[str, tuple[FileCatalogSource, CatalogRead]]
) -> dict[str, Union[DataFrame, SourceError]]:
    """The rows (repo, id, address, to_delete, created_at) of each read, by name, or why it is
    refused: the catalogs not read yet are read on the executors in one Spark job and checked in
    one more, into one frame that each of them is given (its own rows are those of its `repo`),
    and each read keeps it for the run's later steps. Refused: a catalog whose executors read
    another number of rows than its snapshot's count (they did not all read the snapshot), or with
    a row soft-deleted ahead of the database's clock (clocks disagree: every age is suspect)."""
    found: dict[str, Union[DataFrame, SourceError]] = {}
    unread: dict[str, DataFrame] = {}
    for name, (source, read) in reads.items():
        if name != source.repo.name:  # its rows are those of its `repo`: another name would find none
            raise ValueError(f"the rows of repository {source.repo.name!r} asked for as {name!r}")
        if read.rows is not None:
            found[name] = read.rows
            continue
        try:
            frame = source._read_on_executors(spark, read.snapshot.db, read.state, source.kinds())
        except CatalogError as exc:
            found[name] = SourceError(str(exc))
            continue
        read.partitions = max(1, frame.rdd.getNumPartitions())
        unread[name] = frame.select(F.lit(name).alias(REPO), "*")
    if not unread:
        return found
    rows = reduce(DataFrame.unionByName, unread.values()).localCheckpoint()
    ahead_of = F.create_map(
        *[F.lit(x) for name in unread for x in (name, reads[name][1].state.at + reads[name][0].skew)]
    )
    ahead = F.col("to_delete") > ahead_of[F.col(REPO)]
    measured = rows.groupBy(REPO).agg(F.count(F.lit(1)).alias("rows"), F.count_if(ahead).alias("ahead")).collect()
    counts = {row[REPO]: (row["rows"], row["ahead"]) for row in measured}
    for name in unread:
        source, read = reads[name]
        read_rows, read_ahead = counts.get(name, (0, 0))
        if read_rows != read.state.rows:
            found[name] = SourceError(
                f"{source.db.where}: the executors read {read_rows} rows where the snapshot of {read.commit_id} has "
                f"{read.state.rows}: they did not read one consistent state, refusing"
            )
        elif read_ahead:
            sample = rows.filter((F.col(REPO) == name) & ahead).select("id", "to_delete").limit(SAMPLE).collect()
            found[name] = SourceError(
                f"{source.db.where}: {len(sample)}+ row(s) soft-deleted in the future of the database's clock "
                f"{read.state.at.isoformat()} (beyond max_clock_skew_minutes), e.g. id {sample[0]['id']} at "
                f"{sample[0]['to_delete']}: clocks disagree, refusing"
            )
        else:
            read.rows = found[name] = rows
    return found
