"""The names other programs see: the graph's assets and the sweep's modes."""

from __future__ import annotations

from enum import StrEnum
from typing import Optional

# The column that names each row's repository wherever rows of many repositories travel together.
REPO = "repo"

# The assets, in the order a run materializes them.
ASSETS = ("retained_commits", "live_files", "object_inventory", "orphan_candidates", "deletion_receipts")


class ModeError(ValueError):
    """A mode asked for by name is none of the sweep's modes."""


class Mode(StrEnum):
    """What the sweep does with the candidates (docs/design.md §5). The values are the names
    gc.yaml, the run config, the metadata and the JSON summary use."""

    DRY_RUN = "dry_run"  # reports: would_delete receipts, storage untouched
    TRASH = "trash"  # moves to _gc_trash/<run_id>/ (restorable)
    DELETE = "delete"  # removes

    @classmethod
    def chosen(cls, requested: Optional[str], configured: Mode) -> Mode:
        """The mode a run asks for by name, or the repository's configured mode when it names none."""
        if not requested:
            return configured
        try:
            return cls(requested)
        except ValueError:
            choices = ", ".join(mode.value for mode in cls)
            raise ModeError(f"mode {requested!r} is not available; choose one of {choices}") from None
