"""Retention edges the brute-force property test cannot see (docs/MUTATION.md).

The property test compares only which commits are retained and their thresholds; these
pin the rest of a verdict (the explicit "not retained", which starting point keeps a
commit), the strict boundary of a dangling commit, and refusals that name their row.
"""

from __future__ import annotations

import datetime as dt

import pytest

from gc_assets.core.config import Rules, TagRule
from gc_assets.core.retention import Commit, GraphError, Ref, Retention, evaluate

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)
DAY = dt.timedelta(days=1)


def _chain(*days: float) -> list[Commit]:
    commits, parent = [], ()
    for index, day in enumerate(days):
        commits.append(Commit(f"c{index}", parent, T0 + day * DAY))
        parent = (f"c{index}",)
    return commits


def test_a_commit_nothing_retains_gets_an_explicit_false_verdict():
    # Threshold day 19: main's head (day 10) was already the head then; c0 is older.
    verdicts = evaluate(_chain(0, 10), [Ref("main", "branch", "c1")], Rules(default_retention_days=1), T0 + 20 * DAY)
    assert verdicts["c0"] == Retention(False, None, None)
    assert verdicts["c1"] == Retention(True, "main", T0 + 19 * DAY)


def test_a_commit_kept_only_by_a_tag_is_retained_by_that_tag_at_its_own_time():
    refs = [Ref("main", "branch", "c2"), Ref("v1", "tag", "c0")]
    verdicts = evaluate(_chain(0, 1, 30), refs, Rules(default_retention_days=1), T0 + 31 * DAY)
    assert verdicts["c0"] == Retention(True, "v1", T0)
    assert verdicts["c1"] == Retention(False, None, None)


def test_tag_retention_days_keep_the_head_at_the_tags_threshold_not_the_whole_history():
    # Tag threshold day 1.5 (walked first): c2, and c1, which was the head then. main's is day 2.
    refs = [Ref("main", "branch", "c3"), Ref("v1", "tag", "c2")]
    rules = Rules(default_retention_days=1, tags=TagRule(retention_days=1.5))
    verdicts = evaluate(_chain(0, 1, 2, 30), refs, rules, T0 + 3 * DAY)
    assert verdicts["c1"] == Retention(True, "v1", T0 + 1.5 * DAY)
    assert verdicts["c0"] == Retention(False, None, None)
    assert verdicts["c3"] == Retention(True, "main", T0 + 2 * DAY)


def test_a_dangling_commit_is_retained_by_dangling():
    # c1's branch was deleted; both walks have threshold day -2, main's walk claims c0 first.
    commits = _chain(0, 1) + [Commit("main-head", ("c0",), T0 + 2 * DAY)]
    verdicts = evaluate(commits, [Ref("main", "branch", "main-head")], Rules(default_retention_days=7), T0 + 5 * DAY)
    assert verdicts["c1"] == Retention(True, "dangling", T0 - 2 * DAY)
    assert verdicts["c0"] == Retention(True, "main", T0 - 2 * DAY)


def test_a_dangling_commit_exactly_as_old_as_the_threshold_expires():
    """Kept only while strictly newer than the threshold, like a commit under a child at its own time."""
    commits = [Commit("root", (), T0), Commit("orphan", ("root",), T0 + DAY)]
    refs = [Ref("main", "branch", "root")]
    rules = Rules(default_retention_days=7)
    assert not evaluate(commits, refs, rules, T0 + 8 * DAY)["orphan"].retained
    one_second_earlier = T0 + 8 * DAY - dt.timedelta(seconds=1)
    assert evaluate(commits, refs, rules, one_second_earlier)["orphan"] == Retention(
        True, "dangling", T0 + DAY - dt.timedelta(seconds=1)
    )


def test_an_empty_commit_id_is_refused_with_its_row():
    with pytest.raises(GraphError) as refused:
        evaluate([Commit("a", (), T0), Commit("", (), T0)], [], Rules(default_retention_days=1), T0)
    assert str(refused.value) == "commits row 1: empty commit_id"


class _OffsetUnknown(dt.tzinfo):
    """A time zone that cannot say its offset: the instant is as unknown as with no zone."""

    def utcoffset(self, when):
        return None

    def dst(self, when):
        return None

    def tzname(self, when):
        return "unknown"


def test_a_time_zone_without_an_offset_is_refused_like_no_time_zone():
    commits = [Commit("a", (), dt.datetime(2024, 1, 1, tzinfo=_OffsetUnknown()))]
    with pytest.raises(GraphError) as refused:
        evaluate(commits, [], Rules(default_retention_days=1), T0)
    assert str(refused.value) == "commits row 0 (a): created_at has no time zone"
