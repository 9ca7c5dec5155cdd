"""Sweeps as tests drive them: a `gc-assets run` killed with SIGKILL right after its sweep
journaled a first chunk, the Dagster instance it left behind (as run monitoring reports
it), and the receipts a run materialized."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import pyarrow.parquet as pq
from dagster import DagsterInstance, ExecuteInProcessResult

from bench.environment import environment
from gc_assets.sweep.sweeper import CHUNK_OBJECTS_ENV
from gc_assets_tests.conftest import NO_STEP_LOG_CAPTURE

SWEEP_CHUNK_OBJECTS = 100


def run_killed_after_first_chunk(
    tmp_path: Path,
    arguments: list[str],
    journaled: Optional[Callable[[], bool]] = None,
    poll_seconds: float = 0.05,
    chunk_objects: int = SWEEP_CHUNK_OBJECTS,
) -> Path:
    """Start `gc-assets run ARGUMENTS` (chunks of `chunk_objects` objects), kill it once a
    chunk is journaled (by default: a table's own under <tmp_path>/state/_sweeps, looked for
    every `poll_seconds`); returns its DAGSTER_HOME."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n" + NO_STEP_LOG_CAPTURE)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "GC_ASSETS_SHUFFLE_PARTITIONS": "1",
        CHUNK_OBJECTS_ENV: str(chunk_objects),
    }
    command = [sys.executable, "-m", "gc_assets.cli", "run", *arguments, "--json"]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    journal = tmp_path / "state" / "_sweeps"
    journaled = journaled or (lambda: a_chunk_journaled(journal))
    deadline = time.monotonic() + 600
    while not journaled():
        assert process.poll() is None, "the sweep ended before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(poll_seconds)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return home


def a_chunk_journaled(journal: Path, owner: str = "repo=*") -> bool:
    """Whether a chunk's receipts are complete (in a set's journal: `owner` "set"); a pattern that
    never walks Spark's temporary directories."""
    try:
        return bool(list(journal.glob(f"{owner}/date=*/mark=*/chunk-*/_SUCCESS")))
    except FileNotFoundError:  # a directory removed while it was read
        return False


@contextmanager
def instance_after_kill(home: Path, config_path: Path) -> Iterator[DagsterInstance]:
    """The killed run's instance with that run marked failed, ready to re-execute from failure."""
    with environment({"DAGSTER_HOME": str(home), "GC_ASSETS_CONFIG": str(config_path)}):
        instance = DagsterInstance.get()
        for run in [r for r in instance.get_runs() if r.status.value in ("STARTED", "STARTING")]:
            instance.report_run_failed(run)
        yield instance


def receipts_of(result: ExecuteInProcessResult) -> list[dict]:
    """The deletion_receipts rows the run materialized, by address."""
    path = next(
        e.materialization.metadata["path"].value
        for e in result.get_asset_materialization_events()
        if e.materialization.asset_key.path[-1] == "deletion_receipts"
    )
    return sorted(pq.read_table(path).to_pylist(), key=lambda r: r["address"])


def race_exclusive_writes(store, key: str, writers: int) -> list[int]:
    """`writers` threads released at once, each writing its own text to `key` exclusively;
    returns the indexes of those told they won, after checking the stored text is a winner's."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    start = threading.Barrier(writers)

    def write(index: int) -> bool:
        start.wait()
        return store.write_text(key, f"writer-{index}", exclusive=True)

    with ThreadPoolExecutor(writers) as pool:
        won = [i for i, ok in enumerate(pool.map(write, range(writers))) if ok]
    assert store.read_text(key) in {f"writer-{i}" for i in won}
    return won


def receipts_only(config: Path, repo: str, as_of, instance: DagsterInstance, mode: str) -> ExecuteInProcessResult:
    """Re-execute only deletion_receipts of the partition (the mark stays the one materialized)."""
    from dagster import AssetKey

    from gc_assets.core.config import load_config
    from gc_assets.core.time import AS_OF_TAG, partition_date_of
    from gc_assets.defs.assets.collect import mode_run_config
    from gc_assets.defs.build import build_definitions
    from gc_assets.defs.partitions import partition_key

    job = build_definitions(load_config(config), str(config)).resolve_job_def("sweep_job")
    return job.execute_in_process(
        instance=instance,
        partition_key=partition_key(partition_date_of(as_of), repo),
        tags={AS_OF_TAG: as_of.isoformat()},
        run_config=mode_run_config(mode),
        raise_on_error=False,
        asset_selection=[AssetKey("deletion_receipts")],
    )


def outcome_of(result: ExecuteInProcessResult, instance: DagsterInstance, repo: str, date, as_of, mode: str):
    """A run's outcome as run_partition reports it (a RunOutcome), from the events its instance
    stored (a failed step's own result holds only those it yielded): failed when its step failed
    or a check it judged did not pass."""
    from gc_assets.defs.set_runs import TOLD, fleet_outcomes

    heard = [
        entry
        for entry in instance.all_logs(result.run_id)
        if entry.dagster_event is not None and entry.dagster_event.event_type in TOLD
    ]
    check_names = [key.name for key in result.job_def.asset_layer.asset_graph.asset_check_keys]
    return fleet_outcomes(heard, result, [repo], date, as_of, check_names, lambda _: mode)[0]


def sweep_only(config: Path, repo: str, as_of, instance: DagsterInstance, mode: str):
    """receipts_only reported as run_partition reports a run, its checks the sweep's."""
    from gc_assets.core.time import partition_date_of

    result = receipts_only(config, repo, as_of, instance, mode)
    return outcome_of(result, instance, repo, partition_date_of(as_of), as_of, mode)
