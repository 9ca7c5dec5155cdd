"""gc-assets as scripts use it: `run --json` as a process of its own, `export` and the exit
statuses of bad input in this process (gc_assets_tests.cli_runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gc_assets.core.spark import DRIVER_JAVA_OPTIONS_ENV, SPARK_MASTER_ENV, SPARK_REMOTE_ENV
from gc_assets_tests.cli_runs import run_cli, summary_of
from gc_assets_tests.lakes import GC_DATE, lake_on_disk

EXPECTED_KEYS = [
    "repo",
    "date",
    "as_of",
    "mode",
    "run_id",
    "retained_commits",
    "expired_commits",
    "live_objects",
    "inventory_objects",
    "inventory_bytes",
    "orphan_candidates",
    "reclaimable_bytes",
    "receipts",
    "checks",
    "outputs",
]


EXPECTED_ASSETS = ["retained_commits", "live_files", "object_inventory", "orphan_candidates", "deletion_receipts"]


def test_run_json_then_export(tmp_path, capfd):
    """The installed `gc-assets` as a process of its own, as scripts run it: its exit status,
    its last line and what reaches its terminal."""
    lake = lake_on_disk(tmp_path, churn=0)
    before = lake.files()
    env = {**os.environ, "GC_ASSETS_SHUFFLE_PARTITIONS": "2"}
    for name in ("DAGSTER_HOME", SPARK_MASTER_ENV, SPARK_REMOTE_ENV, DRIVER_JAVA_OPTIONS_ENV):
        env.pop(name, None)
    command = [str(Path(sys.executable).with_name("gc-assets")), "run", "--config", str(lake.config_path)]
    done = subprocess.run(
        [*command, "--repo", lake.lake.name, "--date", GC_DATE.isoformat(), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = summary_of(done.stdout)
    assert list(summary) == EXPECTED_KEYS
    assert (
        summary["date"] == "2022-03-31" and summary["as_of"] == "2022-04-01T00:00:00Z" and summary["mode"] == "dry_run"
    )
    assert (summary["retained_commits"], summary["expired_commits"], summary["orphan_candidates"]) == (5, 6, 4)
    assert summary["receipts"] == {"would_delete": 4}
    assert set(summary["checks"].values()) == {"passed"}
    assert lake.files() == before
    # Quiet: one line per step and the summary; Dagster's and Spark's logs only in the log file.
    terminal = done.stdout + done.stderr
    assert "DEBUG" not in terminal and "Warning" not in terminal and "WARN" not in terminal, terminal[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("logs: ")
    log = Path(lines[0].removeprefix("logs: "))
    logged = log.read_text()
    assert log.parent == lake.config_path.parent / "state" / "logs" and "DEBUG" in logged
    # The run's own JVM, as HotSpot reports it: the quick compiler only, with room for the code a
    # run over many tables compiles (the quick compiler alone reserves 48 MiB), and the
    # throughput collector with the whole driver memory from the start; Spark's classes mapped
    # from the archive `make install` built.
    jvm = (
        "driver JVM TieredStopAtLevel=1, ReservedCodeCacheSize=256m, ParallelGC, heap 2048m from the start, "
        "class archive spark-classes.jsa"
    )
    assert f"master local[*], 2 shuffle partitions; {jvm}" in logged
    progress = lines[1 : next(i for i, line in enumerate(lines) if line.startswith("repository "))]
    assert sorted(line.split()[0] for line in progress if not line.startswith("  check ")) == sorted(EXPECTED_ASSETS)
    assert len([line for line in progress if line.startswith("  check ")]) == len(summary["checks"])
    assert (
        "  orphan_candidates  4 candidates, " in done.stdout
        and "  check              blast_radius: passed" in done.stdout
    )

    exported = run_cli(
        capfd,
        "export",
        "orphan_candidates",
        "--config",
        str(lake.config_path),
        "--repo",
        lake.lake.name,
        "--date",
        "2022-03-31",
    )
    assert exported.returncode == 0, exported.stderr[-2000:]
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    assert len(rows) == 4 and {"address", "size", "last_modified", "reason", "repo", "gc_date"} <= set(rows[0])
    assert rows[0]["last_modified"].endswith("Z") and rows[0]["gc_date"] == "2022-03-31"
    as_csv = run_cli(
        capfd,
        "export",
        "deletion_receipts",
        "--config",
        str(lake.config_path),
        "--repo",
        lake.lake.name,
        "--date",
        "2022-03-31",
        "--format",
        "csv",
    )
    assert as_csv.returncode == 0 and len(as_csv.stdout.strip().splitlines()) == 5


def test_bad_input_exits_2_with_a_named_reason(tmp_path, capfd):
    lake = lake_on_disk(tmp_path, churn=0)
    unknown = run_cli(capfd, "run", "--config", str(lake.config_path), "--repo", "nope", "--date", "2022-03-31")
    assert unknown.returncode == 2 and "no repository named 'nope'" in unknown.stderr
    naive = run_cli(
        capfd, "run", "--config", str(lake.config_path), "--repo", lake.lake.name, "--as-of", "2022-03-31T12:00:00"
    )
    assert naive.returncode == 2 and "has no time zone" in naive.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("repositories: [{name: r, format: lakefs-export, storage_namespace: 'ftp://x'}]")
    invalid = run_cli(capfd, "run", "--config", str(bad), "--repo", "r")
    assert invalid.returncode == 2 and "repository 'r': field storage_namespace" in invalid.stderr
    missing = run_cli(
        capfd,
        "export",
        "live_files",
        "--config",
        str(lake.config_path),
        "--repo",
        lake.lake.name,
        "--date",
        "2022-03-30",
    )
    assert missing.returncode == 1 and "has no materialization" in missing.stderr


def test_run_starts_its_spark_session_before_it_imports_dagster(tmp_path):
    """The JVM starts (3 to 4 s) while Dagster is imported (about 1.4 s) and the run planned:
    `run` asks for the session before anything imports Dagster, in a process of its own."""
    lake = lake_on_disk(tmp_path, churn=0)
    script = (
        "import sys\n"
        "import gc_assets.cli as cli\n"
        "def started():\n"
        "    print('dagster imported:', 'dagster' in sys.modules, flush=True)\n"
        "    raise SystemExit(0)\n"
        "cli.start_session_early = started\n"
        f"cli.main(['run', '--config', {str(lake.config_path)!r}, '--repo', {lake.lake.name!r}])\n"
    )
    started = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    assert started.stdout.splitlines()[-1] == "dagster imported: False", started.stdout


def test_the_command_freezes_what_its_run_made_before_the_interpreter_exits():
    """Python's exit ends with a full collection that walks every object a run made only to free
    it with the process (0.8 s after a run over 20 tables, 2.4 s over 1,000): the `gc-assets`
    command freezes them first, and exits with main's status."""
    from importlib.metadata import entry_points

    (command,) = entry_points(group="console_scripts", name="gc-assets")
    assert command.value == "gc_assets.cli:entry"
    script = (
        "import atexit, gc\n"
        "import gc_assets.cli as cli\n"
        "cli.main = lambda own_process: 3 if own_process else 0\n"
        "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0, flush=True))\n"
        "cli.entry()\n"
    )
    exited = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert exited.returncode == 3, exited.stderr
    assert exited.stdout.splitlines()[-1] == "frozen at exit: True", exited.stdout


def test_a_run_in_a_process_of_its_own_freezes_its_imports_and_collects_what_it_makes(tmp_path):
    """What the imports made is never walked by the collector again in the command's own
    process (2.7 s of collections in a run over 1,000 tables instead of 4.3); a run called
    in a process that goes on (a test, a notebook) leaves the collector alone."""
    lake = lake_on_disk(tmp_path, churn=0)
    script = (
        "import gc, sys\n"
        "import gc_assets.runner as runner\n"
        "def planned(*args, **kwargs):\n"
        "    print('frozen:', gc.get_freeze_count() > 0, 'collecting:', gc.isenabled(), flush=True)\n"
        "    raise SystemExit(0)\n"
        "runner.run_partitions = planned\n"
        "import gc_assets.cli as cli\n"
        "cli.start_session_early = lambda: None\n"
        f"cli.main(['run', '--config', {str(lake.config_path)!r}, '--repo', {lake.lake.name!r}], "
        "own_process=sys.argv[1] == 'own')\n"
    )
    for own, frozen in (("own", True), ("shared", False)):
        ran = subprocess.run([sys.executable, "-c", script, own], capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.splitlines()[-1] == f"frozen: {frozen} collecting: True", ran.stdout
