"""What the run stores and reuses: each asset partition validated by the write that stores
it, and the sweep reusing only the verdicts its own run reached on the same inputs."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from dagster import AssetKey, DagsterInstance
from pyspark.sql import functions as F

from gc_assets.core.config import load_config
from gc_assets.core.time import AS_OF_TAG, format_timestamp
from gc_assets.defs.assets.collect import mode_run_config
from gc_assets.defs.build import build_definitions
from gc_assets.defs.partitions import REPOSITORIES, partition_key
from gc_assets.defs.resources import GcConfigResource
from gc_assets.defs.schemas import MODELS, SchemaError, check_columns
from gc_assets.defs.set_partitions import commit_all
from gc_assets.defs.set_runs import RunOutcome
from gc_assets.runner import run_partition
from gc_assets.stores.state import LocalState, ObjectState, Staged, read_parquet
from gc_assets.sweep.guard_table import GUARDS
from gc_assets_tests.lakes import AS_OF, GC_DATE, lake_on_disk
from gc_assets_tests.sweep_runs import outcome_of

# The guards a passing run's receipts take over from its checks: every check judged before a
# sweep (candidates_not_held is not a check: the candidates leave held objects out).
REUSED_IN_A_PASSING_RUN = sorted(g.name for g in GUARDS if g.is_check and g.before_sweep)


@pytest.fixture
def lake(tmp_path, spark):
    return lake_on_disk(tmp_path, churn=20, max_delete_fraction=1.0)


def _gc_job_run(lake, instance: DagsterInstance) -> RunOutcome:
    """A dry run of the partition by gc_job, as the UI launches it: one step, a set of one."""
    defs = build_definitions(load_config(lake.config_path), str(lake.config_path))
    instance.add_dynamic_partitions(REPOSITORIES.name, [lake.lake.name])
    result = defs.resolve_job_def("gc_job").execute_in_process(
        instance=instance,
        partition_key=partition_key(GC_DATE, lake.lake.name),
        tags={AS_OF_TAG: format_timestamp(AS_OF)},
        run_config=mode_run_config("dry_run"),
        raise_on_error=False,
    )
    return outcome_of(result, instance, lake.lake.name, GC_DATE, AS_OF, "dry_run")


def _receipts_metadata(instance: DagsterInstance) -> dict:
    record = instance.fetch_materializations(AssetKey("deletion_receipts"), limit=1).records[0]
    return {k: v.value for k, v in record.event_log_entry.asset_materialization.metadata.items()}


def test_columns_missing_or_of_another_type_are_refused(spark):
    """check_columns judges the schema alone: a dropped column and a changed type each break it."""
    frame = spark.createDataFrame([("r", "c", True)], "repo string, commit_id string, retained boolean").select(
        "repo",
        F.current_date().alias("gc_date"),
        "commit_id",
        F.current_timestamp().alias("created_at"),
        "retained",
        F.lit(None).cast("string").alias("retained_by"),
        F.lit(None).cast("timestamp").alias("threshold"),
        F.lit(True).alias("ref_head"),
    )
    check_columns(frame, MODELS["retained_commits"])
    with pytest.raises(SchemaError, match="ref_head': 'missing"):
        check_columns(frame.drop("ref_head"), MODELS["retained_commits"])
    with pytest.raises(SchemaError, match="created_at': 'timestamp_ntz, not timestamp"):
        check_columns(
            frame.withColumn("created_at", F.col("created_at").cast("timestamp_ntz")), MODELS["retained_commits"]
        )


def test_a_stored_partition_reads_back_in_its_written_schema_every_column_nullable(spark, tmp_path):
    """read_parquet takes the schema from the Parquet footer instead of a Spark job; a column
    written non-null still reads as nullable, so a null test on it is never optimized away."""
    frame = spark.range(3).select(F.col("id").alias("n"), F.lit("x").alias("s"), F.array(F.lit(1)).alias("a"))
    assert not frame.schema["s"].nullable
    frame.write.parquet(str(tmp_path / "p"))
    read = read_parquet(spark, tmp_path / "p")
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in read.schema.fields] == [
        ("n", "bigint", True),
        ("s", "string", True),
        ("a", "array<int>", True),
    ]
    assert read.schema["a"].dataType.containsNull
    assert sorted(r["n"] for r in read.filter(F.col("s").isNotNull()).collect()) == [0, 1, 2]


def test_an_output_breaking_its_schema_is_refused_and_nothing_is_stored(lake, monkeypatch):
    """The rows are validated by measures the write collects: a reason outside the contract
    and a null size are both caught, and no orphan_candidates partition appears."""
    import gc_assets.mark.sets as sets

    original = sets.orphans_each

    def broken(*args, **kwargs):
        frame = original(*args, **kwargs)
        return frame.withColumn("reason", F.lit("forgotten")).withColumn("size", F.lit(None).cast("long"))

    monkeypatch.setattr(sets, "orphans_each", broken)
    outcome = run_partition(
        str(lake.config_path), lake.lake.name, GC_DATE, mode="dry_run", instance=DagsterInstance.ephemeral()
    )

    assert not outcome.success
    assert outcome.error is not None and outcome.error.startswith("orphan_candidates:")
    assert "breaks its schema" in outcome.error and "reason not in" in outcome.error and "size is null" in outcome.error
    gc_config = GcConfigResource(config_path=str(lake.config_path))
    stored = gc_config.state().uri(gc_config.partition_at("orphan_candidates", partition_key(GC_DATE, lake.lake.name)))
    assert "orphan_candidates" not in outcome.summary["outputs"]
    assert not os.path.exists(stored)


def test_the_write_counts_what_it_stores(lake, spark):
    """Rows, bytes and categories in the metadata come from the write itself; they equal a
    separate count of the stored partition."""
    outcome = run_partition(
        str(lake.config_path), lake.lake.name, GC_DATE, mode="dry_run", instance=DagsterInstance.ephemeral()
    )
    assert outcome.success, outcome.error
    stored = spark.read.parquet(f"file://{outcome.summary['outputs']['orphan_candidates']}")
    assert outcome.summary["orphan_candidates"] == stored.count() > 0
    assert outcome.summary["reclaimable_bytes"] == stored.agg(F.sum("size")).first()[0]
    inventory = spark.read.parquet(f"file://{outcome.summary['outputs']['object_inventory']}")
    assert outcome.summary["inventory_objects"] == inventory.count()
    assert outcome.summary["inventory_bytes"] == inventory.agg(F.sum("size")).first()[0]
    receipts = spark.read.parquet(f"file://{outcome.summary['outputs']['deletion_receipts']}")
    assert outcome.summary["receipts"] == {"would_delete": receipts.count()}


def test_partitions_are_staged_under_a_hidden_directory_and_nothing_is_left_behind(lake):
    """Each partition is written beside its place under a hidden directory (Spark's partition
    discovery skips it) and swapped in; after the run only the empty hidden directory is left."""
    outcome = _gc_job_run(lake, DagsterInstance.ephemeral())
    assert outcome.success, outcome.error
    assert len(outcome.summary["outputs"]) == 5
    for asset, path in outcome.summary["outputs"].items():
        repo_directory = Path(path).parent
        assert sorted(p.name for p in repo_directory.iterdir()) == [".staging", Path(path).name], asset
        assert not any((repo_directory / ".staging").iterdir()), asset


def test_the_sweep_reuses_its_own_runs_verdicts_and_judges_again_in_another_run(lake):
    instance = DagsterInstance.ephemeral()
    outcome = _gc_job_run(lake, instance)
    assert outcome.success, outcome.error
    assert _receipts_metadata(instance)["guards_reused"] == REUSED_IN_A_PASSING_RUN

    defs = build_definitions(load_config(lake.config_path), str(lake.config_path))
    alone = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=instance,
        partition_key=partition_key(GC_DATE, lake.lake.name),
        asset_selection=[AssetKey("deletion_receipts")],
        run_config=mode_run_config("dry_run"),
    )
    assert alone.success
    assert _receipts_metadata(instance)["guards_reused"] == []


def test_partitions_commit_one_after_another_on_local_disk_and_many_at_once_on_an_object_store():
    """A local commit is a few renames: threads would only take turns on the interpreter. On an
    object store each is a few requests, which overlap."""
    lock, overlapping = threading.Lock(), []

    class Timed(Staged):
        active = 0

        def commit(self, record: Optional[dict[str, Any]] = None) -> None:
            with lock:
                Timed.active += 1
                overlapping.append(Timed.active)
            time.sleep(0.01)
            with lock:
                Timed.active -= 1

        def discard(self) -> None:
            raise AssertionError("nothing failed")

    commit_all({i: Timed() for i in range(8)}, {i: {} for i in range(8)}, LocalState.commits_at_once)
    assert overlapping == [1] * 8
    overlapping.clear()
    commit_all({i: Timed() for i in range(8)}, {i: {} for i in range(8)}, ObjectState.commits_at_once)
    assert len(overlapping) == 8 and max(overlapping) > 1


def test_a_sweep_acts_only_once_every_partition_of_its_mark_is_in_place(lake, monkeypatch):
    """The partitions are put in place by the run's recorder thread, beside the next phase's Spark
    jobs (defs.set_records); a delete waits for all of them. One that cannot be put in place
    fails the run before any object is deleted."""
    from gc_assets.defs.set_partitions import StoredPartitions

    commit = StoredPartitions.commit

    def failing_for_candidates(self: StoredPartitions) -> None:
        if any("orphan_candidates" in str(getattr(staged, "final", "")) for staged in self.staged.values()):
            raise OSError("No space left on device")
        commit(self)

    monkeypatch.setattr(StoredPartitions, "commit", failing_for_candidates)
    before = sorted(p for p in lake.namespace.rglob("*") if p.is_file())
    outcome = run_partition(
        str(lake.config_path), lake.lake.name, GC_DATE, mode="delete", instance=DagsterInstance.ephemeral()
    )
    assert not outcome.success and "No space left on device" in (outcome.error or ""), outcome.error
    assert sorted(p for p in lake.namespace.rglob("*") if p.is_file()) == before
