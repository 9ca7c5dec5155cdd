"""The retention answers `explain` and `plan` give (docs/design.md §3), without Spark: when a
commit expires, which rule retained it, and how far back each branch can be restored.

Known answers are worked out by hand from §3's rules; the property test holds `expired_at`
to the brute-force definition in gc_assets_tests/oracles.py on random graphs.
"""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gc_assets.core.config import BranchRule, Rules, TagRule
from gc_assets.core.retention import Commit, Ref, Retention, evaluate, expired_at, oldest_restorable, rule_of
from gc_assets.core.time import end_of_day
from gc_assets.demo.lakegen import DOCS_GC_DATE, DOCS_RULES, docs_example
from gc_assets_tests.oracles import lake_graph, retained_brute_force
from gc_assets_tests.test_retention import commit_graphs

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)
DAY = dt.timedelta(days=1)
SECOND = dt.timedelta(seconds=1)


def _noon(day: str) -> dt.datetime:
    return dt.datetime.fromisoformat(f"{day}T12:00:00+00:00")


def _chain(*days: float, prefix: str = "c", root: tuple[str, ...] = ()) -> list[Commit]:
    commits, parent = [], root
    for index, day in enumerate(days):
        commits.append(Commit(f"{prefix}{index}", parent, T0 + day * DAY))
        parent = (f"{prefix}{index}",)
    return commits


# The lakeFS documentation example (main 21 days, dev 7, default 14; every commit at noon).
# A commit expires when the oldest commit above it on a walk is older than T minus the
# walk's days; of several walks the last to let it go decides.
DOCS_EXPIRY = {
    "2022-03-28": None,  # main's head
    "2022-03-12": "2022-04-18",  # under 03-28 on main: 03-28 + 21 days
    "2022-03-09": "2022-04-02",  # 03-12 + 21
    "2022-03-01": "2022-03-30",  # main: 03-09 + 21 outlasts dev: d:03-02 + 7
    "2022-02-27": "2022-03-22",  # main: 03-01 + 21 outlasts dev: 03-01 + 7
    "d:2022-03-02": "2022-03-20",  # d:03-13 + 7
    "d:2022-03-13": "2022-03-21",
    "d:2022-03-14": "2022-03-27",
    "d:2022-03-20": "2022-03-30",
    "d:2022-03-23": "2022-04-02",
    "d:2022-03-26": None,  # dev's head
}


@pytest.mark.parametrize("commit_id, day", DOCS_EXPIRY.items())
def test_expiry_of_every_commit_of_the_documentation_example(commit_id, day):
    commits, refs = lake_graph(docs_example())
    assert expired_at(commits, refs, Rules.model_validate(DOCS_RULES), commit_id) == (_noon(day) if day else None)


def test_documentation_example_expiries_agree_with_its_verdicts_on_gc_day():
    commits, refs = lake_graph(docs_example())
    as_of = end_of_day(DOCS_GC_DATE)
    retained = {c for c, v in evaluate(commits, refs, Rules.model_validate(DOCS_RULES), as_of).items() if v.retained}
    assert retained == {c for c, day in DOCS_EXPIRY.items() if day is None or _noon(day) > as_of}


def test_no_rules_and_a_retained_tag_keep_a_commit_for_ever():
    commits, refs = lake_graph(docs_example())
    assert expired_at(commits, refs, None, "2022-02-27") is None
    tagged = refs + [Ref("v0", "tag", "2022-02-27")]
    assert expired_at(commits, tagged, Rules.model_validate(DOCS_RULES), "2022-02-27") is None
    # A tag that does not retain is no starting point: the branches decide alone.
    ignored = Rules.model_validate({**DOCS_RULES, "tags": {"retain": False}})
    assert expired_at(commits, tagged, ignored, "2022-02-27") == _noon("2022-03-22")


def test_a_tag_elsewhere_in_the_graph_does_not_keep_this_commit():
    commits, refs = lake_graph(docs_example())
    tagged = refs + [Ref("v1", "tag", "2022-03-09")]
    # The tag keeps its own commit only; 02-27 below it still expires with main's walk.
    assert expired_at(commits, tagged, Rules.model_validate(DOCS_RULES), "2022-02-27") == _noon("2022-03-22")


def test_the_oldest_commit_above_decides_even_when_clocks_run_backwards():
    # c2 (day 9) is older than its parent c1 (day 10): c0 is kept while c2 is newer than T - 7.
    commits = _chain(0, 10, 9)
    refs = [Ref("main", "branch", "c2")]
    rules = Rules(default_retention_days=7)
    assert expired_at(commits, refs, rules, "c0") == T0 + 16 * DAY
    assert expired_at(commits, refs, rules, "c1") == T0 + 16 * DAY
    assert expired_at(commits, refs, rules, "c2") is None


def test_fractional_days_count_to_the_second():
    commits = _chain(0, 10)
    assert (
        expired_at(commits, [Ref("main", "branch", "c1")], Rules(default_retention_days=0.5), "c0") == T0 + 10.5 * DAY
    )


def test_the_most_lenient_walk_decides():
    # c0 is under main's head (day 10, 7 days) and dev's head (day 5, 30 days).
    commits = _chain(0, 10) + _chain(5, prefix="d", root=("c0",))
    refs = [Ref("main", "branch", "c1"), Ref("dev", "branch", "d0")]
    rules = Rules(
        branches=(BranchRule(branch_id="main", retention_days=7), BranchRule(branch_id="dev", retention_days=30))
    )
    assert expired_at(commits, refs, rules, "c0") == T0 + 35 * DAY
    # A branch with no rule and no default keeps its whole history: c0 never expires.
    unruled = [Ref("main", "branch", "c1"), Ref("feature", "branch", "d0")]
    assert expired_at(commits, unruled, rules, "c0") is None
    assert expired_at(commits, unruled, rules, "c1") is None


def test_a_pattern_rule_bounds_the_walk_of_a_matching_branch():
    commits = _chain(0, 10)
    rules = Rules(default_retention_days=100, branches=(BranchRule(pattern="feature/*", retention_days=2),))
    assert expired_at(commits, [Ref("feature/x", "branch", "c1")], rules, "c0") == T0 + 12 * DAY
    assert expired_at(commits, [Ref("hotfix", "branch", "c1")], rules, "c0") == T0 + 110 * DAY


def test_a_dangling_commit_expires_by_the_default_as_if_its_child_were_made_with_it():
    # c1's branch was deleted; main's head c2 (day 2) is c0's other child.
    commits = _chain(0, 1) + [Commit("main-head", ("c0",), T0 + 2 * DAY)]
    refs = [Ref("main", "branch", "main-head")]
    rules = Rules(default_retention_days=7)
    assert expired_at(commits, refs, rules, "c1") == T0 + 8 * DAY
    assert expired_at(commits, refs, rules, "c0") == T0 + 9 * DAY  # main's walk outlasts the dangling one
    # The dangling walk decides when it is the more lenient one.
    short = Rules(default_retention_days=7, branches=(BranchRule(branch_id="main", retention_days=1),))
    assert expired_at(commits, refs, short, "c0") == T0 + 8 * DAY
    # Without a default, a dangling commit keeps its whole history.
    assert expired_at(commits, refs, Rules(branches=(BranchRule(branch_id="main", retention_days=1),)), "c0") is None


def test_tag_retention_days_walk_below_the_tag():
    # v1 tags c1 (day 1); main's head is c2 (day 50), c1's child. Tags keep 20 days of history.
    commits = _chain(0, 1, 50)
    refs = [Ref("main", "branch", "c2"), Ref("v1", "tag", "c1")]
    rules = Rules(default_retention_days=1, tags=TagRule(retention_days=20))
    assert expired_at(commits, refs, rules, "c1") is None  # the tagged commit itself
    # c0 is kept by the tag's walk while c1 is newer than T - 20, by main's while c1 and c2 are newer than T - 1.
    assert expired_at(commits, refs, rules, "c0") == T0 + 21 * DAY
    assert (
        expired_at(commits, refs, Rules(default_retention_days=1, tags=TagRule(retention_days=60)), "c0")
        == T0 + 61 * DAY
    )
    # Without retention days a tag keeps only its own commit: its walk bounds nothing below.
    assert expired_at(commits, refs, Rules(default_retention_days=1), "c0") == T0 + 2 * DAY


def test_commits_before_1970_expire_like_any_other():
    # The epoch is no special instant: c0 (1969-01-01) expires a day after c1, its child on main.
    # v1 on c1 keeps only c1 (no tag retention days), so main's walk alone bounds c0.
    base = dt.datetime(1969, 1, 1, tzinfo=UTC)
    commits = [Commit("c0", (), base), Commit("c1", ("c0",), base + DAY), Commit("c2", ("c1",), base + 2 * DAY)]
    refs = [Ref("main", "branch", "c2"), Ref("v1", "tag", "c1")]
    assert expired_at(commits, refs, Rules(default_retention_days=1), "c0") == base + 2 * DAY


def test_an_unknown_commit_is_refused_not_kept_for_ever():
    with pytest.raises(ValueError) as refused:
        expired_at(_chain(0), [Ref("main", "branch", "c0")], Rules(default_retention_days=1), "ghost")
    assert str(refused.value) == "unknown commit 'ghost'"


@pytest.mark.parametrize(
    "rules, name, kind, expected",
    [
        (None, "main", "branch", "no rules: every commit is retained"),
        (Rules.model_validate(DOCS_RULES), "main", "branch", "branch rule branch_id=main, 21 days"),
        (Rules.model_validate(DOCS_RULES), "dev", "branch", "branch rule branch_id=dev, 7 days"),
        (Rules.model_validate(DOCS_RULES), "feature/x", "branch", "default_retention_days=14"),
        (Rules(default_retention_days=0.25), "main", "branch", "default_retention_days=0.25"),
        (
            Rules(branches=(BranchRule(branch_id="main", retention_days=1),)),
            "dev",
            "branch",
            "no rule for branch dev and no default: its whole history is kept",
        ),
        (Rules.model_validate(DOCS_RULES), "dangling", "dangling", "default_retention_days=14"),
        (Rules(), "dangling", "dangling", "no rule for a dangling commit and no default: its whole history is kept"),
        (Rules(default_retention_days=3), "v1", "tag", "tags.retain: a tag keeps its own commit"),
        (Rules(tags=TagRule(retention_days=2.5)), "v1", "tag", "tags.retention_days=2.5"),
    ],
)
def test_the_rule_a_starting_point_was_judged_by(rules, name, kind, expected):
    assert rule_of(rules, name, kind) == expected


PATTERNS = Rules(
    default_retention_days=100,
    branches=(
        BranchRule(pattern="feature/*", retention_days=30),
        BranchRule(pattern="feature/x*", retention_days=2),
        BranchRule(branch_id="feature/exact", retention_days=12.5),
        BranchRule(pattern="*", retention_days=50),
    ),
)


@pytest.mark.parametrize(
    "name, expected, days",
    [
        ("feature/exact", "branch rule branch_id=feature/exact, 12.5 days", 12.5),  # exact beats every pattern
        ("feature/xyz", "branch rule pattern=feature/x*, 2 days", 2),  # the longest matching pattern
        ("feature/other", "branch rule pattern=feature/*, 30 days", 30),
        ("main", "branch rule pattern=*, 50 days", 50),
    ],
)
def test_the_rule_named_for_a_branch_is_the_one_its_threshold_came_from(name, expected, days):
    assert rule_of(PATTERNS, name, "branch") == expected
    # The threshold evaluate() used for this branch is the rule's: T minus those days.
    as_of = T0 + 1000 * DAY
    verdict = evaluate(_chain(0), [Ref(name, "branch", "c0")], PATTERNS, as_of)["c0"]
    assert verdict == Retention(True, name, as_of - days * DAY)


def test_patterns_match_case_sensitively_and_a_non_matching_one_is_not_named():
    rules = Rules(default_retention_days=9, branches=(BranchRule(pattern="feature/*", retention_days=1),))
    assert rule_of(rules, "Feature/x", "branch") == "default_retention_days=9"


def test_oldest_restorable_point_of_the_documentation_example():
    commits, refs = lake_graph(docs_example())
    tagged = [Ref("v0", "tag", "2022-02-27")] + refs  # a tag first: tags are not branches
    verdicts = evaluate(commits, tagged, Rules.model_validate(DOCS_RULES), end_of_day(DOCS_GC_DATE))
    # main keeps 03-28, 03-12, 03-09 (03-01 expired); dev keeps d:03-26, d:03-23.
    assert oldest_restorable(commits, tagged, verdicts) == {"main": _noon("2022-03-09"), "dev": _noon("2022-03-23")}


def test_oldest_restorable_stops_at_the_first_expired_commit():
    # At day 31 with 1 day, main keeps its head only; c0, below the expired c1, is kept by a tag.
    commits = _chain(0, 1, 30)
    refs = [Ref("main", "branch", "c2"), Ref("v1", "tag", "c0")]
    verdicts = evaluate(commits, refs, Rules(default_retention_days=1), T0 + 31 * DAY)
    assert verdicts["c0"].retained and not verdicts["c1"].retained
    assert oldest_restorable(commits, refs, verdicts) == {"main": T0 + 30 * DAY}


def test_oldest_restorable_is_the_deepest_commit_reached_not_the_earliest_clock():
    # Every commit retained; c1's clock (day 3) is earlier than its parent c0's (day 5).
    commits = _chain(5, 3, 10)
    refs = [Ref("main", "branch", "c2")]
    assert oldest_restorable(commits, refs, evaluate(commits, refs, None, T0)) == {"main": T0 + 5 * DAY}


def test_a_branch_whose_head_is_not_retained_cannot_be_restored():
    # Verdicts from a table's own expiry rules may leave a head unretained.
    commits = _chain(0, 1)
    refs = [Ref("main", "branch", "c1"), Ref("dev", "branch", "c0")]
    verdicts = {"c0": Retention(True, "dev", None), "c1": Retention(False, None, None)}
    assert oldest_restorable(commits, refs, verdicts) == {"dev": T0}


# Half days are exact in binary, so `T - days` and the instant expired_at names are exact.
half_days = st.integers(0, 120).map(lambda n: n / 2)


@st.composite
def exact_rule_sets(draw):
    branches = [
        BranchRule(branch_id=n, retention_days=draw(half_days))
        for n in draw(st.lists(st.sampled_from(["main", "dev"]), unique=True))
    ]
    branches += [
        BranchRule(pattern=p, retention_days=draw(half_days))
        for p in draw(st.lists(st.sampled_from(["feature/*", "*"]), unique=True))
    ]
    tags = TagRule(retain=draw(st.booleans()), retention_days=draw(st.none() | half_days))
    return Rules(default_retention_days=draw(st.none() | half_days), branches=tuple(branches), tags=tags)


@settings(max_examples=200)
@given(graph=commit_graphs(), rules=exact_rule_sets())
def test_expired_at_is_the_instant_the_brute_force_definition_lets_go(graph, rules):
    commits, refs = graph
    for commit in commits:
        when = expired_at(commits, refs, rules, commit.commit_id)
        if when is None:
            assert commit.commit_id in retained_brute_force(commits, refs, rules, T0 + 100_000 * DAY)
        else:
            assert commit.commit_id in retained_brute_force(commits, refs, rules, when - SECOND)
            assert commit.commit_id not in retained_brute_force(commits, refs, rules, when)
