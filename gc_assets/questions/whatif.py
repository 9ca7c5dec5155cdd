"""What-if retention: the same commit graph and inventory judged under other rules.

Computes what a mark would decide under each rules file and stops there: nothing is
written to the state directory or the namespace, no receipts exist for a plan.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core import retention
from gc_assets.core.config import Rules
from gc_assets.core.spark import local_frame
from gc_assets.mark.candidates import bounds, decide
from gc_assets.mark.live import deduplicated, live_keys
from gc_assets.mark.partition import GcPartition, Mark
from gc_assets.mark.shared import needed_by_others
from gc_assets.sources.base import retained_frame
from gc_assets.stores import store_for
from gc_assets.sweep.holds import held_frame_of


@dataclass(frozen=True)
class RulesChoice:
    label: str  # the rules file as given, or the config file for the repository's own rules
    rules: Optional[Rules]
    configured: bool = False  # the repository's own rules, judged exactly as the mark does


@dataclass(frozen=True)
class Plan:
    rules: str
    retained_commits: int
    expired_commits: int
    live_objects: int
    orphan_candidates: int
    reclaimable_bytes: int
    oldest_restorable: dict[str, dt.datetime] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The entry of `plan --json` (docs/design.md §9), in its order."""
        return {
            "rules": self.rules,
            "retained_commits": self.retained_commits,
            "expired_commits": self.expired_commits,
            "live_objects": self.live_objects,
            "orphan_candidates": self.orphan_candidates,
            "reclaimable_bytes": self.reclaimable_bytes,
        }


def plan_retention(
    spark: SparkSession,
    partition: GcPartition,
    inventory: DataFrame,
    choices: Sequence[RulesChoice],
    now: dt.datetime,
    mark: Optional[Mark] = None,
    started: Callable[[str], None] = lambda label: None,
    planned: Callable[["Plan"], None] = lambda plan: None,
) -> list[Plan]:
    """One Plan per rules choice, over one reading of the graph and one inventory; `started`
    and `planned` hear of each choice as it begins and ends (a long plan shows progress).

    Everything but the rules is held constant: with the partition's recorded as-of and
    `mark` (the stored mark's), the configured rules reproduce the run; without a mark,
    the plan is one marked `now`."""
    source, repo = partition.source, partition.repo
    commits, refs = source.commit_graph(spark)
    mark = mark or Mark("plan", now, source.source_time(spark))
    judged = bounds(spark, partition, mark)
    held = held_frame_of(spark, store_for(repo), inventory, now, repo.hold_days)
    heads = local_frame(spark, [(c,) for c in sorted(retention.ref_heads(refs))], "commit_id string")
    others = needed_by_others(spark, partition)  # other repositories' rules are theirs: the same in every plan
    plans = []
    for choice in choices:
        started(choice.label)
        if choice.configured:
            verdicts = source.evaluate_retention(spark, repo, commits, refs, partition.as_of)
        else:
            verdicts = retention.evaluate(commits, refs, choice.rules, partition.as_of)
        kept = sorted(c for c, v in verdicts.items() if v.retained)
        live = deduplicated(live_keys(spark, partition, retained_frame(spark, verdicts, kept), heads), others)
        candidates = decide(partition, judged, inventory, live, held)
        totals = candidates.agg(F.count("*").alias("n"), F.sum(F.coalesce("size", F.lit(0))).alias("bytes")).first()
        plans.append(
            Plan(
                choice.label,
                len(kept),
                len(verdicts) - len(kept),
                live.count(),
                int(totals["n"]),
                int(totals["bytes"] or 0),
                retention.oldest_restorable(commits, refs, verdicts),
            )
        )
        planned(plans[-1])
    return plans


def plan_markdown(plans: Sequence[Plan]) -> str:
    """One table row per rules file, then the oldest restorable point of each branch."""
    lines = [
        "| rules | retained commits | expired commits | live objects | candidates | bytes reclaimable |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| `{p.rules}` | {p.retained_commits} | {p.expired_commits} | {p.live_objects} "
        f"| {p.orphan_candidates} | {p.reclaimable_bytes} |"
        for p in plans
    ]
    branches = sorted({b for p in plans for b in p.oldest_restorable})
    if branches:
        lines += ["", "Oldest restorable point per branch:", ""]
        lines += ["| branch | " + " | ".join(f"`{p.rules}`" for p in plans) + " |", "|---|" + "---|" * len(plans)]
        for branch in branches:
            cells = [_when(p.oldest_restorable.get(branch)) for p in plans]
            lines.append(f"| {branch} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plan_text(plans: Sequence[Plan]) -> str:
    """A table per rules file, for a terminal."""
    blocks = []
    for p in plans:
        lines = [
            f"rules {p.rules}",
            f"  commits            {p.retained_commits} retained, {p.expired_commits} expired",
            f"  live objects       {p.live_objects}",
            f"  candidates         {p.orphan_candidates} objects, {p.reclaimable_bytes} bytes reclaimable",
            "  oldest restorable" + ("" if p.oldest_restorable else "  (no branch)"),
        ]
        lines += [f"    {branch:<16} {_when(moment)}" for branch, moment in sorted(p.oldest_restorable.items())]
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def _when(moment: Optional[dt.datetime]) -> str:
    return "-" if moment is None else moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
