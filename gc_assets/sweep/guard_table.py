"""Every safety guard once (GUARDS): its name, the asset whose check it is, what it promises,
and whether it blocks. The asset checks the UI shows are built from GUARDS; the set judges them
all (sweep.together, with the verdicts of gc_assets.core.guards). A sweep launched on its own is
not stopped by an earlier run's failed check, which is why it judges those `before_sweep` again
on what the mark stored (sweep.together.judged_again, docs/design.md §1) before it touches storage.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Guard:
    name: str
    asset: str  # the asset whose check it is
    description: str
    blocking: bool = True  # a failed check stops the rest of its run
    before_sweep: bool = True  # a sweep of a stored mark judges it again before acting
    is_check: bool = True  # shown as an asset check


GUARDS: tuple[Guard, ...] = (
    Guard(
        "heads_and_tags_retained",
        "retained_commits",
        "Every branch head and every tagged commit is retained.",
    ),
    Guard(
        "live_objects_present",
        "object_inventory",
        "Every object a branch head, tag or staging area references is in storage (ERROR, blocks the "
        "sweep). Objects only older retained commits reference that are already gone mean history "
        "was truncated earlier: a WARN naming the commits, which does not block.",
    ),
    Guard(
        "candidates_not_live",
        "orphan_candidates",
        "No candidate is live: the live set is recomputed from the connector's raw entries and "
        "normalized in plain Python, independently of live_files.",
    ),
    Guard(
        "candidates_older_than_min_age",
        "orphan_candidates",
        "Every candidate was last modified before min(mark time, as-of, source time) minus the minimum "
        "object age; an untracked one also before the format's window for in-flight writers.",
    ),
    Guard(
        "independent_witness",
        "orphan_candidates",
        "The independent witness: what each ref head needs, read with the format's own reader "
        "(delta-rs, pyiceberg scan planning, the export's raw rows) and not through the connector, "
        "is live at a head and is no candidate; with the heads of every repository whose external "
        "references reach into this namespace.",
    ),
    Guard(
        "candidates_inside_namespace",
        "orphan_candidates",
        "Every candidate is a plain key inside the namespace, outside every protected prefix and "
        "protected pattern of its format.",
    ),
    Guard(
        "blast_radius",
        "orphan_candidates",
        "Candidates are at most max_delete_fraction of the objects in the namespace.",
    ),
    Guard(
        "candidates_not_held",
        "orphan_candidates",
        "No candidate is under a hold that a restore placed after the mark.",
        is_check=False,  # the mark already leaves held objects out; only a later restore can add one
    ),
    Guard(
        "receipts_cover_candidates",
        "deletion_receipts",
        "Exactly one receipt per candidate, and none for anything else.",
        blocking=False,
        before_sweep=False,
    ),
    Guard(
        "live_objects_intact",
        "deletion_receipts",
        "After the sweep, every live object that was in storage is still there.",
        blocking=False,
        before_sweep=False,
    ),
)
