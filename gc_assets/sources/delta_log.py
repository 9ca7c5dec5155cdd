"""Reading a Delta table's `_delta_log` with Spark (docs/design.md §6.2).

The driver only lists file names and decides which files to read: JSON commits,
classic, multi-part and v2 checkpoints (with their sidecars) and `_last_checkpoint`.
Every action is parsed and replayed on executors with DataFrame operations, so a
log of millions of actions is never collected. Bad input (a missing version, an
unreadable checkpoint, a line that does not parse) raises a DeltaLogError naming
the file and line: a GC must never guess what the table holds.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from gc_assets.core.spark import local_frame
from gc_assets.sources.base import SourceError
from gc_assets.sources.files import (
    ParsedFiles,
    conform,
    list_files,
    list_stamped_files,
    map_files,
    read_parquet,
    read_small_file,
)
from gc_assets.stores.s3.client import S3Settings

LOG_DIR = "_delta_log"
SIDECAR_DIR = "_sidecars"
COMMIT_NAME = re.compile(r"^(\d{20})\.json$")
CLASSIC_CHECKPOINT_NAME = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
MULTIPART_CHECKPOINT_NAME = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
V2_CHECKPOINT_NAME = re.compile(r"^(\d{20})\.checkpoint\.([0-9a-fA-F-]{36})\.(json|parquet)$")
LAST_CHECKPOINT = "_last_checkpoint"

# Delta's Z85 alphabet: a relative deletion vector names its file by a Z85-encoded UUID.
Z85_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
Z85_UUID_LENGTH = 20

_DELETION_VECTOR = T.StructType(
    [
        T.StructField("storageType", T.StringType()),
        T.StructField("pathOrInlineDv", T.StringType()),
        T.StructField("offset", T.IntegerType()),
        T.StructField("sizeInBytes", T.IntegerType()),
        T.StructField("cardinality", T.LongType()),
    ]
)
_FILE_ACTION = [
    T.StructField("path", T.StringType()),
    T.StructField("size", T.LongType()),
    T.StructField("deletionVector", _DELETION_VECTOR),
]
# The subset of Delta actions the GC needs; checkpoints and JSON commits share it.
ACTION_SCHEMA = T.StructType(
    [
        T.StructField("add", T.StructType(_FILE_ACTION + [T.StructField("modificationTime", T.LongType())])),
        T.StructField("remove", T.StructType(_FILE_ACTION + [T.StructField("deletionTimestamp", T.LongType())])),
        T.StructField(
            "cdc", T.StructType([T.StructField("path", T.StringType()), T.StructField("size", T.LongType())])
        ),
        T.StructField(
            "commitInfo",
            T.StructType([T.StructField("timestamp", T.LongType()), T.StructField("inCommitTimestamp", T.LongType())]),
        ),
        T.StructField(
            "metaData",
            T.StructType(
                [
                    T.StructField("partitionColumns", T.ArrayType(T.StringType())),
                    T.StructField("configuration", T.MapType(T.StringType(), T.StringType())),
                ]
            ),
        ),
        T.StructField("sidecar", T.StructType([T.StructField("path", T.StringType())])),
        T.StructField(
            "protocol",
            T.StructType(
                [
                    T.StructField("minReaderVersion", T.IntegerType()),
                    T.StructField("minWriterVersion", T.IntegerType()),
                    T.StructField("readerFeatures", T.ArrayType(T.StringType())),
                    T.StructField("writerFeatures", T.ArrayType(T.StringType())),
                ]
            ),
        ),
    ]
)


class DeltaLogError(SourceError):
    """The log cannot be replayed exactly; the message names the file (and line)."""


@dataclass(frozen=True)
class Checkpoint:
    version: int
    files: tuple[str, ...]  # every part; a v2 checkpoint's sidecars are found inside it


@dataclass
class LogListing:
    """What `_delta_log` holds, by version, and which range of versions can be replayed."""

    log_uri: str
    commits: dict[int, str] = field(default_factory=dict)
    checkpoints: dict[int, Checkpoint] = field(default_factory=dict)
    last_checkpoint: Optional[str] = None
    start: int = 0  # oldest version whose state is known (0, or a checkpoint after log cleanup)
    head: int = 0
    settings: S3Settings = field(default_factory=S3Settings.from_environment)  # to read the files listed
    stamps: dict[str, str] = field(default_factory=dict)  # each listed file's stamp (files.list_stamped_files)

    def checkpoint_at_or_before(self, version: int) -> Optional[Checkpoint]:
        """The newest checkpoint usable as the base of `version`'s state (None: replay from version 0)."""
        usable = [v for v in self.checkpoints if self.start <= v <= version]
        if not usable:
            if self.start != 0 or 0 not in self.commits:
                raise DeltaLogError(f"{self.log_uri}: no checkpoint or commit 0 to rebuild version {version} from")
            return None
        return self.checkpoints[max(usable)]

    @property
    def versions(self) -> range:
        return range(self.start, self.head + 1)


def classify(log_uri: str, uris: list[str], settings: Optional[S3Settings] = None) -> LogListing:
    """Sort `_delta_log` file URIs into commits and complete checkpoints (pure; no I/O)."""
    listing = LogListing(log_uri, settings=settings or S3Settings.from_environment())
    parts: dict[tuple[int, int], set[int]] = {}
    part_files: dict[tuple[int, int], list[str]] = {}
    for uri in uris:
        name = uri.rsplit("/", 1)[-1]
        if match := COMMIT_NAME.match(name):
            listing.commits[int(match.group(1))] = uri
        elif match := CLASSIC_CHECKPOINT_NAME.match(name) or V2_CHECKPOINT_NAME.match(name):
            version = int(match.group(1))
            # Several checkpoints of one version are equivalent; keep one, deterministically.
            if version not in listing.checkpoints or uri < listing.checkpoints[version].files[0]:
                listing.checkpoints[version] = Checkpoint(version, (uri,))
        elif match := MULTIPART_CHECKPOINT_NAME.match(name):
            key = (int(match.group(1)), int(match.group(3)))
            parts.setdefault(key, set()).add(int(match.group(2)))
            part_files.setdefault(key, []).append(uri)
        elif name == LAST_CHECKPOINT:
            listing.last_checkpoint = uri
    for (version, total), seen in parts.items():
        if seen == set(range(1, total + 1)) and version not in listing.checkpoints:
            listing.checkpoints[version] = Checkpoint(version, tuple(sorted(part_files[(version, total)])))
    _plan_replay(listing)
    return listing


def _plan_replay(listing: LogListing) -> None:
    """Choose the replay range: from version 0 when every commit is there, else from the
    oldest checkpoint followed by every later commit. A gap anywhere above it is an error."""
    known = set(listing.commits) | set(listing.checkpoints)
    if not known:
        raise DeltaLogError(f"{listing.log_uri}: no commits or checkpoints: not a Delta table")
    listing.head = max(known)
    missing = [v for v in range(listing.head + 1) if v not in listing.commits]
    if not missing:
        listing.start = 0
        return
    for version in sorted(listing.checkpoints):
        if all(v in listing.commits for v in range(version + 1, listing.head + 1)):
            listing.start = version
            return
    after_checkpoints = [v for v in missing if v > max(listing.checkpoints, default=-1)]
    gap = after_checkpoints[0] if after_checkpoints else missing[-1]
    raise DeltaLogError(
        f"{listing.log_uri}: version {gap} is missing ({gap:020d}.json not found) and no checkpoint covers it"
    )


def list_log(table_uri: str, settings: S3Settings) -> LogListing:
    log_uri = f"{table_uri.rstrip('/')}/{LOG_DIR}"
    stamps = list_stamped_files(log_uri, settings)
    listing = classify(log_uri, sorted(stamps), settings)
    listing.stamps = stamps
    return listing


def commit_id(version: int) -> str:
    return f"{version:020d}"


# --------------------------------------------------------------------------- reading


_PARSED_SCHEMA = T.StructType(
    [
        T.StructField("version", T.LongType()),
        T.StructField("file", T.StringType()),
        T.StructField("file_mtime", T.TimestampType()),
        T.StructField("line_no", T.LongType()),
        *ACTION_SCHEMA.fields,
        T.StructField("error", T.StringType()),  # why the line is not a Delta action; null when it is
    ]
)
_ACTION_ARROW = pa.struct(list(to_arrow_schema(ACTION_SCHEMA)))
_PARSED_ARROW = to_arrow_schema(_PARSED_SCHEMA, timezone="UTC")
_FILE_ACTIONS = ("add", "remove", "cdc")
_VERSION_IN_NAME = re.compile(r"(\d{20})\.[^/]*$")


def parse_actions(text: str) -> tuple[list[int], list[Optional[dict]], list[Optional[str]]]:
    """(line number, action, error) of every non-blank line of newline-delimited actions.

    A line is an error when it is not a JSON object, or names an add, remove or cdc
    action without a string path; its action is then None. Lines split on '\n' and
    blank means only spaces, as Spark's reader of these files did.
    """
    numbers: list[int] = []
    actions: list[Optional[dict]] = []
    errors: list[Optional[str]] = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip(" "):
            continue
        try:
            action = json.loads(line)
        except ValueError:
            action = None
        valid = isinstance(action, dict) and all(
            kind not in action or (isinstance(action[kind], dict) and isinstance(action[kind].get("path"), str))
            for kind in _FILE_ACTIONS
        )
        numbers.append(number)
        actions.append(action if valid else None)
        errors.append(None if valid else f"not a valid Delta action: {line[:200]!r}")
    return numbers, actions, errors


def _action_array(actions: list[Optional[dict]], errors: list[Optional[str]]) -> pa.StructArray:
    """`actions` as Arrow structs of ACTION_SCHEMA; a line whose values do not fit its types
    becomes an error (in `errors`) instead of a guess."""
    try:
        return pa.array(actions, _ACTION_ARROW)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    for index, action in enumerate(actions):
        try:
            pa.array([action], _ACTION_ARROW)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            actions[index] = None
            errors[index] = f"not a valid Delta action: {str(exc).splitlines()[0][:200]}"
    return pa.array(actions, _ACTION_ARROW)


def _actions_batch(uri: str, content: bytes, modified: dt.datetime) -> pa.RecordBatch:
    """One file's actions as rows of _PARSED_SCHEMA (runs on executors)."""
    numbers, actions, errors = parse_actions(content.decode("utf-8", errors="replace"))
    structs = _action_array(actions, errors)
    match = _VERSION_IN_NAME.search(uri)
    rows = len(numbers)
    columns = [
        pa.array([int(match.group(1)) if match else None] * rows, pa.int64()),
        pa.array([uri] * rows, pa.string()),
        pa.array([modified] * rows, pa.timestamp("us", tz="UTC")),
        pa.array(numbers, pa.int64()),
        *structs.flatten(),
        pa.array(errors, pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_PARSED_ARROW)


# Parsed commits and checkpoints of the tables most recently read in this process (two per table).
_PARSED_LOGS = ParsedFiles(capacity=8)


def _memoized(
    spark: SparkSession, listing: LogListing, what: str, files: Sequence[str], parse: Callable[[], DataFrame]
) -> DataFrame:
    """`parse()`, or its cached frame when these files were parsed with the same stamps before;
    files listed without a stamp are always parsed."""
    if not all(f in listing.stamps for f in files):
        return parse()
    key = (what, tuple((f, listing.stamps[f]) for f in files))
    return _PARSED_LOGS.get(spark, key, parse)


def parsed_log_files(spark: SparkSession, files: list[str], settings: S3Settings) -> DataFrame:
    """Newline-delimited actions of `files`, parsed on executors: one row per line with `file`,
    `version` (from the name), `file_mtime`, `line_no`, the actions, and `error` where the line is
    no valid action (see broken_line)."""
    return map_files(spark, files, settings, _actions_batch, _PARSED_SCHEMA)


def broken_line() -> Column:
    """A parsed line that is not a JSON object, or whose add/remove/cdc action has no path or a
    path that is not a valid URI."""
    broken = F.col("error").isNotNull()
    for kind in _FILE_ACTIONS:
        broken = broken | (F.col(kind).isNotNull() & decode_path(F.col(f"{kind}.path")).isNull())
    return broken


def broken_line_error(row: Mapping[str, Any]) -> str:
    """What is wrong with a broken line (`error`, or the file actions' paths)."""
    return row["error"] or "not a valid Delta action: " + repr([row[k]["path"] for k in _FILE_ACTIONS if row[k]])


def _parse_json_actions(spark: SparkSession, files: list[str], settings: S3Settings, what: str) -> DataFrame:
    """Parse newline-delimited actions on executors in one pass, refusing the first broken line
    (broken_line). Cached, with an `error` column that is null on every row."""
    parsed = parsed_log_files(spark, files, settings).cache()
    bad = parsed.filter(broken_line()).limit(1).collect()
    if bad:
        parsed.unpersist()
        row = bad[0]
        raise DeltaLogError(f"{what} {row['file']} line {row['line_no']}: {broken_line_error(row)}")
    return parsed


def read_commits(spark: SparkSession, listing: LogListing) -> DataFrame:
    """Actions of every JSON commit in the listing, with `version`, `file` and `line_no`."""
    if not listing.commits:
        return local_frame(spark, [], _ACTIONS_WITH_VERSION)
    files = [listing.commits[v] for v in sorted(listing.commits)]
    parsed = _memoized(
        spark, listing, "commits", files, lambda: _parse_json_actions(spark, files, listing.settings, "commit")
    )
    return parsed.drop("error")


_ACTIONS_WITH_VERSION = T.StructType(
    [
        T.StructField("version", T.LongType()),
        T.StructField("file", T.StringType()),
        T.StructField("file_mtime", T.TimestampType()),
        T.StructField("line_no", T.LongType()),
        *ACTION_SCHEMA.fields,
    ]
)


def read_checkpoint(spark: SparkSession, listing: LogListing, checkpoint: Checkpoint) -> DataFrame:
    """Actions of one checkpoint (classic, multi-part or v2 with sidecars), as of its version."""
    return _memoized(
        spark, listing, "checkpoint", checkpoint.files, lambda: _read_checkpoint(spark, listing, checkpoint)
    )


def _read_checkpoint(spark: SparkSession, listing: LogListing, checkpoint: Checkpoint) -> DataFrame:
    json_parts = [f for f in checkpoint.files if f.endswith(".json")]
    parquet_parts = [f for f in checkpoint.files if f.endswith(".parquet")]
    frames = []
    parsed_json = _parse_json_actions(spark, json_parts, listing.settings, "checkpoint") if json_parts else None
    if parsed_json is not None:
        frames.append(parsed_json.select(*ACTION_SCHEMA.names))
    if parquet_parts:
        for part in parquet_parts:
            _check_readable(spark, part, listing.settings, f"checkpoint {part}")
        frames.append(read_parquet(spark, parquet_parts, listing.settings, ACTION_SCHEMA))
    top = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
    sidecars = [r["path"] for r in top.filter(F.col("sidecar.path").isNotNull()).select("sidecar.path").collect()]
    if sidecars:
        files = set(list_files(f"{listing.log_uri}/{SIDECAR_DIR}", listing.settings))
        uris = [p if ":" in p.split("/", 1)[0] else f"{listing.log_uri}/{SIDECAR_DIR}/{p}" for p in sidecars]
        for uri in uris:
            if uri.startswith("file:") and uri not in files:
                raise DeltaLogError(f"checkpoint {checkpoint.files[0]} names sidecar {uri}, which is missing")
            _check_readable(spark, uri, listing.settings, f"sidecar {uri} of checkpoint {checkpoint.files[0]}")
        top = top.unionByName(read_parquet(spark, uris, listing.settings, ACTION_SCHEMA))
    actions = top.select(F.lit(checkpoint.version).cast("long").alias("version"), *ACTION_SCHEMA.names).cache()
    broken = F.lit(False)
    for kind in ("add", "remove"):
        path = F.col(f"{kind}.path")
        broken = broken | (F.col(kind).isNotNull() & (path.isNull() | decode_path(path).isNull()))
    bad = actions.filter(broken).select("add.path", "remove.path").limit(1).collect()
    if parsed_json is not None:  # `actions` holds its rows now
        parsed_json.unpersist()
    if bad:
        actions.unpersist()
        raise DeltaLogError(
            f"checkpoint {checkpoint.files[0]}: a file action has no path or an invalid one: {list(bad[0])}"
        )
    return actions


_CHECKPOINT_PART_SCHEMA = T.StructType([T.StructField("file", T.StringType()), *ACTION_SCHEMA.fields])


def _checkpoint_part(uri: str, content: bytes, modified: dt.datetime) -> pa.RecordBatch:
    """One Parquet checkpoint part's actions, with its file (runs on executors)."""
    target = to_arrow_schema(ACTION_SCHEMA, timezone="UTC")
    actions = conform(pq.read_table(pa.BufferReader(content)), target)
    columns = [pa.array([uri] * actions.num_rows, pa.string()), *(c.combine_chunks() for c in actions.columns)]
    return pa.RecordBatch.from_arrays(columns, schema=to_arrow_schema(_CHECKPOINT_PART_SCHEMA, timezone="UTC"))


def read_checkpoints(
    spark: SparkSession, wanted: Mapping[str, tuple[LogListing, Checkpoint]]
) -> tuple[DataFrame, dict[str, str]]:
    """Actions of many tables' checkpoints (`wanted` by a key such as the repository) read in one
    pass: (key, version, *ACTION_SCHEMA), and the keys whose checkpoint must be read alone
    (read_checkpoint), each with the reason: JSON parts or sidecars (a v2 checkpoint), a file
    action without a valid path (read alone, its refusal names it), another store's settings.

    Kept with the executors: the metadata, the replay and the committed files all read it."""
    owners = []
    alone: dict[str, str] = {}
    settings = None
    for key, (listing, checkpoint) in wanted.items():
        if any(not part.endswith(".parquet") for part in checkpoint.files):
            alone[key] = "JSON checkpoint"
        elif settings is not None and listing.settings != settings:
            alone[key] = "another store"
        else:
            settings = listing.settings
            owners += [(part, key, checkpoint.version) for part in checkpoint.files]
    schema = T.StructType([T.StructField("key", T.StringType()), T.StructField("version", T.LongType())])
    if not owners:
        return local_frame(spark, [], T.StructType([*schema.fields, *ACTION_SCHEMA.fields])), alone
    assert settings is not None
    parts = map_files(spark, [part for part, _, _ in owners], settings, _checkpoint_part, _CHECKPOINT_PART_SCHEMA)
    owner = local_frame(spark, owners, "file string, key string, version long")
    actions = parts.join(F.broadcast(owner), "file").select("key", "version", *ACTION_SCHEMA.names).localCheckpoint()
    broken = F.lit(False)
    for kind in ("add", "remove"):
        path = F.col(f"{kind}.path")
        broken = broken | (F.col(kind).isNotNull() & (path.isNull() | decode_path(path).isNull()))
    flagged = F.when(broken, F.lit("a file action without a valid path")).when(
        F.col("sidecar.path").isNotNull(), F.lit("sidecars")
    )
    for row in actions.filter(flagged.isNotNull()).groupBy("key").agg(F.min(flagged).alias("why")).collect():
        alone[row["key"]] = row["why"]
    return actions, alone


def _check_readable(spark: SparkSession, uri: str, settings: S3Settings, what: str) -> None:
    """Read the Parquet footer now, so a corrupt file is named instead of failing a later job."""
    try:
        read_parquet(spark, [uri], settings).schema
    except Exception as exc:  # Spark raises several exception types for a bad footer
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DeltaLogError(f"{what} is unreadable: {first_line[:300]}") from None


def verify_last_checkpoint(listing: LogListing) -> None:
    """`_last_checkpoint` must name a complete checkpoint the listing holds; otherwise the
    listing is incomplete or the log damaged, and nothing may be decided from it.

    Spark's file sources skip names starting with `_`, so this pointer of a few bytes
    is read on the driver, like the listing itself.
    """
    if listing.last_checkpoint is None:
        return
    content = read_small_file(listing.last_checkpoint, listing.settings)
    try:
        pointer = json.loads(content)
        version = int(pointer["version"])
    except (ValueError, KeyError, TypeError):
        raise DeltaLogError(f"{listing.last_checkpoint} line 1: not a valid checkpoint pointer") from None
    if version not in listing.checkpoints:
        raise DeltaLogError(
            f"{listing.last_checkpoint} names checkpoint {version}, which is missing or incomplete in {listing.log_uri}"
        )


# --------------------------------------------------------------------------- paths


def decode_path(path: Column) -> Column:
    """Delta paths are URIs: percent-escapes are decoded, '+' stays '+'. Null when malformed."""
    return F.try_url_decode(F.regexp_replace(path, r"\+", "%2B"))


def z85_uuid_column(encoded: Column) -> Column:
    """The canonical UUID string a 20-character Z85 string encodes, on executors.

    Written with higher-order functions: one small expression, however often the
    optimizer copies it (a nested arithmetic tree per character made planning crawl).
    """
    alphabet = F.lit(Z85_ALPHABET)

    def group_hex(group: Column) -> Column:
        chunk = F.substring(encoded, group * 5 + 1, 5)
        digits = F.transform(F.split(chunk, ""), lambda char: F.instr(alphabet, char).cast("long") - 1)
        value = F.aggregate(digits, F.lit(0).cast("long"), lambda total, digit: total * 85 + digit)
        return F.lpad(F.hex(value), 8, "0")

    hex_digits = F.lower(F.array_join(F.transform(F.sequence(F.lit(0), F.lit(3)), group_hex), ""))
    return F.concat_ws(
        "-",
        F.substring(hex_digits, 1, 8),
        F.substring(hex_digits, 9, 4),
        F.substring(hex_digits, 13, 4),
        F.substring(hex_digits, 17, 4),
        F.substring(hex_digits, 21, 12),
    )


def z85_uuid(encoded: str) -> str:
    """The UUID a Z85 string encodes (ZeroMQ RFC 32), in Python: z85_uuid_column's twin, for the
    delta-rs witness's deletion-vector names."""
    data = b""
    for start in range(0, len(encoded), 5):  # every 5 characters encode 4 bytes, big-endian
        value = 0
        for char in encoded[start : start + 5]:
            value = value * 85 + Z85_ALPHABET.index(char)
        data += value.to_bytes(4, "big")
    return str(uuid.UUID(bytes=data))


def deletion_vector_file(dv: Column) -> Column:
    """The file a deletion vector lives in: `u` relative (prefix + Z85 UUID), `p` absolute, `i` none."""
    stored = dv["pathOrInlineDv"]
    prefix = F.substring(stored, 1, F.greatest(F.length(stored) - Z85_UUID_LENGTH, F.lit(0)))
    encoded = F.substring(stored, -Z85_UUID_LENGTH, Z85_UUID_LENGTH)
    name = F.concat(F.lit("deletion_vector_"), z85_uuid_column(encoded), F.lit(".bin"))
    relative = F.when(F.length(prefix) > 0, F.concat(prefix, F.lit("/"), name)).otherwise(name)
    return (
        F.when(dv["storageType"] == "u", relative)
        .when(dv["storageType"] == "p", decode_path(stored))
        .otherwise(F.lit(None).cast("string"))
    )


def dv_key(dv: Column) -> Column:
    """The deletion vector's unique id, part of a logical file's identity in log replay."""
    return F.coalesce(F.concat_ws("|", dv["storageType"], dv["pathOrInlineDv"], dv["offset"].cast("string")), F.lit(""))


# --------------------------------------------------------------------------- replay


def file_events(actions: DataFrame, *carried: str) -> DataFrame:
    """One row per add/remove action: `carried` columns (a fleet's repository), version, is_add,
    raw path, dv key, decoded file, DV file, size.

    Both kinds come from one scan of `actions` (a line holding both yields two rows).
    """
    kinds = [
        F.when(
            F.col(kind).isNotNull(),
            F.struct(
                F.lit(kind == "add").alias("is_add"),
                F.col(f"{kind}.path").alias("path"),
                F.col(f"{kind}.size").alias("size"),
                F.col(f"{kind}.deletionVector").alias("dv"),
            ),
        )
        for kind in ("add", "remove")
    ]
    event = F.col("event")
    return (
        actions.filter(F.col("add").isNotNull() | F.col("remove").isNotNull())
        .select(*carried, "version", F.explode(F.array(*kinds)).alias("event"))
        .filter(event.isNotNull())
        .select(
            *carried,
            "version",
            event["is_add"].alias("is_add"),
            event["path"].alias("raw_path"),
            dv_key(event["dv"]).alias("dv"),
            decode_path(event["path"]).alias("address"),
            deletion_vector_file(event["dv"]).alias("dv_address"),
            event["size"].alias("size"),
        )
    )


def physical_files(files: DataFrame, *carried: str) -> DataFrame:
    """(address, size, *carried) of each data file and, as a row of its own, its deletion-vector
    file (size unknown), from one scan of `files` (address, dv_address, size, *carried)."""

    def row(address: Column, size: Column) -> Column:
        return F.struct(address.alias("address"), size.alias("size"), *(F.col(name).alias(name) for name in carried))

    vector = F.when(F.col("dv_address").isNotNull(), row(F.col("dv_address"), F.lit(None).cast("long")))
    both = F.explode(F.array(row(F.col("address"), F.col("size")), vector)).alias("p")
    return files.select(both).filter(F.col("p").isNotNull()).select("p.*")


def live_files(events: DataFrame, cdc: DataFrame, version: int | Column, *keys: str) -> DataFrame:
    """(*keys, address, size, at_head) of every physical file of snapshot(`version`) ∪ files added
    after it ∪ `cdc`; at_head: the newest snapshot of `events` holds it.

    Per logical file (path, DV) its last action up to `version` and its last action
    overall decide (an add means present; added and removed in one version counts as
    present, the safe side). `events` must hold the base checkpoint's actions and the
    commits after it. Two aggregations, by logical file then by physical address, and
    no join: the whole replay shuffles the events once. `keys` replay many tables at once
    (a fleet's repository), `version` then a column of `events` naming each one's own.
    """
    action = F.struct("version", "is_add", "address", "dv_address", "size")
    added_later = (F.col("version") > version) & F.col("is_add")
    last = events.groupBy(*keys, "raw_path", "dv").agg(
        F.max(F.when(F.col("version") <= version, action)).alias("at_version"),
        F.max(action).alias("newest"),
        F.collect_set(F.when(added_later, F.struct("address", "dv_address", "size"))).alias("later"),
    )

    def held(file: Column, live: bool, head: bool) -> Column:
        return F.struct(
            file["address"].alias("address"),
            file["dv_address"].alias("dv_address"),
            file["size"].alias("size"),
            F.lit(live).alias("live"),
            F.lit(head).alias("head"),
        )

    files = last.select(
        *keys,
        F.explode(
            F.concat(
                F.array(
                    F.when(F.col("at_version.is_add"), held(F.col("at_version"), True, False)),
                    F.when(F.col("newest.is_add"), held(F.col("newest"), False, True)),
                ),
                F.transform("later", lambda file: held(file, True, False)),
            )
        ).alias("f"),
    ).filter(F.col("f").isNotNull())
    physical = physical_files(files.select(*keys, "f.*"), *keys, "live", "head").unionByName(
        cdc.select(*keys, "address", "size", F.lit(True).alias("live"), F.lit(False).alias("head"))
    )
    return (
        physical.groupBy(*keys, "address")
        .agg(
            F.max(F.when(F.col("live"), F.col("size"))).alias("size"),
            F.max("live").alias("live"),
            F.max("head").alias("at_head"),
        )
        .filter("live")
        .select(*keys, "address", "size", "at_head")
    )


def commits_holding(
    events: DataFrame, wanted: DataFrame, oldest: int | Column, head: int | Column, *keys: str
) -> DataFrame:
    """(*keys, address, commit_id) of every version from `oldest` to `head` whose snapshot holds the
    physical file `address` of `wanted` (*keys, address): a file is in every version from its
    add (or `oldest`) until the version before its next removal.

    `events` (file_events) must hold the base checkpoint of `oldest` and the commits after it.
    `keys` judge many tables at once (a fleet's repository), `oldest` and `head` then columns
    of `events` naming each one's own.
    """
    oldest, head = (F.lit(v) if isinstance(v, int) else v for v in (oldest, head))
    bounded = events.select(
        *keys, "version", "is_add", "address", "dv_address", "size", oldest.alias("v0"), head.alias("vn")
    )
    physical = physical_files(bounded, *keys, "version", "is_add", "v0", "vn").join(
        wanted.select(*keys, "address").distinct(), [*keys, "address"], "left_semi"
    )
    adds = physical.filter("is_add").select(*keys, "address", F.greatest("version", "v0").alias("start"), "vn")
    removes = physical.filter(~F.col("is_add")).select(*keys, "address", F.col("version").alias("removed"))
    spans = (
        adds.join(removes, [*keys, "address"], "left")
        .filter(F.col("removed").isNull() | (F.col("removed") > F.col("start")))
        .groupBy(*keys, "address", "start", "vn")
        .agg(F.coalesce(F.min("removed") - 1, F.col("vn")).alias("end"))
        .filter(F.col("end") >= F.col("start"))
    )
    ids = F.transform(F.sequence("start", "end"), lambda version: F.lpad(version.cast("string"), 20, "0"))
    return spans.select(*keys, "address", F.explode(ids).alias("commit_id"))


def cdc_files(actions: DataFrame, *carried: str) -> DataFrame:
    return actions.filter(F.col("cdc").isNotNull()).select(
        *carried, "version", decode_path(F.col("cdc.path")).alias("address"), F.col("cdc.size").alias("size")
    )


@dataclass(frozen=True)
class Bound:
    """Tombstones removed after `millis` (None: at any time) keep their files live; one without a
    deletionTimestamp counts as newer when `unknown_is_newer` (the state it bounds is not replayable)."""

    millis: Optional[int]
    unknown_is_newer: bool


def tombstoned_files(actions: DataFrame, bound: Optional[Bound], *carried: str) -> DataFrame:
    """(*carried, address, size) of the data and deletion-vector files of every remove action
    newer than `bound`: whatever the replay concludes, a reader inside the retention window may
    need them. With `bound` None each row carries its table's own: `bound_millis` (null: removed
    at any time) and `unknown_is_newer`."""
    if bound is None:
        millis, unknown_is_newer = F.col("bound_millis"), F.col("unknown_is_newer")
    else:
        millis, unknown_is_newer = F.lit(bound.millis).cast("long"), F.lit(bound.unknown_is_newer)
    when = F.col("remove.deletionTimestamp")
    newer = F.coalesce(F.when(millis.isNull(), F.lit(True)).otherwise(when > millis), unknown_is_newer)
    removed = file_events(actions.filter(F.col("remove").isNotNull() & newer), *carried).filter(~F.col("is_add"))
    return physical_files(removed, *carried)
