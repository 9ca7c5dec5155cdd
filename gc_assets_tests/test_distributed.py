"""The graph on real distributed Spark: a standalone cluster (master and two workers on
127.0.0.1) and a Spark Connect server in front of it. Both must find exactly the
candidates of the brute-force oracle that local mode is held to (test_graph), with the
same counts, which proves that nothing depends on driver-local state and that
executor work needs no RDD API. The master's own application list shows the first run
registered with it, and the Connect server's job count shows the second ran there.

Each run is a `gc-assets run --json` subprocess, so the session-wide local Spark of
the other tests is left alone.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq
import pyspark
import pytest
import yaml

from gc_assets.core.spark import SPARK_MASTER_ENV, SPARK_REMOTE_ENV
from gc_assets_tests.lakes import AS_OF, GC_DATE, lake_on_disk, write_config
from gc_assets_tests.oracles import expected_candidates

SPARK_HOME = Path(pyspark.__file__).parent
GC_ASSETS = Path(sys.executable).parent / "gc-assets"
MIN_AGE_HOURS = 24
STARTUP_SECONDS = 90
RUN_SECONDS = 900


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_environment(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}  # ephemeral Dagster instances
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOG_DIR=str(tmp / "spark-logs"),
        SPARK_PID_DIR=str(tmp / "spark-pids"),
        SPARK_WORKER_DIR=str(tmp / "spark-work"),
        GC_ASSETS_SHUFFLE_PARTITIONS="2",
        GC_ASSETS_DRIVER_MEMORY="1g",
    )
    return env


@contextmanager
def server(command: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """A server process in its own process group, stopped (with its children) on exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if process.poll() is not None:
                break
            os.killpg(process.pid, sig)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                continue


def wait_until(predicate, what: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{what}: the server exited early:\n{log.read_text()[-3000:]}")
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"{what}: not ready after {STARTUP_SECONDS}s:\n{log.read_text()[-3000:]}")


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def alive_workers(web_port: int) -> int:
    return int(get_json(f"http://127.0.0.1:{web_port}/json/").get("aliveworkers", 0))


def applications(web_port: int) -> dict[str, list[str]]:
    """The standalone master's own record: ids of its active and completed applications."""
    state = get_json(f"http://127.0.0.1:{web_port}/json/")
    return {kind: [app["id"] for app in state.get(kind, [])] for kind in ("activeapps", "completedapps")}


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def standalone_cluster(tmp: Path, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A master and two one-core workers on 127.0.0.1; yields the master URL and its web UI port."""
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, web = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    master_log = tmp / "logs" / "master.log"
    master_cmd = [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(web)]
    with server(master_cmd, env, master_log) as master:
        wait_until(lambda: port_open(port), "standalone master", master, master_log)
        worker_cmd = [
            spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
            "--cores", "1", "--memory", "1g", "--work-dir", env["SPARK_WORKER_DIR"],
        ]
        with server(worker_cmd + ["--webui-port", str(free_port())], env, tmp / "logs" / "worker-1.log"):
            with server(worker_cmd + ["--webui-port", str(free_port())], env, tmp / "logs" / "worker-2.log"):
                wait_until(lambda: alive_workers(web) == 2, "two standalone workers", master, master_log)
                yield url, web


@contextmanager
def connect_server(tmp: Path, env: dict[str, str], master: str) -> Iterator[tuple[str, int]]:
    """A Spark Connect server on 127.0.0.1 whose executors run on `master`; yields sc://...
    and the port of its UI, whose REST API counts the jobs it ran."""
    port, ui = free_port(), free_port()
    log = tmp / "logs" / "connect.log"
    command = [
        str(SPARK_HOME / "sbin" / "start-connect-server.sh"), "--wait",
        "--master", master,
        "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.executor.memory=768m",
        "--conf", "spark.sql.session.timeZone=UTC",
        "--conf", f"spark.ui.port={ui}",
        "--conf", f"spark.pyspark.python={sys.executable}",
    ]
    with server(command, env, log) as process:
        wait_until(lambda: port_open(port) and port_open(ui), "Spark Connect server", process, log)
        yield f"sc://127.0.0.1:{port}", ui


def connect_jobs(ui: int) -> int:
    """Jobs the Spark Connect server's one application has run, from its REST API."""
    (app,) = get_json(f"http://127.0.0.1:{ui}/api/v1/applications")
    return len(get_json(f"http://127.0.0.1:{ui}/api/v1/applications/{app['id']}/jobs"))


def run_cli(config: Path, repo: str, env: dict[str, str]) -> dict:
    result = subprocess.run(
        [str(GC_ASSETS), "run", "--config", str(config), "--repo", repo, "--date", GC_DATE.isoformat(), "--mode", "dry-run", "--json"],
        env=env, capture_output=True, text=True, timeout=RUN_SECONDS,
    )
    assert result.returncode == 0, f"gc-assets run failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def candidates(summary: dict) -> set[str]:
    return set(pq.read_table(summary["outputs"]["orphan_candidates"], columns=["address"]).column("address").to_pylist())


@pytest.mark.slow
def test_standalone_cluster_and_spark_connect_find_the_oracle_candidates(tmp_path):
    lake = lake_on_disk(tmp_path, churn=20)
    expected = expected_candidates(
        lake.lake, lake.namespace_uri, lake.rules, AS_OF, AS_OF - dt.timedelta(hours=MIN_AGE_HOURS)
    )
    assert expected

    repo = yaml.safe_load(lake.config_path.read_text())["repositories"][0]
    env = spark_environment(tmp_path)
    with standalone_cluster(tmp_path, env) as (master, web):
        assert applications(web) == {"activeapps": [], "completedapps": []}
        standalone_config = write_config(tmp_path / "standalone.yaml", [repo], tmp_path / "state-standalone")
        standalone = run_cli(standalone_config, lake.lake.name, {**env, SPARK_MASTER_ENV: master})
        ran_on_master = applications(web)  # the run registered with the master, and finished
        with connect_server(tmp_path, env, master) as (remote, ui):
            serving = applications(web)
            jobs_before = connect_jobs(ui)
            connect_config = write_config(tmp_path / "connect.yaml", [repo], tmp_path / "state-connect")
            connected = run_cli(connect_config, lake.lake.name, {**env, SPARK_REMOTE_ENV: remote})
            jobs_run = connect_jobs(ui) - jobs_before

    assert ran_on_master["activeapps"] == [] and len(ran_on_master["completedapps"]) == 1
    assert len(serving["activeapps"]) == 1  # the Connect server, whose executors are the cluster's
    assert jobs_run > 0  # the second run's jobs ran in the Connect server, not in a local session

    assert candidates(standalone) == expected
    assert standalone["receipts"] == {"would_delete": len(expected)}
    assert standalone["inventory_objects"] == len(lake.files())
    assert set(standalone["checks"].values()) == {"passed"}
    assert candidates(connected) == expected
    assert {k: v for k, v in connected.items() if k not in ("run_id", "outputs")} == {
        k: v for k, v in standalone.items() if k not in ("run_id", "outputs")
    }
