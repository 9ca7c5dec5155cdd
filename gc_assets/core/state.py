"""Where gc_assets keeps its own things: under `_gc/` and `_gc_trash/` in each namespace, and
in the state directory on the driver (docs/design.md §5).

In the namespace: the sweep's lease (`_gc/lease/`), the record of each trash run
(`_gc/trash/<run_id>.json`), the holds a restore places (`_gc/holds/<run_id>.json`), the
catalog rows a trash run removed (`_gc/catalog-rows/<run_id>/`) and the trashed objects
themselves (`_gc_trash/<run_id>/<address>`). None of it is ever a candidate.

In the state directory: each asset partition at `<asset>/repo=<repo>/date=<date>/` with
TIMES_FILE beside its part files, each restore's receipts under `restores/`, and each mark's
sweep journal under `_sweeps/`. `_reaches/<owner>/<referrer>` says that a mark of the
referrer read references into the owner's namespace (mark.shared).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Mapping
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


REACHES = "_reaches"


def record_reaches(state_dir: Path, referrer: str, as_of: dt.datetime, examples: Mapping[str, str]) -> None:
    """Say that `referrer`'s live set at `as_of` names objects of each owner of `examples`
    (owner -> one address it names there); forget the owners it no longer reaches, but only
    records of an as-of no later than this one (a backfill of an older date forgets nothing)."""
    base = state_dir / REACHES
    for record in base.glob(f"*/{quote(referrer, safe='')}"):
        owner = unquote(record.parent.name)
        if owner not in examples and _recorded_as_of(record) <= as_of:
            record.unlink(missing_ok=True)
    for owner, example in examples.items():
        record = base / quote(owner, safe="") / quote(referrer, safe="")
        record.parent.mkdir(parents=True, exist_ok=True)
        newest = max([as_of, *([_recorded_as_of(record)] if record.exists() else [])])
        record.write_text(json.dumps({"referrer": referrer, "as_of": newest.isoformat(), "example": example}))


def _recorded_as_of(record: Path) -> dt.datetime:
    return dt.datetime.fromisoformat(json.loads(record.read_text())["as_of"])


def recorded_referrers(state_dir: Path, owner: str) -> list[str]:
    """The repositories a mark found naming objects of `owner`'s namespace (record_reaches)."""
    folder = state_dir / REACHES / quote(owner, safe="")
    return sorted(unquote(record.name) for record in folder.iterdir()) if folder.is_dir() else []
