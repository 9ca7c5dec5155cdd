"""Lakes marked once per test module, and put back in place before each test that sweeps them.

The mark (retained_commits, live_files, object_inventory and orphan_candidates, with their
checks) is most of a graph run. A test that only sweeps a mark restores the lake, its gc.yaml
and its state directory as saved after the mark, then re-executes deletion_receipts alone.
States are restored at the paths they were saved from, never copied elsewhere: stored
partitions and sweep journals record absolute paths."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import hashlib
import shutil
from pathlib import Path
from typing import Any, Sequence

import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from gc_assets.core.config import load_config
from gc_assets.core.time import AS_OF_TAG, as_of_tags, parse_timestamp
from gc_assets.defs.assets.collect import mode_run_config
from gc_assets.defs.build import build_definitions
from gc_assets.defs.partitions import REPOSITORIES, partition_key
from gc_assets.defs.set_runs import RunOutcome
from gc_assets.demo.lakegen import Lake
from gc_assets.runner import run_partition, utc_now
from gc_assets_tests.lakes import AS_OF, GC_DATE, LakeOnDisk, lake_on_disk
from gc_assets_tests.oracles import expected_candidates
from gc_assets_tests.sweep_runs import outcome_of, receipts_only

MIN_AGE = dt.timedelta(hours=24)
MARK_ASSETS = ("retained_commits", "live_files", "object_inventory", "orphan_candidates")
SWEEP_ASSETS = ("object_inventory", "orphan_candidates", "deletion_receipts")
SAVED_PARTS = ("lake", "state", "gc.yaml")  # everything lake_on_disk writes under its root
MARKED, TRASHED = "marked", "trashed"


def namespace_snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """key -> (sha256, mtime_ns) of every regular file, product bookkeeping under _gc/ aside."""
    result = {}
    for path in root.rglob("*"):
        key = str(path.relative_to(root))
        if path.is_file() and not key.startswith("_gc/"):
            result[key] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return result


def expected_of(lake: LakeOnDisk) -> set[str]:
    """The candidates the oracle expects at AS_OF with the default minimum age."""
    return expected_candidates(lake.lake, lake.namespace_uri, lake.rules, AS_OF, AS_OF - MIN_AGE)


def run_assets(
    lake: LakeOnDisk, instance: DagsterInstance, assets: Sequence[str], mode: str = "", date: dt.date = GC_DATE
) -> RunOutcome:
    """gc_job on `assets` alone (with their checks), as-of fixed at launch as run_partition does."""
    instance.add_dynamic_partitions(REPOSITORIES.name, [lake.lake.name])
    tags = as_of_tags(date, utc_now())
    job = build_definitions(load_config(lake.config_path), str(lake.config_path)).resolve_job_def("gc_job")
    sweeps = "deletion_receipts" in assets
    result = job.execute_in_process(
        instance=instance,
        partition_key=partition_key(date, lake.lake.name),
        tags=tags,
        run_config=mode_run_config(mode) if sweeps else None,
        asset_selection=[AssetKey(asset) for asset in assets],
        raise_on_error=False,
    )
    return outcome_of(result, instance, lake.lake.name, date, parse_timestamp(tags[AS_OF_TAG]), mode)


def mark(lake: LakeOnDisk, instance: DagsterInstance, date: dt.date = GC_DATE) -> RunOutcome:
    """The mark and its candidates for `date`, judged by their checks; storage untouched."""
    return run_assets(lake, instance, MARK_ASSETS, date=date)


class SavedLake:
    """A lake on disk, marked in an instance of its own, whose states are saved by name and put back in place."""

    def __init__(self, lake: LakeOnDisk, instance: DagsterInstance):
        self.lake, self.instance = lake, instance
        self.root = lake.config_path.parent
        self._models: dict[str, Lake] = {}

    def save(self, name: str) -> None:
        for part in SAVED_PARTS:
            replace_with_copy(self.root / part, self._saved(name) / part)
        self._models[name] = copy.deepcopy(self.lake.lake)

    def restore(self, name: str, **repo_options: Any) -> LakeOnDisk:
        """The lake as saved under `name`, with `repo_options` set in its gc.yaml and a model of its own to change."""
        for part in SAVED_PARTS:
            replace_with_copy(self._saved(name) / part, self.root / part)
        if repo_options:
            config = yaml.safe_load(self.lake.config_path.read_text())
            config["repositories"][0].update(repo_options)
            self.lake.config_path.write_text(yaml.safe_dump(config))
        return dataclasses.replace(self.lake, lake=copy.deepcopy(self._models[name]))

    def sweep(self, mode: str) -> RunOutcome:
        """deletion_receipts alone in `mode`, against the stored mark."""
        result = receipts_only(self.lake.config_path, self.lake.lake.name, AS_OF, self.instance, mode)
        return outcome_of(result, self.instance, self.lake.lake.name, GC_DATE, AS_OF, mode)

    def _saved(self, name: str) -> Path:
        return self.root.with_name(f"{self.root.name}-{name}")


def replace_with_copy(source: Path, target: Path) -> None:
    """`target` becomes a copy of `source`, modification times included (the lakes' history is in them)."""
    if target.is_dir():
        shutil.rmtree(target)
    elif target.exists():
        target.unlink()
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def marked_lake(root: Path, **options: Any) -> SavedLake:
    """lake_on_disk(root, **options), marked and saved as MARKED."""
    saved = SavedLake(lake_on_disk(root, **options), DagsterInstance.ephemeral())
    marked = mark(saved.lake, saved.instance)
    assert marked.success, marked.error
    saved.save(MARKED)
    return saved


@dataclasses.dataclass(frozen=True)
class Trashed:
    """A trash sweep of the marked lake: the namespace before it, and its outcome."""

    before: dict[str, tuple[str, int]]
    outcome: RunOutcome


def trash_and_save(saved: SavedLake) -> Trashed:
    """Trash the marked candidates once and save that state as TRASHED."""
    lake = saved.restore(MARKED)
    before = namespace_snapshot(lake.namespace)
    outcome = saved.sweep("trash")
    assert outcome.success, outcome.error
    saved.save(TRASHED)
    return Trashed(before, outcome)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, spark) -> SavedLake:
    """The docs example, marked once for the module."""
    return marked_lake(tmp_path_factory.mktemp("lake"))


@pytest.fixture(scope="module")
def trashed(saved: SavedLake) -> Trashed:
    """Its candidates trashed once, as the tests of restore, holds and purge begin."""
    return trash_and_save(saved)


def whole_run(lake: LakeOnDisk, mode: str) -> RunOutcome:
    """A whole graph run: a new mark, then the sweep."""
    return run_partition(
        str(lake.config_path), lake.lake.name, GC_DATE, mode=mode, instance=DagsterInstance.ephemeral()
    )
