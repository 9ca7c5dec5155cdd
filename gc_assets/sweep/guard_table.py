"""Every safety guard once (GUARDS): the asset check it is, on which asset, and whether a failure
stops its repository (a blocking check). How each is judged, for a set of repositories at once,
is gc_assets.core.guards (the verdicts) and gc_assets.sweep.together (what each one reads); a
sweep of a stored mark judges them again right before it touches storage.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Guard:
    name: str
    asset: str  # the asset whose check it is
    description: str
    blocking: bool = True  # a failed check stops its repository before the receipts


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
        "receipts_cover_candidates",
        "deletion_receipts",
        "Exactly one receipt per candidate, and none for anything else.",
        blocking=False,
    ),
    Guard(
        "live_objects_intact",
        "deletion_receipts",
        "After the sweep, every live object that was in storage is still there.",
        blocking=False,
    ),
)
