"""A Spark standalone cluster whose workers cannot see the driver's disk, as on EMR, Dataproc or
Kubernetes: the lake and the state directory are on S3 (moto), and each worker runs in a mount
namespace of its own where every test's temporary directory (the driver's gc.yaml, its Spark
scratch space, any local state) is an empty directory. A whole graph trashes, the trash run is
restored, and a later run deletes: exactly the oracle's objects each time, every partition,
journal and receipt written by executors to the state bucket.

Each step is the `gc-assets` command a user runs, against the cluster's master.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bench.spark_servers import applications, hidden_from, spark_environment, standalone_cluster
from gc_assets.core.spark import SPARK_MASTER_ENV
from gc_assets.stores.state import FRAME_MANIFEST
from gc_assets_tests.lakes import write_config
from gc_assets_tests.oracles import expected_candidates
from gc_assets_tests.s3_server import S3Endpoint, moto_server

GC_ASSETS = Path(sys.executable).parent / "gc-assets"
COMMAND_SECONDS = 600
LAKE, STATE = "cluster-lake", "cluster-state"


def gc_assets(env: dict[str, str], *arguments: str) -> dict:
    """One command's JSON (its last line of stdout); the command must succeed."""
    result = subprocess.run(
        [str(GC_ASSETS), *arguments], env=env, capture_output=True, text=True, timeout=COMMAND_SECONDS
    )
    assert result.returncode == 0, f"{arguments[0]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_cluster_whose_workers_cannot_see_the_drivers_disk_trashes_restores_and_deletes(
    tmp_path, tmp_path_factory, monkeypatch
):
    driver_temp = tmp_path_factory.getbasetemp().parent  # every test process's temporary directories
    marker = tmp_path / "driver-only"
    marker.write_text("x")
    # What the workers get: the driver's temporary directories, empty.
    assert subprocess.run(["test", "-e", str(marker)]).returncode == 0
    assert subprocess.run(hidden_from([driver_temp], ["test", "-e", str(marker)])).returncode == 1

    with moto_server() as aws, tempfile.TemporaryDirectory(prefix="gc-cluster-") as workers_home:
        for name, value in aws.items():
            monkeypatch.setenv(name, value)
        s3 = S3Endpoint(aws["AWS_ENDPOINT_URL"])
        lake, uploaded, repo = s3.export_lake(tmp_path / "local", LAKE, churn=8)
        s3.create_bucket(STATE)
        config = str(write_config(tmp_path / "gc.yaml", [repo], f"s3://{STATE}/gc"))
        # Spark's scratch space is a temporary directory: the driver's is hidden from the workers, and
        # each worker's is its own. Both workers are on 127.0.0.1, where Spark would read the other's
        # shuffle files from disk as on one machine; these stand for two, so blocks go over the network.
        conf = tmp_path / "spark-conf"
        conf.mkdir()
        (conf / "spark-defaults.conf").write_text("spark.shuffle.readHostLocalDisk false\n")
        env = {
            **spark_environment(tmp_path),
            "SPARK_LOCAL_DIRS": str(tmp_path / "scratch"),
            "SPARK_CONF_DIR": str(conf),
        }
        time.sleep(1.1)  # S3 times are whole seconds: every upload is now strictly before as_of
        as_of = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        s3.date_export(lake, LAKE, "repo", as_of)
        expected = expected_candidates(lake.lake, repo["storage_namespace"], lake.rules, as_of, as_of)
        assert expected

        with standalone_cluster(Path(workers_home), env, hidden=[driver_temp]) as (master, web):
            on_cluster = {**env, SPARK_MASTER_ENV: master}
            run = ("run", "--config", config, "--repo", "s3-repo", "--json")
            trashed = gc_assets(on_cluster, *run, "--as-of", as_of.isoformat(), "--mode", "trash")
            state_keys = s3.keys(STATE, "gc/")
            lake_after_trash = s3.keys(LAKE)
            restored = gc_assets(
                on_cluster, "restore", "--config", config, "--repo", "s3-repo", "--run-id", trashed["run_id"]
            )
            lake_after_restore = s3.keys(LAKE)
            gc_assets(env, "release", "--config", config, "--repo", "s3-repo", "--run-id", trashed["run_id"])
            time.sleep(1.1)  # the restored copies are newer than the first as-of: a later export and as-of
            again = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
            s3.date_export(lake, LAKE, "repo", again)
            deleted = gc_assets(on_cluster, *run, "--as-of", again.isoformat(), "--mode", "delete")
            lake_after_delete = s3.keys(LAKE)
            ran = applications(web)

    assert len(ran["completedapps"]) == 3 and ran["activeapps"] == []  # trash, restore and delete ran there
    assert trashed["receipts"] == {"trashed": len(expected)} and set(trashed["checks"].values()) == {"passed"}
    assert trashed["outputs"]["deletion_receipts"].startswith(f"s3://{STATE}/gc/deletion_receipts/")
    for asset in trashed["outputs"]:
        assert f"gc/{asset}/repo=s3-repo/date={as_of.date()}/{FRAME_MANIFEST}" in state_keys, asset
    assert any(
        k.startswith("gc/_sweeps/repo=s3-repo/") and k.endswith(f"/receipts/{FRAME_MANIFEST}") for k in state_keys
    )
    trash = {f"repo/_gc_trash/{trashed['run_id']}/{key}" for key in expected}
    assert trash <= lake_after_trash and not {f"repo/{key}" for key in expected} & lake_after_trash

    assert restored["receipts"] == {"restored": len(expected)}, restored
    assert restored["output"].startswith(f"s3://{STATE}/gc/restores/repo=s3-repo/")
    assert uploaded <= lake_after_restore

    assert deleted["receipts"] == {"deleted": len(expected)} and set(deleted["checks"].values()) == {"passed"}
    left = {k for k in lake_after_delete if not k.startswith(("repo/_gc/", "repo/_gc_trash/"))}
    assert left == uploaded - {f"repo/{key}" for key in expected}
    assert not (tmp_path / ".gc_state").exists() and not list(tmp_path.glob("**/_sweeps")), (
        "no state on the driver's disk"
    )
