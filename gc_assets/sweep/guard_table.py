"""Every safety guard once (GUARDS): the asset check it is, and how a sweep of a stored mark
judges it again on one partition's frames (with the verdicts of gc_assets.core.guards).

The asset checks the UI shows are built from GUARDS. A sweep launched on its own is not
stopped by an earlier run's failed check, which is why it judges them again on what the mark
stored (docs/design.md §1) before it touches storage.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Mapping, Optional

from pyspark.sql import DataFrame, SparkSession

from gc_assets.core import guards
from gc_assets.core.guards import Verdict
from gc_assets.mark.partition import (
    GcPartition,
    Mark,
    candidate_cutoff,
    untracked_cutoff,
)
from gc_assets.mark.shared import witnessed_by_others
from gc_assets.sweep.holds import held_frame


@dataclass
class Evidence:
    """What the guards of one partition judge: its assets' frames and, read only when a
    guard needs it, the mark the candidates were computed from."""

    spark: SparkSession
    partition: GcPartition
    frames: Mapping[str, DataFrame]
    load_mark: Callable[[], Mark]
    now: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))

    @cached_property
    def mark(self) -> Mark:
        return self.load_mark()

    def retained(self) -> DataFrame:
        return self.frames["retained_commits"].filter("retained").select("commit_id", "threshold")

    def heads(self) -> DataFrame:
        return self.frames["retained_commits"].filter("ref_head").select("commit_id")


@dataclass(frozen=True)
class Guard:
    name: str
    asset: str  # the asset whose check it is
    description: str
    judge: Optional[Callable[[Evidence], Verdict]]  # None: judged only after the receipts, by the set
    blocking: bool = True  # a failed check stops the rest of its run
    before_sweep: bool = True  # the sweep judges it again before acting
    is_check: bool = True  # shown as an asset check


def _live_objects_present(e: Evidence) -> Verdict:
    return guards.live_objects_present(
        e.frames["live_files"],
        e.frames["object_inventory"],
        lambda missing: e.partition.source.commits_referencing(e.spark, e.retained(), missing),
    )


def _candidates_not_live(e: Evidence) -> Verdict:
    entries = e.partition.source.live_entries(e.spark, e.retained(), e.heads())
    return guards.candidates_not_live(e.frames["orphan_candidates"], entries, e.partition.repo.storage_namespace)


def _candidates_older_than_min_age(e: Evidence) -> Verdict:
    format_guard = e.partition.source.untracked_min_age(e.spark, e.partition.repo)
    return guards.candidates_older_than_min_age(
        e.frames["orphan_candidates"],
        candidate_cutoff(e.partition, e.mark),
        untracked_cutoff(e.partition, e.mark, format_guard),
    )


def _independent_witness(e: Evidence) -> Verdict:
    witness = e.partition.source.witness_heads(e.spark, guards.head_commits(e.frames["retained_commits"]))
    for others in witnessed_by_others(e.spark, e.partition):
        witness = witness.unionByName(others)
    return guards.independent_witness(
        e.frames["orphan_candidates"], witness, e.frames["live_files"], e.partition.repo.storage_namespace
    )


def _candidates_inside_namespace(e: Evidence) -> Verdict:
    source = e.partition.source
    protected = e.partition.protected_prefixes(source.protected_prefixes)
    return guards.candidates_inside_namespace(e.frames["orphan_candidates"], protected, source.protected_patterns)


def _candidates_not_held(e: Evidence) -> Verdict:
    held = held_frame(e.spark, e.partition, e.frames["object_inventory"], e.now)
    return guards.candidates_not_held(e.frames["orphan_candidates"], held)


GUARDS: tuple[Guard, ...] = (
    Guard(
        "heads_and_tags_retained",
        "retained_commits",
        "Every branch head and every tagged commit is retained.",
        lambda e: guards.heads_and_tags_retained(e.frames["retained_commits"]),
    ),
    Guard(
        "live_objects_present",
        "object_inventory",
        "Every object a branch head, tag or staging area references is in storage (ERROR, blocks the "
        "sweep). Objects only older retained commits reference that are already gone mean history "
        "was truncated earlier: a WARN naming the commits, which does not block.",
        _live_objects_present,
    ),
    Guard(
        "candidates_not_live",
        "orphan_candidates",
        "No candidate is live: the live set is recomputed from the connector's raw entries and "
        "normalized in plain Python, independently of live_files.",
        _candidates_not_live,
    ),
    Guard(
        "candidates_older_than_min_age",
        "orphan_candidates",
        "Every candidate was last modified before min(mark time, as-of, source time) minus the minimum "
        "object age; an untracked one also before the format's window for in-flight writers.",
        _candidates_older_than_min_age,
    ),
    Guard(
        "independent_witness",
        "orphan_candidates",
        "The independent witness: what each ref head needs, read with the format's own reader "
        "(delta-rs, pyiceberg scan planning, the export's raw rows) and not through the connector, "
        "is live at a head and is no candidate; with the heads of every repository whose external "
        "references reach into this namespace.",
        _independent_witness,
    ),
    Guard(
        "candidates_inside_namespace",
        "orphan_candidates",
        "Every candidate is a plain key inside the namespace, outside every protected prefix and "
        "protected pattern of its format.",
        _candidates_inside_namespace,
    ),
    Guard(
        "blast_radius",
        "orphan_candidates",
        "Candidates are at most max_delete_fraction of the objects in the namespace.",
        lambda e: guards.blast_radius(
            e.frames["orphan_candidates"].count(), e.frames["object_inventory"].count(), e.partition.repo
        ),
    ),
    Guard(
        "candidates_not_held",
        "orphan_candidates",
        "No candidate is under a hold that a restore placed after the mark.",
        _candidates_not_held,
        is_check=False,  # the mark already leaves held objects out; only a later restore can add one
    ),
    Guard(
        "receipts_cover_candidates",
        "deletion_receipts",
        "Exactly one receipt per candidate, and none for anything else.",
        None,
        blocking=False,
        before_sweep=False,
    ),
    Guard(
        "live_objects_intact",
        "deletion_receipts",
        "After the sweep, every live object that was in storage is still there.",
        None,
        blocking=False,
        before_sweep=False,
    ),
)


def refusals(evidence: Evidence) -> list[Verdict]:
    """The guards a sweep must pass, judged again now; the ERRORs among them."""
    verdicts = [guard.judge(evidence) for guard in GUARDS if guard.before_sweep and guard.judge is not None]
    return [v for v in verdicts if not v.passed and v.severity == "ERROR"]


class SweepRefused(RuntimeError):
    """A guard the sweep must pass did not: storage is untouched."""


def refuse_unless_guards_pass(evidence: Evidence) -> None:
    """Raise SweepRefused naming every ERROR of refusals(evidence)."""
    failed = refusals(evidence)
    if failed:
        raise SweepRefused(
            "sweep refused, storage untouched: " + "; ".join(f"{v.name}: {v.description}" for v in failed)
        )
