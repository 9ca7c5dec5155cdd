"""Many repositories' partitions of one asset stored from one frame, in one write (docs/design.md §9).

The frame carries `repo`; it is written once, split by repository, beside the state directory's
partitions. The columns are checked once on what was written, and the rows' rules, counts and
top prefixes are measured per repository in one query each. Each repository's partition then
passes or fails alone: one that breaks its schema is left out, named; every other is swapped
into `<asset>/repo=<repo>/date=<date>/` with its TIMES_FILE, exactly as the IO manager stores a
partition written by its own step.
"""

from __future__ import annotations

import datetime as dt
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.parquet as pq
from dagster import MetadataValue
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core.state import spark_path
from gc_assets.defs.metadata import PREFIX_ASSETS, breaking_rows, measures, output_metadata, top_prefixes_by
from gc_assets.defs.partitions import partition_key
from gc_assets.defs.resources import GcConfigResource, stored_schema, swap_in
from gc_assets.defs.schemas import MODELS, SchemaError, check_columns, refuse_broken_rows, row_rules

REPO = "repo"
_INDEX = "_repository_index"  # the split column: repository names need no escaping in directory names


@dataclass
class StoredPartitions:
    """What one fleet write stored: each repository's partition metadata, or why it was left out."""

    frame: DataFrame  # every stored partition, read back
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)  # repository -> materialization metadata
    refused: dict[str, str] = field(default_factory=dict)  # repository -> why its partition was not stored


def store_partitions(
    spark: SparkSession,
    gc_config: GcConfigResource,
    asset: str,
    frame: DataFrame,
    notes: Mapping[str, Mapping[str, Any]],
    date: dt.date,
    run_id: str,
) -> StoredPartitions:
    """Store the partition (date, repo) of `asset` for every repository `notes` names from `frame`
    (one with no rows gets an empty partition); its notes join its metadata, and the times among
    them its TIMES_FILE."""
    repos = list(notes)
    model = MODELS[asset]
    root = Path(gc_config.load().state_path) / asset / ".staging" / f"fleet.{uuid.uuid4().hex}"
    index = spark.createDataFrame(list(enumerate(repos)), f"{_INDEX} int, {REPO} string")
    split = frame.join(F.broadcast(index), REPO).select(*frame.columns, _INDEX)
    try:
        split.repartition(_INDEX).write.partitionBy(_INDEX).parquet(spark_path(root))
        written = _read_split(spark, root, frame)
        check_columns(written, model)
        by_repo = {repos[row[_INDEX]]: row.asDict() for row in _measured(written, asset, model).collect()}
        prefixes = top_prefixes_by(written, (_INDEX,)) if asset in PREFIX_ASSETS else {}
        empty = _empty_part(spark, written, root)
        stored = StoredPartitions(written)
        finals = []
        for i, repo in enumerate(repos):
            staging = root / f"{_INDEX}={i}"
            measured = by_repo.get(repo) or _nothing_measured(written, asset, model)
            try:
                refuse_broken_rows(model, breaking_rows(measured))
            except SchemaError as exc:
                stored.refused[repo] = str(exc)
                continue
            if not staging.is_dir():
                staging.mkdir(parents=True)
                shutil.copyfile(empty, staging / empty.name)
            final = Path(gc_config.state_location(asset, partition_key(date, repo)))
            times = {k: v.isoformat() for k, v in notes[repo].items() if isinstance(v, dt.datetime)}
            swap_in(staging, final, {"run_id": run_id, **times})
            finals.append(final)
            metadata = output_metadata(asset, measured, None, prefixes.get((i,), []))
            stored.metadata[repo] = {
                **{k: metadata_value(v) for k, v in notes[repo].items()},
                "path": MetadataValue.path(str(final)),
                **metadata,
            }
        schema = stored_schema(finals[0]) if finals else None
        reader = spark.read if schema is None else spark.read.schema(schema)
        stored.frame = reader.parquet(*[spark_path(p) for p in finals]) if finals else frame.limit(0)
        return stored
    finally:
        shutil.rmtree(root, ignore_errors=True)


def metadata_value(value: Any) -> Any:
    """A note as the metadata an asset's own step gives it: times as timestamps, lists as JSON."""
    if isinstance(value, dt.datetime):
        return MetadataValue.timestamp(value)
    if isinstance(value, (list, tuple, dict)):
        return MetadataValue.json(list(value) if isinstance(value, tuple) else value)
    return value


def _read_split(spark: SparkSession, root: Path, frame: DataFrame) -> DataFrame:
    """What the split write stored, with its split column (`frame` without rows when it stored none)."""
    if not any(root.glob(f"{_INDEX}=*")):
        return frame.limit(0).withColumn(_INDEX, F.lit(0))
    schema = stored_schema(next(root.glob(f"{_INDEX}=*"), root))
    reader = spark.read if schema is None else spark.read.schema(schema.add(_INDEX, T.IntegerType()))
    return reader.parquet(spark_path(root))


def _measured(written: DataFrame, asset: str, model: Any) -> DataFrame:
    return written.groupBy(_INDEX).agg(*measures(asset, row_rules(model)))


def _nothing_measured(written: DataFrame, asset: str, model: Any) -> dict[str, Any]:
    """The measures of a partition without rows (no group of the query above): all zero."""
    return {name: 0 for name in _measured(written, asset, model).columns if name != _INDEX}


def _empty_part(spark: SparkSession, written: DataFrame, root: Path) -> Path:
    """A part file of no rows with the schema of the write (Spark's own footer), for the
    partitions of repositories that have no rows."""
    path = root / "_empty" / "part-00000-empty.snappy.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = sorted(root.glob(f"{_INDEX}=*/*.parquet"))
    if parts:
        schema = pq.read_schema(parts[0])
        pq.write_table(pa.Table.from_batches([], schema), path)
    else:
        written.drop(_INDEX).limit(0).coalesce(1).write.parquet(spark_path(path.parent / "spark"))
        path = next((path.parent / "spark").glob("*.parquet"))
    return path
