"""The graph on real distributed Spark, deployed as on EMR, Dataproc or Kubernetes: a standalone
cluster (master and two workers on 127.0.0.1) whose workers cannot see the driver's disk, and a
Spark Connect server in front of it. The lake and the state directory are on S3 (moto); each
worker runs in a mount namespace of its own where every test's temporary directory (the driver's
gc.yaml, its Spark scratch space, anything local) is an empty directory.

The graph trashes exactly the brute-force oracle's candidates on the cluster; then, over Spark
Connect, the trash run is restored and released, and a later run deletes them: exactly the
oracle's objects each time, judged alike both ways, every partition, journal and receipt
written to the state bucket by executors. The master's own application list shows the first run
registered with it, and the Connect server's job count shows the others ran there. Executor work
needs no RDD API and nothing on the driver's disk.

Each step that runs Spark is the `gc-assets` command a user runs, so the session-wide local Spark
of the other tests is left alone; `release` (no Spark) runs in the test's process.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bench.spark_servers import (
    applications,
    connect_jobs,
    connect_property,
    connect_server,
    hidden_from,
    spark_environment,
    standalone_cluster,
)
from gc_assets.core.spark import SPARK_MASTER_ENV, SPARK_REMOTE_ENV
from gc_assets.core.time import partition_date_of
from gc_assets.runner import stored_table
from gc_assets.stores.state import FRAME_MANIFEST
from gc_assets_tests.cli_runs import run_cli, summary_of
from gc_assets_tests.lakes import write_config
from gc_assets_tests.oracles import expected_candidates
from gc_assets_tests.s3_server import S3Endpoint, moto_server

GC_ASSETS = Path(sys.executable).parent / "gc-assets"
COMMAND_SECONDS = 600
LAKE, STATE, REPO = "cluster-lake", "cluster-state", "s3-repo"
COUNTS = ("retained_commits", "expired_commits", "live_objects", "orphan_candidates")


def gc_assets(env: dict[str, str], *arguments: str) -> dict:
    """One command's JSON (its last line of stdout); the command must succeed."""
    result = subprocess.run(
        [str(GC_ASSETS), *arguments], env=env, capture_output=True, text=True, timeout=COMMAND_SECONDS
    )
    assert result.returncode == 0, f"{arguments[0]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return summary_of(result.stdout)


def addresses(config: str, asset: str, as_of: dt.datetime) -> set[str]:
    table = stored_table(config, asset, partition_date_of(as_of), REPO)
    assert table is not None, asset
    return set(table.column("address").to_pylist())


@pytest.mark.slow
def test_a_cluster_whose_workers_cannot_see_the_drivers_disk_and_spark_connect_collect_exactly(
    tmp_path, tmp_path_factory, monkeypatch, capfd
):
    driver_temp = tmp_path_factory.getbasetemp().parent  # every test process's temporary directories
    marker = tmp_path / "driver-only"
    marker.write_text("x")
    # What the workers get: the driver's temporary directories, empty.
    assert subprocess.run(["test", "-e", str(marker)]).returncode == 0
    assert subprocess.run(hidden_from([driver_temp], ["test", "-e", str(marker)])).returncode == 1

    with moto_server() as aws, tempfile.TemporaryDirectory(prefix="gc-cluster-") as outside:
        for name, value in aws.items():
            monkeypatch.setenv(name, value)
        s3 = S3Endpoint(aws["AWS_ENDPOINT_URL"])
        lake, uploaded, repo = s3.export_lake(tmp_path / "local", LAKE, churn=8)
        s3.create_bucket(STATE)
        config = str(write_config(tmp_path / "gc.yaml", [repo], f"s3://{STATE}/gc"))
        # Spark's scratch space is a temporary directory: the driver's is hidden from the workers, and
        # each worker's is its own. Both workers are on 127.0.0.1, where Spark would read the other's
        # shuffle files from disk as on one machine; these stand for two, so blocks go over the network.
        # Every JVM here lives for one run or two: the fast compiler alone, as a local session's driver
        # has it (core.spark.LOCAL_DRIVER_JAVA_OPTIONS), spares the optimizing one's work on two cores.
        conf = tmp_path / "spark-conf"
        conf.mkdir()
        (conf / "spark-defaults.conf").write_text(
            "spark.shuffle.readHostLocalDisk false\n"
            "spark.driver.extraJavaOptions -XX:TieredStopAtLevel=1\n"
            "spark.executor.extraJavaOptions -XX:TieredStopAtLevel=1\n"
        )
        env = {
            **spark_environment(tmp_path),
            "SPARK_LOCAL_DIRS": str(tmp_path / "scratch"),
            "SPARK_CONF_DIR": str(conf),
            "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1",
        }
        time.sleep(1.1)  # S3 times are whole seconds: every upload is now strictly before as_of
        as_of = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        s3.date_export(lake, LAKE, "repo", as_of)
        expected = expected_candidates(lake.lake, repo["storage_namespace"], lake.rules, as_of, as_of)
        assert expected
        run = ("run", "--config", config, "--repo", REPO, "--json")

        with standalone_cluster(Path(outside), env, hidden=[driver_temp]) as (master, web):
            assert applications(web) == {"activeapps": [], "completedapps": []}
            on_master = {**env, SPARK_MASTER_ENV: master}
            trashed = gc_assets(on_master, *run, "--as-of", as_of.isoformat(), "--mode", "trash")
            trashed_candidates = addresses(config, "orphan_candidates", as_of)
            trashed_receipts = addresses(config, "deletion_receipts", as_of)
            state_keys, lake_after_trash = s3.keys(STATE, "gc/"), s3.keys(LAKE)
            ran_on_master = applications(web)  # the run registered with the master, and finished
            with connect_server(Path(outside), env, master, driver_memory="1g") as (remote, ui):
                serving = applications(web)
                server_memory = connect_property(ui, "spark.driver.memory")
                jobs_before = connect_jobs(ui)
                on_connect = {**env, SPARK_REMOTE_ENV: remote}
                back = ("restore", "--config", config, "--repo", REPO, "--run-id", trashed["run_id"])
                restored = gc_assets(on_connect, *back)
                lake_after_restore = s3.keys(LAKE)
                # Lifting the restore's holds needs no Spark: the command runs in this process.
                released = run_cli(capfd, "release", "--config", config, "--repo", REPO, "--run-id", trashed["run_id"])
                time.sleep(1.1)  # the restored copies are newer than the first as-of: a later export and as-of
                again = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
                s3.date_export(lake, LAKE, "repo", again)
                deleted = gc_assets(on_connect, *run, "--as-of", again.isoformat(), "--mode", "delete")
                lake_after_delete = s3.keys(LAKE)
                jobs_run = connect_jobs(ui) - jobs_before

    assert ran_on_master["activeapps"] == [] and len(ran_on_master["completedapps"]) == 1
    assert len(serving["activeapps"]) == 1  # the Connect server, whose executors are the cluster's
    assert jobs_run > 0  # the later runs' jobs ran in the Connect server, not in a local session
    assert server_memory == "1g"  # the server's own driver is sized as asked (the bench gives it a local run's)

    assert trashed_candidates == trashed_receipts == expected
    assert trashed["receipts"] == {"trashed": len(expected)} and set(trashed["checks"].values()) == {"passed"}
    assert trashed["inventory_objects"] == len(uploaded)
    assert trashed["outputs"]["orphan_candidates"].startswith(f"s3://{STATE}/gc/orphan_candidates/")
    for asset in trashed["outputs"]:
        assert f"gc/{asset}/repo={REPO}/date={as_of.date()}/{FRAME_MANIFEST}" in state_keys, asset
    assert any(k.startswith("gc/_sweeps/set/") and k.endswith(f"/receipts/{FRAME_MANIFEST}") for k in state_keys)
    trash = {f"repo/_gc_trash/{trashed['run_id']}/{key}" for key in expected}
    assert trash <= lake_after_trash and not {f"repo/{key}" for key in expected} & lake_after_trash

    assert restored["receipts"] == {"restored": len(expected)}, restored
    assert restored["output"].startswith(f"s3://{STATE}/gc/restores/repo={REPO}/")
    assert uploaded <= lake_after_restore
    assert released.returncode == 0, released.stderr
    assert summary_of(released.stdout)["released"] == len(expected), released.stdout

    assert deleted["receipts"] == {"deleted": len(expected)} and set(deleted["checks"].values()) == {"passed"}
    assert {k: deleted[k] for k in COUNTS} == {k: trashed[k] for k in COUNTS}  # Connect judges as the cluster did
    left = {k for k in lake_after_delete if not k.startswith(("repo/_gc/", "repo/_gc_trash/"))}
    assert left == uploaded - {f"repo/{key}" for key in expected}
    assert not (tmp_path / ".gc_state").exists() and not list(tmp_path.glob("**/_sweeps")), (
        "no state on the driver's disk"
    )
