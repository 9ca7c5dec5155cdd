"""The UI end to end: `dagster dev` on 127.0.0.1 for the project's workspace and instance
configuration, queried and driven through its GraphQL API as the UI does.

The launched run goes through the queued run coordinator of dagster.yaml and the
daemon, and executes in a run worker subprocess, exactly as a click in the UI would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gc_assets.defs.concurrency import REPOSITORY_TAG
from gc_assets_tests.lakes import GC_DATE, lake_on_disk

PROJECT = Path(__file__).resolve().parent.parent
DAGSTER = Path(sys.executable).with_name("dagster")
LOCATION = {"repositoryLocationName": "gc_assets", "repositoryName": "__repository__"}
STARTUP_TIMEOUT = 240
RUN_TIMEOUT = 900  # a loaded machine runs the whole graph in minutes

ASSETS_QUERY = """
{
  assetNodes {
    assetKey { path }
    groupName
    kinds
    description
    isPartitioned
    assetChecksOrError { ... on AssetChecks { checks { name description blocking } } }
  }
}
"""
AUTOMATION_QUERY = """
query ($selector: RepositorySelector!) {
  sensorsOrError(repositorySelector: $selector) { ... on Sensors { results { name description } } }
  schedulesOrError(repositorySelector: $selector) { ... on Schedules { results { name cronSchedule } } }
}
"""
ADD_PARTITION = """
mutation ($selector: RepositorySelector!, $key: String!) {
  addDynamicPartition(repositorySelector: $selector, partitionsDefName: "repositories", partitionKey: $key) {
    __typename
    ... on PythonError { message }
  }
}
"""
LAUNCH_RUN = """
mutation ($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
LAUNCH_BACKFILL = """
mutation ($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""
REPOSITORY_RUNS = """
query ($tags: [ExecutionTag!]) {
  runsOrError(filter: {tags: $tags}) {
    ... on Runs { results { runId status startTime endTime tags { key value } } }
  }
}
"""
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}
RESULTS_QUERY = """
query ($partition: String!) {
  assetNodes {
    assetKey { path }
    latestMaterializationByPartition(partitions: [$partition]) {
      metadataEntries {
        label
        __typename
        ... on IntMetadataEntry { intValue }
        ... on MarkdownMetadataEntry { mdStr }
      }
    }
    assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization { status } } } }
  }
}
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _graphql(port: int, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        payload = json.loads(response.read())
    assert "errors" not in payload, payload["errors"]
    return payload["data"]


def _wait_for_definitions(port: int, server: subprocess.Popen) -> list[dict[str, Any]]:
    """Poll until the webserver answers and the code location has loaded its assets."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        assert server.poll() is None, "dagster dev exited during startup"
        try:
            nodes = _graphql(port, ASSETS_QUERY)["assetNodes"]
            if nodes:
                return nodes
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(2)
    raise AssertionError(f"the webserver did not serve the asset graph within {STARTUP_TIMEOUT}s")


def _stop(server: subprocess.Popen) -> None:
    """Stop dagster dev and everything it spawned (webserver, daemon, code server, run workers)."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(server.pid, signal.SIGKILL)  # children that outlived dagster dev
    except ProcessLookupError:
        pass


@pytest.mark.slow
def test_ui_serves_the_graph_materializes_a_partition_and_queues_a_backfill_behind_it(tmp_path):
    lake = lake_on_disk(tmp_path / "lake", churn=5)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT / "dagster.yaml", home / "dagster.yaml")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "GC_ASSETS_CONFIG": str(lake.config_path),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "GC_ASSETS_SPARK_MASTER": "local[2]",
    }
    port = _free_port()
    log = open(tmp_path / "dagster_dev.log", "wb")
    started = time.monotonic()
    server = subprocess.Popen(
        [str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=PROJECT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        nodes = {tuple(n["assetKey"]["path"]): n for n in _wait_for_definitions(port, server)}
        startup = time.monotonic() - started
        assert set(nodes) == {
            ("retained_commits",),
            ("live_files",),
            ("object_inventory",),
            ("orphan_candidates",),
            ("deletion_receipts",),
            ("retention_whatif",),
        }
        whatif = nodes.pop(("retention_whatif",))
        assert whatif["groupName"] == "questions" and not whatif["isPartitioned"] and whatif["description"]
        for node in nodes.values():
            assert node["isPartitioned"] and node["description"]
            assert node["groupName"] in {"mark", "sweep"} and "spark" in node["kinds"]
        assert "lakefs" in nodes[("retained_commits",)]["kinds"]
        checks = {c["name"]: c for n in nodes.values() for c in n["assetChecksOrError"]["checks"]}
        assert len(checks) == 9 and all(c["description"] for c in checks.values())
        assert checks["candidates_not_live"]["blocking"] and not checks["live_objects_intact"]["blocking"]

        automation = _graphql(port, AUTOMATION_QUERY, {"selector": LOCATION})
        assert {s["name"] for s in automation["sensorsOrError"]["results"]} == {"repository_registry", "new_commits"}
        assert [(s["name"], s["cronSchedule"]) for s in automation["schedulesOrError"]["results"]] == [
            ("daily_gc", "0 3 * * *")
        ]

        repo = lake.lake.name
        added = _graphql(port, ADD_PARTITION, {"selector": LOCATION, "key": repo})["addDynamicPartition"]
        # The registry sensor may have added it first; both outcomes leave the partition in place.
        assert added["__typename"] in {"AddDynamicPartitionSuccess", "DuplicateDynamicPartitionError"}, added

        date = GC_DATE.isoformat()
        tags = {"dagster/partition": f"{date}|{repo}", "dagster/partition/date": date, REPOSITORY_TAG: repo}
        params = {
            "selector": {**LOCATION, "jobName": "gc_job"},
            "runConfigData": {"ops": {"collect_partition": {"config": {"mode": "dry_run"}}}},
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
        }
        before = lake.files()
        launched = _graphql(port, LAUNCH_RUN, {"params": params})["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]

        # A backfill of the mark group for the day before, launched while the gc_job run is
        # queued or running: its run carries the repository tag, and the queue runs the two
        # one after the other.
        backfill = {
            "partitionNames": [f"2022-03-30|{repo}"],
            "assetSelection": [{"path": ["retained_commits"]}, {"path": ["live_files"]}],
            "fromFailure": False,
        }
        backfilled = _graphql(port, LAUNCH_BACKFILL, {"params": backfill})["launchPartitionBackfill"]
        assert backfilled["__typename"] == "LaunchBackfillSuccess", backfilled

        run_started = time.monotonic()
        runs: list[dict[str, Any]] = []
        while time.monotonic() - run_started < RUN_TIMEOUT:
            filter_tags = [{"key": REPOSITORY_TAG, "value": repo}]
            runs = _graphql(port, REPOSITORY_RUNS, {"tags": filter_tags})["runsOrError"]["results"]
            if len(runs) == 2 and all(r["status"] in FINISHED for r in runs):
                break
            time.sleep(3)
        log_tail = (tmp_path / "dagster_dev.log").read_text()[-3000:]
        assert [r["status"] for r in runs] == ["SUCCESS"] * 2, (runs, log_tail)
        backfill_run = next(r for r in runs if r["runId"] != run_id)
        backfill_tags = {t["key"]: t["value"] for t in backfill_run["tags"]}
        assert backfill_tags["dagster/backfill"] == backfilled["backfillId"]
        assert backfill_tags["dagster/partition/date"] == "2022-03-30"
        first, second = sorted(runs, key=lambda r: r["startTime"])
        assert second["startTime"] >= first["endTime"], "two runs of one repository overlapped"

        results = {
            tuple(n["assetKey"]["path"]): n
            for n in _graphql(port, RESULTS_QUERY, {"partition": f"{date}|{repo}"})["assetNodes"]
        }
        candidates = results[("orphan_candidates",)]["latestMaterializationByPartition"][0]["metadataEntries"]
        by_label = {entry["label"]: entry for entry in candidates}
        assert by_label["orphan_candidates"]["intValue"] > 0 and by_label["reclaimable_bytes"]["intValue"] > 0
        assert by_label["top_prefixes"]["mdStr"].startswith("| prefix | objects | bytes |")
        statuses = {
            c["name"]: (c["executionForLatestMaterialization"] or {}).get("status")
            for n in results.values()
            for c in n["assetChecksOrError"]["checks"]
        }
        assert set(statuses.values()) == {"SUCCEEDED"}, statuses
        assert lake.files() == before  # dry run: storage untouched
        print(
            f"webserver ready after {startup:.0f}s; both runs done {time.monotonic() - run_started:.0f}s after launch"
        )
    finally:
        _stop(server)
        log.close()
