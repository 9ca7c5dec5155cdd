"""Why one object is live, a candidate, or neither: the verdict `gc-assets explain` prints.

Pure: the caller gathers the facts from the partition's materialized assets; this
module only decides, in the order the mark applies its rules (docs/design.md §3).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from gc_assets.core.time import format_timestamp
from gc_assets.core.uris import under_prefix

SHOWN_COMMITS = 5  # the newest referencing commits an explanation names


@dataclass(frozen=True)
class Reference:
    """A commit that references the object, as retained_commits judged it."""

    commit_id: str
    created_at: dt.datetime
    retained: bool
    retained_by: Optional[str]
    threshold: Optional[dt.datetime]
    rule: Optional[str] = None  # the rule that retained it, named by retention.rule_of


@dataclass(frozen=True)
class Facts:
    """What the materialized assets of one partition say about one key."""

    key: Optional[str]  # None: the address lies outside the namespace
    live_source: Optional[str] = None  # committed / staged / metadata when live_files has it
    needed_by: Optional[str] = None  # another repository whose retained versions reference it
    in_inventory: bool = False
    last_modified: Optional[dt.datetime] = None
    size: Optional[int] = None
    candidate_reason: Optional[str] = None  # expired / untracked when orphan_candidates has it
    references: tuple[Reference, ...] = ()
    expired_at: Optional[dt.datetime] = None  # when the newest referencing commit expired
    protected_prefixes: tuple[str, ...] = ()
    nested_in: dict[str, str] = field(default_factory=dict)  # protected prefix -> the repository nested there
    protected_patterns: tuple[str, ...] = ()
    hold: Optional[str] = None  # the hold record that holds it
    min_object_age_hours: float = 24.0
    untracked_collectable: bool = True  # False: the format cannot see staged objects (lakeFS's storage namespace)


@dataclass(frozen=True)
class Explanation:
    address: str
    status: str
    reasons: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"address": self.address, "status": self.status, "reasons": self.reasons}


def _when(moment: Optional[dt.datetime]) -> str:
    return "(unknown)" if moment is None else format_timestamp(moment)


def _referenced_by(reference: Reference) -> str:
    kept = (
        f"retained by {reference.retained_by} ({reference.rule or 'its rule'}; "
        f"threshold {_when(reference.threshold) if reference.threshold else 'none: whole history'})"
        if reference.retained
        else "expired"
    )
    return f"commit {reference.commit_id} of {_when(reference.created_at)}: {kept}"


def explain(address: str, facts: Facts) -> Explanation:
    """The status of one address and the reasons for it, most decisive first."""
    if facts.key is None:
        return Explanation(address, "outside", ["the address lies outside the storage namespace: never collected"])
    references = sorted(facts.references, key=lambda r: r.created_at, reverse=True)
    if facts.candidate_reason is not None:
        if facts.candidate_reason == "expired" and references:
            newest = references[0]
            reasons = [
                f"expired: the newest commit that references it is {newest.commit_id} of {_when(newest.created_at)}, "
                f"expired since {_when(facts.expired_at)}",
                f"{len(references)} commit(s) reference it, none retained",
            ]
        elif facts.candidate_reason == "expired":
            reasons = ["expired: only expired commits reference it"]
        else:
            reasons = ["untracked: no commit references it"]
        reasons.append(f"last modified {_when(facts.last_modified)}, {facts.size} bytes")
        return Explanation(address, "candidate", reasons)
    if facts.live_source is not None:
        retained = [r for r in references if r.retained]
        reasons = [_referenced_by(r) for r in retained[:SHOWN_COMMITS]]
        if len(retained) > SHOWN_COMMITS:
            reasons.append(f"and {len(retained) - SHOWN_COMMITS} older retained commit(s)")
        if facts.live_source == "staged":
            reasons.insert(0, "staged: an uncommitted entry of a branch names it")
        elif facts.live_source == "metadata":
            reasons.insert(0, "format metadata the table still needs")
        elif facts.needed_by is not None and not retained:
            reasons.insert(0, f"repository {facts.needed_by} needs it: a retained version of it references the object")
        elif not retained:
            reasons.insert(0, "a retained commit references it")
        if facts.needed_by is not None and retained:
            reasons.append(f"repository {facts.needed_by} needs it too")
        return Explanation(address, "live", reasons)
    protected = [p for p in facts.protected_prefixes if under_prefix(facts.key, (p,))]
    if protected and protected[0] in facts.nested_in:
        owner = facts.nested_in[protected[0]]
        return Explanation(
            address,
            "protected",
            [f"inside repository {owner}'s namespace ({protected[0]}): repository {owner} collects its own objects"],
        )
    if protected:
        return Explanation(address, "protected", [f"under the protected prefix {protected[0]}"])
    patterns = [p for p in facts.protected_patterns if re.search(p, facts.key)]
    if patterns:
        return Explanation(address, "protected", [f"matches the protected pattern {patterns[0]}"])
    if facts.hold is not None:
        return Explanation(address, "held", [f"held by {facts.hold} (a restore): `gc-assets release` lifts it"])
    if facts.in_inventory and not references and not facts.untracked_collectable:
        return Explanation(
            address,
            "protected",
            [
                "untracked: no commit references it, and it may be staged (uncommitted), which only lakeFS itself "
                "knows: never collected from the storage namespace alone"
            ],
        )
    if facts.in_inventory:
        kind = "expired" if references else "untracked"
        return Explanation(
            address,
            "too_young",
            [
                f"{kind}, but last modified {_when(facts.last_modified)}: newer than the candidate cutoff "
                f"(min_object_age {facts.min_object_age_hours:g} h, and the format's window for in-flight "
                "writers when untracked)"
            ],
        )
    return Explanation(address, "unknown", ["neither the inventory nor the live set of this partition has it"])
