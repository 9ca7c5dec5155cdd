"""Listing and reading the part files of a metadata dataset, wherever it is stored.

Local files are read by Spark itself. There is no S3A (nor ABFS, nor the GCS connector)
on these machines, so files on S3 are read on executors with pyarrow's S3 filesystem, and
files on Azure and GCS with the stores' own clients (stores/settings.py), one per
partition, through mapInArrow over the list of files; the driver only lists the files
and, for Parquet, reads the first file's footer for the schema. Every function takes the
repository's store settings (its gc.yaml `s3`, `azure`, `gcs` overrides over each cloud's
environment); credentials come from the environment.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterator, Optional

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from gc_assets.core.config import redacted
from gc_assets.core.spark import local_frame, task_count
from gc_assets.core.uris import local_path
from gc_assets.sources.base import SourceError
from gc_assets.stores.blobs import retried
from gc_assets.stores.retries import RetryPolicy
from gc_assets.stores.s3.client import S3Settings
from gc_assets.stores.settings import blob_location, is_blob_uri
from gc_assets.stores.slices import Slice

TEXT_SCHEMA = T.StructType(
    [
        T.StructField("value", T.StringType(), True),
        T.StructField("file", T.StringType(), False),
        T.StructField("modified", T.TimestampType(), True),  # the file's modification time
    ]
)
TEXT_ARROW_SCHEMA = to_arrow_schema(TEXT_SCHEMA, timezone="UTC")
LINE_BREAK = re.compile(r"\r\n|\r|\n")  # the line ends Spark's text source splits on


def is_s3(uri: str) -> bool:
    return uri.startswith(("s3://", "s3a://", "s3n://"))


def is_remote(uri: str) -> bool:
    """Read by this module on executors rather than by Spark: S3, Azure and GCS files."""
    return is_s3(uri) or is_blob_uri(uri)


def s3_filesystem(settings: S3Settings) -> Any:
    """pyarrow's S3 filesystem for the repository's endpoint, region and gc.yaml credentials (else
    those of the environment), with the stores' timeouts and their RetryPolicy's attempts.

    The AWS SDK's default strategy retries at once, then after 50 ms, doubling: 3.15 s over 8
    attempts, each pause within the policy's. Its standard strategy pauses up to 1 s, 2 s, 4 s...,
    so a refused endpoint was named after about 50 s whatever the timeouts. The default one's
    max_attempts counts retries. pyarrow takes no deadline: a silent endpoint costs each attempt
    its timeouts."""
    from pyarrow import fs

    given = settings.credentials()
    keys = {
        "aws_access_key_id": "access_key",
        "aws_secret_access_key": "secret_key",
        "aws_session_token": "session_token",
    }
    credentials = {keys[name]: value for name, value in given.items()}
    return fs.S3FileSystem(
        endpoint_override=settings.endpoint_url,
        region=settings.region or "us-east-1",
        connect_timeout=settings.timeouts.connect,
        request_timeout=settings.timeouts.read,
        retry_strategy=fs.AwsDefaultS3RetryStrategy(max_attempts=RetryPolicy().attempts - 1),
        **credentials,
    )


def _s3_path(uri: str) -> str:
    return uri.split("://", 1)[1]


def list_files(location: str, settings: S3Settings) -> list[str]:
    """URIs of the regular files directly under `location`, sorted; empty when it does not exist."""
    return sorted(list_stamped_files(location, settings))


def list_stamped_files(location: str, settings: S3Settings) -> dict[str, str]:
    """The regular files directly under `location`, each with a stamp that changes when the file
    is written again (size and modification time; locally also the inode, on Azure and GCS the
    ETag or generation); empty when `location` does not exist."""
    if location.startswith("file://"):
        directory = local_path(location)
        if not os.path.isdir(directory):
            return {}
        with os.scandir(directory) as entries:
            return {
                f"file://{entry.path}": _stat_stamp(stat)
                for entry in entries
                if entry.is_file() and (stat := entry.stat())
            }
    if is_s3(location):
        from pyarrow import fs

        try:
            infos = s3_filesystem(settings).get_file_info(
                fs.FileSelector(_s3_path(location).rstrip("/"), allow_not_found=True)
            )
        except OSError as exc:
            raise SourceError(redacted(f"cannot list metadata at {location}: {exc}")) from None
        return {f"s3://{info.path}": f"{info.size}:{info.mtime_ns}" for info in infos if info.type == fs.FileType.File}
    if is_blob_uri(location):
        try:
            client, key, root = blob_location(location, settings)
            directory = key.rstrip("/") + "/"
            found = list(client.list(Slice(directory, recursive=False), RetryPolicy(timeouts=settings.timeouts)))
        except Exception as exc:  # noqa: BLE001 - the SDKs' errors, named
            raise SourceError(redacted(f"cannot list metadata at {location}: {type(exc).__name__}: {exc}")) from None
        return {root + item.key: f"{item.size}:{item.version}" for item in found if not item.key.endswith("/")}
    raise SourceError(f"cannot read metadata from {location!r}: unsupported scheme")


class ParsedFiles:
    """Parsed files kept cached on the executors under a key naming each file with its stamp,
    for the `capacity` most recently used keys; the others are unpersisted.

    Every step of a run builds its own connector and would parse the same immutable log
    again (a Delta table's log six times per run); a file written again gets a new stamp,
    so a table recreated at the same path is parsed afresh. The bound also keeps a
    long-running process from caching a copy per step, forever.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, Hashable], tuple[SparkSession, DataFrame]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, spark: SparkSession, key: Hashable, parse: Callable[[], DataFrame]) -> DataFrame:
        """The cached frame of `key` in this session, else `parse()` (cached by it; a refusal is not kept)."""
        with self._lock:
            entry = self._entries.get((id(spark), key))
            if entry is not None and entry[0] is spark:
                self._entries.move_to_end((id(spark), key))
                return entry[1]
            frame = parse()
            self._entries[(id(spark), key)] = (spark, frame)
            while len(self._entries) > self.capacity:
                _, (_, evicted) = self._entries.popitem(last=False)
                evicted.unpersist()
            return frame


def read_small_file(uri: str, settings: S3Settings) -> bytes:
    """The whole content of a small metadata file (a pointer, a refs part), read on the driver."""
    try:
        if is_s3(uri):
            with s3_filesystem(settings).open_input_stream(_s3_path(uri)) as stream:
                return stream.read()
        if is_blob_uri(uri):
            return _blob_bytes(uri, settings)
        with open(local_path(uri), "rb") as handle:
            return handle.read()
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - OSError, or an SDK's error on Azure and GCS
        raise SourceError(redacted(f"cannot read {uri}: {exc}")) from None


def file_stamp(uri: str, settings: S3Settings) -> tuple[int, int]:
    """(size, modification time in ns) of one file: a cheap sign that it changed."""
    if is_s3(uri):
        info = s3_filesystem(settings).get_file_info(_s3_path(uri))
        return info.size, info.mtime_ns
    if is_blob_uri(uri):
        found = _blob_info(uri, settings)
        return found.size, int(found.modified.timestamp() * 1_000_000) * 1000
    stat = os.stat(local_path(uri))
    return stat.st_size, stat.st_mtime_ns


def _blob_info(uri: str, settings: S3Settings) -> Any:
    client, key, _ = blob_location(uri, settings)
    found = retried(client, f"head {uri}", lambda: client.head(key), RetryPolicy(timeouts=settings.timeouts))
    if found is None:
        raise SourceError(f"cannot read {uri}: it does not exist")
    return found


def _blob_bytes(uri: str, settings: S3Settings) -> bytes:
    client, key, _ = blob_location(uri, settings)
    return retried(client, f"read {uri}", lambda: client.read(key), RetryPolicy(timeouts=settings.timeouts))


def _decompressed(uri: str, data: bytes) -> bytes:
    """`data` decompressed by the file's extension (.gz, .bz2, ...), as Spark's text source does."""
    try:
        codec = pa.Codec.detect(uri)
    except (TypeError, ValueError):  # no compression extension
        return data
    return pa.input_stream(pa.py_buffer(data), compression=codec.name).read()


def read_parquet(
    spark: SparkSession, files: list[str], settings: S3Settings, schema: Optional[T.StructType] = None
) -> DataFrame:
    """Parquet part files as one DataFrame, in `schema` or the first file's schema, read from its
    footer on the driver (Spark's own inference is a job per read, and a set reads many).

    Columns a file lacks are null, as with Spark's own reader.
    """
    if schema is None:
        try:
            if is_blob_uri(files[0]):
                footer = pq.read_schema(pa.BufferReader(_blob_bytes(files[0], settings)))
            elif is_s3(files[0]):
                footer = pq.read_schema(_s3_path(files[0]), filesystem=s3_filesystem(settings))
            else:
                footer = pq.read_schema(local_path(files[0]))
            schema = from_arrow_schema(footer)
        except Exception as exc:  # noqa: BLE001 - OSError, or an SDK's error on Azure and GCS
            raise SourceError(redacted(f"cannot read the Parquet footer of {files[0]}: {exc}")) from None
    if not any(is_remote(f) for f in files):
        return spark.read.schema(schema).parquet(*files)
    target = to_arrow_schema(schema, timezone="UTC")

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        filesystem = s3_filesystem(settings) if any(is_s3(f) for f in files) else None
        for batch in batches:
            for uri in batch.column("file").to_pylist():
                if is_blob_uri(uri):
                    table = pq.read_table(pa.BufferReader(_blob_bytes(uri, settings)))
                else:
                    table = pq.read_table(_s3_path(uri), filesystem=filesystem)
                yield from conform(table, target).to_batches()

    return _files_frame(spark, files).mapInArrow(read, schema)


def _stat_stamp(stat: os.stat_result) -> str:
    """What changes when a local file is written again, even in place or by a rename over it."""
    return f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}"


def read_text(spark: SparkSession, files: list[str], settings: S3Settings) -> DataFrame:
    """Text files as rows (value, file, modified), one per line.

    Compressed files (.gz, .bz2, ...) are decompressed by extension, as Spark does.
    """
    if not any(is_remote(f) for f in files):
        return spark.read.text(files).select(
            "value", F.input_file_name().alias("file"), F.col("_metadata.file_modification_time").alias("modified")
        )

    def rows(uri: str, content: bytes, modified: dt.datetime) -> pa.RecordBatch:
        values = split_lines(content.decode("utf-8"))
        return pa.RecordBatch.from_arrays(
            [
                pa.array(values, pa.string()),
                pa.array([uri] * len(values), pa.string()),
                pa.array([modified] * len(values), pa.timestamp("us", tz="UTC")),
            ],
            schema=TEXT_ARROW_SCHEMA,
        )

    return map_files(spark, files, settings, rows, TEXT_SCHEMA)


def map_files(
    spark: SparkSession,
    files: list[str],
    settings: S3Settings,
    parse: Callable[[str, bytes, dt.datetime], pa.RecordBatch],
    schema: T.StructType,
) -> DataFrame:
    """`parse(uri, content, modified)` of every whole file, on executors, a few files per task.

    Local files are opened directly (executors see the same paths Spark's own readers
    would), S3 with pyarrow, Azure and GCS with the stores' clients; content is
    decompressed by extension.
    """

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        filesystem = s3_filesystem(settings) if any(is_s3(f) for f in files) else None
        for batch in batches:
            for uri in batch.column("file").to_pylist():
                yield parse(uri, *_whole_file(uri, settings, filesystem))

    return _files_frame(spark, files).mapInArrow(read, schema)


def _whole_file(uri: str, settings: S3Settings, filesystem: Any) -> tuple[bytes, dt.datetime]:
    """(decompressed content, modification time) of one file; local times in whole
    milliseconds, as Spark's file sources report them."""
    if is_blob_uri(uri):
        return _decompressed(uri, _blob_bytes(uri, settings)), _blob_info(uri, settings).modified
    if is_s3(uri):
        modified = filesystem.get_file_info(_s3_path(uri)).mtime
        with filesystem.open_input_stream(_s3_path(uri)) as stream:
            return _decompressed(uri, stream.read()), modified
    path = local_path(uri)
    with open(path, "rb") as handle:
        content = handle.read()
    millis = os.stat(path).st_mtime_ns // 1_000_000
    return _decompressed(uri, content), dt.datetime.fromtimestamp(millis // 1000, dt.timezone.utc) + dt.timedelta(
        milliseconds=millis % 1000
    )


def split_lines(text: str) -> list[str]:
    """Lines as Spark's text source yields them: no trailing empty line after a final line break."""
    lines = LINE_BREAK.split(text)
    return lines[:-1] if lines and lines[-1] == "" else lines


def conform(table: pa.Table, target: pa.Schema) -> pa.Table:
    """`table` with exactly `target`'s columns, in order and types; missing ones are null."""
    columns = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in target
    ]
    return pa.Table.from_arrays(columns, schema=target)


def _files_frame(spark: SparkSession, files: list[str]) -> DataFrame:
    """One row per file, spread so that each executor task reads a few."""
    partitions = task_count(spark, len(files))
    return local_frame(spark, [(f,) for f in files], "file string").repartition(partitions)
