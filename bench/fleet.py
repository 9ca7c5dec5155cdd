"""Benchmark: a fleet of small Delta tables in one `gc-assets run --all`, against a delta-rs loop.

For each count N, N Delta tables of about `--files` data files each (made once with delta-rs
and kept) sit below one warehouse directory that a `discover:` entry finds. In one run the
bench times:
- delta-rs: `vacuum(dry_run=True, full=True)` over every table in this process, one after
  another (the loop a user would write);
- `gc-assets run --config F --all --mode dry-run --json` in a subprocess, cold (it starts its
  own JVM), and its Spark jobs (from the event log the run's Spark writes).
Every table's candidates must equal delta-rs's; a count that disagrees fails the bench. Before
each side is timed, every file of the tables is read once: both start from a warm page cache.
The cost of one more table is the slope between the two counts.

Where the run's seconds go: the fleet run reports each phase (JVM start and mark up to the
stored retained_commits, the listing, the live set, the candidates, the guards with the
receipts, the recorded check results), which the bench prints for the largest count, with where
its processor time went (bench.cpu: the driver's Python, the JVM's tasks, query planning,
compilers and collector, the executors' Python workers).

What no design of the run can remove, in the same run: the parts every fleet run must keep
(docs/design.md §9) cost at least what they cost alone. The witness is delta-rs reading the
head of every table (sources.delta.delta_rs_files), timed here in this process one table after
another as the loop is; Dagster stores each partition's materialization and check result one
event at a time: the run reports the seconds its event store took, and the bench times as many
events stored alone as the run stores them (each asset's materializations one batch, then the
check evaluations), in an instance like the run's; and a cold process's start (imports, JVM
and Spark session, Spark's first job) once, after the runs.

With `--instance postgres` every run (and the events alone) keeps Dagster's records in a
PostgreSQL of its own (bench.postgres_server, a new database each), as a deployment would:
the run keeps one connection there and stores each asset's materializations in one statement
(defs.set_records.store_many_events). The server's CPU in each run is a part of the run's split:
it shares the two cores but is not in the run's process tree. Without it, an ephemeral
instance, as `run` uses with no DAGSTER_HOME.

With `--delete`, copies of the tables are deleted instead: delta-rs's full vacuum over one copy
of each in a loop, against a cold `run --all --mode delete` over the other; the files left
must be the same, table by table. With `--store s3` both copies are uploaded to a bucket
without versions on moto's S3 server, started by the bench on 127.0.0.1, and both sides
delete there; `--versioned` turns the bucket's versioning on first. There delta-rs deletes by
key, leaving each file's bytes behind a delete marker, and gc_assets deletes the version it
listed: the bench counts each side's deleted files whose bytes stay (a noncurrent version or a
delete marker), and fails if gc_assets left any.

With `--state s3` every run keeps its state directory on moto's S3 server (a new prefix of a
bucket of its own), as a cluster keeps it, the tables where `--store` puts them.

With `--lost-history`, every table of a copy has lost a file that only its older retained
version reads (as a table vacuumed earlier with a shorter window than gc_assets' has), under a
window that retains that version: `live_objects_present` must warn for every table and name the
commits that read the lost file, and nothing else may fail. The run's Spark jobs must not grow
with the tables.

Usage: python -m bench.fleet [--tables 10,40] [--files 270] [--work-dir bench/results]
                            [--delete [--store local|s3 [--versioned]] | --lost-history] [--instance ephemeral|postgres]
                            [--state local|s3]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple, Optional
from urllib.parse import urlsplit

import yaml
from dagster import DagsterInstance

from bench.cpu import SERVER, CpuSplit, run_sampled
from bench.environment import environment
from bench.postgres_server import Postgres, postgres_server
from bench.run import candidate_set, delta_rs_vacuum, make_delta_table
from bench.s3_server import FAKE_CREDENTIALS, listed_keys, moto_server, upload_tree, versioning_as_s3
from gc_assets.core.names import ASSETS
from gc_assets.core.spark import SPARK_REMOTE_ENV
from gc_assets.defs.instance import ephemeral_instance
from gc_assets.defs.partitions import partition_key
from gc_assets.sources import delta_log
from gc_assets.sources.delta import delta_rs_files
from gc_assets.stores.settings import StoreSettings


def fleet_tables(work: Path, tables: int, files: int) -> list[Path]:
    """N tables as <work>/fleet-<N>/delta/table-<i>; made once, reused by every later run."""
    return [make_delta_table(work / f"fleet-{tables}", f"{i:05d}", files)[0] for i in range(tables)]


def fleet_config(
    work: Path, tables: int, under: Optional[Path] = None, on_s3: Optional[str] = None, state: Optional[str] = None
) -> Path:
    """A gc.yaml whose one `discover:` entry finds the N tables (or the tables below `under`, or
    below the S3 prefix `on_s3/delta/` when given, `under` then naming the file only); its state
    directory beside them, or a new prefix below the object store URI `state`."""
    under = under or work / f"fleet-{tables}"
    entry = {
        "discover": {"format": "delta", "under": f"{on_s3}/delta/" if on_s3 else (under / "delta").as_uri()},
        "rules": {"default_retention_days": 0},
        "allow_unsafe_retention": True,
        "min_object_age_hours": 0,  # the tables were just made: their deletes are minutes old
        "allow_unsafe_min_age": True,
        "max_delete_fraction": 0.9,
    }
    path = work / f"{under.name}.yaml"
    state_dir = f"{state}/{under.name}-{uuid.uuid4().hex[:8]}" if state else str(work / f"state-{under.name}")
    document = {"state_dir": state_dir, "partitions_start_date": "2022-01-01"}
    path.write_text(yaml.safe_dump({**document, "repositories": [entry]}))
    return path


PHASE_LINE = re.compile(r"^\s*(\w+): \d+ (?:partitions stored|results recorded) in ([\d.]+) s")
EVENTS_LINE = re.compile(r"^\s*events: (\d+) stored by Dagster in ([\d.]+) s")


S3_BUCKET = "fleet"  # --store s3: the bench's bucket, without versions
STATE_BUCKET = "fleet-state"  # --state s3: the runs' state directories
WARNED = (("live_objects_present", "warning"),)  # the checks a lost history leaves unpassed


class FleetRun(NamedTuple):
    """A cold `gc-assets run --all`: its seconds, candidates per repository, Spark jobs, the
    seconds of each phase its progress lines report, the events Dagster stored and their seconds,
    and where its processor time went."""

    seconds: float
    found: dict[str, set[str]]
    jobs: int
    phases: dict[str, float]
    events: int
    events_seconds: float
    cpu: CpuSplit


def fleet_run(
    config: Path,
    mode: str = "dry-run",
    home: Optional[Path] = None,
    warned: bool = False,
    server: Optional[Postgres] = None,
) -> FleetRun:
    """`gc-assets run --all` cold in a subprocess in `mode`, on the instance under `home` (else
    an ephemeral one), whose PostgreSQL `server`'s CPU in the run is a part of its split. With
    `warned`, every repository's checks must all pass but live_objects_present, which warns
    (WARNED)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", SPARK_REMOTE_ENV)}
    if home is not None:
        env["DAGSTER_HOME"] = str(home)
    events = config.parent / f"{config.stem}-events"
    events.mkdir(exist_ok=True)
    # The run's own Spark writes its event log here; its job starts are the run's Spark jobs.
    logging = {"enabled": "true", "dir": str(events), "compress": "false", "rolling.enabled": "false"}
    env["PYSPARK_SUBMIT_ARGS"] = (
        " ".join(f"--conf spark.eventLog.{k}={v}" for k, v in logging.items()) + " pyspark-shell"
    )
    command = [str(Path(sys.executable).parent / "gc-assets"), "run", "--config", str(config), "--all"]
    command += ["--date", dt.date.today().isoformat(), "--mode", mode, "--json"]
    before = set(events.iterdir())
    server_before = server.server_seconds() if server else 0.0
    result, cpu = run_sampled(command, env)
    if server:
        cpu.parts[SERVER] = server.server_seconds() - server_before
    summaries = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    unpassed = {tuple(sorted((c, v) for c, v in s["checks"].items() if v != "passed")) for s in summaries}
    if (unpassed != {WARNED}) if warned else (result.returncode != 0):
        raise SystemExit(
            f"{' '.join(command)} failed ({result.returncode}, {sorted(map(str, unpassed))[:3]}):\n"
            f"{result.stderr[-3000:]}"
        )
    logs = set(events.iterdir()) - before
    files = [path for log in logs for path in ([log] if log.is_file() else sorted(log.rglob("*"))) if path.is_file()]
    jobs = sum(line.count('"Event":"SparkListenerJobStart"') for path in files for line in path.open())
    lines = result.stdout.splitlines()
    phases = {m[1]: float(m[2]) for m in map(PHASE_LINE.match, lines) if m}
    stored = next(((int(m[1]), float(m[2])) for m in map(EVENTS_LINE.match, lines) if m), None)
    if stored is None:
        raise SystemExit(f"{' '.join(command)} reported no events line:\n{result.stdout[-3000:]}")
    found = {s["repo"]: candidate_set(s) for s in summaries}
    return FleetRun(cpu.wall, found, jobs, phases, *stored, cpu)


def events_alone(tables: int, checks: int, home: Optional[Path]) -> float:
    """Seconds for Dagster to store as many events as a run of `tables` stores, as it stores
    them (each asset's materializations one batch, then `checks` check evaluations, a guard's
    verdicts at once), in one op and nothing else: the instance's own cost with no Spark beside
    it. The instance is like the run's: an ephemeral one, or the one under `home`, readied as a
    fleet run readies it."""
    from dagster import AssetCheckEvaluation, AssetKey, job, op

    from gc_assets.defs.set_records import record_check_evaluations, record_materializations, store_many_events

    date = dt.date(2026, 1, 1)
    names = [f"table-{i:05d}" for i in range(tables)]
    seconds = []

    @op
    def record(context) -> None:
        store_many_events(context.instance)
        started = time.perf_counter()
        for asset in ASSETS:
            metadata = {"rows": 270, "bytes": 72900, "path": f"/state/{asset}", "as_of": "2026-01-01T00:00:00Z"}
            record_materializations(context, asset, date, {name: metadata for name in names})
        for first in range(0, checks, tables):  # as the run hands them over: a guard's verdicts at once
            evaluations = [
                AssetCheckEvaluation(
                    AssetKey("orphan_candidates"),
                    f"check_{i // tables}",
                    True,
                    partition=partition_key(date, names[i % tables]),
                )
                for i in range(first, min(first + tables, checks))
            ]
            record_check_evaluations(context, evaluations)
        seconds.append(time.perf_counter() - started)

    @job
    def events() -> None:
        record()

    quiet = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
    events.execute_in_process(instance=run_instance(home), run_config=quiet)
    return seconds[0]


def run_instance(home: Optional[Path]) -> DagsterInstance:
    """The instance a run of the command line gets with DAGSTER_HOME at `home` (unset: ephemeral)."""
    return ephemeral_instance() if home is None else DagsterInstance.from_config(str(home))


PROCESS_START = """
import json, time
started = time.perf_counter()
import gc_assets.definitions
from gc_assets.core.spark import spark_session
imported = time.perf_counter()
spark = spark_session()
session = time.perf_counter()
spark.range(10).count()
print(json.dumps([imported - started, session - imported, time.perf_counter() - session]))
"""


def process_start() -> list[float]:
    """Seconds a cold process spends before any work of its own: importing gc_assets and
    Dagster, starting the JVM and the Spark session as the command line does, and Spark's
    first job (its code not yet compiled)."""
    env = {k: v for k, v in os.environ.items() if k != SPARK_REMOTE_ENV}
    result = subprocess.run([sys.executable, "-c", PROCESS_START], env=env, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.splitlines()[-1])


def witness_loop(paths: list[Path]) -> float:
    """Seconds for delta-rs to read the head version of every table, one after another: the
    fleet's witness's own work (its newest commit is each table's head)."""
    settings = StoreSettings.from_environment()
    heads = [delta_log.list_log(path.as_uri(), settings).head for path in paths]
    started = time.perf_counter()
    for path, head in zip(paths, heads):
        delta_rs_files(path.as_uri(), settings, str(head))
    return time.perf_counter() - started


def require_delta_rs_candidates(expected: dict[str, set[str]], found: dict[str, set[str]]) -> None:
    """Fail the bench unless every table has exactly delta-rs's candidates, and no table is missing or extra."""
    disagree = sorted(name for name in expected.keys() | found.keys() if found.get(name) != expected.get(name))
    if disagree:
        raise SystemExit(
            f"{len(expected)} tables: candidates differ from delta-rs for {disagree[:5]} ({len(found)} collected)"
        )


def warm(paths: list[Path]) -> None:
    """Every file of the tables read once, so that each timed side starts from the same page
    cache: this machine's kernel reclaims cold pages on its own, which made either side cold."""
    for path in paths:
        for directory, _, names in os.walk(path):
            for name in names:
                Path(directory, name).read_bytes()


def measure(
    work: Path, tables: int, files: int, postgres: Optional[Postgres] = None, state: Optional[str] = None
) -> dict[str, Any]:
    paths = fleet_tables(work, tables, files)
    delta_rs = {}
    warm(paths)
    started = time.perf_counter()
    for path in paths:
        delta_rs[path.name] = delta_rs_vacuum(path)[1]
    loop_seconds = time.perf_counter() - started
    witness_seconds = witness_loop(paths)
    warm(paths)
    home = postgres and postgres.dagster_home(f"dry_{tables}", work)
    run = fleet_run(fleet_config(work, tables, state=state), home=home, server=postgres)
    require_delta_rs_candidates(delta_rs, run.found)
    alone = postgres and postgres.dagster_home(f"alone_{tables}", work)
    return {
        "phases": run.phases,
        "cpu": run.cpu,
        "witness_s": witness_seconds,
        "events": run.events,
        "events_s": run.events_seconds,
        "events_alone_s": events_alone(tables, run.events - len(ASSETS) * tables, alone),
        "tables": tables,
        "candidates": sum(len(c) for c in delta_rs.values()),
        "delta_rs_s": loop_seconds,
        "fleet_s": run.seconds,
        "spark_jobs": run.jobs,
    }


def files_left(path: Path) -> set[str]:
    """Every file below a table's directory but its log and gc_assets' own records, relative to
    it (delta-rs's vacuum commits its start and end to the log)."""
    return _data_files(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())


def _files_left(uri: str, s3: Optional[Any]) -> set[str]:
    """files_left of the table at `uri`, on disk or (with `s3`, a client) in the bench's bucket."""
    if s3 is None:
        return files_left(Path(urlsplit(uri).path))
    prefix = uri.removeprefix(f"s3://{S3_BUCKET}/") + "/"
    return _data_files(key.removeprefix(prefix) for key in listed_keys(s3, S3_BUCKET, prefix))


def _left_behind(s3: Any, uris: list[str]) -> int:
    """The data files of the tables at `uris` with a noncurrent version or a delete marker: the
    bytes a delete by key leaves behind on a versioned bucket. gc_assets' own records (its lease,
    rewritten and removed) are not counted."""
    behind: set[str] = set()
    for uri in uris:
        prefix = uri.removeprefix(f"s3://{S3_BUCKET}/") + "/"
        for page in s3.get_paginator("list_object_versions").paginate(Bucket=S3_BUCKET, Prefix=prefix):
            versions = [v for v in page.get("Versions", []) if not v["IsLatest"]] + page.get("DeleteMarkers", [])
            behind |= {prefix + key for key in _data_files(v["Key"].removeprefix(prefix) for v in versions)}
    return len(behind)


def _data_files(found: Iterable[str]) -> set[str]:
    """The keys of `found`, relative to a table, but its log and gc_assets' own records."""
    return {f for f in found if not f.startswith(("_delta_log/", "_gc/"))}


def measure_delete(
    work: Path,
    tables: int,
    files: int,
    postgres: Optional[Postgres] = None,
    s3: Optional[Any] = None,
    versioned: bool = False,
    state: Optional[str] = None,
) -> dict[str, Any]:
    """The N tables copied twice (times kept): delta-rs deletes one copy of each in a loop (full
    vacuum, no retention period) and `gc-assets run --all --mode delete` the other, cold. The
    files left must be the same, table by table (files_left). With `s3` (a boto3 client of the
    bench's S3 endpoint, whose variables are in the environment) the copies are uploaded to a
    bucket (keeping versions if `versioned`) and both sides delete there. With `state` (an
    object store URI), the run keeps its state directory there."""
    from deltalake import DeltaTable

    paths = fleet_tables(work, tables, files)
    copies, uris, options = {}, {}, {}
    for side in ("delta-rs", "gc"):
        root = work / f"delete-{tables}-{side}"
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work / f"state-{root.name}", ignore_errors=True)
        if s3 is None:
            copies[side] = [Path(shutil.copytree(p, root / "delta" / p.name)) for p in paths]
            uris[side] = [p.as_uri() for p in copies[side]]
            continue
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda p: upload_tree(s3, p, S3_BUCKET, f"{root.name}/delta/{p.name}"), paths))
        uris[side] = [f"s3://{S3_BUCKET}/{root.name}/delta/{p.name}" for p in paths]
    if s3 is not None:
        options = {name: os.environ[name] for name in (*FAKE_CREDENTIALS, "AWS_ENDPOINT_URL")}
        options["AWS_ALLOW_HTTP"] = "true"
        time.sleep(1.1)  # S3 times are whole seconds: every upload strictly before the run's as-of
    warm(copies.get("delta-rs", []))
    started = time.perf_counter()
    for uri in uris["delta-rs"]:
        DeltaTable(uri, storage_options=options).vacuum(
            retention_hours=0, dry_run=False, enforce_retention_duration=False, full=True
        )
    loop_seconds = time.perf_counter() - started
    warm(copies.get("gc", []))
    root = work / f"delete-{tables}-gc"
    config = fleet_config(work, tables, under=root, on_s3=s3 and f"s3://{S3_BUCKET}/{root.name}", state=state)
    home = postgres and postgres.dagster_home(f"delete_{tables}", work)
    run = fleet_run(config, mode="delete", home=home, server=postgres)
    left = {uri.rsplit("/", 1)[1]: _files_left(uri, s3) for uri in uris["delta-rs"]}
    ours = {uri.rsplit("/", 1)[1]: _files_left(uri, s3) for uri in uris["gc"]}
    differ = sorted(name for name in left if left[name] != ours.get(name))
    if differ or len(run.found) != len(left):
        raise SystemExit(f"{tables} tables deleted: the files left differ from delta-rs's for {differ[:5]}")
    behind = {side: _left_behind(s3, side_uris) for side, side_uris in uris.items()} if versioned else {}
    if behind.get("gc"):
        raise SystemExit(f"{tables} tables deleted: gc_assets left the bytes of {behind['gc']:,} files it deleted")
    return {
        "left_behind": behind,
        "tables": tables,
        "deleted": sum(len(f) for f in run.found.values()),
        "delta_rs_s": loop_seconds,
        "fleet_s": run.seconds,
        "spark_jobs": run.jobs,
        "phases": run.phases,
        "cpu": run.cpu,
        "events": run.events,
        "events_s": run.events_seconds,
    }


def measure_lost_history(work: Path, tables: int, files: int, postgres: Optional[Postgres] = None) -> dict[str, Any]:
    """A copy of the N tables, each missing a file only its version before the head reads,
    dry-run cold under a window that retains that version (fleet_run's `warned`)."""
    from deltalake import DeltaTable

    root = work / f"lost-history-{tables}"
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(work / f"state-{root.name}", ignore_errors=True)
    for path in fleet_tables(work, tables, files):
        copy = Path(shutil.copytree(path, root / "delta" / path.name))
        head = DeltaTable(str(copy))
        older = DeltaTable(str(copy), version=head.version() - 1)
        Path(urlsplit(min(set(older.file_uris()) - set(head.file_uris()))).path).unlink()
    config = fleet_config(work, tables, under=root)
    document = yaml.safe_load(config.read_text())
    document["repositories"][0]["rules"] = {"default_retention_days": 7}  # the older version is retained
    config.write_text(yaml.safe_dump(document))
    home = postgres and postgres.dagster_home(f"lost_{tables}", work)
    run = fleet_run(config, home=home, warned=True, server=postgres)
    return {
        "tables": tables,
        "fleet_s": run.seconds,
        "spark_jobs": run.jobs,
        "phases": run.phases,
        "cpu": run.cpu,
        "events_s": run.events_seconds,
    }


def report_lost_history(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| tables, each warned | run --all, cold (s) | Dagster events (s) | Spark jobs |",
        "|---:" * 4 + "|",
    ]
    for r in rows:
        lines.append(f"| {r['tables']:,} | {r['fleet_s']:.1f} | {r['events_s']:.1f} | {r['spark_jobs']} |")
    return lines + slope_and_phases(rows, "that lost history")


def report_delete(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| tables | files deleted | delta-rs deleting its copy, loop (s) | run --all --mode delete, cold (s) "
        "| ratio | Spark jobs | Dagster events (s) |",
        "|---:" * 7 + "|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tables']:,} | {r['deleted']:,} | {r['delta_rs_s']:.2f} | {r['fleet_s']:.1f} "
            f"| {r['fleet_s'] / r['delta_rs_s']:.1f}× | {r['spark_jobs']} | {r['events']:,} ({r['events_s']:.1f}) |"
        )
    behind = [
        f"{r['tables']:,} tables: delta-rs {r['left_behind']['delta-rs']:,}, gc_assets {r['left_behind']['gc']:,}"
        for r in rows
        if r["left_behind"]
    ]
    if behind:
        lines.append("deleted files whose bytes stay (a noncurrent version or a delete marker): " + "; ".join(behind))
    return lines + slope_and_phases(rows, "deleted")


def slope_and_phases(rows: list[dict[str, Any]], what: str) -> list[str]:
    """The cost of one more table between the first and the last count, and where the last
    count's run spent its seconds."""
    first, last = rows[0], rows[-1]
    lines = []
    if last["tables"] > first["tables"]:
        extra = last["tables"] - first["tables"]
        lines.append(
            f"one more table {what}: {(last['fleet_s'] - first['fleet_s']) / extra * 1000:.1f} ms; "
            f"Spark jobs per table: {(last['spark_jobs'] - first['spark_jobs']) / extra:.1f}"
        )
    lines.append(
        f"where the run of {last['tables']:,} tables goes (each phase ends when its asset is stored), seconds:"
    )
    return lines + [f"  {phase:<20} {value:.1f}" for phase, value in last["phases"].items()] + [last["cpu"].line()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="10,40", help="two or more comma-separated table counts")
    parser.add_argument("--files", default=270, type=int, help="data files per table")
    parser.add_argument("--work-dir", default="bench/results", type=Path)
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--delete", action="store_true", help="delete copies of the tables instead of a dry run")
    kind.add_argument(
        "--lost-history", action="store_true", help="dry-run copies whose older versions lost a file each"
    )
    parser.add_argument(
        "--instance", default="ephemeral", choices=("ephemeral", "postgres"), help="where the runs' Dagster events go"
    )
    parser.add_argument(
        "--store", default="local", choices=("local", "s3"), help="where the tables lie (s3: moto's server; --delete)"
    )
    parser.add_argument("--versioned", action="store_true", help="the S3 bucket keeps versions (--store s3)")
    parser.add_argument(
        "--state", default="local", choices=("local", "s3"), help="where the runs keep their state (s3: moto's server)"
    )
    args = parser.parse_args()
    if args.store == "s3" and not args.delete:
        parser.error("--store s3 measures a delete run: add --delete")
    if args.versioned and args.store != "s3":
        parser.error("--versioned is a bucket's setting: add --store s3")
    work = (args.work_dir / "fleet").absolute()
    counts = [int(n) for n in args.tables.split(",")]
    with contextlib.ExitStack() as stack:
        postgres = stack.enter_context(postgres_server()) if args.instance == "postgres" else None
        endpoint = stack.enter_context(_bucket(args.versioned)) if "s3" in (args.store, args.state) else None
        s3 = endpoint if args.store == "s3" else None  # where the tables lie
        state = None
        if args.state == "s3":
            endpoint.create_bucket(Bucket=STATE_BUCKET)
            state = f"s3://{STATE_BUCKET}"
        if args.delete:
            lines = report_delete(
                [measure_delete(work, n, args.files, postgres, s3, args.versioned, state) for n in counts]
            )
        elif args.lost_history:
            lines = report_lost_history([measure_lost_history(work, n, args.files, postgres) for n in counts])
        else:
            lines = report_dry([measure(work, n, args.files, postgres, state) for n in counts])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines += [
        f"Dagster instance: {args.instance}, tables on: {args.store}{' (versioned)' if args.versioned else ''}, "
        f"state on: {args.state}",
        f"load average (1, 5, 15 min) at the end: {load}",
    ]
    # Printed last and at once: the in-process runs write Dagster's log to the same streams.
    print("\n".join(lines), flush=True)


@contextlib.contextmanager
def _bucket(versioned: bool) -> Iterator[Any]:
    """moto's S3 server for this bench, its variables in this process's environment (so in the
    runs' too), and a client of it, with S3_BUCKET made (its versioning Enabled if `versioned`,
    moto then answering versioned requests as S3 does)."""
    import boto3

    with moto_server() as variables, environment(variables), versioning_as_s3():
        client = boto3.session.Session().client("s3", endpoint_url=variables["AWS_ENDPOINT_URL"])
        client.create_bucket(Bucket=S3_BUCKET)
        if versioned:
            client.put_bucket_versioning(Bucket=S3_BUCKET, VersioningConfiguration={"Status": "Enabled"})
        yield client


def report_dry(rows: list[dict[str, Any]]) -> list[str]:
    imports, session, first_job = process_start()
    lines = [
        "| tables | candidates | delta-rs loop (s) | run --all, cold (s) | ratio | Spark jobs |",
        "|---:" * 6 + "|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tables']:,} | {r['candidates']:,} | {r['delta_rs_s']:.2f} | {r['fleet_s']:.1f} "
            f"| {r['fleet_s'] / r['delta_rs_s']:.1f}× | {r['spark_jobs']} |"
        )
    last = rows[-1]
    lines += slope_and_phases(rows, "in a run --all")
    lines += [
        "what the parts every fleet run keeps cost alone, against 3x the delta-rs loop:",
        "| tables | delta-rs loop (s) | 3x loop (s) | witness: delta-rs reads each head (s) "
        "| Dagster events | their store in the run (s) | as many alone (s) | witness + events alone (s) "
        "| ratio to the loop |",
        "|---:" * 9 + "|",
    ]
    for r in rows:
        floor = r["witness_s"] + r["events_alone_s"]
        lines.append(
            f"| {r['tables']:,} | {r['delta_rs_s']:.2f} | {3 * r['delta_rs_s']:.1f} | {r['witness_s']:.2f} "
            f"| {r['events']:,} | {r['events_s']:.1f} | {r['events_alone_s']:.1f} | {floor:.1f} "
            f"| {floor / r['delta_rs_s']:.1f}x |"
        )
    kept = imports + session + first_job + last["witness_s"] + last["events_alone_s"]
    lines.append(
        f"a cold process before any work: imports {imports:.1f} s, JVM and Spark session {session:.1f} s, "
        f"first Spark job {first_job:.1f} s; with the witness and the events alone at {last['tables']:,} tables: "
        f"{kept / last['delta_rs_s']:.1f}x the loop"
    )
    return lines


if __name__ == "__main__":
    main()
