"""Brute-force oracles: the docs/design.md §3 definitions evaluated literally, with no cleverness."""

from __future__ import annotations

import datetime as dt
import fnmatch
import math
import posixpath
import unicodedata
from typing import Optional
from urllib.parse import unquote

from gc_assets.core.config import Rules
from gc_assets.core.retention import Commit, Ref
from gc_assets.demo.lakegen import Lake


def _days_for_branch(rules: Rules, branch: str) -> Optional[float]:
    exact = [r.retention_days for r in rules.branches if r.branch_id == branch]
    if exact:
        return exact[0]
    patterns = sorted(
        (r for r in rules.branches if r.pattern and fnmatch.fnmatchcase(branch, r.pattern)),
        key=lambda r: -len(r.pattern or ""),
    )
    return patterns[0].retention_days if patterns else rules.default_retention_days


def retained_brute_force(
    commits: list[Commit], refs: list[Ref], rules: Optional[Rules], as_of: dt.datetime
) -> dict[str, float]:
    """commit_id -> most lenient threshold (epoch seconds; -inf = whole history) of retained commits.

    Each starting point walks its whole first-parent chain; a commit is retained by a
    walk when every child on the way down from the start is newer than the threshold.
    """
    if rules is None:
        return {c.commit_id: -math.inf for c in commits}
    by_id = {c.commit_id: c for c in commits}
    t = as_of.timestamp()

    def threshold(days: Optional[float]) -> float:
        return -math.inf if days is None else t - days * 86400

    # (start commit, threshold, created_at of the (possibly virtual) child above the start)
    starts: list[tuple[str, float, Optional[float]]] = []
    for ref in refs:
        if ref.kind == "branch":
            starts.append((ref.commit_id, threshold(_days_for_branch(rules, ref.name)), None))
        elif rules.tags.retain:
            if rules.tags.retention_days is not None:
                starts.append((ref.commit_id, threshold(rules.tags.retention_days), None))
            else:
                starts.append((ref.commit_id, math.inf, None))  # its own commit only
    first_parents = {c.parents[0] for c in commits if c.parents}
    heads = {r.commit_id for r in refs if r.kind == "branch"}
    for c in commits:
        if c.commit_id not in first_parents and c.commit_id not in heads:
            starts.append((c.commit_id, threshold(rules.default_retention_days), c.created_at.timestamp()))

    best: dict[str, float] = {}
    for start, limit, virtual_child in starts:
        chain = [start]
        while by_id[chain[-1]].parents:
            chain.append(by_id[chain[-1]].parents[0])
        for depth, commit_id in enumerate(chain):
            children = [by_id[c].created_at.timestamp() for c in chain[:depth]]
            if virtual_child is not None:
                children.append(virtual_child)
            if all(child > limit for child in children):
                recorded = limit if limit != math.inf else by_id[start].created_at.timestamp()
                best[commit_id] = min(best.get(commit_id, math.inf), recorded)
    return best


def lake_graph(lake: Lake) -> tuple[list[Commit], list[Ref]]:
    commits = [Commit(c.commit_id, c.parents, c.created_at) for c in lake.commits.values()]
    refs = [Ref(n, "branch", c) for n, c in lake.branches.items()] + [Ref(n, "tag", c) for n, c in lake.tags.items()]
    return commits, refs


def expected_candidates(
    lake: Lake,
    namespace: str,
    rules: Optional[Rules],
    as_of: dt.datetime,
    cutoff: dt.datetime,
    protected: tuple[str, ...] = ("_lakefs/", "_gc/", "_gc_trash/"),
    untracked: bool = True,
) -> set[str]:
    """Objects in storage that no retained commit or staged entry references, old enough, unprotected;
    with `untracked` False only those some commit references (lakeFS's storage namespace alone)."""
    commits, refs = lake_graph(lake)
    retained = retained_brute_force(commits, refs, rules, as_of)
    addresses = [a for commit_id in retained for a, _ in lake.commits[commit_id].entries.values()]
    addresses += [address for _, _, address, _ in lake.staged]
    live: set[str] = set()
    for address in addresses:
        key = oracle_key(address, namespace)
        if key is not None:
            live.update(oracle_spellings(key))
    committed = {oracle_key(a, namespace) for c in lake.commits.values() for a, _ in c.entries.values()}
    return {
        key
        for key, (_, mtime) in lake.objects.items()
        if key not in live
        and mtime < cutoff
        and not any(key == p.rstrip("/") or key.startswith(p) for p in protected)
        and (untracked or key in committed)
    }


def oracle_key(address: str, namespace: str) -> Optional[str]:
    """The key an address names inside `namespace` (file:///path, s3://, gs:// or abfss://), literally:
    relative addresses are keys; absolute ones must start with a spelling of the namespace."""
    head, sep, rest = address.partition(":")
    if not sep or len(head) < 2 or not head[0].isalpha() or not all(c.isalnum() or c in "+.-" for c in head):
        if address.startswith("/"):
            return oracle_key("file://" + address, namespace)
        return address
    scheme = head.lower()
    ns_scheme, ns_rest = namespace.split("://", 1)
    if scheme in ("s3", "s3a", "s3n") and ns_scheme == "s3":
        body = rest[2:] if rest.startswith("//") else None
    elif scheme == "file" and ns_scheme == "file":
        body = (
            rest[len("//localhost") :]
            if rest.startswith("//localhost/")
            else rest[2:]
            if rest.startswith("///")
            else rest
        )
        body = body[1:] if body.startswith("//") else body
        ns_rest = ns_rest.lstrip("/")
        body = body.lstrip("/")
    elif scheme == ns_scheme and scheme in ("gs", "abfss") and rest.startswith("//"):
        body = rest[2:]  # one spelling per namespace: the canonical one the table was written with
    else:
        return None
    if body is None or not body.startswith(ns_rest + "/") or len(body) == len(ns_rest) + 1:
        return None
    return body[len(ns_rest) + 1 :]


def oracle_spellings(key: str) -> set[str]:
    """Every name storage may give the object a live key names: as written, percent-decoded,
    NFC and NFD, each with '.'/'..' resolved unless that leaves the namespace."""
    names = {key, unquote(key)}
    names |= {unicodedata.normalize(form, n) for n in list(names) for form in ("NFC", "NFD")}
    resolved = {posixpath.normpath(n) for n in names if n}
    return names | {r for r in resolved if r not in (".", "..") and not r.startswith(("../", "/"))}
