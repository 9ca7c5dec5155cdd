"""What a person sees while `run`, `demo`, `plan` and `explain` work: one line per step and
the summary, with Dagster's and Spark's logs in a file (docs/design.md §9)."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from rich.console import Console

# Per asset: how its line reads, from its materialization metadata.
_STEP_LINES = {
    "retained_commits": lambda m: (
        f"{m.get('retained_commits', 0)} retained, {m.get('expired_commits', 0)} expired commits"
    ),
    "live_files": lambda m: f"{m.get('live_objects', 0)} live objects",
    "object_inventory": lambda m: f"{m.get('dagster/row_count', 0)} objects listed, {m.get('bytes', 0)} bytes",
    "orphan_candidates": lambda m: (
        f"{m.get('orphan_candidates', 0)} candidates, {m.get('reclaimable_bytes', 0)} bytes reclaimable"
    ),
    "deletion_receipts": lambda m: (
        "receipts "
        + (
            ", ".join(f"{k.removeprefix('receipts_')}={v}" for k, v in sorted(m.items()) if k.startswith("receipts_"))
            or "none"
        )
    ),
}


def log_path(logs: Path, command: str) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return logs / f"{command}-{stamp}-{os.getpid()}.log"


@contextlib.contextmanager
def quiet(path: Path, verbose: bool, announce: bool = True) -> Iterator[None]:
    """Send file descriptor 2 to `path` unless `verbose`: Dagster's console log, the Spark
    JVM (which inherits it when it starts) and Python warnings all write there."""
    if verbose:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if announce:
        print(f"logs: {path}", flush=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


class Progress:
    """One line per finished step; on a terminal a spinner names the step under way."""

    def __init__(self, console: Optional[Console] = None):
        self.console = console or Console(highlight=False)
        self.live = self.console.is_terminal
        self.status: Any = None

    def __enter__(self) -> "Progress":
        if self.live:
            self.status = self.console.status("starting")
            self.status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.status is not None:
            self.status.stop()

    def started(self, step: str) -> None:
        if self.status is not None:
            self.status.update(f"{step} …")

    def materialized(self, asset: str, metadata: Mapping[str, Any]) -> None:
        describe = _STEP_LINES.get(asset)
        self.line(f"  {asset:<18} {describe(metadata) if describe else 'done'}")

    def checked(self, name: str, passed: bool) -> None:
        self.line(f"  {'check':<18} {name}: {'passed' if passed else 'NOT PASSED'}")

    def failed(self, step: str, message: str) -> None:
        self.line(f"  {step:<18} FAILED: {message}")

    def line(self, text: str) -> None:
        self.console.print(text, markup=False, soft_wrap=True)
