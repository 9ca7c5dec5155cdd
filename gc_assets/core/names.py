"""The names other programs see: the graph's assets and the sweep's modes."""

from typing import Literal, get_args

# The assets, in the order a run materializes them.
ASSETS = ("retained_commits", "live_files", "object_inventory", "orphan_candidates", "deletion_receipts")

# dry_run reports, trash moves to _gc_trash/<run>/ (restorable), delete removes (docs/design.md §5).
Mode = Literal["dry_run", "trash", "delete"]
MODES: tuple[str, ...] = get_args(Mode)
