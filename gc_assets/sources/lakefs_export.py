"""lakeFS graph export, the reference format (docs/design.md §6.1).

An export directory holds the datasets commits, refs, metaranges, ranges and,
optionally, staged, each as Parquet or JSON Lines part files. Ranges are
content-addressed and shared by many commits, so the live set reads each range of
the retained commits once: range ids are de-duplicated before ranges are joined.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from functools import reduce
from typing import Any, Iterator, Optional, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core.config import RepositoryConfig, Rules
from gc_assets.core.retention import Commit, Ref
from gc_assets.sources.base import (
    RepositorySource,
    SourceError,
    metadata_settings,
)
from gc_assets.sources.files import (
    file_stamp,
    list_files,
    read_parquet,
    read_small_file,
    read_text,
)
from gc_assets.stores.s3.client import S3Settings
from gc_assets.stores.settings import StoreSettings

DATASETS: dict[str, T.StructType] = {
    "commits": T.StructType(
        [
            T.StructField("commit_id", T.StringType()),
            T.StructField("parents", T.ArrayType(T.StringType())),
            T.StructField("created_at", T.StringType()),  # parsed and zone-checked on the driver
            T.StructField("metarange_id", T.StringType()),
        ]
    ),
    "refs": T.StructType(
        [
            T.StructField("name", T.StringType()),
            T.StructField("kind", T.StringType()),
            T.StructField("commit_id", T.StringType()),
        ]
    ),
    "metaranges": T.StructType(
        [T.StructField("metarange_id", T.StringType()), T.StructField("range_id", T.StringType())]
    ),
    "ranges": T.StructType(
        [
            T.StructField("range_id", T.StringType()),
            T.StructField("path", T.StringType()),
            T.StructField("address", T.StringType()),
            T.StructField("size", T.LongType()),
        ]
    ),
    "staged": T.StructType(
        [
            T.StructField("branch", T.StringType()),
            T.StructField("path", T.StringType()),
            T.StructField("address", T.StringType()),
            T.StructField("size", T.LongType()),
        ]
    ),
}
OPTIONAL_DATASETS = {"staged"}
MANIFEST = "_manifest.json"
EMPTY_METARANGE = ""  # an empty tree, as lakeFS spells it: the only metarange that may have no rows
SAMPLE = 5
NOT_NULL = {
    "commits": ("commit_id", "parents", "created_at", "metarange_id"),
    "refs": ("name", "kind", "commit_id"),
    "metaranges": ("metarange_id", "range_id"),
    "ranges": ("range_id", "address"),
    "staged": ("address",),
}


def parse_created_at(value: object, row: int, commit_id: str) -> dt.datetime:
    """A UTC datetime from an RFC 3339 string or a zoned timestamp; zone-less values are refused."""
    if isinstance(value, dt.datetime):
        parsed = value
    else:
        try:
            parsed = dt.datetime.fromisoformat(str(value))
        except ValueError:
            raise SourceError(f"commits row {row} ({commit_id}): created_at {value!r} is not RFC 3339") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise SourceError(f"commits row {row} ({commit_id}): created_at {value!r} has no time zone")
    return parsed.astimezone(dt.timezone.utc)


# What this process already found whole, by file names, sizes and modification times: the
# mark, the checks and the sweep of one run read the same export (see LakeFSExportSource.verify).
_VERIFIED_SNAPSHOTS: set[tuple[tuple[str, int, int], ...]] = set()
_NULL_FREE_ROWS: dict[tuple[str, tuple[tuple[str, int, int], ...]], int] = {}  # dataset found null-free: its rows
_WELL_FORMED_LINES: set[tuple[str, tuple[tuple[str, int, int], ...]]] = set()  # JSON Lines dataset: every line parsed


class LakeFSExportSource(RepositorySource):
    protected_patterns: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, repo: RepositoryConfig) -> "LakeFSExportSource":
        return cls(repo.source_uri, metadata_settings(repo), repo.block_storage_prefix)

    def __init__(self, export_uri: str, settings: Optional[S3Settings] = None, block_storage_prefix: str = "_lakefs"):
        self.export_uri = export_uri.rstrip("/")
        self.protected_prefixes = (f"{block_storage_prefix}/",)  # lakeFS's own files in the namespace
        self.settings = settings or StoreSettings.from_environment()
        self._frames: dict[str, Optional[DataFrame]] = {}
        self._rows: dict[str, int] = {}
        self._manifest: Optional[dict[str, Any]] = None  # {} once read and absent
        self._verified = False

    def _parts(self, name: str) -> list[str]:
        """Part files of one dataset (names starting with '_' or '.' are not parts)."""
        location = f"{self.export_uri}/{name}"
        return [f for f in list_files(location, self.settings) if not os.path.basename(f).startswith(("_", "."))]

    def _dataset(self, spark: SparkSession, name: str) -> Optional[DataFrame]:
        if name not in self._frames:
            self._frames[name] = self._read(spark, name)
        return self._frames[name]

    def _read(self, spark: SparkSession, name: str) -> Optional[DataFrame]:
        location = f"{self.export_uri}/{name}"
        files = self._parts(name)
        if not files:
            if name in OPTIONAL_DATASETS:
                return None
            raise SourceError(f"export dataset {name!r} is missing: no part files under {location}")
        kinds = {os.path.splitext(f)[1] for f in files}
        schema = DATASETS[name]
        stamps = tuple((f, *file_stamp(f, self.settings)) for f in sorted(files))
        if kinds == {".parquet"}:
            frame = read_parquet(spark, files, self.settings)
            _check_parquet_columns(name, frame, schema)
            frame = frame.select(
                *[
                    F.date_format(F.col(c.name), "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX").alias(c.name)
                    if c.name == "created_at"
                    else F.col(c.name).cast(c.dataType)
                    for c in schema.fields
                ]
            )
        elif kinds == {".jsonl"}:
            well_formed = (name, stamps) in _WELL_FORMED_LINES
            frame = _read_json_lines(spark, name, files, schema, self.settings, well_formed)
            _WELL_FORMED_LINES.add((name, stamps))
        else:
            raise SourceError(
                f"export dataset {name!r} at {location}: part files must be all .parquet or all .jsonl, "
                f"found {sorted(kinds)}"
            )
        if (name, stamps) not in _NULL_FREE_ROWS:
            _NULL_FREE_ROWS[(name, stamps)] = _rows_without_nulls(name, frame)
        self._rows[name] = _NULL_FREE_ROWS[(name, stamps)]
        return frame

    def retention_rules(self, spark: SparkSession, repo: RepositoryConfig) -> Optional[Rules]:
        return repo.rules

    # ------------------------------------------------------------------ fail closed (docs/design.md §10)

    def manifest(self) -> Optional[dict[str, Any]]:
        """The exporter's `_manifest.json`, validated, or None when the export has none."""
        if self._manifest is None:
            uri = f"{self.export_uri}/{MANIFEST}"
            if uri not in list_files(self.export_uri, self.settings):
                self._manifest = {}
            else:
                self._manifest = parse_manifest(read_small_file(uri, self.settings), uri)
        return self._manifest or None

    def snapshot(self) -> tuple[tuple[str, int, int], ...]:
        """Every file of the export with its size and modification time: what changes when the export does."""
        files = [f"{self.export_uri}/{MANIFEST}"] if self.manifest() is not None else []
        files += [f for name in DATASETS for f in self._parts(name)]
        return tuple((f, *file_stamp(f, self.settings)) for f in sorted(files))

    def verify(self, spark: SparkSession) -> None:
        """Refuse a partial export: rows the graph names but the datasets lack, or counts that
        disagree with the manifest. Runs before anything is marked, once per state of the export
        in this process: the mark, the checks and the sweep of one run read the same files."""
        if self._verified:
            return
        snapshot = self.snapshot()
        if snapshot in _VERIFIED_SNAPSHOTS:
            self._verified = True
            return
        commits = self._dataset(spark, "commits")
        metaranges = self._dataset(spark, "metaranges")
        ranges = self._dataset(spark, "ranges")
        assert commits is not None and metaranges is not None and ranges is not None
        manifest = self.manifest()
        if manifest is not None:
            self._verify_counts(spark, manifest)
        self._refuse_dangling(
            commits.filter(F.col("metarange_id") != EMPTY_METARANGE),
            "commit_id",
            "metarange_id",
            metaranges,
            "metaranges",
        )
        self._refuse_dangling(metaranges, "metarange_id", "range_id", ranges, "ranges")
        if self.snapshot() == snapshot:  # not rewritten while it was read
            _VERIFIED_SNAPSHOTS.add(snapshot)
        self._verified = True

    def _refuse_dangling(self, referring: DataFrame, owner: str, key: str, referred: DataFrame, dataset: str) -> None:
        """Every `key` that `referring` rows name has rows in `referred`, or the export is partial."""
        dangling = (
            referring.select(owner, key).join(referred.select(key).distinct(), key, "left_anti").limit(SAMPLE).collect()
        )
        if dangling:
            named = ", ".join(
                f"{key.removesuffix('_id')} {r[key]} of {owner.removesuffix('_id')} {r[owner]}" for r in dangling
            )
            raise SourceError(
                f"export {self.export_uri}: {named} has no rows in dataset {dataset!r} "
                "(a partial export, or a lost part file): refusing to mark"
            )

    def _verify_counts(self, spark: SparkSession, manifest: dict[str, Any]) -> None:
        counts: dict[str, int] = manifest["datasets"]
        for name in DATASETS:
            found = 0 if self._dataset(spark, name) is None else self._rows[name]
            if name not in counts:
                if name in OPTIONAL_DATASETS and found == 0:
                    continue
                raise SourceError(
                    f"export {self.export_uri}: {MANIFEST} gives no row count for dataset {name!r}, "
                    f"which has {found} rows"
                )
            if counts[name] != found:
                raise SourceError(
                    f"export {self.export_uri}: dataset {name!r} has {found} rows, {MANIFEST} says {counts[name]} "
                    "(an export read while it was being written, or a lost part file)"
                )

    def source_time(self, spark: SparkSession) -> dt.datetime:
        """The manifest's exported_at; without one, the oldest part file's modification time
        (the export cannot describe a state later than its oldest file)."""
        manifest = self.manifest()
        if manifest is not None:
            return manifest["exported_at"]
        oldest: Optional[int] = None
        for name in DATASETS:
            for uri in self._parts(name):
                mtime_ns = file_stamp(uri, self.settings)[1]
                oldest = mtime_ns if oldest is None else min(oldest, mtime_ns)
        if oldest is None:
            raise SourceError(f"export {self.export_uri}: no part files to date the export by")
        return dt.datetime.fromtimestamp(oldest / 1e9, tz=dt.timezone.utc)

    def untracked_min_age(self, spark: SparkSession, repo: RepositoryConfig) -> dt.timedelta:
        """lakeFS GC's own guard for uncommitted uploads is the minimum object age."""
        return repo.min_object_age

    def witness_heads(self, spark: SparkSession, head_ids: Sequence[str]) -> DataFrame:
        """What the head commits' metaranges hold, from the export's raw rows read with pyarrow: no
        code shared with the Spark live-set path. The commits are read on the driver, the
        metaranges and ranges part file by part file on executors: the driver holds nothing per object."""
        parts = {name: self._parts(name) for name in ("commits", "metaranges", "ranges")}
        if not all(parts.values()):
            raise SourceError(f"export {self.export_uri}: a required dataset has no part files")
        commits = read_raw_dataset(parts["commits"], self.settings, ("commit_id", "metarange_id"))
        heads = pa.table({"commit_id": pa.array(list(head_ids), pa.string())})
        head_metaranges = heads.join(commits, "commit_id", join_type="left outer")
        unknown = head_metaranges.filter(pc.is_null(head_metaranges["metarange_id"]))["commit_id"].to_pylist()
        if unknown:
            raise SourceError(
                f"export {self.export_uri}: head commit {unknown[0]} is not in dataset 'commits' "
                "(or has no metarange_id)"
            )
        metaranges = raw_rows_on_executors(spark, parts["metaranges"], self.settings, ("metarange_id", "range_id"))
        ranges = raw_rows_on_executors(spark, parts["ranges"], self.settings, ("range_id", "address"))
        # Each (head, range) once, however often the head is named or its metarange lists the range.
        head_ranges = (
            spark.createDataFrame(head_metaranges, "commit_id string, metarange_id string")
            .join(metaranges, "metarange_id")
            .select("commit_id", "range_id")
            .distinct()
        )
        return head_ranges.join(ranges, "range_id").select("commit_id", "address")

    def commit_graph(self, spark: SparkSession) -> tuple[list[Commit], list[Ref]]:
        self.verify(spark)
        commits_frame = self._dataset(spark, "commits")
        refs_frame = self._dataset(spark, "refs")
        assert commits_frame is not None and refs_frame is not None
        table = commits_frame.select("commit_id", "parents", "created_at").toArrow()
        commits = [
            Commit(commit_id, tuple(parents), parse_created_at(created_at, row, commit_id))
            for row, (commit_id, parents, created_at) in enumerate(
                zip(*(table.column(c).to_pylist() for c in ("commit_id", "parents", "created_at")))
            )
        ]
        refs = [Ref(r["name"], r["kind"], r["commit_id"]) for r in refs_frame.toArrow().to_pylist()]
        return commits, refs

    def live_entries(self, spark: SparkSession, retained: DataFrame, heads: DataFrame) -> DataFrame:
        self.verify(spark)
        commits = self._dataset(spark, "commits")
        metaranges = self._dataset(spark, "metaranges")
        ranges = self._dataset(spark, "ranges")
        assert commits is not None and metaranges is not None and ranges is not None
        flagged_metaranges = (
            retained.select("commit_id")
            .join(commits.select("commit_id", "metarange_id"), "commit_id")
            .join(heads.select("commit_id").distinct().withColumn("head", F.lit(True)), "commit_id", "left")
            .groupBy("metarange_id")
            .agg(F.max(F.coalesce("head", F.lit(False))).alias("at_head"))
        )
        needed_ranges = (
            flagged_metaranges.join(metaranges, "metarange_id")
            .groupBy("range_id")
            .agg(F.max("at_head").alias("at_head"))
        )
        committed = ranges.join(needed_ranges, "range_id").select(
            "address", "size", F.lit("committed").alias("source"), "at_head"
        )
        staged = self._dataset(spark, "staged")
        if staged is None:
            return committed
        return committed.unionByName(
            staged.select("address", "size", F.lit("staged").alias("source"), F.lit(True).alias("at_head"))
        )

    def committed_addresses(self, spark: SparkSession) -> DataFrame:
        ranges = self._dataset(spark, "ranges")
        assert ranges is not None
        return ranges.select("address").distinct()

    def fingerprint(self, spark: Optional[SparkSession] = None) -> str:
        """sha256 of the refs' rows and of every part file's name, size and mtime, without Spark.

        The refs are read on the driver (pyarrow or JSON Lines) so that a copy that keeps
        modification times still shows a moved branch.
        """
        digest = hashlib.sha256()
        for name in DATASETS:
            location = f"{self.export_uri}/{name}"
            parts = [
                uri for uri in list_files(location, self.settings) if not os.path.basename(uri).startswith(("_", "."))
            ]
            if not parts and name not in OPTIONAL_DATASETS:
                raise SourceError(f"export dataset {name!r} is missing: no part files under {location}")
            for uri in parts:
                size, mtime_ns = file_stamp(uri, self.settings)
                digest.update(f"{name}/{os.path.basename(uri)} {size} {mtime_ns}\n".encode())
                if name != "refs":
                    continue
                content = read_small_file(uri, self.settings)
                if uri.endswith(".parquet"):
                    rows = pq.read_table(pa.BufferReader(content), columns=["name", "kind", "commit_id"]).to_pylist()
                    lines = sorted(json.dumps(row, sort_keys=True) for row in rows)
                else:
                    lines = sorted(line.strip() for line in content.decode("utf-8").splitlines() if line.strip())
                digest.update("\n".join(lines).encode())
        return digest.hexdigest()

    def logical_addresses(self, spark: SparkSession, path: str) -> DataFrame:
        commits = self._dataset(spark, "commits")
        metaranges = self._dataset(spark, "metaranges")
        ranges = self._dataset(spark, "ranges")
        assert commits is not None and metaranges is not None and ranges is not None
        return (
            ranges.filter(F.col("path") == path)
            .select("range_id", "address")
            .join(metaranges, "range_id")
            .join(commits.select("commit_id", "metarange_id"), "metarange_id")
            .select("address", "commit_id")
            .distinct()
        )

    def commits_referencing(self, spark: SparkSession, retained: DataFrame, addresses: DataFrame) -> DataFrame:
        commits = self._dataset(spark, "commits")
        metaranges = self._dataset(spark, "metaranges")
        ranges = self._dataset(spark, "ranges")
        assert commits is not None and metaranges is not None and ranges is not None
        return (
            ranges.select("range_id", "address")
            .join(addresses.select("address").distinct(), "address")
            .join(metaranges, "range_id")
            .join(commits.select("commit_id", "metarange_id"), "metarange_id")
            .join(retained.select("commit_id"), "commit_id")
            .select("address", "commit_id")
            .distinct()
        )


def _check_parquet_columns(name: str, frame: DataFrame, schema: T.StructType) -> None:
    present = {f.name: f.dataType for f in frame.schema.fields}
    for field in schema.fields:
        if field.name not in present:
            raise SourceError(f"export dataset {name!r}: column {field.name!r} is missing")
        if field.name == "created_at" and not isinstance(present[field.name], (T.TimestampType, T.StringType)):
            kind = present[field.name].simpleString()
            hint = " (a timestamp without time zone)" if isinstance(present[field.name], T.TimestampNTZType) else ""
            raise SourceError(f"export dataset {name!r}: created_at has type {kind}{hint}; it needs a UTC timestamp")


def _read_json_lines(
    spark: SparkSession, name: str, files: list[str], schema: T.StructType, settings: S3Settings, well_formed: bool
) -> DataFrame:
    """Parse JSON Lines, refusing the first line that does not parse or lacks a column (unless
    these files were found `well_formed` already: a sweeping run reads the export twice)."""
    lines = read_text(spark, files, settings).select(F.col("file").alias("_file"), F.col("value").alias("_line"))
    lines = lines.filter(F.trim("_line") != "")
    parsed = lines.select("_file", "_line", F.from_json("_line", schema, {"mode": "PERMISSIVE"}).alias("row"))
    if not well_formed:
        _refuse_malformed_lines(name, parsed)
    return parsed.select("row.*")


def _refuse_malformed_lines(name: str, parsed: DataFrame) -> None:
    """Refuse the first line of `parsed` (_file, _line, row) that did not parse or lacks a column."""
    keys = F.json_object_keys("_line")
    missing = [F.when(~F.array_contains(keys, c), F.lit(c)) for c in NOT_NULL[name]]
    bad = parsed.select(
        "_file",
        "_line",
        F.when(F.col("row").isNull() | keys.isNull(), F.lit("not a JSON object"))
        .otherwise(F.concat_ws(", ", *missing))
        .alias("_problem"),
    ).filter(F.col("_problem") != "")
    first = bad.limit(1).collect()
    if first:
        problem = first[0]["_problem"]
        what = problem if problem == "not a JSON object" else f"missing column(s) {problem}"
        raise SourceError(
            f"export dataset {name!r}, file {first[0]['_file']}: {what} in line {first[0]['_line'][:200]!r}"
        )


def _rows_without_nulls(name: str, frame: DataFrame) -> int:
    """The dataset's row count, counted in the same pass that refuses a null required column."""
    null = reduce(lambda a, b: a | b, [F.col(c).isNull() for c in NOT_NULL[name]])
    measured = frame.agg(F.count(F.lit(1)).alias("rows"), F.count_if(null).alias("nulls")).first()
    if measured["nulls"]:
        offending = frame.filter(null).limit(1).collect()
        raise SourceError(f"export dataset {name!r}: row with a null required column: {offending[0].asDict()}")
    return measured["rows"]


def parse_manifest(content: bytes, uri: str) -> dict[str, Any]:
    """`{"exported_at": <RFC 3339 with zone>, "datasets": {name: rows}}`, or SourceError naming the field."""
    try:
        manifest = json.loads(content)
    except ValueError as exc:
        raise SourceError(f"{uri}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("datasets"), dict):
        raise SourceError(f"{uri}: expected an object with 'exported_at' and a 'datasets' map of row counts")
    try:
        exported_at = dt.datetime.fromisoformat(str(manifest.get("exported_at")).replace("Z", "+00:00"))
    except ValueError:
        raise SourceError(f"{uri}: exported_at {manifest.get('exported_at')!r} is not an RFC 3339 time") from None
    if exported_at.tzinfo is None:
        raise SourceError(f"{uri}: exported_at {manifest.get('exported_at')!r} has no time zone")
    counts = manifest["datasets"]
    for name, rows in counts.items():
        if name not in DATASETS:
            raise SourceError(f"{uri}: unknown dataset {name!r} in datasets")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise SourceError(f"{uri}: row count of dataset {name!r} is {rows!r}, not a non-negative integer")
    return {"exported_at": exported_at.astimezone(dt.timezone.utc), "datasets": dict(counts)}


def read_raw_dataset(parts: list[str], settings: S3Settings, columns: tuple[str, ...]) -> pa.Table:
    """`columns` of every part file of one dataset as one Arrow table of strings, read directly
    (the witness's own reader; a JSON Lines export infers its own types)."""
    tables = []
    for uri in parts:
        content = read_small_file(uri, settings)
        if uri.endswith(".parquet"):
            table = pq.read_table(pa.BufferReader(content), columns=list(columns))
        else:
            rows = [json.loads(line) for line in content.decode("utf-8").splitlines() if line.strip()]
            table = (
                pa.Table.from_pylist(rows) if rows else pa.table({name: pa.array([], pa.string()) for name in columns})
            )
        tables.append(pa.table({name: table[name].cast(pa.string()) for name in columns}))
    return pa.concat_tables(tables)


def raw_rows_on_executors(
    spark: SparkSession, parts: list[str], settings: S3Settings, columns: tuple[str, ...]
) -> DataFrame:
    """read_raw_dataset on executors, one part file per task at most."""
    schema = T.StructType([T.StructField(name, T.StringType()) for name in columns])

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for uri in batch.column("uri").to_pylist():
                yield from read_raw_dataset([uri], settings, columns).to_batches()

    uris = spark.createDataFrame([(uri,) for uri in parts], "uri string")
    return uris.repartition(len(parts)).mapInArrow(read, schema)
