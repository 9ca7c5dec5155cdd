"""`gc-assets demo`: a lakeFS-layout lake with the documentation example plus churn, GC'd in dry run."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import time
from pathlib import Path

import yaml

from gc_assets.lakegen import DOCS_GC_DATE, DOCS_RULES, add_churn, docs_example, write_lake
from gc_assets.runner import format_summary, run_partition

DEMO_REPO = "example-repo"


def build_demo(directory: Path, churn_commits: int = 400) -> Path:
    """Write the demo lake and its gc.yaml under `directory`; returns the gc.yaml path."""
    directory = directory.resolve()
    namespace = directory / "lake" / DEMO_REPO
    if namespace.exists():
        shutil.rmtree(namespace)
    lake = docs_example(DEMO_REPO)
    start = dt.datetime(2022, 1, 15, tzinfo=dt.timezone.utc)
    add_churn(lake, churn_commits, start, dt.datetime(2022, 3, 30, tzinfo=dt.timezone.utc))
    export_dir = write_lake(lake, namespace)
    config = {
        "state_dir": str(directory / ".gc_state"),
        "partitions_start_date": "2022-01-01",
        "repositories": [
            {
                "name": DEMO_REPO,
                "format": "lakefs-export",
                "storage_namespace": namespace.as_uri(),
                "source": export_dir.as_uri(),
                "rules": {**DOCS_RULES, "branches": DOCS_RULES["branches"] + [{"pattern": "feature/*", "retention_days": 3}]},
                "mode": "dry_run",
            }
        ],
    }
    config_path = directory / "gc.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return config_path


def run_demo(directory: Path) -> int:
    started = time.monotonic()
    config_path = build_demo(directory)
    print(f"demo lake written under {directory.resolve()} (config {config_path})", flush=True)
    outcome = run_partition(str(config_path), DEMO_REPO, DOCS_GC_DATE, mode="dry_run")
    print(format_summary(outcome, time.monotonic() - started), flush=True)
    print(json.dumps(outcome.summary), flush=True)
    return 0 if outcome.success else 1
