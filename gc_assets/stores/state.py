"""The state directory (core.state says what lives where) as frames and small records, on the
driver's disk or on an object store.

On disk (`state_dir: .gc_state`, the default) Spark writes and reads Parquet itself, and a
frame is put in place by renaming its directory. On an object store (`s3://`, `abfss://`,
`gs://`: a cluster, whose executors cannot see the driver's disk) there is neither a Hadoop
connector nor a rename: executors write and read the Parquet parts through the store's own
client (stores.base.ObjectIO), and a frame is visible once its manifest (FRAME_MANIFEST: its
parts, its schema, its record) is written, in one request. A reader finds the old frame or the
new one, never a mix, on either.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import shutil
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from gc_assets.core.config import STATE_SCHEMES, ConfigError, GcConfig
from gc_assets.core.spark import local_frame
from gc_assets.core.split_parquet import SPARK_SCHEMA_KEY, value_runs, write_empty, write_split
from gc_assets.core.state import TIMES_FILE, spark_path
from gc_assets.stores.base import ObjectIO, Store, StoreError

FRAME_MANIFEST = "_gc_frame.json"  # on an object store: a frame's parts, schema and record

_NULLABILITY = ("nullable", "containsNull", "valueContainsNull")
log = logging.getLogger(__name__)


class StateError(ConfigError):
    """The state directory cannot be used: named before anything is moved or deleted."""


class Staged(ABC):
    """Rows written beside their place, not yet visible to readers."""

    @abstractmethod
    def commit(self, record: Optional[dict[str, Any]] = None) -> None:
        """Put the frame in its place, with `record` (TIMES_FILE) beside it."""

    @abstractmethod
    def discard(self) -> None:
        """Remove what was written; the frame in place, if any, stays."""


class StagedFrame(Staged):
    """A frame written beside its place and read back for checking, not yet visible to readers."""

    frame: DataFrame


class StateFiles(ABC):
    """gc_assets' own frames and records under one root; keys are '/'-joined and relative."""

    root: str
    commits_at_once: int  # staged frames committed at once (Staged.commit), by threads

    def uri(self, key: str) -> str:
        """Where `key` is, as a user reads it in a log or the JSON summary."""
        return f"{self.root.rstrip('/')}/{key}"

    @abstractmethod
    def stage(self, spark: SparkSession, frame: DataFrame, key: str) -> StagedFrame:
        """Write `frame` beside `key` and read it back (each action on it reads what was written,
        until the commit)."""

    @abstractmethod
    def stage_split(self, spark: SparkSession, frame: DataFrame, by: str, keys: Sequence[str]) -> list[Staged]:
        """Write the rows of `frame` whose int column `by` is i beside keys[i] (without `by`), for
        every key in one Spark job: many repositories' partitions of one asset from one frame
        (docs/design.md §6.7). A key without rows gets an empty frame; each is committed or
        discarded on its own."""

    def write(
        self, spark: SparkSession, frame: DataFrame, key: str, record: Optional[dict[str, Any]] = None
    ) -> DataFrame:
        """Replace the frame at `key` by `frame` and return it as written: decided exactly once,
        whatever reads it later."""
        staged = self.stage(spark, frame, key)
        try:
            staged.commit(record)
        except BaseException:
            staged.discard()
            raise
        written = self.read(spark, key)
        assert written is not None, f"{self.uri(key)} was just written"
        return written

    @abstractmethod
    def keep_table(self, key: str, table: pa.Table) -> None:
        """Replace the frame at `key` by a small `table` the driver holds, written whole without a
        Spark job and durable before the caller goes on; read back as any frame."""

    @abstractmethod
    def read(self, spark: SparkSession, key: str) -> Optional[DataFrame]:
        """The frame at `key`, or None when none was written."""

    @abstractmethod
    def read_many(self, spark: SparkSession, keys: list[str], schema: str | StructType) -> DataFrame:
        """The frames at `keys`, one after another, in `schema` (empty when `keys` is)."""

    @abstractmethod
    def read_table(self, key: str) -> Optional[pa.Table]:
        """The frame at `key` read on this machine, without Spark (`gc-assets export`); None when none."""

    @abstractmethod
    def frames(self, prefix: str, pattern: str) -> list[str]:
        """Keys of the complete frames directly under `prefix` whose name matches `pattern` (fnmatch)."""

    @abstractmethod
    def record(self, key: str) -> Optional[dict[str, Any]]:
        """The record written with the frame at `key` (TIMES_FILE), or None."""

    @abstractmethod
    def fingerprint(self, key: str) -> str:
        """Changes whenever the frame at `key` is written again ('' when there is none)."""

    @abstractmethod
    def read_text(self, key: str) -> Optional[str]: ...

    @abstractmethod
    def write_text(self, key: str, text: str) -> None:
        """Write a small record whole: a reader finds the old text or the new."""

    @abstractmethod
    def keys(self, prefix: str) -> list[str]:
        """Keys of the small records under `prefix` (a directory key ending in '/')."""

    @abstractmethod
    def remove(self, key: str) -> None:
        """Remove a small record; an absent one is not an error."""


class LocalState(StateFiles):
    """The state directory on a local (or shared POSIX) path: Spark's own Parquet, renamed in place."""

    # A commit is a few renames on this machine's disk, done in microseconds: threads would only
    # take turns on the interpreter (1,000 commits: 0.3 to 0.4 s on 16 threads, 0.12 to 0.15 s on one).
    commits_at_once = 1

    def __init__(self, path: Path):
        self.path = path
        self.root = str(path)

    def uri(self, key: str) -> str:
        return str(self.path / key)

    def stage(self, spark: SparkSession, frame: DataFrame, key: str) -> StagedFrame:
        final = self.path / key
        staging = _staging_beside(final)
        frame.write.parquet(spark_path(staging))
        return _LocalStagedFrame(staging, final, read_parquet(spark, staging))

    def stage_split(self, spark: SparkSession, frame: DataFrame, by: str, keys: Sequence[str]) -> list[Staged]:
        root = self.path / ".staging" / f"split.{uuid.uuid4().hex}"
        staged: list[Staged] = []
        try:
            schema = write_split(spark, frame, by, root)
            for i, key in enumerate(keys):
                final = self.path / key
                staging, written = _staging_beside(final), root / f"{by}={i}"
                staging.parent.mkdir(parents=True, exist_ok=True)
                if written.is_dir():
                    written.rename(staging)
                else:
                    staging.mkdir()
                    write_empty(schema, staging)
                staged.append(_LocalStaged(staging, final))
        except BaseException:
            for each in staged:
                each.discard()
            raise
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return staged

    def keep_table(self, key: str, table: pa.Table) -> None:
        staging = _staging_beside(self.path / key)
        staging.mkdir(parents=True)
        with open(staging / "part-00000.parquet", "wb") as out:
            pq.write_table(with_spark_schema(table), out)
            out.flush()
            os.fsync(out.fileno())
        (staging / "_SUCCESS").touch()
        swap_in(staging, self.path / key, None)

    def read(self, spark: SparkSession, key: str) -> Optional[DataFrame]:
        folder = self.path / key
        return read_parquet(spark, folder) if folder.is_dir() else None

    def read_table(self, key: str) -> Optional[pa.Table]:
        folder = self.path / key
        return pq.read_table(folder) if folder.is_dir() else None

    def read_many(self, spark: SparkSession, keys: list[str], schema: str | StructType) -> DataFrame:
        if not keys:
            return local_frame(spark, [], schema)
        return spark.read.schema(schema).parquet(*(spark_path(self.path / key) for key in keys))

    def frames(self, prefix: str, pattern: str) -> list[str]:
        folder = self.path / prefix
        found = sorted(p.parent for p in folder.glob(f"{pattern}/_SUCCESS")) if folder.is_dir() else []
        return [f"{prefix.rstrip('/')}/{p.name}" for p in found]

    def record(self, key: str) -> Optional[dict[str, Any]]:
        text = self.read_text(f"{key}/{TIMES_FILE}")
        return None if text is None else json.loads(text)

    def fingerprint(self, key: str) -> str:
        """Every write gives a frame new part file names: its files' names, sizes and times."""
        folder = self.path / key
        files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
        return "\n".join(f"{p.relative_to(folder)}\0{p.stat().st_size}\0{p.stat().st_mtime_ns}" for p in files)

    def read_text(self, key: str) -> Optional[str]:
        path = self.path / key
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def write_text(self, key: str, text: str) -> None:
        path = self.path / key
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
        with open(partial, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)

    def keys(self, prefix: str) -> list[str]:
        folder = self.path / prefix
        if not folder.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.path)) for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")
        )

    def remove(self, key: str) -> None:
        (self.path / key).unlink(missing_ok=True)


def _staging_beside(final: Path) -> Path:
    """A hidden directory no reader lists; its own name is not hidden, or Spark warns that it
    ignores the path it reads back."""
    return final.parent / ".staging" / f"{final.name}.{uuid.uuid4().hex}"


@dataclass
class _LocalStaged(Staged):
    staging: Path
    final: Path

    def commit(self, record: Optional[dict[str, Any]] = None) -> None:
        swap_in(self.staging, self.final, record)

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


@dataclass
class _LocalStagedFrame(_LocalStaged, StagedFrame):
    frame: DataFrame


def swap_in(staging: Path, final: Path, record: Optional[dict[str, Any]]) -> None:
    """Put a written frame in its place with its record (TIMES_FILE): a reader finds the old one
    or the new one, never a mix."""
    if record is not None:
        (staging / TIMES_FILE).write_text(json.dumps(record))
    replaced = final.with_name(f".{final.name}.{uuid.uuid4().hex}.replaced")
    if final.exists():
        final.rename(replaced)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(final)
    shutil.rmtree(replaced, ignore_errors=True)


def read_parquet(spark: SparkSession, path: str | os.PathLike[str]) -> DataFrame:
    """Parquet Spark wrote, in the schema in its footer: letting Spark infer it costs a job per read."""
    schema = stored_schema(path)
    reader = spark.read if schema is None else spark.read.schema(schema)
    return reader.parquet(spark_path(path))


def with_spark_schema(table: pa.Table) -> pa.Table:
    """`table` with its Spark schema in its metadata, where Spark's own writes keep it (stored_schema)."""
    schema = from_arrow_schema(table.schema).json().encode()
    return table.replace_schema_metadata({**(table.schema.metadata or {}), SPARK_SCHEMA_KEY: schema})


def stored_schema(path: str | os.PathLike[str]) -> Optional[StructType]:
    """The Spark schema in the footer of a part file under `path` (None when there is none), every
    field nullable as Spark reads files: a column claimed non-null lets Spark drop null tests."""
    parts = sorted(p for p in Path(path).glob("*.parquet") if not p.name.startswith(("_", ".")))
    if not parts:
        return None
    stored = (pq.read_metadata(parts[0]).metadata or {}).get(SPARK_SCHEMA_KEY)
    return None if stored is None else nullable_schema(stored)


def nullable_schema(schema_json: str | bytes) -> StructType:
    """A Spark schema from its JSON, every field nullable."""
    return StructType.fromJson(_nullable(json.loads(schema_json)))


def _nullable(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: True if k in _NULLABILITY else _nullable(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_nullable(v) for v in node]
    return node


class ObjectState(StateFiles):
    """The state directory on an object store. A frame at `key` is its manifest
    (`key/FRAME_MANIFEST`) and the parts it names (`key/gen=<id>/part-<id>.parquet`), written by
    the executors that computed them; writing the manifest is the commit, and the parts of the
    frame it replaced are removed after it."""

    commits_at_once = 16  # each commit is a few requests to the store

    def __init__(self, root: str, store: Store):
        self.root, self.store, self.io = root.rstrip("/"), store, store.object_io()

    def stage(self, spark: SparkSession, frame: DataFrame, key: str) -> StagedFrame:
        generation = f"{key}/gen={uuid.uuid4().hex}"
        written = frame.mapInArrow(_part_writer(self.io, generation), "part string").collect()
        manifest = {"parts": sorted(row["part"] for row in written), "schema": frame.schema.json()}
        return _ObjectStagedFrame(self, key, manifest, self._frame(spark, manifest))

    def stage_split(self, spark: SparkSession, frame: DataFrame, by: str, keys: Sequence[str]) -> list[Staged]:
        generation = uuid.uuid4().hex
        columns = [c for c in frame.columns if c != by]
        writer = _split_part_writer(self.io, [f"{key}/gen={generation}" for key in keys], by, columns)
        written = frame.repartition(by).sortWithinPartitions(by).mapInArrow(writer, "part_of int, part string")
        parts: dict[int, list[str]] = {}
        for row in written.collect():
            parts.setdefault(row["part_of"], []).append(row["part"])
        schema = frame.select(*columns).schema.json()
        return [
            _ObjectStaged(self, key, {"parts": sorted(parts.get(i, [])), "schema": schema})
            for i, key in enumerate(keys)
        ]

    def keep_table(self, key: str, table: pa.Table) -> None:
        part = f"{key}/gen={uuid.uuid4().hex}/part-{uuid.uuid4().hex}.parquet"
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        self.io.put(self.io.connect(), part, sink.getvalue().to_pybytes())
        self.commit(key, {"parts": [part], "schema": from_arrow_schema(table.schema).json()})

    def commit(self, key: str, manifest: dict[str, Any]) -> None:
        """Make the frame `manifest` names the one at `key`, in one request; then remove the parts
        of the frame it replaced."""
        replaced = self._manifest(key)
        self.store.write_text(f"{key}/{FRAME_MANIFEST}", json.dumps(manifest))
        for part in (replaced or {}).get("parts", []):  # committed: a part left behind is only garbage
            if part not in manifest["parts"]:
                try:
                    self.store.remove(part)
                except StoreError as exc:
                    log.warning("a replaced part stays: %s", exc)

    def read(self, spark: SparkSession, key: str) -> Optional[DataFrame]:
        manifest = self._manifest(key)
        return None if manifest is None else self._frame(spark, manifest)

    def read_many(self, spark: SparkSession, keys: list[str], schema: str | StructType) -> DataFrame:
        manifests = [m for m in (self._manifest(key) for key in keys) if m is not None]
        parts = [part for manifest in manifests for part in manifest["parts"]]
        wanted = schema if isinstance(schema, StructType) else StructType.fromDDL(schema)
        return self._frame(spark, {"parts": parts, "schema": wanted.json()})

    def read_table(self, key: str) -> Optional[pa.Table]:
        manifest = self._manifest(key)
        if manifest is None:
            return None
        client = self.io.connect()
        tables = [pq.read_table(pa.BufferReader(self.io.get(client, part))) for part in manifest["parts"]]
        if not tables:
            return to_arrow_schema(nullable_schema(manifest["schema"]), timezone="UTC").empty_table()
        return pa.concat_tables(tables)

    def frames(self, prefix: str, pattern: str) -> list[str]:
        start = prefix.rstrip("/") + "/"
        found = []
        for key in self.store.keys(start):
            name, _, rest = key[len(start) :].partition("/")
            if rest == FRAME_MANIFEST and fnmatch.fnmatchcase(name, pattern):
                found.append(start + name)
        return sorted(found)

    def record(self, key: str) -> Optional[dict[str, Any]]:
        manifest = self._manifest(key)
        return None if manifest is None else manifest.get("record")

    def fingerprint(self, key: str) -> str:
        """Every write names new parts in its manifest."""
        text = self.store.read_text(f"{key}/{FRAME_MANIFEST}")
        return "" if text is None else hashlib.sha256(text.encode()).hexdigest()

    def read_text(self, key: str) -> Optional[str]:
        return self.store.read_text(key)

    def write_text(self, key: str, text: str) -> None:
        self.store.write_text(key, text)

    def keys(self, prefix: str) -> list[str]:
        return self.store.keys(prefix)

    def remove(self, key: str) -> None:
        self.store.remove(key)

    def _manifest(self, key: str) -> Optional[dict[str, Any]]:
        text = self.store.read_text(f"{key}/{FRAME_MANIFEST}")
        return None if text is None else json.loads(text)

    def _frame(self, spark: SparkSession, manifest: dict[str, Any]) -> DataFrame:
        schema = nullable_schema(manifest["schema"])
        parts = manifest["parts"]
        if not parts:
            return local_frame(spark, [], schema)
        return local_frame(spark, [(part,) for part in parts], "part string").mapInArrow(
            _part_reader(self.io, schema), schema
        )


@dataclass
class _ObjectStaged(Staged):
    state: ObjectState
    key: str
    manifest: dict[str, Any]

    def commit(self, record: Optional[dict[str, Any]] = None) -> None:
        self.state.commit(self.key, {**self.manifest, **({"record": record} if record is not None else {})})

    def discard(self) -> None:
        for part in self.manifest["parts"]:
            self.state.store.remove(part)


@dataclass
class _ObjectStagedFrame(_ObjectStaged, StagedFrame):
    frame: DataFrame


def _part_writer(io: ObjectIO, generation: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executor's side of a write: its task's rows as one Parquet part, its key returned.
    A retried task writes a part of its own name; only the parts returned are in the manifest."""

    def body(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        sink, writer = pa.BufferOutputStream(), None
        for batch in batches:
            if writer is None:
                writer = pq.ParquetWriter(sink, batch.schema)
            writer.write_batch(batch)
        if writer is None:
            return
        writer.close()
        key = f"{generation}/part-{uuid.uuid4().hex}.parquet"
        io.put(io.connect(), key, sink.getvalue().to_pybytes())
        yield pa.RecordBatch.from_pydict({"part": [key]})

    return body


_SPLIT_PARTS = pa.schema([("part_of", pa.int32()), ("part", pa.string())])  # each part and its key's index


def _split_part_writer(
    io: ObjectIO, generations: list[str], by: str, columns: list[str]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executor's side of a split write: its task's rows of each value i of `by` as one
    Parquet part under generations[i], each part's value and key returned."""

    def body(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        client, values, keys = None, [], []
        sink, writer = None, None

        def put() -> None:
            nonlocal client
            writer.close()  # type: ignore[union-attr]
            client = client or io.connect()
            keys.append(f"{generations[values[-1]]}/part-{uuid.uuid4().hex}.parquet")
            io.put(client, keys[-1], sink.getvalue().to_pybytes())  # type: ignore[union-attr]

        for value, run in value_runs(batches, by):
            rows = run.select(columns)
            if not values or values[-1] != value:
                if writer is not None:
                    put()
                values.append(value)
                sink = pa.BufferOutputStream()
                writer = pq.ParquetWriter(sink, rows.schema)
            writer.write_batch(rows)  # type: ignore[union-attr]
        if writer is not None:
            put()
        yield pa.RecordBatch.from_pydict({"part_of": values, "part": keys}, _SPLIT_PARTS)

    return body


def _part_reader(io: ObjectIO, schema: StructType) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    names = schema.names

    def body(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        client = None
        for batch in batches:
            for part in batch.column("part").to_pylist():
                client = client or io.connect()
                table = pq.read_table(pa.BufferReader(io.get(client, part)))
                yield from table.select(names).to_batches()

    return body


def is_object_uri(state_dir: str) -> bool:
    scheme, separator, _ = state_dir.partition("://")
    return bool(separator) and scheme.lower() in STATE_SCHEMES


def state_files(config: GcConfig) -> StateFiles:
    """The configuration's state directory: on an object store when state_dir is a URI of one
    (checked writable once per process), else the local path."""
    if is_object_uri(config.state_dir):
        return _object_state(config.state_dir, _store_environment())
    return LocalState(config.state_path)


def _store_environment() -> tuple[tuple[str, str], ...]:
    """The variables a store's settings come from: a process that changes them gets a new store."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_STORE_VARIABLES)))


_STORE_VARIABLES = ("AWS_", "AZURE_", "GOOGLE_", "STORAGE_EMULATOR", "GC_ASSETS_")


@lru_cache(maxsize=8)
def _object_state(uri: str, environment: tuple[tuple[str, str], ...]) -> ObjectState:
    from gc_assets.stores import store_at

    try:
        state = ObjectState(uri, store_at(uri))
        probe = f"_gc_probe/{uuid.uuid4().hex}"
        state.write_text(probe, "gc_assets checks that it can write its state here")
        state.remove(probe)
    except StoreError as exc:
        raise StateError(f"state_dir {uri} cannot be written: {exc}. Nothing was moved or deleted") from None
    return state
