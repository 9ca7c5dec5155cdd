"""lakeFS graph export, the reference format (DESIGN §6.1).

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
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.config import RepositoryConfig, Rules
from gc_assets.retention import Commit, Ref
from gc_assets.sources.base import RepositorySource, SourceError
from gc_assets.sources.files import file_stamp, list_files, read_parquet, read_small_file, read_text
from gc_assets.stores.s3 import S3Settings

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


class LakeFSExportSource(RepositorySource):
    protected_prefixes = ("_lakefs/",)
    protected_patterns: tuple[str, ...] = ()

    def __init__(self, export_uri: str, s3: Optional[S3Settings] = None):
        self.export_uri = export_uri.rstrip("/")
        self.s3 = s3 or S3Settings.from_environment()
        self._frames: dict[str, Optional[DataFrame]] = {}

    def _dataset(self, spark: SparkSession, name: str) -> Optional[DataFrame]:
        if name not in self._frames:
            self._frames[name] = self._read(spark, name)
        return self._frames[name]

    def _read(self, spark: SparkSession, name: str) -> Optional[DataFrame]:
        location = f"{self.export_uri}/{name}"
        files = [f for f in list_files(location, self.s3) if not os.path.basename(f).startswith(("_", "."))]
        if not files:
            if name in OPTIONAL_DATASETS:
                return None
            raise SourceError(f"export dataset {name!r} is missing: no part files under {location}")
        kinds = {os.path.splitext(f)[1] for f in files}
        schema = DATASETS[name]
        if kinds == {".parquet"}:
            frame = read_parquet(spark, files, self.s3)
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
            frame = _read_json_lines(spark, name, files, schema, self.s3)
        else:
            raise SourceError(
                f"export dataset {name!r} at {location}: part files must be all .parquet or all .jsonl, "
                f"found {sorted(kinds)}"
            )
        _check_not_null(name, frame)
        return frame

    def retention_rules(self, spark: SparkSession, repo: RepositoryConfig) -> Optional[Rules]:
        return repo.rules

    def commit_graph(self, spark: SparkSession) -> tuple[list[Commit], list[Ref]]:
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
            flagged_metaranges.join(metaranges, "metarange_id").groupBy("range_id").agg(F.max("at_head").alias("at_head"))
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
            parts = [uri for uri in list_files(location, self.s3) if not os.path.basename(uri).startswith(("_", "."))]
            if not parts and name not in OPTIONAL_DATASETS:
                raise SourceError(f"export dataset {name!r} is missing: no part files under {location}")
            for uri in parts:
                size, mtime_ns = file_stamp(uri, self.s3)
                digest.update(f"{name}/{os.path.basename(uri)} {size} {mtime_ns}\n".encode())
                if name != "refs":
                    continue
                content = read_small_file(uri, self.s3)
                if uri.endswith(".parquet"):
                    rows = pq.read_table(pa.BufferReader(content), columns=["name", "kind", "commit_id"]).to_pylist()
                    lines = sorted(json.dumps(row, sort_keys=True) for row in rows)
                else:
                    lines = sorted(line.strip() for line in content.decode("utf-8").splitlines() if line.strip())
                digest.update("\n".join(lines).encode())
        return digest.hexdigest()

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


def _read_json_lines(spark: SparkSession, name: str, files: list[str], schema: T.StructType, s3: S3Settings) -> DataFrame:
    """Parse JSON Lines, refusing the first line that does not parse or lacks a column."""
    lines = read_text(spark, files, s3).select(F.col("file").alias("_file"), F.col("value").alias("_line"))
    lines = lines.filter(F.trim("_line") != "")
    parsed = lines.select("_file", "_line", F.from_json("_line", schema, {"mode": "PERMISSIVE"}).alias("row"))
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
        raise SourceError(f"export dataset {name!r}, file {first[0]['_file']}: {what} in line {first[0]['_line'][:200]!r}")
    return parsed.select("row.*")


def _check_not_null(name: str, frame: DataFrame) -> None:
    condition = None
    for column in NOT_NULL[name]:
        clause = F.col(column).isNull()
        condition = clause if condition is None else condition | clause
    offending = frame.filter(condition).limit(1).collect()
    if offending:
        raise SourceError(f"export dataset {name!r}: row with a null required column: {offending[0].asDict()}")

