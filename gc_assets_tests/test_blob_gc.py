"""The whole graph on Azure and GCS namespaces: one generated lakeFS repository (JSON Lines
export) per emulator, uploaded once, collected in dry run, then in trash mode (the sweep only,
against the dry run's mark), restored, released and collected again in delete mode, removing
exactly the oracle's objects and leaving every live object in place. Metadata (the export) is
read from the emulator too.

Time rule as in test_s3_gc.py: objects are stamped at upload, so the test collects as of a
moment just after it, with min_object_age_hours 0 (allow_unsafe_min_age); a restore writes
the objects anew, so the delete run collects as of a moment after the restore.
"""

from __future__ import annotations

import datetime as dt
import json
import time

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance

from gc_assets import cli
from gc_assets.core.time import partition_date_of
from gc_assets.runner import run_partition
from gc_assets_tests.blob_servers import azurite, fake_gcs  # noqa: F401 - the fixtures
from gc_assets_tests.lakes import export_entry, lake_on_disk, write_config
from gc_assets_tests.oracles import expected_candidates
from gc_assets_tests.sweep_runs import receipts_of, receipts_only

CONTAINER = "gc-lake"


@pytest.fixture(params=["azurite", "fake_gcs"], scope="module")
def cloud(request):
    return request.getfixturevalue(request.param)


def _outside_gc(keys: set[str]) -> set[str]:
    return {k for k in keys if not k.startswith(("repo/_gc/", "repo/_gc_trash/"))}


def test_lake_is_collected_in_dry_run_trash_restore_and_delete_mode(cloud, spark, tmp_path):
    lake = lake_on_disk(tmp_path / "local", fmt="jsonl", churn=40)
    cloud.create(CONTAINER)
    uploaded = cloud.upload_tree(lake.namespace, CONTAINER, "repo")
    namespace = cloud.namespace(CONTAINER, "repo")
    repo = export_entry("blob-repo", namespace)
    config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")
    manifest = json.loads((lake.namespace / "_lakefs" / "export" / "_manifest.json").read_text())

    def exported_now() -> dt.datetime:
        """An export taken now (objects written after an export's time are never candidates)."""
        time.sleep(1.1)  # storage times are whole seconds: every write is now strictly before as_of
        moment = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        cloud.put(
            CONTAINER,
            "repo/_lakefs/export/_manifest.json",
            json.dumps({**manifest, "exported_at": moment.isoformat()}).encode(),
        )
        return moment

    as_of = exported_now()
    expected = expected_candidates(lake.lake, namespace, lake.rules, as_of, as_of)
    assert expected and all(f"repo/{key}" in uploaded for key in expected)
    removed = {f"repo/{key}" for key in expected}
    instance = DagsterInstance.ephemeral()

    dry = run_partition(
        str(config), "blob-repo", partition_date_of(as_of), as_of=as_of, mode="dry_run", instance=instance
    )
    assert dry.success, dry.error
    assert {r["address"] for r in pq.read_table(dry.summary["outputs"]["orphan_candidates"]).to_pylist()} == expected
    assert dry.summary["receipts"] == {"would_delete": len(expected)}
    assert dry.summary["inventory_objects"] == len(uploaded)
    assert cloud.keys(CONTAINER) == uploaded  # dry run leaves storage untouched

    trashed = receipts_only(config, "blob-repo", as_of, instance, "trash")
    assert trashed.success
    receipts = receipts_of(trashed)
    assert {r["address"] for r in receipts} == expected and {r["action"] for r in receipts} == {"trashed"}
    run_id = receipts[0]["run_id"]
    keys = cloud.keys(CONTAINER)
    assert _outside_gc(keys) == uploaded - removed
    assert {f"repo/_gc_trash/{run_id}/{key}" for key in expected} <= keys

    arguments = ["--config", str(config), "--repo", "blob-repo", "--run-id", run_id]
    assert cli.main(["restore", *arguments]) == 0
    assert _outside_gc(cloud.keys(CONTAINER)) == uploaded  # every object back where it was
    assert cli.main(["release", *arguments]) == 0

    as_of = exported_now()
    assert expected_candidates(lake.lake, namespace, lake.rules, as_of, as_of) == expected
    deleted = run_partition(
        str(config), "blob-repo", partition_date_of(as_of), as_of=as_of, mode="delete", instance=instance
    )
    assert deleted.success, deleted.error
    assert deleted.summary["receipts"] == {"deleted": len(expected)}
    assert set(deleted.summary["checks"].values()) == {"passed"}  # live_objects_intact among them
    assert _outside_gc(cloud.keys(CONTAINER)) == uploaded - removed
