"""Where gc_assets keeps its own things: under `_gc/` and `_gc_trash/` in each namespace, and
in the state directory on the driver (docs/design.md §5).

In the namespace: the sweep's lease (`_gc/lease/`), the record of each trash run
(`_gc/trash/<run_id>.json`), the holds a restore places (`_gc/holds/<run_id>.json`), the
catalog rows a trash run removed (`_gc/catalog-rows/<run_id>/`) and the trashed objects
themselves (`_gc_trash/<run_id>/<address>`). None of it is ever a candidate.

In the state directory (a local path or an object-store URI: stores.state), keys relative to it:
each asset partition at `<asset>/repo=<repo>/date=<date>/` with
TIMES_FILE beside its part files, each restore's receipts under `restores/`, and each mark's
sweep journal under `_sweeps/`. `_reaches/<owner>/<referrer>` says that a mark of the
referrer read references into the owner's namespace (mark.shared).
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from urllib.parse import quote, unquote

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
SWEEPS = "_sweeps"


def partition_at(asset: str, repo: str, date: str, suffix: str = "") -> str:
    """Where an asset partition (or a file beside it) is kept: `<asset>/repo=<repo>/date=<date>`."""
    base = f"{asset}/repo={repo}/date={date}"
    return f"{base}/{suffix}" if suffix else base


def restore_at(repo: str, date: dt.date, run_id: str) -> str:
    """Where the receipts of restoring trash run `run_id` on `date` are kept."""
    return partition_at(RESTORES, repo, date.isoformat(), f"run_id={run_id}")


def sweep_journal_at(repo: str, date: dt.date, mark_id: str) -> str:
    """One journal per mark, outside every IO-managed partition directory."""
    return f"{SWEEPS}/repo={repo}/date={date.isoformat()}/mark={mark_id}"


def sweep_set_journal_at(date: dt.date, mark_id: str) -> str:
    """One journal per mark of a set of repositories swept together, each row naming its repository."""
    return f"{SWEEPS}/set/date={date.isoformat()}/mark={mark_id}"


def spark_path(path: str | os.PathLike[str]) -> str:
    """A local path as Spark reads it: file:// and the path as is (Hadoop paths are not percent-encoded)."""
    return f"file://{Path(path).resolve()}"


REACHES = "_reaches"


def reaches_at(owner: str, referrer: str) -> str:
    """The record that a mark of `referrer` read references into `owner`'s namespace."""
    return f"{REACHES}/{quote(owner, safe='')}/{quote(referrer, safe='')}"


def reach_of(key: str) -> tuple[str, str]:
    """(owner, referrer) of a record at `key` (reaches_at)."""
    _, owner, referrer = key.split("/")
    return unquote(owner), unquote(referrer)
