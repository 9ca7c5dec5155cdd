"""Spark servers on 127.0.0.1 for the tests and the benchmark: a standalone cluster and a
Spark Connect server, each started in its own process group and stopped with it."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import pyspark

from gc_assets.core.spark import PYTHON_DAEMON_KEY, PYTHON_DAEMON_MODULE

SPARK_HOME = Path(pyspark.__file__).parent
STARTUP_SECONDS = 90


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


def bound_web_port(log: Path, ui: str) -> int | None:
    """The port a Spark server's web UI (`ui`, as MasterWebUI) bound, as its log says: a UI whose
    port was taken meanwhile (free_port only found it free) binds the next one."""
    found = re.search(rf"Bound {ui} to \S+, and started at https?://[^:/]+:(\d+)", log.read_text(errors="replace"))
    return int(found.group(1)) if found else None


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def hidden_from(paths: Sequence[Path], command: list[str]) -> list[str]:
    """`command` in a mount namespace of its own where each of `paths` is an empty directory: a
    worker that cannot see the driver's disk, as on a cluster's other machines."""
    mounts = " && ".join(f"mount -t tmpfs gc-hidden {shlex.quote(str(path))}" for path in paths)
    isolate = ["unshare", "--mount", "--propagation", "private"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    return [*isolate, "sh", "-c", f'{mounts} && exec "$@"', "sh", *command]


@contextmanager
def standalone_cluster(tmp: Path, env: dict[str, str], hidden: Sequence[Path] = ()) -> Iterator[tuple[str, int]]:
    """A master and two one-core workers on 127.0.0.1; yields the master URL and its web UI port.
    With `hidden`, the workers cannot see those directories (hidden_from), and each works in a
    directory of its own under `tmp`, which must lie outside them."""
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, web = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    master_log = tmp / "logs" / "master.log"
    master_cmd = [
        spark_class,
        "org.apache.spark.deploy.master.Master",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--webui-port",
        str(web),
    ]
    with server(master_cmd, env, master_log) as master:

        def ready() -> bool:
            return port_open(port) and bound_web_port(master_log, "MasterWebUI") is not None

        wait_until(ready, "standalone master", master, master_log)
        web = bound_web_port(master_log, "MasterWebUI") or web  # another process may have taken the one asked for
        worker_cmd = [
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            url,
            "--host",
            "127.0.0.1",
            "--cores",
            "1",
            "--memory",
            "1g",
        ]

        def worker(number: int) -> list[str]:
            work = tmp / f"worker-{number}" if hidden else Path(env["SPARK_WORKER_DIR"])
            command = [*worker_cmd, "--work-dir", str(work), "--webui-port", str(free_port())]
            return hidden_from(hidden, command) if hidden else command

        with server(worker(1), env, tmp / "logs" / "worker-1.log"):
            with server(worker(2), env, tmp / "logs" / "worker-2.log"):
                wait_until(lambda: alive_workers(web) == 2, "two standalone workers", master, master_log)
                yield url, web


@contextmanager
def connect_server(
    tmp: Path, env: dict[str, str], master: str, driver_memory: str | None = None
) -> Iterator[tuple[str, int]]:
    """A Spark Connect server on 127.0.0.1 whose executors run on `master` (its driver has
    `driver_memory`, else Spark's default); yields sc://... and the port of its UI, whose
    REST API counts the jobs it ran."""
    port, ui = free_port(), free_port()
    log = tmp / "logs" / "connect.log"
    command = [
        str(SPARK_HOME / "sbin" / "start-connect-server.sh"),
        "--wait",
        "--master",
        master,
        *(["--driver-memory", driver_memory] if driver_memory else []),
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--conf",
        "spark.executor.memory=768m",
        "--conf",
        "spark.sql.session.timeZone=UTC",
        "--conf",
        f"spark.ui.port={ui}",
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        "--conf",
        f"{PYTHON_DAEMON_KEY}={PYTHON_DAEMON_MODULE}",  # as every session gc_assets starts itself
    ]
    with server(command, env, log) as process:
        wait_until(lambda: port_open(port) and port_open(ui), "Spark Connect server", process, log)
        yield f"sc://127.0.0.1:{port}", ui


def _connect_application(ui: int) -> str:
    """The REST API address of the Spark Connect server's one application."""
    (app,) = get_json(f"http://127.0.0.1:{ui}/api/v1/applications")
    return f"http://127.0.0.1:{ui}/api/v1/applications/{app['id']}"


def connect_property(ui: int, key: str) -> str | None:
    """A Spark property of the Spark Connect server's one application, from its REST API."""
    return dict(get_json(f"{_connect_application(ui)}/environment")["sparkProperties"]).get(key)


def connect_jobs(ui: int) -> int:
    """Jobs the Spark Connect server's one application has run, from its REST API."""
    return len(get_json(f"{_connect_application(ui)}/jobs"))
