"""Partitions (date × repository) and the time a partition stands for (docs/design.md §2).

A run's as-of is fixed once, when the run is launched: every launcher writes it as the
run tag AS_OF_TAG, and every step and check of the run reads that tag. A run launched
without it (from the UI, by a backfill) takes the time its instance recorded when it
created the run, and a re-execution that of the run it re-executes: both are written
once and never change, whichever step reads them, in whichever process or retry.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

from dagster import (
    DagsterInstance,
    DagsterRun,
    DailyPartitionsDefinition,
    DynamicPartitionsDefinition,
    MultiPartitionKey,
    MultiPartitionsDefinition,
)

REPOSITORIES = DynamicPartitionsDefinition(name="repositories")
AS_OF_TAG = "gc_assets/as_of"
ROOT_RUN_TAG = "dagster/root_run_id"  # on every re-execution: the run of the group first launched


class TimeError(ValueError):
    """An as-of time that the partition or the mode does not allow."""


def gc_partitions(start_date: dt.date) -> MultiPartitionsDefinition:
    return MultiPartitionsDefinition(
        # end_offset=1: today's partition exists (GC as of now), for sensors and the UI.
        {"date": DailyPartitionsDefinition(start_date=start_date.isoformat(), end_offset=1), "repo": REPOSITORIES}
    )


def partition_key(date: dt.date, repo: str) -> MultiPartitionKey:
    return MultiPartitionKey({"date": date.isoformat(), "repo": repo})


def split_partition_key(key: Any) -> tuple[str, str]:
    """(date, repo) of a multi-partition key or its string form 'date|repo'."""
    if isinstance(key, MultiPartitionKey):
        dims = key.keys_by_dimension
        return dims["date"], dims["repo"]
    date, _, repo = str(key).partition("|")
    return date, repo


def end_of_day(date: dt.date) -> dt.datetime:
    return dt.datetime.combine(date + dt.timedelta(days=1), dt.time(), tzinfo=dt.timezone.utc)


def resolve_as_of(date: dt.date, now: dt.datetime, override: Optional[str]) -> dt.datetime:
    """`min(D+1 00:00Z, now)`, or an override that lies inside day D (up to its end)."""
    return checked_as_of(date, override) if override else min(end_of_day(date), now)


def checked_as_of(date: dt.date, text: str) -> dt.datetime:
    """An as-of time given as text, which must lie inside day D (up to its end)."""
    as_of = parse_timestamp(text)
    start = end_of_day(date) - dt.timedelta(days=1)
    if not start < as_of <= end_of_day(date):
        raise TimeError(f"as-of {as_of.isoformat()} is not inside the partition date {date.isoformat()}")
    return as_of


def as_of_tags(date: dt.date, launched_at: dt.datetime, override: Optional[str] = None) -> dict[str, str]:
    """The tag that fixes a run's as-of at its launch: `resolve_as_of` of the launch time,
    refused here, not in a step, when it does not lie inside day D."""
    as_of = format_timestamp(resolve_as_of(date, launched_at, override))
    checked_as_of(date, as_of)
    return {AS_OF_TAG: as_of}


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


def partition_date_of(as_of: dt.datetime) -> dt.date:
    """The day an as-of time closes: midnight belongs to the day that just ended."""
    shifted = as_of - dt.timedelta(microseconds=1)
    return shifted.date()


def parse_timestamp(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise TimeError(f"{text!r} is not an ISO 8601 timestamp") from None
    if value.tzinfo is None:
        raise TimeError(f"{text!r} has no time zone (write it like 2022-03-31T12:00:00Z)")
    return value.astimezone(dt.timezone.utc)


def format_timestamp(value: dt.datetime) -> str:
    """UTC in ISO 8601 with a Z, as the JSON summary writes it."""
    return value.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")
