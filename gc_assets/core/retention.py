"""Which commits are retained as of a time T (docs/design.md §3), as pure Python.

The rules are lakeFS's: from every starting point (branch head, tag, dangling
commit) walk first parents; the start is retained, and a parent is retained while
its child is newer than the starting point's threshold, so every commit newer than
the threshold is kept plus the one that was the head at the threshold. A commit
reached from several starting points keeps the most lenient (oldest) threshold.

Starting points are walked from the most lenient threshold to the strictest, so a
walk stops at the first commit an earlier walk already claimed: each commit is
visited once, and a graph of millions of commits costs one pass and no recursion.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from gc_assets.core.config import Rules

WHOLE_HISTORY = -math.inf
DANGLING = "dangling"
_KIND_ORDER = {"branch": 0, "tag": 1, DANGLING: 2}


class GraphError(ValueError):
    """The commit graph is malformed; the message names the dataset and the row."""


@dataclass(frozen=True)
class Commit:
    commit_id: str
    parents: tuple[str, ...]
    created_at: dt.datetime


@dataclass(frozen=True)
class Ref:
    name: str
    kind: str  # "branch" or "tag"
    commit_id: str


@dataclass(frozen=True)
class Retention:
    retained: bool
    retained_by: Optional[str]
    threshold: Optional[dt.datetime]  # None: the whole first-parent history is kept


@dataclass(frozen=True)
class StartingPoint:
    label: str  # the ref name, or "dangling"
    kind: str
    commit_id: str
    threshold: float  # epoch seconds; WHOLE_HISTORY keeps everything below
    start_retained: bool


def validate_graph(commits: Sequence[Commit], refs: Sequence[Ref]) -> None:
    """Refuse graphs the rules cannot be evaluated on, naming the offending row."""
    known: set[str] = set()
    for row, commit in enumerate(commits):
        if not commit.commit_id:
            raise GraphError(f"commits row {row}: empty commit_id")
        if commit.commit_id in known:
            raise GraphError(f"commits row {row}: duplicate commit_id {commit.commit_id!r}")
        if commit.created_at.tzinfo is None or commit.created_at.utcoffset() is None:
            raise GraphError(f"commits row {row} ({commit.commit_id}): created_at has no time zone")
        known.add(commit.commit_id)
    for row, commit in enumerate(commits):
        for parent in commit.parents:
            if parent not in known:
                raise GraphError(f"commits row {row} ({commit.commit_id}): unknown parent {parent!r}")
    for row, ref in enumerate(refs):
        if ref.kind not in ("branch", "tag"):
            raise GraphError(f"refs row {row} ({ref.name}): kind must be branch or tag, not {ref.kind!r}")
        if ref.commit_id not in known:
            raise GraphError(f"refs row {row} ({ref.name}): unknown commit {ref.commit_id!r}")


def branch_retention_days(rules: Rules, branch: str) -> Optional[float]:
    """Exact names win over patterns, then the longest matching pattern, then the default."""
    for rule in rules.branches:
        if rule.branch_id == branch:
            return rule.retention_days
    matching = [r for r in rules.branches if r.pattern is not None and fnmatch.fnmatchcase(branch, r.pattern)]
    if matching:
        return max(matching, key=lambda r: len(r.pattern or "")).retention_days
    return rules.default_retention_days


def _threshold(as_of: float, days: Optional[float]) -> float:
    return WHOLE_HISTORY if days is None else as_of - days * 86400.0


def starting_points(
    commits: Sequence[Commit], refs: Sequence[Ref], rules: Optional[Rules], as_of: dt.datetime
) -> list[StartingPoint]:
    """Branch heads, tags and dangling commits with their thresholds."""
    t = as_of.timestamp()
    created = {c.commit_id: c.created_at.timestamp() for c in commits}
    points: list[StartingPoint] = []
    branch_heads: set[str] = set()
    for ref in refs:
        if ref.kind == "branch":
            branch_heads.add(ref.commit_id)
            days = None if rules is None else branch_retention_days(rules, ref.name)
            points.append(StartingPoint(ref.name, "branch", ref.commit_id, _threshold(t, days), True))
        elif rules is None or rules.tags.retain:
            if rules is not None and rules.tags.retention_days is not None:
                threshold = _threshold(t, rules.tags.retention_days)
            elif rules is None:
                threshold = WHOLE_HISTORY
            else:
                threshold = created[ref.commit_id]  # keeps its own commit, not its parent
            points.append(StartingPoint(ref.name, "tag", ref.commit_id, threshold, True))
    first_parents = {c.parents[0] for c in commits if c.parents}
    default_days = None if rules is None else rules.default_retention_days
    dangling_threshold = _threshold(t, default_days)
    for commit in commits:
        if commit.commit_id not in first_parents and commit.commit_id not in branch_heads:
            # As if it had a child created at its own created_at: kept while newer than the threshold.
            start_retained = created[commit.commit_id] > dangling_threshold
            points.append(StartingPoint(DANGLING, DANGLING, commit.commit_id, dangling_threshold, start_retained))
    return points


def evaluate(
    commits: Sequence[Commit], refs: Sequence[Ref], rules: Optional[Rules], as_of: dt.datetime
) -> dict[str, Retention]:
    """Retention of every commit as of `as_of`. No rules at all keeps every commit."""
    validate_graph(commits, refs)
    created = {c.commit_id: c.created_at.timestamp() for c in commits}
    first_parent = {c.commit_id: c.parents[0] for c in commits if c.parents}
    points = [p for p in starting_points(commits, refs, rules, as_of) if p.start_retained]
    points.sort(key=lambda p: (p.threshold, _KIND_ORDER[p.kind], p.label, p.commit_id))

    claimed: dict[str, StartingPoint] = {}
    for point in points:
        commit_id: Optional[str] = point.commit_id
        while commit_id is not None and commit_id not in claimed:
            claimed[commit_id] = point
            commit_id = first_parent.get(commit_id) if created[commit_id] > point.threshold else None

    result: dict[str, Retention] = {}
    for commit in commits:
        point = claimed.get(commit.commit_id)
        if point is None:
            result[commit.commit_id] = Retention(False, None, None)
        else:
            result[commit.commit_id] = Retention(True, point.label, _as_datetime(point.threshold))
    return result


def _as_datetime(epoch: float) -> Optional[dt.datetime]:
    if epoch == WHOLE_HISTORY:
        return None
    return dt.datetime.fromtimestamp(epoch, tz=dt.timezone.utc)


def ref_heads(refs: Iterable[Ref]) -> set[str]:
    return {ref.commit_id for ref in refs}


def rule_of(rules: Optional[Rules], name: str, kind: str) -> str:
    """The rule a starting point was judged by, as a person would name it (docs/design.md §3)."""
    if rules is None:
        return "no rules: every commit is retained"
    if kind == "branch":
        exact = [r for r in rules.branches if r.branch_id == name]
        matching = [r for r in rules.branches if r.pattern is not None and fnmatch.fnmatchcase(name, r.pattern)]
        if exact:
            return f"branch rule branch_id={name}, {exact[0].retention_days:g} days"
        if matching:
            rule = max(matching, key=lambda r: len(r.pattern or ""))
            return f"branch rule pattern={rule.pattern}, {rule.retention_days:g} days"
        return _default_rule(rules, f"branch {name}")
    if kind == "tag":
        if rules.tags.retention_days is not None:
            return f"tags.retention_days={rules.tags.retention_days:g}"
        return "tags.retain: a tag keeps its own commit"
    return _default_rule(rules, "a dangling commit")


def _default_rule(rules: Rules, whom: str) -> str:
    if rules.default_retention_days is None:
        return f"no rule for {whom} and no default: its whole history is kept"
    return f"default_retention_days={rules.default_retention_days:g}"


def expired_at(
    commits: Sequence[Commit], refs: Sequence[Ref], rules: Optional[Rules], commit_id: str
) -> Optional[dt.datetime]:
    """The instant from which `commit_id` is no longer retained; None when it never expires.

    A walk retains a commit while every commit above it on the walk (and a dangling
    start's virtual child) is newer than `T - days`, i.e. until the oldest of them plus
    `days`; the commit expires when the last walk that reaches it lets it go. Retention
    only shrinks as T grows, so this is one instant.
    """
    created = {c.commit_id: c.created_at.timestamp() for c in commits}
    if commit_id not in created:
        raise ValueError(f"unknown commit {commit_id!r}")
    if rules is None or (rules.tags.retain and any(r.kind == "tag" and r.commit_id == commit_id for r in refs)):
        return None  # kept by its tag for ever
    children: dict[str, list[str]] = {}
    for c in commits:
        if c.parents:
            children.setdefault(c.parents[0], []).append(c.commit_id)
    as_of_zero = dt.datetime.fromtimestamp(0, tz=dt.timezone.utc)
    days_of = {
        (p.kind, p.label, p.commit_id): (None if p.threshold == WHOLE_HISTORY else -p.threshold / 86400.0)
        for p in starting_points(commits, refs, rules, as_of_zero)
    }
    starts: dict[str, list[tuple[str, Optional[float]]]] = {}
    for (kind, _label, start), days in days_of.items():
        if kind == "tag" and rules.tags.retention_days is None:
            continue  # keeps only its own commit, for ever
        starts.setdefault(start, []).append((kind, days))
    latest = -math.inf
    # Walk down the first-parent children of commit_id (a tree), carrying the oldest
    # commit above it; every starting point met bounds how long it is kept.
    stack: list[tuple[str, float]] = [(commit_id, math.inf)]
    while stack:
        here, oldest_above = stack.pop()
        for kind, days in starts.get(here, []):
            if days is None:
                return None
            above = min(oldest_above, created[here]) if kind == DANGLING else oldest_above
            if above == math.inf:
                return None  # a branch head or tag commit itself: kept while it is one
            latest = max(latest, above + days * 86400.0)
        for child in children.get(here, []):
            stack.append((child, min(oldest_above, created[child])))
    # Every path down first-parent children ends at a branch head or a dangling commit, both
    # starting points that bound (or end) the wait: `latest` is always set here.
    return dt.datetime.fromtimestamp(latest, tz=dt.timezone.utc)


def oldest_restorable(
    commits: Sequence[Commit], refs: Sequence[Ref], verdicts: dict[str, Retention]
) -> dict[str, dt.datetime]:
    """Per branch, the creation time of the oldest commit still retained on its first-parent
    history: how far back the branch can be restored."""
    by_id = {c.commit_id: c for c in commits}
    oldest: dict[str, dt.datetime] = {}
    for ref in refs:
        if ref.kind != "branch":
            continue
        commit_id: Optional[str] = ref.commit_id
        while commit_id is not None and verdicts[commit_id].retained:
            oldest[ref.name] = by_id[commit_id].created_at
            parents = by_id[commit_id].parents
            commit_id = parents[0] if parents else None
    return oldest
