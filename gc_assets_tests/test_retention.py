"""Retention rules (docs/design.md §3): the lakeFS documentation example, edge cases, and a
property test against the brute-force oracle on random commit graphs."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gc_assets.core.config import BranchRule, Rules, TagRule
from gc_assets.core.retention import Commit, GraphError, Ref, evaluate
from gc_assets.core.time import end_of_day
from gc_assets.demo.lakegen import DOCS_GC_DATE, DOCS_RULES, docs_example
from gc_assets_tests.oracles import lake_graph, retained_brute_force

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


def _retained(verdicts):
    return {commit_id for commit_id, v in verdicts.items() if v.retained}


def test_lakefs_documentation_example():
    commits, refs = lake_graph(docs_example())
    verdicts = evaluate(commits, refs, Rules.model_validate(DOCS_RULES), end_of_day(DOCS_GC_DATE))
    retained = _retained(verdicts)
    # dev: its head on 2022-03-24 was d:2022-03-23, kept with every newer dev commit.
    assert {"d:2022-03-23", "d:2022-03-26"} <= retained
    assert not {"d:2022-03-02", "d:2022-03-13", "d:2022-03-14", "d:2022-03-20"} & retained
    # main: its head on 2022-03-10 was 2022-03-09, kept with every newer main commit.
    assert {"2022-03-09", "2022-03-12", "2022-03-28"} <= retained
    assert not {"2022-02-27", "2022-03-01"} & retained
    assert retained == {"d:2022-03-23", "d:2022-03-26", "2022-03-09", "2022-03-12", "2022-03-28"}
    assert verdicts["2022-03-09"].retained_by == "main"
    assert verdicts["d:2022-03-23"].retained_by == "dev"
    assert verdicts["2022-03-09"].threshold == dt.datetime(2022, 3, 11, tzinfo=UTC)


def _chain(*days: float) -> list[Commit]:
    commits, parent = [], ()
    for index, day in enumerate(days):
        commits.append(Commit(f"c{index}", parent, T0 + dt.timedelta(days=day)))
        parent = (f"c{index}",)
    return commits


def test_no_rules_keeps_every_commit_even_dangling_ones():
    commits = _chain(0, 1, 2) + [Commit("orphan", (), T0)]
    verdicts = evaluate(commits, [Ref("main", "branch", "c2")], None, T0 + dt.timedelta(days=400))
    assert _retained(verdicts) == {"c0", "c1", "c2", "orphan"}
    assert all(v.threshold is None for v in verdicts.values())


def test_state_at_cutoff_keeps_the_first_commit_at_or_older_than_the_threshold():
    commits = _chain(0, 1, 2, 10)
    rules = Rules(default_retention_days=5)
    verdicts = evaluate(commits, [Ref("main", "branch", "c3")], rules, T0 + dt.timedelta(days=12))
    assert _retained(verdicts) == {"c3", "c2"}  # threshold day 7: head at that time was c2


def test_tags_keep_their_own_commit_unless_told_otherwise():
    commits = _chain(0, 1, 2, 30)
    refs = [Ref("main", "branch", "c3"), Ref("v1", "tag", "c1")]
    as_of = T0 + dt.timedelta(days=31)
    # main's threshold is day 30 (its head's own time): only the head; the tag keeps c1.
    assert _retained(evaluate(commits, refs, Rules(default_retention_days=1), as_of)) == {"c3", "c1"}
    no_tags = Rules(default_retention_days=1, tags=TagRule(retain=False))
    assert _retained(evaluate(commits, refs, no_tags, as_of)) == {"c3"}
    tag_history = Rules(default_retention_days=1, tags=TagRule(retention_days=100))
    assert _retained(evaluate(commits, refs, tag_history, as_of)) == {"c3", "c1", "c0"}


def test_exact_branch_rule_beats_patterns_and_longest_pattern_wins():
    commits = _chain(0, 5, 10, 20)
    as_of = T0 + dt.timedelta(days=21)
    rules = Rules(
        default_retention_days=100,
        branches=(
            BranchRule(pattern="feature/*", retention_days=30),
            BranchRule(pattern="feature/x*", retention_days=2),
            BranchRule(branch_id="feature/exact", retention_days=12),
        ),
    )
    assert _retained(evaluate(commits, [Ref("feature/xyz", "branch", "c3")], rules, as_of)) == {"c3", "c2"}
    assert _retained(evaluate(commits, [Ref("feature/exact", "branch", "c3")], rules, as_of)) == {"c3", "c2", "c1"}
    assert _retained(evaluate(commits, [Ref("feature/other", "branch", "c3")], rules, as_of)) == {
        "c3",
        "c2",
        "c1",
        "c0",
    }
    assert _retained(evaluate(commits, [Ref("main", "branch", "c3")], rules, as_of)) == {"c3", "c2", "c1", "c0"}


def test_branch_without_rule_and_without_default_keeps_whole_history():
    commits = _chain(0, 1, 2)
    rules = Rules(branches=(BranchRule(branch_id="main", retention_days=0),))
    verdicts = evaluate(commits, [Ref("dev", "branch", "c2")], rules, T0 + dt.timedelta(days=100))
    assert _retained(verdicts) == {"c0", "c1", "c2"}


def test_dangling_commit_behaves_as_if_it_had_a_child_at_its_own_time():
    # c1's branch was deleted: c1 is dangling; with 7 days default it expires after a week.
    commits = _chain(0, 1) + [Commit("main-head", ("c0",), T0 + dt.timedelta(days=2))]
    refs = [Ref("main", "branch", "main-head")]
    rules = Rules(default_retention_days=7)
    assert "c1" in _retained(evaluate(commits, refs, rules, T0 + dt.timedelta(days=5)))
    assert "c1" not in _retained(evaluate(commits, refs, rules, T0 + dt.timedelta(days=9)))
    tagged = refs + [Ref("keep", "tag", "c1")]
    assert "c1" in _retained(evaluate(commits, tagged, rules, T0 + dt.timedelta(days=9)))


def test_most_lenient_threshold_wins():
    commits = _chain(0, 1, 2, 3)
    refs = [Ref("main", "branch", "c3"), Ref("dev", "branch", "c3")]
    rules = Rules(
        branches=(BranchRule(branch_id="main", retention_days=1), BranchRule(branch_id="dev", retention_days=2.5))
    )
    verdicts = evaluate(commits, refs, rules, T0 + dt.timedelta(days=4))
    assert _retained(verdicts) == {"c3", "c2", "c1"}
    assert verdicts["c1"].retained_by == "dev"


@pytest.mark.parametrize(
    "commits, refs, message",
    [
        ([Commit("a", (), T0), Commit("a", (), T0)], [], "duplicate commit_id 'a'"),
        ([Commit("a", ("ghost",), T0)], [], "unknown parent 'ghost'"),
        ([Commit("a", (), T0)], [Ref("main", "branch", "ghost")], "refs row 0 (main): unknown commit 'ghost'"),
        ([Commit("a", (), dt.datetime(2024, 1, 1))], [], "no time zone"),
        ([Commit("a", (), T0)], [Ref("main", "note", "a")], "kind must be branch or tag"),
    ],
)
def test_malformed_graphs_are_refused_with_the_row(commits, refs, message):
    with pytest.raises(GraphError, match=message.replace("(", r"\(").replace(")", r"\)")):
        evaluate(commits, refs, Rules(default_retention_days=1), T0)


def test_a_million_commit_chain_is_evaluated_without_recursion():
    n = 1_000_000
    commits = [Commit(f"c{i}", (f"c{i - 1}",) if i else (), T0 + dt.timedelta(seconds=i)) for i in range(n)]
    refs = [Ref("main", "branch", f"c{n - 1}"), Ref("old", "tag", "c10")]
    as_of = T0 + dt.timedelta(seconds=n)
    verdicts = evaluate(commits, refs, Rules(default_retention_days=1), as_of)
    kept = _retained(verdicts)
    # 86,399 commits newer than the threshold, the head at the cutoff, and the tag.
    assert len(kept) == 86_400 + 1
    assert "c10" in kept and f"c{n - 86_400}" in kept and f"c{n - 86_401}" not in kept
    everything = evaluate(commits, refs, None, as_of)
    assert sum(v.retained for v in everything.values()) == n


@st.composite
def commit_graphs(draw):
    """Random graphs: roots, branches, merges, non-monotonic clocks, tags, deleted branches."""
    n = draw(st.integers(1, 40))
    commits: list[Commit] = []
    for i in range(n):
        parents: tuple[str, ...] = ()
        if i and draw(st.floats(0, 1)) > 0.1:
            first = draw(st.integers(0, i - 1))
            parents = (f"c{first}",)
            if i > 1 and draw(st.booleans()) and draw(st.booleans()):
                second = draw(st.integers(0, i - 1))
                if second != first:
                    parents += (f"c{second}",)
        created = T0 + dt.timedelta(hours=draw(st.integers(0, 24 * 60)))
        commits.append(Commit(f"c{i}", parents, created))
    names = ["main", "dev", "feature/a", "feature/ab", "release/1"]
    refs = [
        Ref(name, "branch", f"c{draw(st.integers(0, n - 1))}")
        for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=4))
    ]
    refs += [Ref(f"v{k}", "tag", f"c{draw(st.integers(0, n - 1))}") for k in range(draw(st.integers(0, 3)))]
    return commits, refs


retention_days = st.one_of(st.none(), st.floats(0, 60, allow_nan=False))


@st.composite
def rule_sets(draw):
    if draw(st.integers(0, 5)) == 0:
        return None
    branches = []
    for name in draw(st.lists(st.sampled_from(["main", "dev", "release/1"]), unique=True, max_size=3)):
        branches.append(BranchRule(branch_id=name, retention_days=draw(st.floats(0, 60))))
    for pattern in draw(st.lists(st.sampled_from(["feature/*", "feature/a*", "*"]), unique=True, max_size=2)):
        branches.append(BranchRule(pattern=pattern, retention_days=draw(st.floats(0, 60))))
    tags = TagRule(retain=draw(st.booleans()), retention_days=draw(retention_days))
    return Rules(default_retention_days=draw(retention_days), branches=tuple(branches), tags=tags)


@given(graph=commit_graphs(), rules=rule_sets(), as_of_hours=st.integers(0, 24 * 90))
def test_retained_set_equals_brute_force_definition(graph, rules, as_of_hours):
    commits, refs = graph
    as_of = T0 + dt.timedelta(hours=as_of_hours)
    verdicts = evaluate(commits, refs, rules, as_of)
    oracle = retained_brute_force(commits, refs, rules, as_of)
    assert _retained(verdicts) == set(oracle)
    for commit_id, threshold in oracle.items():
        got = verdicts[commit_id].threshold
        assert (got.timestamp() if got is not None else -math.inf) == pytest.approx(threshold)
    heads = {r.commit_id for r in refs if r.kind == "branch" or rules is None or rules.tags.retain}
    assert heads <= _retained(verdicts)
