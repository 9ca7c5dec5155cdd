"""The Definitions as the UI shows them, the instance configuration, and the rule that
never lets two GC runs work on one repository at once."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
import yaml
from dagster import (
    AssetKey,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    Failure,
    instance_for_test,
    validate_run_config,
)
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._utils.tags import TagConcurrencyLimitsCounter

from gc_assets.core.config import load_config
from gc_assets.defs.assets.collect import STEP
from gc_assets.defs.build import build_definitions
from gc_assets.defs.concurrency import (
    RANGE_TAGS,
    REPOSITORY_TAG,
    ensure_sole_run,
    not_sole_runs,
    others_in_progress,
)
from gc_assets.defs.set_runs import FLEET_TAG
from gc_assets.runner import run_partition
from gc_assets.sweep.guard_table import GUARDS
from gc_assets_tests.lakes import GC_DATE, lake_on_disk

PROJECT = Path(__file__).resolve().parent.parent
MARK_ASSETS = {"retained_commits", "live_files"}
SWEEP_ASSETS = {"object_inventory", "orphan_candidates", "deletion_receipts"}
BLOCKING_CHECKS = {
    "heads_and_tags_retained",
    "live_objects_present",
    "candidates_not_live",
    "candidates_older_than_min_age",
    "independent_witness",
    "candidates_inside_namespace",
    "blast_radius",
}


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    return lake_on_disk(tmp_path_factory.mktemp("definitions"), churn=5)


@pytest.fixture(scope="module")
def defs(lake):
    return build_definitions(load_config(lake.config_path), str(lake.config_path))


def _specs(defs):
    return {spec.key.path[-1]: (asset, spec) for asset in defs.assets for spec in asset.specs}


def test_assets_carry_groups_kinds_descriptions_and_no_backfill_policy(defs):
    specs = _specs(defs)
    assert set(specs) == MARK_ASSETS | SWEEP_ASSETS | {"retention_whatif"}
    whatif = specs.pop("retention_whatif")[0]
    assert whatif.partitions_def is None and whatif.specs_by_key[AssetKey("retention_whatif")].group_name == "questions"
    for name, (asset, spec) in specs.items():
        assert spec.group_name == ("mark" if name in MARK_ASSETS else "sweep")
        assert {"spark", "parquet"} <= set(spec.kinds)
        assert len(spec.description) > 40
        assert asset.backfill_policy is None  # one tagged run per partition (see definitions.py)
        assert asset.partitions_def.get_partitions_def_for_dimension("repo").name == "repositories"
    # The repository format shows on the assets that read it; no S3 kind on a local lake.
    assert "lakefs" in specs["retained_commits"][1].kinds and "lakefs" in specs["live_files"][1].kinds
    assert "s3" not in specs["object_inventory"][1].kinds


def test_checks_are_described_and_the_safety_checks_block(defs):
    checks = {spec.name: spec for definition in defs.assets for spec in definition.check_specs}
    assert BLOCKING_CHECKS < set(checks)
    for name, spec in checks.items():
        assert spec.description, name
        assert spec.blocking == (name in BLOCKING_CHECKS), name


def test_the_five_assets_and_their_checks_are_one_step_that_any_selection_runs(defs):
    """One step collects a partition as a set of one, as fleet_job collects many: the five assets
    and every check are its own, and each job selects what it needs of it."""
    for name in ("gc_job", "mark_job", "sweep_job"):
        assert set(defs.resolve_job_def(name).graph.node_dict) == {STEP}, name
    (step,) = [asset for asset in defs.assets if asset.node_def.name == STEP]
    assert step.can_subset
    assert {spec.name for spec in step.check_specs} == {guard.name for guard in GUARDS if guard.is_check}


def test_jobs_select_their_phase_run_in_process_and_expose_the_mode(defs):
    selected = {
        name: {key.path[-1] for key in defs.resolve_job_def(name).asset_layer.selected_asset_keys}
        for name in ("gc_job", "mark_job", "sweep_job")
    }
    assert selected == {
        "gc_job": MARK_ASSETS | SWEEP_ASSETS,
        "mark_job": MARK_ASSETS,
        "sweep_job": {"deletion_receipts"},
    }
    for name in selected:
        assert defs.resolve_job_def(name).executor_def.name == "in_process"
    for name in ("gc_job", "sweep_job"):
        job = defs.resolve_job_def(name)
        assert validate_run_config(job, {})["ops"][STEP]["config"] == {"mode": ""}
        edited = validate_run_config(job, {"ops": {STEP: {"config": {"mode": "delete"}}}})
        assert edited["ops"][STEP]["config"] == {"mode": "delete"}
    assert {s.name for s in defs.sensors} == {"repository_registry", "new_commits"}
    assert {s.name for s in defs.schedules} == {"daily_gc"}


def test_workspace_loads_the_definitions_module():
    workspace = yaml.safe_load((PROJECT / "workspace.yaml").read_text())
    target = workspace["load_from"][0]["python_module"]
    assert (target["module_name"], target["attribute"]) == ("gc_assets.definitions", "defs")


def test_dagster_yaml_queues_at_most_one_run_per_repository(defs, tmp_path, monkeypatch):
    shutil.copy(PROJECT / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    assert limits == [
        {"key": REPOSITORY_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
        {"key": FLEET_TAG, "limit": 1},
    ]
    job = defs.resolve_job_def("gc_job")

    def run_of(repo: str, date: str = "2022-03-31") -> DagsterRun:
        return DagsterRun(job_name="gc_job", tags=job.partitions_def.get_tags_for_partition_key(f"{date}|{repo}"))

    # Dagster tags every partition run with the repo dimension, which is the limited tag.
    assert run_of("a").tags[REPOSITORY_TAG] == "a"
    queue = TagConcurrencyLimitsCounter(limits, [run_of("a")])
    assert queue.is_blocked(run_of("a", "2022-03-30"))
    assert not queue.is_blocked(run_of("b"))
    fleet = defs.resolve_job_def("fleet_job")
    fleet_run = DagsterRun(
        job_name="fleet_job", tags={**fleet.tags, **fleet.partitions_def.get_tags_for_partition_key("2022-03-31")}
    )
    assert TagConcurrencyLimitsCounter(limits, [fleet_run]).is_blocked(
        DagsterRun(
            job_name="fleet_job", tags={**fleet.tags, **fleet.partitions_def.get_tags_for_partition_key("2022-03-30")}
        )
    ), "one fleet run at a time, whatever its date"


def _add_run(instance: DagsterInstance, repo: str, status: DagsterRunStatus) -> str:
    run_id = str(uuid.uuid4())
    instance.add_run(DagsterRun(job_name="gc_job", run_id=run_id, tags={REPOSITORY_TAG: repo}, status=status))
    return run_id


def test_sole_run_check_sees_only_unfinished_runs_of_the_same_repository():
    with instance_for_test() as instance:
        own = _add_run(instance, "a", DagsterRunStatus.STARTED)
        _add_run(instance, "a", DagsterRunStatus.SUCCESS)
        _add_run(instance, "a", DagsterRunStatus.NOT_STARTED)
        on_b = _add_run(instance, "b", DagsterRunStatus.STARTED)
        ensure_sole_run(instance, "a", own)
        other = _add_run(instance, "a", DagsterRunStatus.CANCELING)
        ranged = str(uuid.uuid4())
        range_tags = dict(zip(RANGE_TAGS, ("2022-03-30|a", "2022-03-31|a")))
        instance.add_run(DagsterRun(job_name="gc_job", run_id=ranged, tags=range_tags, status=DagsterRunStatus.STARTED))
        assert others_in_progress(instance, ["a", "b"], own) == {"a": sorted([other, ranged]), "b": [on_b]}
        with pytest.raises(Failure, match=other):
            ensure_sole_run(instance, "a", own)
        refused = not_sole_runs(instance, ["a", "b", "c"], own)  # a set's claim: one query for all
        assert sorted(refused) == ["a", "b"] and other in refused["a"] and on_b in refused["b"]


def test_sweep_refuses_while_another_run_of_the_repository_is_in_progress(lake, spark):
    instance = DagsterInstance.ephemeral()
    other = _add_run(instance, lake.lake.name, DagsterRunStatus.STARTED)
    before = lake.files()
    outcome = run_partition(str(lake.config_path), lake.lake.name, GC_DATE, mode="delete", instance=instance)
    assert not outcome.success
    assert outcome.error.startswith("deletion_receipts:") and other in outcome.error
    assert lake.files() == before
    materialized = {
        key.path[-1] for key in instance.get_asset_keys() if instance.get_latest_materialization_event(key) is not None
    }
    assert materialized == MARK_ASSETS | {"object_inventory", "orphan_candidates"}
    assert outcome.summary["orphan_candidates"] > 0  # there was something the sweep would have deleted
    assert instance.get_latest_materialization_event(AssetKey("deletion_receipts")) is None
