"""`gc-assets demo`: demo repositories built from scratch, each GC'd end to end in dry run.

Each builder writes one repository under the demo directory and returns its gc.yaml
entry and the partition date to collect; every repository shares one gc.yaml.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from gc_assets.lakegen import DOCS_GC_DATE, DOCS_RULES, add_churn, docs_example, write_lake
from gc_assets.runner import format_summary, run_partition


@dataclass(frozen=True)
class DemoRepository:
    config: dict[str, Any]  # its gc.yaml entry
    gc_date: dt.date


def lakefs_demo(directory: Path, churn_commits: int = 400) -> DemoRepository:
    """The lakeFS documentation example plus random churn, in the lakeFS layout."""
    name = "example-repo"
    namespace = directory / "lake" / name
    lake = docs_example(name)
    add_churn(
        lake,
        churn_commits,
        dt.datetime(2022, 1, 15, tzinfo=dt.timezone.utc),
        dt.datetime(2022, 3, 30, tzinfo=dt.timezone.utc),
    )
    export_dir = write_lake(lake, namespace)
    rules = {**DOCS_RULES, "branches": DOCS_RULES["branches"] + [{"pattern": "feature/*", "retention_days": 3}]}
    config = {
        "name": name,
        "format": "lakefs-export",
        "storage_namespace": namespace.as_uri(),
        "source": export_dir.as_uri(),
        "rules": rules,
        "mode": "dry_run",
    }
    return DemoRepository(config, DOCS_GC_DATE)


# One builder per demo repository; the demo collects each in this order.
DEMO_BUILDERS: list[Callable[[Path], DemoRepository]] = [lakefs_demo]


def build_demo(directory: Path) -> tuple[Path, list[DemoRepository]]:
    """Write every demo repository and the shared gc.yaml; returns the gc.yaml path."""
    directory = directory.resolve()
    if (directory / "lake").exists():
        shutil.rmtree(directory / "lake")
    directory.mkdir(parents=True, exist_ok=True)
    repositories = [build(directory) for build in DEMO_BUILDERS]
    config = {
        "state_dir": str(directory / ".gc_state"),
        "partitions_start_date": "2022-01-01",
        "repositories": [repo.config for repo in repositories],
    }
    config_path = directory / "gc.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return config_path, repositories


def run_demo(directory: Path) -> int:
    started = time.monotonic()
    config_path, repositories = build_demo(directory)
    print(f"demo lake written under {directory.resolve()} (config {config_path})", flush=True)
    status = 0
    for repo in repositories:
        repo_started = time.monotonic()
        outcome = run_partition(str(config_path), repo.config["name"], repo.gc_date, mode="dry_run")
        print(format_summary(outcome, time.monotonic() - repo_started), flush=True)
        print(json.dumps(outcome.summary), flush=True)
        status = status or (0 if outcome.success else 1)
    print(f"demo finished in {time.monotonic() - started:.1f}s", flush=True)
    return status
