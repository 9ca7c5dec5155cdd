"""The state directory on an object store (stores.state.ObjectState): frames written and read by
executors through the store's client, visible whole once their manifest is written, and small
ones the driver keeps itself (as on a local state directory); a state_dir
that cannot be written refused before anything is moved; the lease's fence on S3.

The whole graph with its state on S3 is test_distributed's (a cluster whose workers cannot see
the driver's disk) and test_s3_gc's (a sweep killed mid-way resumes from its journal on S3).
"""

from __future__ import annotations

import datetime as dt

import pytest
from dagster import DagsterInstance
from pyspark.sql import functions as F

from gc_assets.runner import run_partition
from gc_assets.sources.discovery import load_lake
from gc_assets.stores import store_at
from gc_assets.stores.state import LocalState, ObjectState, StateError, state_files
from gc_assets_tests.lakes import write_config
from gc_assets_tests.lease_race import race_rounds
from gc_assets_tests.s3_server import s3  # noqa: F401 - the fixture

STATE_BUCKET = "gc-state"
KEY = "live_files/repo=r/date=2024-01-01"


@pytest.fixture(scope="module")
def object_state(s3):
    s3.create_bucket(STATE_BUCKET)
    return ObjectState(f"s3://{STATE_BUCKET}/unit", store_at(f"s3://{STATE_BUCKET}/unit"))


def _frame(spark, rows: int, tag: str):
    return spark.range(rows).select(
        F.concat(F.lit(f"{tag}-"), F.col("id").cast("string")).alias("address"),
        F.col("id").alias("size"),
        F.timestamp_seconds(F.col("id") + 1_700_000_000).alias("last_modified"),
    )


def test_a_frame_is_seen_whole_old_or_new_and_only_once_its_manifest_is_written(object_state, s3, spark):
    first = object_state.write(spark, _frame(spark, 50, "old").repartition(3), KEY, {"run_id": "one"})
    assert sorted(r["address"] for r in first.collect()) == sorted(f"old-{i}" for i in range(50))
    assert first.schema["last_modified"].dataType.simpleString() == "timestamp"
    parts_before = {k for k in s3.keys(STATE_BUCKET, f"unit/{KEY}/") if k.endswith(".parquet")}
    assert len(parts_before) == 3  # one part per task, written by the executor that computed it

    staged = object_state.stage(spark, _frame(spark, 20, "new").repartition(2), KEY)
    assert staged.frame.count() == 20
    # Written but not committed: every reader still finds the old frame, and only it.
    assert {r["address"][:3] for r in object_state.read(spark, KEY).collect()} == {"old"}
    assert object_state.record(KEY) == {"run_id": "one"}
    staged.commit({"run_id": "two"})
    assert {r["address"][:3] for r in object_state.read(spark, KEY).collect()} == {"new"}
    assert object_state.record(KEY) == {"run_id": "two"}
    parts_after = {k for k in s3.keys(STATE_BUCKET, f"unit/{KEY}/") if k.endswith(".parquet")}
    assert not parts_after & parts_before, "the replaced frame's parts are removed after the commit"
    assert object_state.read_table(KEY).num_rows == 20  # `gc-assets export` reads it without Spark

    discarded = object_state.stage(spark, _frame(spark, 5, "gone"), KEY)
    discarded.discard()
    assert {k for k in s3.keys(STATE_BUCKET, f"unit/{KEY}/") if k.endswith(".parquet")} == parts_after
    assert object_state.read(spark, KEY).count() == 20


def test_journal_frames_are_found_by_name_and_an_empty_frame_keeps_its_schema(object_state, spark):
    root = "_sweeps/repo=r/date=2024-01-01/mark=m"
    object_state.write(spark, _frame(spark, 3, "a"), f"{root}/chunk-1")
    object_state.write(spark, _frame(spark, 0, "b"), f"{root}/chunk-2")
    object_state.write(spark, _frame(spark, 4, "c"), f"{root}/todo-x")
    object_state.write_text(f"{root}/metadata.json", "{}")
    assert object_state.frames(root, "chunk-*") == [f"{root}/chunk-1", f"{root}/chunk-2"]
    chunks = object_state.read_many(spark, object_state.frames(root, "chunk-*"), "address string, size long")
    assert chunks.count() == 3 and chunks.columns == ["address", "size"]
    empty = object_state.read(spark, f"{root}/chunk-2")
    assert empty.count() == 0 and empty.columns == ["address", "size", "last_modified"]
    assert object_state.read(spark, f"{root}/never") is None and object_state.frames(root, "never") == []


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_small_frame_the_driver_keeps_reads_back_as_any_frame_and_is_replaced_whole(
    where, object_state, s3, spark, tmp_path
):
    """A set sweep's chunk intents and outcomes are written by the driver (keep_table), no Spark
    job: found by name beside Spark's own frames, read in their schema, timestamps included."""
    state = object_state if where == "s3" else LocalState(tmp_path)
    root = "_sweeps/set/date=2024-01-01/mark=kept"
    state.write(spark, _frame(spark, 3, "spark"), f"{root}/chunk-1")
    state.keep_table(f"{root}/chunk-2", _frame(spark, 2, "driver").toArrow())
    assert state.frames(root, "chunk-*") == [f"{root}/chunk-1", f"{root}/chunk-2"]
    both = state.read_many(spark, state.frames(root, "chunk-*"), "address string, size long, last_modified timestamp")
    expected = _frame(spark, 3, "spark").unionByName(_frame(spark, 2, "driver"))
    assert sorted(tuple(r) for r in both.collect()) == sorted(tuple(r) for r in expected.collect())
    kept = state.read(spark, f"{root}/chunk-2")
    assert kept.columns == ["address", "size", "last_modified"]
    assert kept.schema["last_modified"].dataType.simpleString() == "timestamp"

    state.keep_table(f"{root}/chunk-2", _frame(spark, 1, "again").toArrow())
    assert [r["address"] for r in state.read(spark, f"{root}/chunk-2").collect()] == ["again-0"]
    if where == "s3":
        parts = [k for k in s3.keys(STATE_BUCKET, f"unit/{root}/chunk-2/") if k.endswith(".parquet")]
        assert len(parts) == 1, "the replaced table's part is removed after the commit"


@pytest.mark.parametrize("where", ["local", "s3"])
def test_one_frame_split_by_repository_stages_each_partition_alone_committed_or_discarded(
    where, object_state, spark, tmp_path
):
    """A set run stores each repository's partition of an asset from one frame in one Spark job
    (stage_split): each key gets exactly its own rows (one without rows, an empty frame in the
    schema), nothing is visible before its commit, a discarded one leaves the frame in place."""
    state = object_state if where == "s3" else LocalState(tmp_path)
    keys = [f"orphan_candidates/repo={name}/date=2024-01-01" for name in ("a", "b", "empty", "refused")]
    state.write(spark, _frame(spark, 2, "before"), keys[3], {"run_id": "earlier"})
    frame = _frame(spark, 30, "x").withColumn("i", (F.col("size") % 4).cast("int")).filter("i != 2")
    staged = state.stage_split(spark, frame.repartition(3), "i", keys)
    assert all(state.read(spark, key) is None for key in keys[:3]), "nothing is visible before its commit"
    for each in staged[:3]:
        each.commit({"run_id": "split"})
    staged[3].discard()
    for i, key in enumerate(keys[:3]):
        read = state.read(spark, key)
        assert read.columns == ["address", "size", "last_modified"] and state.record(key) == {"run_id": "split"}
        assert sorted(r["size"] for r in read.collect()) == [n for n in range(30) if n % 4 == i and i != 2], key
    assert sorted(r["address"] for r in state.read(spark, keys[3]).collect()) == ["before-0", "before-1"]
    assert state.record(keys[3]) == {"run_id": "earlier"}
    assert state.read_table(keys[2]).num_rows == 0


def test_a_state_dir_that_cannot_be_written_is_named_before_anything_is_moved(s3, spark, tmp_path):
    lake, uploaded, repo = s3.export_lake(tmp_path / "local", "gc-unwritable-state")
    config = write_config(tmp_path / "gc.yaml", [repo], "s3://no-such-state-bucket/gc")
    with pytest.raises(StateError, match=r"state_dir s3://no-such-state-bucket/gc cannot be written: .*NoSuchBucket"):
        state_files(load_lake(config))
    with pytest.raises(StateError, match="state_dir s3://no-such-state-bucket/gc cannot be written"):
        run_partition(str(config), "s3-repo", dt.date.today(), mode="delete", instance=DagsterInstance.ephemeral())
    assert s3.keys("gc-unwritable-state") == uploaded


def test_sweeps_racing_from_several_processes_on_s3_exactly_one_holds_the_lease(s3):
    """The fence needs no shared disk: the lease is a conditional write in the namespace
    (If-None-Match: *), which exactly one of the racing processes wins."""
    s3.create_bucket("gc-lease-race")
    race_rounds("s3://gc-lease-race/repo", rounds=2)
