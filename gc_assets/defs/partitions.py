"""Partitions (date × repository) and the time a partition stands for (docs/design.md §2)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

from dagster import (
    DailyPartitionsDefinition,
    DynamicPartitionsDefinition,
    MultiPartitionKey,
    MultiPartitionsDefinition,
)

REPOSITORIES = DynamicPartitionsDefinition(name="repositories")
AS_OF_TAG = "gc_assets/as_of"


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
    if not override:
        return min(end_of_day(date), now)
    as_of = parse_timestamp(override)
    start = end_of_day(date) - dt.timedelta(days=1)
    if not start < as_of <= end_of_day(date):
        raise TimeError(f"as-of {as_of.isoformat()} is not inside the partition date {date.isoformat()}")
    return as_of


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
