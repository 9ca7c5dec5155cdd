"""Many repositories' partitions of one asset stored from one frame, in one write (docs/design.md §6.7).

The frame carries `repo`; it is computed once and kept with the executors, its columns checked
once, its rows' rules, counts and top prefixes measured per repository in one query each, and
it is written once, split by repository (StateFiles.stage_split: on the driver's disk or on an
object store), beside the state directory's partitions. Each repository's partition then
passes or fails alone: one that breaks its schema is left out, named; every other is put in
place at `<asset>/repo=<repo>/date=<date>/` with its record.
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping

from dagster import MetadataValue
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.names import REPO
from gc_assets.core.spark import local_frame, one_of
from gc_assets.defs.metadata import PREFIX_ASSETS, breaking_rows, measures, output_metadata, top_prefixes_by
from gc_assets.defs.partitions import partition_key
from gc_assets.defs.resources import GcConfigResource
from gc_assets.defs.schemas import MODELS, SchemaError, check_columns, refuse_broken_rows, row_rules
from gc_assets.stores.state import Staged

_INDEX = "_repository_index"  # the split column: repository names need no escaping in directory names


@dataclass
class StoredPartitions:
    """What one fleet write stored: each repository's partition metadata, or why it was left out."""

    frame: DataFrame  # the rows of every stored partition, as written (kept with the executors)
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)  # repository -> materialization metadata
    refused: dict[str, str] = field(default_factory=dict)  # repository -> why its partition was not stored
    staged: dict[int, Staged] = field(default_factory=dict)  # each stored partition, written, not yet in place
    records: dict[int, dict[str, Any]] = field(default_factory=dict)  # each one's record (TIMES_FILE)
    commits_at_once: int = 1

    def commit(self) -> None:
        """Put every stored partition in place (commit_all): until then none is visible."""
        commit_all(self.staged, self.records, self.commits_at_once)


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
    them its TIMES_FILE. Each is written beside its place, and put there by the result's `commit`:
    the caller does it while Spark goes on to the next asset."""
    repos = list(notes)
    model = MODELS[asset]
    files = gc_config.state()
    keys = [gc_config.partition_at(asset, partition_key(date, repo)) for repo in repos]
    index = local_frame(spark, list(enumerate(repos)), f"{_INDEX} int, {REPO} string")
    # Computed once and kept with the executors: the write, the measures and every later reader
    # of the stored partitions (the guards) see exactly these rows.
    split = frame.join(F.broadcast(index), REPO).select(*frame.columns, _INDEX).localCheckpoint()
    check_columns(split, model)
    measured_frame = split.groupBy(_INDEX).agg(*measures(asset, row_rules(model)))
    by_repo = {repos[row[_INDEX]]: row.asDict() for row in measured_frame.collect()}
    nothing = {name: 0 for name in measured_frame.columns if name != _INDEX}  # a partition without rows
    prefixes = top_prefixes_by(split, (_INDEX,)) if asset in PREFIX_ASSETS else {}
    staged = files.stage_split(spark, split, _INDEX, keys)
    stored = StoredPartitions(split, commits_at_once=files.commits_at_once)
    for i, repo in enumerate(repos):
        measured = by_repo.get(repo) or nothing
        try:
            refuse_broken_rows(model, breaking_rows(measured))
        except SchemaError as exc:
            stored.refused[repo] = str(exc)
            staged[i].discard()
            continue
        times = {k: v.isoformat() for k, v in notes[repo].items() if isinstance(v, dt.datetime)}
        stored.records[i] = {"run_id": run_id, **times}
        stored.staged[i] = staged[i]
        metadata = output_metadata(asset, measured, None, prefixes.get((i,), []))
        stored.metadata[repo] = {
            **{k: metadata_value(v) for k, v in notes[repo].items()},
            "path": MetadataValue.path(files.uri(keys[i])),
            **metadata,
        }
    stored.frame = split.filter(one_of(_INDEX, list(stored.staged))).drop(_INDEX)
    return stored


def commit_all(staged: Mapping[int, Staged], records: Mapping[int, dict[str, Any]], at_once: int) -> None:
    """Commit every staged partition with its record, `at_once` at a time (StateFiles.commits_at_once);
    when one fails, those not yet committed are discarded and the error raised."""
    committed: set[int] = set()

    def commit(i: int) -> None:
        staged[i].commit(records[i])
        committed.add(i)

    try:
        with ThreadPoolExecutor(at_once) as pool:
            list(pool.map(commit, staged))
    except BaseException:
        for i, each in staged.items():
            if i not in committed:
                each.discard()
        raise


def metadata_value(value: Any) -> Any:
    """A note as the metadata an asset's own step gives it: times as timestamps, lists as JSON."""
    if isinstance(value, dt.datetime):
        return MetadataValue.timestamp(value)
    if isinstance(value, (list, tuple, dict)):
        return MetadataValue.json(list(value) if isinstance(value, tuple) else value)
    return value
