"""Many repositories' partitions of one asset stored from one frame, in one write (docs/design.md §6.7).

The frame carries `repo`; it is computed once and kept with the executors, its columns checked
once, its rows' rules, counts and top prefixes measured per repository in one query each, and
it is written once, split by repository (core.split_parquet), beside the state directory's
partitions. Each repository's partition then passes or fails alone: one that breaks its
schema is left out, named; every other is swapped into `<asset>/repo=<repo>/date=<date>/`
with its TIMES_FILE, exactly as the IO manager stores a partition written by its own step.
"""

from __future__ import annotations

import datetime as dt
import shutil
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

from dagster import MetadataValue
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.names import REPO
from gc_assets.core.spark import one_of
from gc_assets.core.split_parquet import write_empty, write_split
from gc_assets.defs.metadata import PREFIX_ASSETS, breaking_rows, measures, output_metadata, top_prefixes_by
from gc_assets.defs.partitions import partition_key
from gc_assets.defs.resources import GcConfigResource
from gc_assets.defs.schemas import MODELS, SchemaError, check_columns, refuse_broken_rows, row_rules
from gc_assets.stores.state import LocalState, swap_in

_INDEX = "_repository_index"  # the split column: repository names need no escaping in directory names


@dataclass
class StoredPartitions:
    """What one fleet write stored: each repository's partition metadata, or why it was left out."""

    frame: DataFrame  # the rows of every stored partition, as written (kept with the executors)
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
    files = gc_config.state()
    assert isinstance(files, LocalState), "a fleet collects together only with a local state directory"
    root = files.path / asset / ".staging" / f"fleet.{uuid.uuid4().hex}"
    index = spark.createDataFrame(list(enumerate(repos)), f"{_INDEX} int, {REPO} string")
    # Computed once and kept with the executors: the write, the measures and every later reader
    # of the stored partitions (the guards) see exactly these rows.
    split = frame.join(F.broadcast(index), REPO).select(*frame.columns, _INDEX).localCheckpoint()
    check_columns(split, model)
    measured_frame = split.groupBy(_INDEX).agg(*measures(asset, row_rules(model)))
    by_repo = {repos[row[_INDEX]]: row.asDict() for row in measured_frame.collect()}
    nothing = {name: 0 for name in measured_frame.columns if name != _INDEX}  # a partition without rows
    prefixes = top_prefixes_by(split, (_INDEX,)) if asset in PREFIX_ASSETS else {}
    try:
        schema = write_split(spark, split, _INDEX, root)
        stored = StoredPartitions(split)
        kept = []
        for i, repo in enumerate(repos):
            staging = root / f"{_INDEX}={i}"
            measured = by_repo.get(repo) or nothing
            try:
                refuse_broken_rows(model, breaking_rows(measured))
            except SchemaError as exc:
                stored.refused[repo] = str(exc)
                continue
            if not staging.is_dir():
                staging.mkdir(parents=True)
                write_empty(schema, staging)
            final = files.path / gc_config.partition_at(asset, partition_key(date, repo))
            times = {k: v.isoformat() for k, v in notes[repo].items() if isinstance(v, dt.datetime)}
            swap_in(staging, final, {"run_id": run_id, **times})
            kept.append(i)
            metadata = output_metadata(asset, measured, None, prefixes.get((i,), []))
            stored.metadata[repo] = {
                **{k: metadata_value(v) for k, v in notes[repo].items()},
                "path": MetadataValue.path(str(final)),
                **metadata,
            }
        stored.frame = split.filter(one_of(_INDEX, kept)).drop(_INDEX)
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
