"""The time rules of gc_assets.core.time, on plain values (mutation-tested: docs/MUTATION.md)."""

from __future__ import annotations

import datetime as dt
import time as clock

import pytest

from gc_assets.core import time
from gc_assets.core.config import RepositoryConfig
from gc_assets.core.time import TimeError, UnsafeSettings

UTC = dt.timezone.utc
DAY = dt.date(2022, 3, 31)
END = dt.datetime(2022, 4, 1, tzinfo=UTC)


def _repo(**settings) -> RepositoryConfig:
    return RepositoryConfig.model_validate(
        {"name": "lake", "format": "delta", "storage_namespace": "file:///tmp/lake", **settings}
    )


def test_end_of_day_is_the_next_midnight_in_utc():
    end = time.end_of_day(DAY)
    assert end == END and end.tzinfo is UTC
    assert time.end_of_day(dt.date(2022, 12, 31)) == dt.datetime(2023, 1, 1, tzinfo=UTC)


def test_resolve_as_of_is_the_earlier_of_end_of_day_and_now():
    before = dt.datetime(2022, 3, 31, 12, tzinfo=UTC)
    after = dt.datetime(2022, 4, 3, tzinfo=UTC)
    assert time.resolve_as_of(DAY, before, None) == before
    assert time.resolve_as_of(DAY, after, None) == END
    assert time.resolve_as_of(DAY, after, "") == END
    assert time.resolve_as_of(DAY, after, "2022-03-31T06:00:00Z") == dt.datetime(2022, 3, 31, 6, tzinfo=UTC)


def test_checked_as_of_lies_inside_the_day_up_to_its_end():
    assert time.checked_as_of(DAY, "2022-04-01T00:00:00Z") == END
    assert time.checked_as_of(DAY, "2022-03-31T00:00:00.000001Z") == dt.datetime(2022, 3, 31, 0, 0, 0, 1, tzinfo=UTC)
    for outside in ("2022-03-31T00:00:00Z", "2022-04-01T00:00:00.000001Z", "2022-03-30T12:00:00Z"):
        with pytest.raises(TimeError) as refused:
            time.checked_as_of(DAY, outside)
        as_of = time.parse_timestamp(outside).isoformat()
        assert str(refused.value) == f"as-of {as_of} is not inside the partition date 2022-03-31"


def test_as_of_tags_fix_the_as_of_at_launch():
    launched = dt.datetime(2022, 3, 31, 9, 30, tzinfo=UTC)
    assert time.as_of_tags(DAY, launched) == {"gc_assets/as_of": "2022-03-31T09:30:00Z"}
    assert time.AS_OF_TAG == "gc_assets/as_of"
    late = dt.datetime(2022, 4, 2, tzinfo=UTC)
    assert time.as_of_tags(DAY, late) == {time.AS_OF_TAG: "2022-04-01T00:00:00Z"}
    assert time.as_of_tags(DAY, late, "2022-03-31T12:00:00+02:00") == {time.AS_OF_TAG: "2022-03-31T10:00:00Z"}
    with pytest.raises(TimeError):
        time.as_of_tags(DAY, late, "2022-04-01T12:00:00Z")


def test_a_future_as_of_is_refused_outside_dry_run():
    now = dt.datetime(2022, 3, 31, 12, tzinfo=UTC)
    later = now + dt.timedelta(microseconds=1)
    time.refuse_future_as_of(True, later, now)
    time.refuse_future_as_of(False, now, now)
    time.refuse_future_as_of(False, now - dt.timedelta(days=1), now)
    with pytest.raises(TimeError) as refused:
        time.refuse_future_as_of(False, later, now)
    assert str(refused.value) == "an as-of time later than the wall clock is only allowed in dry_run"


def test_partition_date_of_gives_midnight_to_the_day_that_ended():
    assert time.partition_date_of(END) == DAY
    assert time.partition_date_of(END + dt.timedelta(microseconds=1)) == dt.date(2022, 4, 1)
    assert time.partition_date_of(END - dt.timedelta(hours=23)) == DAY


def test_parse_timestamp_needs_iso_8601_with_a_zone_and_gives_utc():
    parsed = time.parse_timestamp("2022-03-31T14:00:00+02:00")
    assert parsed == dt.datetime(2022, 3, 31, 12, tzinfo=UTC) and parsed.tzinfo is UTC
    with pytest.raises(TimeError) as refused:
        time.parse_timestamp("yesterday")
    assert str(refused.value) == "'yesterday' is not an ISO 8601 timestamp"
    assert refused.value.__suppress_context__
    with pytest.raises(TimeError) as refused:
        time.parse_timestamp("2022-03-31T12:00:00")
    assert str(refused.value) == "'2022-03-31T12:00:00' has no time zone (write it like 2022-03-31T12:00:00Z)"


def test_format_timestamp_writes_utc_with_a_z(monkeypatch):
    zoned = dt.datetime(2022, 3, 31, 14, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert time.format_timestamp(zoned) == "2022-03-31T12:00:00Z"
    assert time.format_timestamp(END) == "2022-04-01T00:00:00Z"
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # whatever this machine's zone, UTC is written
    clock.tzset()
    try:
        assert time.format_timestamp(zoned) == "2022-03-31T12:00:00Z"
    finally:
        monkeypatch.undo()
        clock.tzset()


def test_knowledge_time_is_the_earliest_of_the_three():
    a, b, c = (dt.datetime(2022, 3, d, tzinfo=UTC) for d in (1, 2, 3))
    for as_of, mark_time, source_time in ((a, b, c), (b, a, c), (c, b, a)):
        assert time.knowledge_time(as_of, mark_time, source_time) == a


def test_candidate_cutoff_is_the_minimum_object_age_before_the_knowledge_time():
    assert time.candidate_cutoff(END, _repo(min_object_age_hours=6)) == END - dt.timedelta(hours=6)


def test_untracked_guard_is_the_format_window_or_the_override():
    hour = dt.timedelta(hours=1)
    assert time.untracked_guard(_repo(min_object_age_hours=2), 5 * hour) == 5 * hour
    assert time.untracked_guard(_repo(min_object_age_hours=7), 5 * hour) == 7 * hour
    assert time.untracked_guard(_repo(min_object_age_hours=1, untracked_min_age_hours=9), 5 * hour) == 9 * hour
    assert time.untracked_guard(_repo(min_object_age_hours=1, untracked_min_age_hours=5), 5 * hour) == 5 * hour
    overridden = _repo(min_object_age_hours=8, untracked_min_age_hours=6, allow_unsafe_min_age=True)
    assert time.untracked_guard(overridden, 5 * hour) == 8 * hour
    unsafe = _repo(min_object_age_hours=1, untracked_min_age_hours=2.5, allow_unsafe_min_age=True)
    assert time.untracked_guard(unsafe, 5 * hour) == 2.5 * hour


def test_an_override_below_the_format_window_needs_allow_unsafe_min_age():
    with pytest.raises(UnsafeSettings) as refused:
        time.untracked_guard(_repo(min_object_age_hours=1, untracked_min_age_hours=2.5), dt.timedelta(hours=5))
    assert str(refused.value) == (
        "repository 'lake': untracked_min_age_hours 2.5 is below the format's own guard for in-flight writers "
        "(5 hours); that needs allow_unsafe_min_age: true"
    )


def test_untracked_cutoff_is_the_untracked_guard_before_the_knowledge_time():
    repo = _repo(min_object_age_hours=1)
    assert time.untracked_cutoff(END, repo, dt.timedelta(hours=5)) == END - dt.timedelta(hours=5)
