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
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core.config import RepositoryConfig, Rules
from gc_assets.core.names import REPO
from gc_assets.core.retention import Commit, Ref
from gc_assets.core.spark import local_frame
from gc_assets.sources.base import (
    LIVE_ENTRY_SCHEMA,
    WITNESS_OF_MANY,
    Graph,
    LiveRead,
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
        self._stamps: dict[str, tuple[tuple[str, int, int], ...]] = {}  # each dataset's part files as read
        self._unchecked_lines: dict[str, DataFrame] = {}  # JSON Lines datasets not yet found well-formed

    def _parts(self, name: str) -> list[str]:
        """Part files of one dataset (names starting with '_' or '.' are not parts)."""
        location = f"{self.export_uri}/{name}"
        return [f for f in list_files(location, self.settings) if not os.path.basename(f).startswith(("_", "."))]

    def _dataset(self, spark: SparkSession, name: str) -> Optional[DataFrame]:
        if name not in self._frames:
            self._frames[name] = self._read(spark, name)
        return self._frames[name]

    def _read(self, spark: SparkSession, name: str) -> Optional[DataFrame]:
        """One dataset's rows, read lazily: verify_exports finds them whole (no nulls, no malformed
        lines, the manifest's counts) before anything is marked from them."""
        location = f"{self.export_uri}/{name}"
        files = self._parts(name)
        if not files:
            if name in OPTIONAL_DATASETS:
                return None
            raise SourceError(f"export dataset {name!r} is missing: no part files under {location}")
        kinds = {os.path.splitext(f)[1] for f in files}
        schema = DATASETS[name]
        self._stamps[name] = tuple((f, *file_stamp(f, self.settings)) for f in sorted(files))
        if kinds == {".parquet"}:
            frame = read_parquet(spark, files, self.settings)
            _check_parquet_columns(name, frame, schema)
            return frame.select(
                *[
                    F.date_format(F.col(c.name), "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX").alias(c.name)
                    if c.name == "created_at"
                    else F.col(c.name).cast(c.dataType)
                    for c in schema.fields
                ]
            )
        if kinds == {".jsonl"}:
            parsed = _parsed_json_lines(spark, files, schema, self.settings)
            if (name, self._stamps[name]) not in _WELL_FORMED_LINES:
                self._unchecked_lines[name] = parsed
            return parsed.select("row.*")
        raise SourceError(
            f"export dataset {name!r} at {location}: part files must be all .parquet or all .jsonl, "
            f"found {sorted(kinds)}"
        )

    def _checks(self, spark: SparkSession, repo: str) -> list[DataFrame]:
        """Rows (repo, dataset, rows, nulls, file, line, problem), lazily, of every dataset not yet
        found whole in this state of its files: its first malformed line, its rows and its rows
        with a null required column."""
        checks = []
        for name, parsed in self._unchecked_lines.items():
            checks.append(
                _malformed_lines(name, parsed).select(
                    F.lit(repo).alias(REPO),
                    F.lit(name).alias("dataset"),
                    F.lit(None).cast("long").alias("rows"),
                    F.lit(None).cast("long").alias("nulls"),
                    "file",
                    "line",
                    "problem",
                )
            )
        for name in DATASETS:
            frame = self._dataset(spark, name)
            if frame is not None and (name, self._stamps[name]) not in _NULL_FREE_ROWS:
                checks.append(
                    _measured(frame, name).select(
                        F.lit(repo).alias(REPO),
                        F.lit(name).alias("dataset"),
                        "rows",
                        "nulls",
                        *[F.lit(None).cast("string").alias(c) for c in ("file", "line", "problem")],
                    )
                )
        return checks

    def _found_whole(self, spark: SparkSession, checked: list[Row]) -> Optional[str]:
        """Why the export is not whole by its `checked` rows (of _checks) and its manifest, or None;
        what was found whole is remembered for this state of its files."""
        malformed = [row for row in checked if row["problem"] is not None]
        if malformed:
            row = malformed[0]
            problem = row["problem"]
            what = problem if problem == "not a JSON object" else f"missing column(s) {problem}"
            return f"export dataset {row['dataset']!r}, file {row['file']}: {what} in line {row['line'][:200]!r}"
        for name in self._unchecked_lines:
            _WELL_FORMED_LINES.add((name, self._stamps[name]))
        self._unchecked_lines.clear()
        for row in checked:
            if row["rows"] is None:
                continue
            name = row["dataset"]
            if row["nulls"]:
                frame = self._dataset(spark, name)
                assert frame is not None
                offending = frame.filter(_null_required(name)).limit(1).collect()
                return f"export dataset {name!r}: row with a null required column: {offending[0].asDict()}"
            _NULL_FREE_ROWS[(name, self._stamps[name])] = row["rows"]
        for name in DATASETS:
            if self._dataset(spark, name) is not None:
                self._rows[name] = _NULL_FREE_ROWS[(name, self._stamps[name])]
        manifest = self.manifest()
        return None if manifest is None else self._counts_disagree(spark, manifest)

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
        """Refuse a partial export (verify_exports of this one)."""
        refused = verify_exports(spark, {self.export_uri: self})
        if refused:
            raise SourceError(refused[self.export_uri])

    def _counts_disagree(self, spark: SparkSession, manifest: dict[str, Any]) -> Optional[str]:
        counts: dict[str, int] = manifest["datasets"]
        for name in DATASETS:
            found = 0 if self._dataset(spark, name) is None else self._rows[name]
            if name not in counts:
                if name in OPTIONAL_DATASETS and found == 0:
                    continue
                return (
                    f"export {self.export_uri}: {MANIFEST} gives no row count for dataset {name!r}, "
                    f"which has {found} rows"
                )
            if counts[name] != found:
                return (
                    f"export {self.export_uri}: dataset {name!r} has {found} rows, {MANIFEST} says {counts[name]} "
                    "(an export read while it was being written, or a lost part file)"
                )
        return None

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
        return self.witness_heads_together(spark, {self.export_uri: (self, head_ids)}).drop(REPO)

    @classmethod
    def witness_heads_together(
        cls, spark: SparkSession, heads: Mapping[str, tuple[RepositorySource, Sequence[str]]]
    ) -> DataFrame:
        """What the head commits' metaranges hold, from each export's raw rows read with pyarrow: no
        code shared with the Spark live-set path. The commits are read on the driver, the
        metaranges and ranges of every export part file by part file on executors, in one plan:
        the driver holds nothing per object."""
        head_rows: list[tuple[str, str, str]] = []
        parts: dict[str, list[tuple[str, str]]] = {"metaranges": [], "ranges": []}
        settings: dict[str, S3Settings] = {}
        for name, (source, head_ids) in heads.items():
            export = cast(LakeFSExportSource, source)
            found = {dataset: export._parts(dataset) for dataset in ("commits", "metaranges", "ranges")}
            if not all(found.values()):
                raise SourceError(f"export {export.export_uri}: a required dataset has no part files")
            commits = read_raw_dataset(found["commits"], export.settings, ("commit_id", "metarange_id"))
            wanted = pa.table({"commit_id": pa.array(list(head_ids), pa.string())})
            head_metaranges = wanted.join(commits, "commit_id", join_type="left outer")
            unknown = head_metaranges.filter(pc.is_null(head_metaranges["metarange_id"]))["commit_id"].to_pylist()
            if unknown:
                raise SourceError(
                    f"export {export.export_uri}: head commit {unknown[0]} is not in dataset 'commits' "
                    "(or has no metarange_id)"
                )
            head_rows += [(name, row["commit_id"], row["metarange_id"]) for row in head_metaranges.to_pylist()]
            for dataset in parts:
                parts[dataset] += [(name, uri) for uri in found[dataset]]
            settings[name] = export.settings
        if not head_rows:
            return local_frame(spark, [], WITNESS_OF_MANY)
        metaranges = raw_rows_on_executors(spark, parts["metaranges"], settings, ("metarange_id", "range_id"))
        ranges = raw_rows_on_executors(spark, parts["ranges"], settings, ("range_id", "address"))
        # Each (head, range) once, however often the head is named or its metarange lists the range.
        head_ranges = (
            local_frame(spark, head_rows, f"{REPO} string, commit_id string, metarange_id string")
            .join(metaranges, [REPO, "metarange_id"])
            .select(REPO, "commit_id", "range_id")
            .distinct()
        )
        return head_ranges.join(ranges, [REPO, "range_id"]).select(REPO, "commit_id", "address")

    def commit_graph(self, spark: SparkSession) -> tuple[list[Commit], list[Ref]]:
        graph = self.commit_graphs(spark, {self.export_uri: self})[self.export_uri]
        if isinstance(graph, Exception):
            raise graph
        return graph

    @classmethod
    def commit_graphs(cls, spark: SparkSession, sources: Mapping[str, RepositorySource]) -> dict[str, Graph]:
        """Every export verified, then the commits and refs of all of them read in one Spark job each."""
        exports = {name: cast(LakeFSExportSource, source) for name, source in sources.items()}
        graphs: dict[str, Graph] = {name: SourceError(why) for name, why in verify_exports(spark, exports).items()}
        whole = {name: source for name, source in exports.items() if name not in graphs}
        if not whole:
            return graphs
        commits = _together(spark, whole, "commits", "commit_id", "parents", "created_at")
        refs = _together(spark, whole, "refs", "name", "kind", "commit_id")
        assert commits is not None and refs is not None
        read: dict[str, tuple[list[Commit], list[Ref]]] = {name: ([], []) for name in whole}
        for name, commit_id, parents, created_at in zip(
            *_columns(commits.toArrow(), REPO, "commit_id", "parents", "created_at")
        ):
            try:
                if not isinstance(graphs.get(name), Exception):
                    read[name][0].append(
                        Commit(commit_id, tuple(parents), parse_created_at(created_at, len(read[name][0]), commit_id))
                    )
            except SourceError as exc:
                graphs[name] = exc
        for name, ref, kind, commit_id in zip(*_columns(refs.toArrow(), REPO, "name", "kind", "commit_id")):
            read[name][1].append(Ref(ref, kind, commit_id))
        return {name: graphs.get(name, read.get(name)) for name in exports}

    def live_entries(self, spark: SparkSession, retained: DataFrame, heads: DataFrame) -> DataFrame:
        def mine(commits: DataFrame) -> DataFrame:
            return commits.select(F.lit(self.export_uri).alias(REPO), "commit_id")

        live = _live(spark, {self.export_uri: self}, mine(retained), mine(heads))
        return live.select(*LIVE_ENTRY_SCHEMA.fieldNames())

    @classmethod
    def live_entries_together(cls, spark: SparkSession, reads: Mapping[str, LiveRead]) -> DataFrame:
        """Every export's live entries in one plan."""

        def commits(of: Callable[[LiveRead], Sequence[str]]) -> DataFrame:
            rows = [(name, commit_id) for name, read in reads.items() for commit_id in of(read)]
            return local_frame(spark, rows, f"{REPO} string, commit_id string")

        exports = {name: cast(LakeFSExportSource, read.source) for name, read in reads.items()}
        return _live(spark, exports, commits(lambda read: read.retained), commits(lambda read: read.heads))

    def committed_addresses(self, spark: SparkSession) -> DataFrame:
        self.verify(spark)
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
        self.verify(spark)
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
        self.verify(spark)
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


def _live(
    spark: SparkSession, exports: Mapping[str, LakeFSExportSource], retained: DataFrame, heads: DataFrame
) -> DataFrame:
    """(repo, LIVE_ENTRY_SCHEMA): the ranges the `retained` commits' metaranges name (repo,
    commit_id), each range once, of every export of `exports` in one plan: the datasets of all of
    them read together, the repository a join key."""
    refused = verify_exports(spark, exports)
    if refused:
        raise SourceError(next(iter(refused.values())))
    commits = _together(spark, exports, "commits", "commit_id", "metarange_id")
    metaranges = _together(spark, exports, "metaranges", "metarange_id", "range_id")
    ranges = _together(spark, exports, "ranges", "range_id", "address", "size")
    assert commits is not None and metaranges is not None and ranges is not None
    flagged_metaranges = (
        retained.join(commits, [REPO, "commit_id"])
        .join(heads.distinct().withColumn("head", F.lit(True)), [REPO, "commit_id"], "left")
        .groupBy(REPO, "metarange_id")
        .agg(F.max(F.coalesce("head", F.lit(False))).alias("at_head"))
    )
    needed_ranges = (
        flagged_metaranges.join(metaranges, [REPO, "metarange_id"])
        .groupBy(REPO, "range_id")
        .agg(F.max("at_head").alias("at_head"))
    )
    committed = ranges.join(needed_ranges, [REPO, "range_id"]).select(
        REPO, "address", "size", F.lit("committed").alias("source"), "at_head"
    )
    staged = _together(spark, exports, "staged", "address", "size")
    if staged is None:
        return committed
    return committed.unionByName(
        staged.select(REPO, "address", "size", F.lit("staged").alias("source"), F.lit(True).alias("at_head"))
    )


def _columns(table: pa.Table, *names: str) -> list[list[Any]]:
    return [table.column(name).to_pylist() for name in names]


def _check_parquet_columns(name: str, frame: DataFrame, schema: T.StructType) -> None:
    present = {f.name: f.dataType for f in frame.schema.fields}
    for field in schema.fields:
        if field.name not in present:
            raise SourceError(f"export dataset {name!r}: column {field.name!r} is missing")
        if field.name == "created_at" and not isinstance(present[field.name], (T.TimestampType, T.StringType)):
            kind = present[field.name].simpleString()
            hint = " (a timestamp without time zone)" if isinstance(present[field.name], T.TimestampNTZType) else ""
            raise SourceError(f"export dataset {name!r}: created_at has type {kind}{hint}; it needs a UTC timestamp")


def _parsed_json_lines(spark: SparkSession, files: list[str], schema: T.StructType, settings: S3Settings) -> DataFrame:
    """(_file, _line, row) of every non-blank line, parsed permissively: _malformed_lines finds the bad ones."""
    lines = read_text(spark, files, settings).select(F.col("file").alias("_file"), F.col("value").alias("_line"))
    lines = lines.filter(F.trim("_line") != "")
    return lines.select("_file", "_line", F.from_json("_line", schema, {"mode": "PERMISSIVE"}).alias("row"))


def _malformed_lines(name: str, parsed: DataFrame) -> DataFrame:
    """(file, line, problem) of the first line of `parsed` that did not parse or lacks a column."""
    keys = F.json_object_keys("_line")
    missing = [F.when(~F.array_contains(keys, c), F.lit(c)) for c in NOT_NULL[name]]
    bad = parsed.select(
        F.col("_file").alias("file"),
        F.col("_line").alias("line"),
        F.when(F.col("row").isNull() | keys.isNull(), F.lit("not a JSON object"))
        .otherwise(F.concat_ws(", ", *missing))
        .alias("problem"),
    ).filter(F.col("problem") != "")
    return bad.limit(1)


def _null_required(name: str) -> Column:
    return reduce(lambda a, b: a | b, [F.col(c).isNull() for c in NOT_NULL[name]])


def _measured(frame: DataFrame, name: str) -> DataFrame:
    """(rows, nulls): the dataset's row count, counted in the same pass that finds a null required column."""
    return frame.agg(F.count(F.lit(1)).alias("rows"), F.count_if(_null_required(name)).alias("nulls"))


def verify_exports(spark: SparkSession, sources: Mapping[str, "LakeFSExportSource"]) -> dict[str, str]:
    """Why each export of `sources` that is not whole is refused, by name: a missing dataset, a
    malformed line, a null required value, counts that disagree with the manifest, rows the graph
    names but the datasets lack. Every export is checked in the same two Spark jobs, and once per
    state of its files in this process (the mark, the checks and the sweep of one run read the
    same export). Runs before anything is marked."""
    refused: dict[str, str] = {}
    reading: dict[str, tuple[tuple[str, int, int], ...]] = {}
    for name, source in sources.items():
        if source._verified:
            continue
        try:
            snapshot = source.snapshot()
            if snapshot in _VERIFIED_SNAPSHOTS:
                source._verified = True
                continue
            for dataset in DATASETS:
                source._dataset(spark, dataset)
        except SourceError as exc:
            refused[name] = str(exc)
            continue
        reading[name] = snapshot
    checks = [check for name in reading for check in sources[name]._checks(spark, name)]
    checked: dict[str, list[Row]] = {name: [] for name in reading}
    for row in reduce(DataFrame.unionByName, checks).collect() if checks else []:
        checked[row[REPO]].append(row)
    for name in reading:
        why = sources[name]._found_whole(spark, checked[name])
        if why is not None:
            refused[name] = why
    whole = {name: sources[name] for name in reading if name not in refused}
    refused |= _dangling(spark, whole)
    for name, source in whole.items():
        if name not in refused and source.snapshot() == reading[name]:  # not rewritten while it was read
            _VERIFIED_SNAPSHOTS.add(reading[name])
        source._verified = True
    return refused


def _together(
    spark: SparkSession, sources: Mapping[str, "LakeFSExportSource"], dataset: str, *columns: str
) -> Optional[DataFrame]:
    """`columns` of one dataset of every export of `sources` (that has it), with `repo`."""
    frames = [
        frame.select(F.lit(name).alias(REPO), *columns)
        for name, source in sources.items()
        for frame in (source._dataset(spark, dataset),)
        if frame is not None
    ]
    return reduce(DataFrame.unionByName, frames) if frames else None


def _dangling(spark: SparkSession, sources: Mapping[str, "LakeFSExportSource"]) -> dict[str, str]:
    """Why each export of `sources` is partial: a metarange a commit names, or a range a metarange
    names, that has no rows (its first SAMPLE), all exports in one Spark job."""
    if not sources:
        return {}
    commits = _together(spark, sources, "commits", "commit_id", "metarange_id")
    metaranges = _together(spark, sources, "metaranges", "metarange_id", "range_id")
    ranges = _together(spark, sources, "ranges", "range_id")
    assert commits is not None and metaranges is not None and ranges is not None

    def missing(referring: DataFrame, owner: str, key: str, referred: DataFrame, dataset: str) -> DataFrame:
        # An outer join, not an anti join: Spark pushes an anti join into each branch of the union,
        # one broadcast an export.
        present = referred.select(REPO, key).distinct().withColumn("present", F.lit(True))
        rows = referring.select(REPO, owner, key).join(present, [REPO, key], "left").filter(F.col("present").isNull())
        first = F.row_number().over(Window.partitionBy(REPO).orderBy(owner, key))
        return (
            rows.withColumn("n", first)
            .filter(F.col("n") <= SAMPLE)
            .select(
                REPO,
                F.lit(dataset).alias("dataset"),
                F.concat(
                    F.lit(f"{key.removesuffix('_id')} "),
                    F.col(key),
                    F.lit(f" of {owner.removesuffix('_id')} "),
                    F.col(owner),
                ).alias("named"),
            )
        )

    found = missing(
        commits.filter(F.col("metarange_id") != EMPTY_METARANGE), "commit_id", "metarange_id", metaranges, "metaranges"
    ).unionByName(missing(metaranges, "metarange_id", "range_id", ranges, "ranges"))
    named: dict[str, dict[str, list[str]]] = {}
    for row in found.collect():
        named.setdefault(row[REPO], {}).setdefault(row["dataset"], []).append(row["named"])
    refused = {}
    for name, by_dataset in named.items():
        dataset = "metaranges" if "metaranges" in by_dataset else "ranges"  # the graph's first gap
        refused[name] = (
            f"export {sources[name].export_uri}: {', '.join(sorted(by_dataset[dataset]))} has no rows in dataset "
            f"{dataset!r} (a partial export, or a lost part file): refusing to mark"
        )
    return refused


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
    spark: SparkSession,
    parts: Sequence[tuple[str, str]],
    settings: Mapping[str, S3Settings],
    columns: tuple[str, ...],
) -> DataFrame:
    """(repo, *columns): read_raw_dataset of each (repo, part file) of `parts` on executors, with its
    repository's `settings`, one part file per task at most."""
    schema = T.StructType([T.StructField(REPO, T.StringType()), *[T.StructField(c, T.StringType()) for c in columns]])

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for repo, uri in zip(batch.column(REPO).to_pylist(), batch.column("uri").to_pylist()):
                for rows in read_raw_dataset([uri], settings[repo], columns).to_batches():
                    yield pa.RecordBatch.from_arrays(
                        [pa.array([repo] * rows.num_rows, pa.string()), *rows.columns], names=[REPO, *columns]
                    )

    uris = local_frame(spark, list(parts), f"{REPO} string, uri string")
    return uris.repartition(max(1, len(parts))).mapInArrow(read, schema)
