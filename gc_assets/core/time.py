"""The time rules of docs/design.md §2 and §10, on plain values: the as-of a partition stands
for, how it is written and read, and the cutoffs the mark's knowledge allows.

A partition (date D) stands for `min(D+1 00:00Z, now)` or an override inside day D. A mark
knows nothing written after its knowledge time, the earliest of the as-of, the mark's own
time and the time its source state was current; candidates are older than that by the
minimum object age, untracked ones by the format's window for in-flight writers too.
"""

from __future__ import annotations

import datetime as dt
from typing import Optional

from gc_assets.core.config import RepositoryConfig

AS_OF_TAG = "gc_assets/as_of"  # the run tag that fixes a run's as-of at its launch


class TimeError(ValueError):
    """An as-of time that the partition or the mode does not allow."""


class UnsafeSettings(ValueError):
    """A repository's settings would let the GC act on what it cannot know is garbage."""


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


def refuse_future_as_of(dry_run: bool, as_of: dt.datetime, now: dt.datetime) -> None:
    """An as-of later than the wall clock judges a future nobody has seen: dry run only."""
    if not dry_run and as_of > now:
        raise TimeError("an as-of time later than the wall clock is only allowed in dry_run")


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


def knowledge_time(as_of: dt.datetime, mark_time: dt.datetime, source_time: dt.datetime) -> dt.datetime:
    """The latest moment a mark's knowledge covers: nothing written after it was seen by it."""
    return min(mark_time, as_of, source_time)


def candidate_cutoff(knowledge: dt.datetime, repo: RepositoryConfig) -> dt.datetime:
    """No object modified at or after this time is ever a candidate (docs/design.md §2, §10)."""
    return knowledge - repo.min_object_age


def untracked_guard(repo: RepositoryConfig, format_guard: dt.timedelta) -> dt.timedelta:
    """How old an untracked object must be: the format's window for in-flight writers, or the
    configured override (below the format's window only with allow_unsafe_min_age)."""
    if repo.untracked_min_age_hours is None:
        return max(format_guard, repo.min_object_age)
    override = dt.timedelta(hours=repo.untracked_min_age_hours)
    if override < format_guard and not repo.allow_unsafe_min_age:
        raise UnsafeSettings(
            f"repository {repo.name!r}: untracked_min_age_hours {repo.untracked_min_age_hours:g} is below the "
            f"format's own guard for in-flight writers ({format_guard.total_seconds() / 3600:g} hours); "
            "that needs allow_unsafe_min_age: true"
        )
    return max(override, repo.min_object_age)


def untracked_cutoff(knowledge: dt.datetime, repo: RepositoryConfig, format_guard: dt.timedelta) -> dt.datetime:
    """No untracked object modified at or after this time is a candidate (docs/design.md §10)."""
    return knowledge - untracked_guard(repo, format_guard)
