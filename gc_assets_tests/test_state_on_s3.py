"""The state directory on an object store (stores.state.ObjectState): frames written and read by
executors through the store's client, visible whole once their manifest is written, and the
whole graph keeping every partition, journal and receipt there, nothing on the driver's disk.

The same graph on a cluster whose workers cannot see the driver's disk is test_distributed's.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
from dagster import DagsterInstance
from pyspark.sql import functions as F

from gc_assets.core.time import partition_date_of
from gc_assets.runner import run_partition, stored_table
from gc_assets.sources.discovery import load_lake
from gc_assets.stores import store_at, store_for
from gc_assets.stores.state import FRAME_MANIFEST, ObjectState, StateError, state_files
from gc_assets.sweep.holds import release
from gc_assets.sweep.trash import restore
from gc_assets_tests.lakes import write_config
from gc_assets_tests.lease_race import race_rounds
from gc_assets_tests.oracles import expected_candidates
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


def test_a_state_dir_that_cannot_be_written_is_named_before_anything_is_moved(s3, spark, tmp_path):
    lake, uploaded, repo = s3.export_lake(tmp_path / "local", "gc-unwritable-state")
    config = write_config(tmp_path / "gc.yaml", [repo], "s3://no-such-state-bucket/gc")
    with pytest.raises(StateError, match=r"state_dir s3://no-such-state-bucket/gc cannot be written: .*NoSuchBucket"):
        state_files(load_lake(config))
    with pytest.raises(StateError, match="state_dir s3://no-such-state-bucket/gc cannot be written"):
        run_partition(str(config), "s3-repo", dt.date.today(), mode="delete", instance=DagsterInstance.ephemeral())
    assert s3.keys("gc-unwritable-state") == uploaded


def test_the_graph_trashes_restores_and_deletes_with_its_state_on_s3(s3, spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative local state dir would appear here
    lake, uploaded, repo = s3.export_lake(tmp_path / "local", "gc-lake-state-on-s3")
    s3.create_bucket("gc-run-state")
    state_dir = "s3://gc-run-state/gc"
    config = write_config(tmp_path / "gc.yaml", [repo], state_dir)
    time.sleep(1.1)  # S3 times are whole seconds: every upload is now strictly before as_of
    as_of = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    s3.date_export(lake, "gc-lake-state-on-s3", "repo", as_of)
    expected = expected_candidates(lake.lake, repo["storage_namespace"], lake.rules, as_of, as_of)
    assert expected
    instance = DagsterInstance.ephemeral()
    date = partition_date_of(as_of)

    trashed = run_partition(str(config), "s3-repo", date, as_of=as_of, mode="trash", instance=instance)
    assert trashed.success, trashed.error
    assert trashed.summary["receipts"] == {"trashed": len(expected)}
    assert all(uri.startswith(f"{state_dir}/") for uri in trashed.summary["outputs"].values())
    receipts = stored_table(str(config), "deletion_receipts", date, "s3-repo").to_pylist()
    assert {r["address"] for r in receipts} == expected
    state_keys = s3.keys("gc-run-state", "gc/")
    for asset in trashed.summary["outputs"]:
        assert f"gc/{asset}/repo=s3-repo/date={date}/{FRAME_MANIFEST}" in state_keys, asset
    assert any(
        k.startswith("gc/_sweeps/repo=s3-repo/") and k.endswith(f"receipts/{FRAME_MANIFEST}") for k in state_keys
    )

    lake_config = load_lake(config)
    store = store_for(lake_config.repository("s3-repo"))
    back = restore(
        store, lake_config.repository("s3-repo"), trashed.summary["run_id"], state_files(lake_config), lambda: spark
    )
    assert back.counts == {"restored": len(expected)} and back.location.startswith(f"{state_dir}/restores/")
    assert uploaded <= s3.keys("gc-lake-state-on-s3")
    assert release(store, trashed.summary["run_id"]) == len(expected)

    time.sleep(1.1)  # the restored copies are newer than the first as-of: a later export and as-of
    again = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    s3.date_export(lake, "gc-lake-state-on-s3", "repo", again)
    deleted = run_partition(str(config), "s3-repo", date, as_of=again, mode="delete", instance=instance)
    assert deleted.success, deleted.error
    assert deleted.summary["receipts"] == {"deleted": len(expected)}
    left = {k for k in s3.keys("gc-lake-state-on-s3") if not k.startswith(("repo/_gc/", "repo/_gc_trash/"))}
    assert left == uploaded - {f"repo/{key}" for key in expected}
    assert not list(tmp_path.glob("**/_sweeps")) and not (tmp_path / ".gc_state").exists(), "nothing local"


def test_sweeps_racing_from_several_processes_on_s3_exactly_one_holds_the_lease(s3):
    """The fence needs no shared disk: the lease is a conditional write in the namespace
    (If-None-Match: *), which exactly one of the racing processes wins."""
    s3.create_bucket("gc-lease-race")
    race_rounds("s3://gc-lease-race/repo", rounds=2)
