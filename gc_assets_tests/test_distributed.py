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
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from bench.spark_servers import (
    applications,
    connect_jobs,
    connect_property,
    connect_server,
    spark_environment,
    standalone_cluster,
)
from gc_assets.core.spark import SPARK_MASTER_ENV, SPARK_REMOTE_ENV
from gc_assets_tests.lakes import AS_OF, GC_DATE, lake_on_disk, write_config
from gc_assets_tests.oracles import expected_candidates

GC_ASSETS = Path(sys.executable).parent / "gc-assets"
MIN_AGE_HOURS = 24
RUN_SECONDS = 900


def run_cli(config: Path, repo: str, env: dict[str, str]) -> dict:
    result = subprocess.run(
        [
            str(GC_ASSETS),
            "run",
            "--config",
            str(config),
            "--repo",
            repo,
            "--date",
            GC_DATE.isoformat(),
            "--mode",
            "dry-run",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
    )
    assert result.returncode == 0, (
        f"gc-assets run failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def candidates(summary: dict) -> set[str]:
    return set(
        pq.read_table(summary["outputs"]["orphan_candidates"], columns=["address"]).column("address").to_pylist()
    )


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
        with connect_server(tmp_path, env, master, driver_memory="1g") as (remote, ui):
            serving = applications(web)
            server_memory = connect_property(ui, "spark.driver.memory")
            jobs_before = connect_jobs(ui)
            connect_config = write_config(tmp_path / "connect.yaml", [repo], tmp_path / "state-connect")
            connected = run_cli(connect_config, lake.lake.name, {**env, SPARK_REMOTE_ENV: remote})
            jobs_run = connect_jobs(ui) - jobs_before

    assert ran_on_master["activeapps"] == [] and len(ran_on_master["completedapps"]) == 1
    assert len(serving["activeapps"]) == 1  # the Connect server, whose executors are the cluster's
    assert jobs_run > 0  # the second run's jobs ran in the Connect server, not in a local session
    assert server_memory == "1g"  # the server's own driver is sized as asked (the bench gives it a local run's)

    assert candidates(standalone) == expected
    assert standalone["receipts"] == {"would_delete": len(expected)}
    assert standalone["inventory_objects"] == len(lake.files())
    assert set(standalone["checks"].values()) == {"passed"}
    assert candidates(connected) == expected
    assert {k: v for k, v in connected.items() if k not in ("run_id", "outputs")} == {
        k: v for k, v in standalone.items() if k not in ("run_id", "outputs")
    }
