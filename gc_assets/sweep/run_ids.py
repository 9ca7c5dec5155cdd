"""Run ids that restore and release are given: one plain path segment naming a known record."""

from __future__ import annotations

import re

from gc_assets.stores.base import Store

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class RunIdError(ValueError):
    """A run id given to restore or release is not one plain segment naming a known record."""


def checked_run_id(store: Store, run_id: str, records: str) -> str:
    """`run_id` when it is one plain path segment with a record under `records`; else RunIdError.

    An empty id, `..` or `a/b` would name every run's trash, or a place outside it.
    """
    if not RUN_ID_PATTERN.match(run_id) or run_id in (".", ".."):
        raise RunIdError(f"run id {run_id!r} is not one plain segment (letters, digits, '_', '.', '-')")
    if store.read_text(f"{records}{run_id}.json") is None:
        raise RunIdError(f"no record {records}{run_id}.json in {store.namespace}: unknown run id {run_id!r}")
    return run_id
