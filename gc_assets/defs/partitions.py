"""Partitions (date × repository) and the as-of of a run (docs/design.md §2); the time rules
themselves are gc_assets.core.time.

A run's as-of is fixed once, when the run is launched: every launcher writes it as the
run tag AS_OF_TAG, and every step and check of the run reads that tag. A run launched
without it (from the UI, by a backfill) takes the time its instance recorded when it
created the run, and a re-execution that of the run it re-executes: both are written
once and never change, whichever step reads them, in whichever process or retry.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from dagster import (
    DagsterInstance,
    DagsterRun,
    DailyPartitionsDefinition,
    DynamicPartitionsDefinition,
    MultiPartitionKey,
    MultiPartitionsDefinition,
)

from gc_assets.core.time import AS_OF_TAG, TimeError, checked_as_of, resolve_as_of

REPOSITORIES = DynamicPartitionsDefinition(name="repositories")
ROOT_RUN_TAG = "dagster/root_run_id"  # on every re-execution: the run of the group first launched


def date_partitions(start_date: dt.date) -> DailyPartitionsDefinition:
    # end_offset=1: today's partition exists (GC as of now), for sensors and the UI.
    return DailyPartitionsDefinition(start_date=start_date.isoformat(), end_offset=1)


def gc_partitions(start_date: dt.date) -> MultiPartitionsDefinition:
    return MultiPartitionsDefinition({"date": date_partitions(start_date), "repo": REPOSITORIES})


def partition_key(date: dt.date, repo: str) -> MultiPartitionKey:
    return MultiPartitionKey({"date": date.isoformat(), "repo": repo})


def split_partition_key(key: Any) -> tuple[str, str]:
    """(date, repo) of a multi-partition key or its string form 'date|repo'."""
    if isinstance(key, MultiPartitionKey):
        dims = key.keys_by_dimension
        return dims["date"], dims["repo"]
    date, _, repo = str(key).partition("|")
    return date, repo


def run_as_of(instance: DagsterInstance, run: DagsterRun, date: dt.date) -> dt.datetime:
    """The as-of of `run` for partition date `date`: its tag, else its root run's tag, else
    `min(end of day, creation time)` of its root run as the instance recorded it."""
    if run.tags.get(AS_OF_TAG):
        return checked_as_of(date, run.tags[AS_OF_TAG])
    root_id = run.root_run_id or run.tags.get(ROOT_RUN_TAG) or run.run_id
    root = instance.get_run_record_by_id(root_id)
    if root is None:
        raise TimeError(
            f"run {run.run_id} re-executes run {root_id}, which the instance no longer holds: its as-of is unknown; "
            f"launch the run again with the tag {AS_OF_TAG}"
        )
    if root_id != run.run_id and root.dagster_run.tags.get(AS_OF_TAG):
        return checked_as_of(date, root.dagster_run.tags[AS_OF_TAG])
    created = root.create_timestamp
    return resolve_as_of(date, created if created.tzinfo else created.replace(tzinfo=dt.timezone.utc), None)
