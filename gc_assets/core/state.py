"""Where gc_assets keeps its own things: under `_gc/` and `_gc_trash/` in each namespace, and
in the state directory on the driver (docs/design.md §5).

In the namespace: the sweep's lease (`_gc/lease/`), the record of each trash run
(`_gc/trash/<run_id>.json`), the holds a restore places (`_gc/holds/<run_id>.json`), the
catalog rows a trash run removed (`_gc/catalog-rows/<run_id>/`) and the trashed objects
themselves (`_gc_trash/<run_id>/<address>`). None of it is ever a candidate.

In the state directory: each asset partition at `<asset>/repo=<repo>/date=<date>/` with
TIMES_FILE beside its part files, each restore's receipts under `restores/`, and each mark's
sweep journal under `_sweeps/`.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

GC_PREFIX = "_gc/"
TRASH_PREFIX = "_gc_trash"  # trash mode moves an object to `_gc_trash/<run_id>/<address>`
TRASH_RUNS_PREFIX = f"{GC_PREFIX}trash/"
HOLDS_PREFIX = f"{GC_PREFIX}holds/"
LEASE_PREFIX = f"{GC_PREFIX}lease/"
ROWS_PREFIX = f"{GC_PREFIX}catalog-rows/"
GC_OWN_PREFIXES = (GC_PREFIX, f"{TRASH_PREFIX}/")  # never candidates, whatever the configuration

# Beside each stored partition's part files (a name Spark and pyarrow skip): the run that
# wrote it and the times its step recorded (as_of, mark_time, source_time, ...), so that a
# later question about the partition (`plan`) holds them constant.
TIMES_FILE = "_gc_times.json"
RESTORES = "restores"  # receipts of `gc-assets restore`, stored as an asset partition would be


def state_location(state_dir: Path, asset: str, repo: str, date: str, suffix: str = "") -> Path:
    """Where an asset partition (or a file beside it) is stored: `<asset>/repo=<repo>/date=<date>/`."""
    base = state_dir / asset / f"repo={repo}" / f"date={date}"
    return base / suffix if suffix else base


def restore_location(state_dir: Path, repo: str, date: dt.date, run_id: str) -> Path:
    """Where the receipts of restoring trash run `run_id` on `date` are stored."""
    return state_location(state_dir, RESTORES, repo, date.isoformat(), f"run_id={run_id}")


def sweep_journal_location(state_dir: Path, repo: str, date: dt.date, mark_id: str) -> Path:
    """One journal per mark, outside every IO-managed partition directory."""
    return state_dir / "_sweeps" / f"repo={repo}" / f"date={date.isoformat()}" / f"mark={mark_id}"


def spark_path(path: str | os.PathLike[str]) -> str:
    """A local path as Spark reads it: file:// and the path as is (Hadoop paths are not percent-encoded)."""
    return f"file://{Path(path).resolve()}"
