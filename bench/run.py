"""Benchmark: the whole GC graph in dry run on synthetic lakes, against two references.

For each size a lakeFS-layout lake is generated (gc_assets.demo.lakegen.bulk_lake; cached
under the work directory, since a dry run never changes it) and a run of its partition
goes through the project's Definitions, exactly as `gc-assets run` does. The table gives
wall time per step and per asset (from the run's event log), the total,
objects per second, peak driver RSS (Python and JVM processes) and peak JVM heap.

References, as ratios in the same run:
- scandir: one process walks the namespace with os.scandir and takes a Python set
  difference against the live set read with pyarrow, the near-limit for a local disk.
  Its candidates must equal the graph's, so every benchmark run is also an oracle check.
- delta-rs: `DeltaTable.vacuum(dry_run=True, full=True)` on Delta tables of many small
  files, against the graph on the same tables (needs the `delta` connector).

Each size also runs as users start it, `gc-assets run` in a subprocess: cold (the run
starts its own JVM) and warm (a Spark Connect server started once by the bench, as a
production deployment keeps one running); both must find the same candidates.

A size whose run fails or disagrees is reported and the bench goes on with the next:
the tables and the JSON keep every finished size, and the exit status is 1.

A file catalog (format file-catalog, bench/catalog.py) of 1 M rows in SQLite runs beside
them, against a brute-force pass in one process; `--catalog-only` runs it alone.


`--native` runs each lakeFS lake a second time in lakeFS's own layout (`format: lakefs`:
SSTables and a refs dump written beside the export, over the same objects); it must find
the scandir reference's candidates that some commit names (it never collects untracked
objects, which may be staged).

Usage: python -m bench.run [--sizes 100k,1M] [--with-10m] [--delta 200k] [--with-2m] [--catalog 1M]
       [--catalog-only] [--no-cold] [--no-warm] [--native]
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import os
import shutil
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from bench.catalog import CATALOG_SIZES, CatalogResult, bench_catalog, format_catalog_table
from bench.cpu import CpuSplit, run_sampled
from bench.sampling import PeriodicSampler
from bench.spark_servers import (
    connect_jobs,
    connect_server,
    spark_environment,
)
from gc_assets.core.spark import SPARK_REMOTE_ENV, driver_memory
from gc_assets.core.time import end_of_day
from gc_assets.demo.lakegen import REFS_MANIFEST, BulkShape, write_bulk_lake, write_native_from_export

GC_DATE = dt.date(2024, 3, 31)
AS_OF = end_of_day(GC_DATE)
MIN_OBJECT_AGE = dt.timedelta(hours=24)
RULES = {"default_retention_days": 14, "branches": [{"branch_id": "main", "retention_days": 21}]}
SIZES = {
    "2k": BulkShape(objects=2_000, commits=40, branches=2, range_size=20, changes_per_commit=10),
    "10k": BulkShape(objects=10_000, commits=100, branches=2),
    "100k": BulkShape(objects=100_000, commits=1_000, branches=5),
    "1M": BulkShape(objects=1_000_000, commits=10_000, branches=50),
    "10M": BulkShape(objects=10_000_000, commits=100_000, branches=500),
}
DELTA_SIZES = {"100": 100, "10k": 10_000, "100k": 100_000, "200k": 200_000, "2M": 2_000_000}
DELTA_FILES_PER_WRITE = 2_000
DELTA_REMOVED_FRACTION = 0.25
PROTECTED = ("_lakefs/", "_gc/", "_gc_trash/")


@dataclass
class Peaks:
    python_rss: int = 0
    jvm_rss: int = 0
    jvm_heap_used: int = 0
    jvm_heap_max: int = 0


class PeakSampler(PeriodicSampler):
    """Samples driver memory every `interval` seconds while a run is in progress.

    The driver is two processes: this Python interpreter and the JVM it started
    (a child process); the heap is read from the JVM's memory MXBean through py4j.
    """

    def __init__(self, interval: float = 0.1):
        super().__init__(interval)
        self.peaks = Peaks()
        self._me = psutil.Process()

    def sample(self) -> None:
        p = self.peaks
        p.python_rss = max(p.python_rss, self._me.memory_info().rss)
        for child in self._me.children(recursive=True):
            try:
                if child.name() == "java":
                    p.jvm_rss = max(p.jvm_rss, child.memory_info().rss)
            except psutil.Error:
                continue
        jvm = _jvm()
        if jvm is not None:
            try:
                heap = jvm.java.lang.management.ManagementFactory.getMemoryMXBean().getHeapMemoryUsage()
                p.jvm_heap_used = max(p.jvm_heap_used, int(heap.getUsed()))
                p.jvm_heap_max = int(heap.getMax())
            except Exception:  # the session is being created or stopped
                pass


def _jvm() -> Any:
    """The py4j view of the local driver JVM, when a classic session exists (not over Spark Connect)."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    return context._jvm if context is not None else None


def spark_job_count() -> Optional[int]:
    """Jobs the driver has started so far (None over Spark Connect): one more than the newest
    job's id. The status store keeps only the newest spark.ui.retainedJobs, so its size stops
    counting (and shrinks when it evicts) in a long-lived session."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return None
    context._jsc.sc().listenerBus().waitUntilEmpty()  # every job start the run caused is recorded
    jobs = context._jsc.sc().statusStore().jobsList(None)  # newest first
    return 0 if jobs.isEmpty() else int(jobs.head().jobId()) + 1


@dataclass
class GraphRun:
    seconds: float
    steps: dict[str, float]
    summary: dict[str, Any]
    peaks: Peaks
    spark_jobs: Optional[int]
    success: bool
    error: Optional[str] = None


def run_graph(config_path: Path, repo: str, date: dt.date, as_of: Optional[dt.datetime] = None) -> GraphRun:
    """`run` in dry run for one partition, timed per step (and per asset) from the run's event log."""
    from gc_assets.defs.instance import ephemeral_instance
    from gc_assets.runner import run_partition

    instance = ephemeral_instance()
    jobs_before = spark_job_count()
    started = time.perf_counter()
    with PeakSampler() as sampler:
        outcome = run_partition(str(config_path), repo, date, as_of=as_of, mode="dry_run", instance=instance)
    seconds = time.perf_counter() - started
    jobs_after = spark_job_count()
    jobs = None if jobs_after is None else jobs_after - (jobs_before or 0)
    steps = step_durations(instance, outcome.summary["run_id"])
    return GraphRun(seconds, steps, outcome.summary, sampler.peaks, jobs, outcome.success, outcome.error)


class SizeFailed(RuntimeError):
    """One size's run failed or found other candidates than its reference."""


def cli_run(config_path: Path, repo: str, date: dt.date, remote: Optional[str] = None) -> tuple[CpuSplit, set[str]]:
    """`gc-assets run --json` in dry run as a user starts it, timed from launch to exit (with its
    process tree's CPU: bench.cpu); cold (the run starts its own JVM) or warm (`remote`: a Spark
    Connect server already running, whose CPU is not the run's tree's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", SPARK_REMOTE_ENV)}
    if remote:
        env[SPARK_REMOTE_ENV] = remote
    command = [str(Path(sys.executable).parent / "gc-assets"), "run", "--config", str(config_path), "--repo", repo]
    command += ["--date", date.isoformat(), "--mode", "dry-run", "--json"]
    result, cpu = run_sampled(command, env)
    if result.returncode != 0:
        raise SizeFailed(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return cpu, candidate_set(json.loads(result.stdout.strip().splitlines()[-1]))


@dataclass
class WarmSpark:
    """A Spark Connect server on this machine (local[*], as the cold run uses): the warm runs'
    Spark, and its REST API's job count for the Spark jobs of a run."""

    remote: str
    ui_port: int

    def jobs(self) -> int:
        return connect_jobs(self.ui_port)


@contextmanager
def warm_spark(work: Path) -> Iterator[WarmSpark]:
    """A Spark Connect server for the warm runs, started before and stopped after them."""
    servers = work / "servers"
    env = {
        **spark_environment(servers),
        "GC_ASSETS_SHUFFLE_PARTITIONS": os.environ.get("GC_ASSETS_SHUFFLE_PARTITIONS", "8"),
    }
    # A local run's driver memory: with local[*] the server's driver is also its executor, and
    # with Spark's default 1 GiB a 1 M-object run lost a task result under memory pressure.
    with connect_server(servers, env, "local[*]", driver_memory()) as (remote, ui_port):
        yield WarmSpark(remote, ui_port)


def step_durations(instance: Any, run_id: str) -> dict[str, float]:
    """Seconds from STEP_START to STEP_SUCCESS (or STEP_FAILURE) of every step of a run; a step
    stores several assets (a set's run), so it is timed per asset too: from the one stored before
    it (or the step's start) to its materialization."""
    started: dict[str, float] = {}
    durations: dict[str, float] = {}
    phase_began: dict[str, float] = {}
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None or entry.step_key is None:
            continue
        if event.event_type_value == "STEP_START":
            started[entry.step_key] = phase_began[entry.step_key] = entry.timestamp
        elif event.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE") and entry.step_key in started:
            durations[entry.step_key] = entry.timestamp - started[entry.step_key]
        elif event.event_type_value == "ASSET_MATERIALIZATION" and entry.step_key in phase_began:
            asset = event.asset_key.path[-1]
            if asset != entry.step_key and asset not in durations:
                durations[asset] = entry.timestamp - phase_began[entry.step_key]
                phase_began[entry.step_key] = entry.timestamp
    return durations


def prepare_lake(work: Path, label: str, shape: BulkShape) -> tuple[Path, Path, float]:
    """The lake of `shape` under `work` (reused when already complete); (namespace, export, seconds)."""
    namespace = work / "lakes" / f"lake-{label}"
    marker = namespace / "_lakefs" / "bench-shape.json"
    wanted = json.dumps(asdict(shape), sort_keys=True)
    if marker.exists() and marker.read_text() == wanted:
        return namespace, namespace / "_lakefs" / "export", 0.0
    shutil.rmtree(namespace, ignore_errors=True)
    started = time.perf_counter()
    export = write_bulk_lake(shape, namespace, AS_OF - dt.timedelta(days=1))
    marker.write_text(wanted)
    return namespace, export, time.perf_counter() - started


def write_config(path: Path, state_dir: Path, repos: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump({"state_dir": str(state_dir), "partitions_start_date": "2024-01-01", "repositories": repos})
    )
    return path


def candidate_set(summary: dict[str, Any]) -> set[str]:
    location = summary.get("outputs", {}).get("orphan_candidates")
    if not location:
        return set()
    return set(pq.read_table(location, columns=["address"]).column("address").to_pylist())


def retained_commits(
    commits: dict[str, tuple[tuple[str, ...], float]],
    refs: list[tuple[str, str, str]],
    rules: dict[str, Any],
    as_of: float,
) -> set[str]:
    """The lakeFS retention rules, written here apart from gc_assets so the reference is a
    second opinion: from every branch head, tag and dangling commit, walk first parents
    while the commit above is newer than the start's threshold. A walk stops early where an
    earlier walk with a threshold as old or older already went on."""
    branch_rules = rules.get("branches", [])
    tags = {"retain": True, "retention_days": None, **rules.get("tags", {})}

    def threshold(days: Optional[float]) -> float:
        return -float("inf") if days is None else as_of - days * 86400

    def branch_days(name: str) -> Optional[float]:
        exact = [r["retention_days"] for r in branch_rules if r.get("branch_id") == name]
        matching = sorted(
            (r for r in branch_rules if r.get("pattern") and fnmatch.fnmatchcase(name, r["pattern"])),
            key=lambda r: -len(r["pattern"]),
        )
        return exact[0] if exact else matching[0]["retention_days"] if matching else rules.get("default_retention_days")

    starts: list[tuple[str, float, Optional[float]]] = []  # (commit, threshold, time of a virtual child)
    for name, kind, commit_id in refs:
        if kind == "branch":
            starts.append((commit_id, threshold(branch_days(name)), None))
        elif tags["retain"]:
            only_itself = tags["retention_days"] is None
            starts.append((commit_id, float("inf") if only_itself else threshold(tags["retention_days"]), None))
    first_parents = {parents[0] for parents, _ in commits.values() if parents}
    heads = {commit_id for _, kind, commit_id in refs if kind == "branch"}
    default = threshold(rules.get("default_retention_days"))
    starts += [(c, default, created) for c, (_, created) in commits.items() if c not in first_parents | heads]

    kept: set[str] = set()
    walked: dict[str, float] = {}  # commit -> the oldest threshold a walk went past it with
    for start, limit, virtual_child in starts:
        if virtual_child is not None and virtual_child <= limit:
            continue
        kept.add(start)
        commit_id = start
        while commits[commit_id][1] > limit and commits[commit_id][0]:
            if walked.get(commit_id, float("inf")) <= limit:
                break
            walked[commit_id] = limit
            commit_id = commits[commit_id][0][0]
            kept.add(commit_id)
    return kept


def scandir_baseline(
    namespace: Path, export: Path, rules: dict[str, Any], as_of: dt.datetime
) -> tuple[float, set[str]]:
    """The single-process reference: live set with pyarrow, inventory with os.scandir,
    candidates by Python set difference. Returns (seconds, candidates)."""
    started = time.perf_counter()
    cutoff_ns = int((min(as_of, dt.datetime.now(dt.timezone.utc)) - MIN_OBJECT_AGE).timestamp() * 1e9)
    commits_table = pq.read_table(export / "commits")
    commits = {
        c: (tuple(p), t.timestamp())
        for c, p, t in zip(*(commits_table.column(n).to_pylist() for n in ("commit_id", "parents", "created_at")))
    }
    refs = [(r["name"], r["kind"], r["commit_id"]) for r in pq.read_table(export / "refs").to_pylist()]
    kept = retained_commits(commits, refs, rules, as_of.timestamp())
    retained = pa.array(sorted(kept))
    metarange_ids = commits_table.filter(pc.is_in(commits_table["commit_id"], retained))["metarange_id"]
    metaranges = pq.read_table(export / "metaranges")
    range_ids = pc.unique(metaranges.filter(pc.is_in(metaranges["metarange_id"], metarange_ids))["range_id"])
    ranges = pq.read_table(export / "ranges", columns=["range_id", "address"])
    live = set(ranges.filter(pc.is_in(ranges["range_id"], range_ids))["address"].to_pylist())

    inventory: set[str] = set()
    pending = [""]
    while pending:
        relative = pending.pop()
        with os.scandir(namespace / relative if relative else namespace) as entries:
            for entry in entries:
                key = f"{relative}/{entry.name}" if relative else entry.name
                if entry.is_dir(follow_symlinks=False):
                    if not (key + "/").startswith(PROTECTED):
                        pending.append(key)
                elif entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime_ns < cutoff_ns:
                    inventory.add(key)
    candidates = {key for key in inventory - live if not key.startswith(PROTECTED)}
    return time.perf_counter() - started, candidates


def make_delta_table(work: Path, label: str, files: int) -> tuple[Path, float]:
    """A Delta table of `files` data files (appends of many one-row partitions), a quarter
    of them removed by a delete, every file dated two days back. Reused when complete."""
    import numpy as np
    from deltalake import DeltaTable, write_deltalake

    table_dir = work / "delta" / f"table-{label}"
    marker = work / "delta" / f"table-{label}.done"
    if marker.exists() and marker.read_text() == str(files):
        return table_dir, 0.0
    shutil.rmtree(table_dir, ignore_errors=True)
    started = time.perf_counter()
    writes = max(1, files // DELTA_FILES_PER_WRITE)
    per_write = files // writes
    for write in range(writes):
        batch = pa.table(
            {
                "part": pa.array(np.arange(per_write, dtype=np.int32)),
                "value": pa.array(np.full(per_write, write, np.int64)),
            }
        )
        write_deltalake(str(table_dir), batch, partition_by=["part"], mode="append")
    DeltaTable(str(table_dir)).delete(f"part < {int(per_write * DELTA_REMOVED_FRACTION)}")
    two_days_ago = time.time() - 2 * 86400
    for root, _dirs, names in os.walk(table_dir):
        if os.path.basename(root) == "_delta_log":
            continue
        for name in names:
            os.utime(os.path.join(root, name), (two_days_ago, two_days_ago))
    marker.write_text(str(files))
    return table_dir, time.perf_counter() - started


def delta_rs_vacuum(table_dir: Path) -> tuple[float, set[str]]:
    """delta-rs full vacuum in dry run, with no retention period: every removed or
    unreferenced file is listed. Returns (seconds, relative paths)."""
    from deltalake import DeltaTable

    started = time.perf_counter()
    listed = DeltaTable(str(table_dir)).vacuum(
        retention_hours=0, dry_run=True, enforce_retention_duration=False, full=True
    )
    seconds = time.perf_counter() - started
    prefix = str(table_dir).rstrip("/") + "/"
    return seconds, {p.removeprefix(prefix).removeprefix(table_dir.as_uri() + "/") for p in listed}


def delta_repository(name: str, table_dir: Path) -> dict[str, Any]:
    return {
        "name": name,
        "format": "delta",
        "storage_namespace": table_dir.as_uri(),
        "rules": {"default_retention_days": 0},
        "allow_unsafe_retention": True,
        "min_object_age_hours": 1,
        "max_delete_fraction": 0.9,
    }


@dataclass
class LakeResult:
    size: str
    objects: int
    commits: int
    branches: int
    generate_seconds: float
    graph: dict[str, Any]
    scandir_seconds: float
    candidates: int
    candidates_agree: bool
    load_average: list[float] = field(default_factory=list)
    cold_seconds: Optional[float] = None
    cold_cpu: Optional[dict[str, Any]] = None  # the cold run's CpuSplit
    warm_first_seconds: Optional[float] = None  # the server's first run of this size
    warm_seconds: Optional[float] = None
    warm_spark_jobs: Optional[int] = None


@dataclass
class DeltaResult:
    size: str
    files: int
    delta_rs_seconds: float
    delta_rs_candidates: int
    graph_seconds: Optional[float]
    graph_candidates: Optional[int]
    candidates_agree: Optional[bool]
    note: str = ""
    cold_seconds: Optional[float] = None
    cold_cpu: Optional[dict[str, Any]] = None  # the cold run's CpuSplit
    warm_first_seconds: Optional[float] = None  # the server's first run of this size
    warm_seconds: Optional[float] = None
    warm_spark_jobs: Optional[int] = None
    spark_jobs: Optional[int] = None
    steps: dict[str, float] = field(default_factory=dict)
    load_average: list[float] = field(default_factory=list)


def cold_and_warm(
    config: Path, repo: str, date: dt.date, expected: set[str], cold: bool, warm: Optional[WarmSpark]
) -> dict[str, Any]:
    """The CLI runs beside the instrumented one; each must find the same candidates."""
    found: dict[str, Any] = {}
    if cold:
        cpu, candidates = cli_run(config, repo, date)
        found["cold_seconds"], found["cold_cpu"] = cpu.wall, asdict(cpu)
        if candidates != expected:
            raise SizeFailed(f"{repo}: the cold CLI run found other candidates than the reference")
    if warm is not None:
        # Twice: a deployment's server has run before, so its compiled code and caches are warm; the
        # first run of a size on a new server is reported apart (warm_first_seconds).
        for key in ("warm_first_seconds", "warm_seconds"):
            before = warm.jobs()
            cpu, candidates = cli_run(config, repo, date, warm.remote)
            found[key], found["warm_spark_jobs"] = cpu.wall, warm.jobs() - before
            if candidates != expected:
                raise SizeFailed(f"{repo}: the warm CLI run found other candidates than the reference")
    return found


def prepare_native(namespace: Path, export: Path, shape: BulkShape) -> tuple[Path, float]:
    """The same lake in lakeFS's own layout, beside its export (same objects); a reused one gets
    its refs dump stamped now, as a fresh `lakectl refs-dump` would (a dump older than 24 h is refused)."""
    marker = namespace / "_lakefs" / "bench-native.json"
    wanted = json.dumps(asdict(shape), sort_keys=True)
    manifest = namespace / REFS_MANIFEST
    if marker.exists() and marker.read_text() == wanted:
        from gc_assets.sources.lakefs.records import split_value
        from gc_assets.sources.lakefs.sstable import read_sstable

        for metarange in json.loads(manifest.read_text()).values():
            path = namespace / "_lakefs" / metarange
            tables = [path] + [
                namespace / "_lakefs" / split_value(v)[0].decode()
                for _, v in read_sstable(path.read_bytes(), metarange).records()
            ]
            for table in tables:
                os.utime(table)
        return manifest, 0.0
    started = time.perf_counter()
    write_native_from_export(
        {name: pq.read_table(export / name) for name in ("commits", "refs", "metaranges", "ranges")}, namespace
    )
    marker.write_text(wanted)
    return manifest, time.perf_counter() - started


def bench_lake(
    work: Path, label: str, shape: BulkShape, cold: bool = False, warm: Optional[WarmSpark] = None, native: bool = False
) -> LakeResult:
    namespace, export, generate_seconds = prepare_lake(work, label, shape)
    name = f"bench-{label.lower()}" + ("-native" if native else "")
    repo: dict[str, Any] = {"name": name, "storage_namespace": namespace.as_uri(), "rules": RULES}
    if native:
        manifest, native_seconds = prepare_native(namespace, export, shape)
        repo.update(format="lakefs", refs_dump=manifest.as_uri())
        generate_seconds += native_seconds
        label = f"{label} native"
    else:
        repo.update(format="lakefs-export", source=export.as_uri())
    state = work / "state" / label.replace(" ", "-")
    shutil.rmtree(state, ignore_errors=True)
    config = write_config(work / "config" / f"{label.replace(' ', '-')}.yaml", state, [repo])
    graph = run_graph(config, name, GC_DATE)
    if not graph.success:
        raise SizeFailed(f"benchmark run on {label} failed: {graph.error} {graph.summary.get('checks')}")
    scandir_seconds, expected = scandir_baseline(namespace, export, RULES, AS_OF)
    if native:  # lakeFS's storage alone cannot tell an abandoned upload from a staged object: only expired ones go
        expected &= set(pq.read_table(export / "ranges", columns=["address"]).column("address").to_pylist())
    found = candidate_set(graph.summary)
    return LakeResult(
        label,
        shape.objects,
        shape.commits,
        shape.branches,
        generate_seconds,
        _graph_dict(graph),
        scandir_seconds,
        len(found),
        found == expected,
        list(os.getloadavg()),
        **cold_and_warm(config, name, GC_DATE, expected, cold, warm),
    )


def bench_delta(
    work: Path, label: str, files: int, cold: bool = False, warm: Optional[WarmSpark] = None
) -> DeltaResult:
    table_dir, _ = make_delta_table(work, label, files)
    rs_seconds, rs_candidates = delta_rs_vacuum(table_dir)
    name = f"delta-{label.lower()}"
    state = work / "state" / f"delta-{label}"
    shutil.rmtree(state, ignore_errors=True)
    try:
        config = write_config(work / "config" / f"delta-{label}.yaml", state, [delta_repository(name, table_dir)])
        date = dt.datetime.now(dt.timezone.utc).date()
        graph = run_graph(config, name, date)
    except Exception as exc:  # reported in the table: the connector or its configuration is missing
        return DeltaResult(label, files, rs_seconds, len(rs_candidates), None, None, None, f"graph not run: {exc}")
    if not graph.success:
        return DeltaResult(
            label, files, rs_seconds, len(rs_candidates), None, None, None, f"graph failed: {graph.error}"
        )
    found = candidate_set(graph.summary)
    return DeltaResult(
        label,
        files,
        rs_seconds,
        len(rs_candidates),
        graph.seconds,
        len(found),
        found == rs_candidates,
        spark_jobs=graph.spark_jobs,
        steps=graph.steps,
        load_average=list(os.getloadavg()),
        **cold_and_warm(config, name, date, rs_candidates, cold, warm),
    )


def _graph_dict(graph: GraphRun) -> dict[str, Any]:
    return {
        "seconds": graph.seconds,
        "steps": graph.steps,
        "peaks": asdict(graph.peaks),
        "spark_jobs": graph.spark_jobs,
        "summary": {
            k: graph.summary[k]
            for k in (
                "retained_commits",
                "expired_commits",
                "live_objects",
                "inventory_objects",
                "orphan_candidates",
                "checks",
            )
        },
    }


def _seconds(value: Optional[float]) -> str:
    return f"{value:.1f}" if value is not None else "n/a"


def _ratio(value: Optional[float], reference: float) -> str:
    return f"{value / reference:.1f}×" if value is not None else "n/a"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def format_tables(lakes: list[LakeResult], deltas: list[DeltaResult]) -> str:
    """Markdown tables of the results, as printed and quoted in docs/BENCHMARKS.md."""
    lines: list[str] = []
    if lakes:
        steps = list(dict.fromkeys(step for r in lakes for step in r.graph["steps"]))
        lines += ["| step (s) | " + " | ".join(r.size for r in lakes) + " |", "|---|" + "---:|" * len(lakes)]
        for step in steps:
            lines.append(f"| {step} | " + " | ".join(f"{r.graph['steps'].get(step, 0):.1f}" for r in lakes) + " |")
        rows = [
            ("objects", lambda r: f"{r.objects:,}"),
            ("commits / branches", lambda r: f"{r.commits:,} / {r.branches}"),
            ("**total (s)**", lambda r: f"**{r.graph['seconds']:.1f}**"),
            ("objects per second", lambda r: f"{r.objects / r.graph['seconds']:,.0f}"),
            ("Spark jobs", lambda r: str(r.graph["spark_jobs"])),
            ("cold: `gc-assets run`, JVM start included (s)", lambda r: _seconds(r.cold_seconds)),
            ("warm: `gc-assets run` on a running Spark Connect server (s)", lambda r: _seconds(r.warm_seconds)),
            ("warm, the server's first run of the size (s)", lambda r: _seconds(r.warm_first_seconds)),
            (
                "Spark jobs of the warm run (Connect REST API)",
                lambda r: str(r.warm_spark_jobs) if r.warm_spark_jobs is not None else "n/a",
            ),
            ("warm / scandir", lambda r: f"{r.warm_seconds / r.scandir_seconds:.1f}×" if r.warm_seconds else "n/a"),
            ("peak driver RSS, Python (MiB)", lambda r: _mib(r.graph["peaks"]["python_rss"])),
            ("peak driver RSS, JVM (MiB)", lambda r: _mib(r.graph["peaks"]["jvm_rss"])),
            ("peak JVM heap used (MiB)", lambda r: _mib(r.graph["peaks"]["jvm_heap_used"])),
            ("candidates", lambda r: f"{r.candidates:,}"),
            ("scandir + set difference (s)", lambda r: f"{r.scandir_seconds:.1f}"),
            ("graph / scandir", lambda r: f"{r.graph['seconds'] / r.scandir_seconds:.1f}×"),
            ("candidates equal scandir's", lambda r: "yes" if r.candidates_agree else "**NO**"),
            ("load average (1 min)", lambda r: f"{r.load_average[0]:.2f}" if r.load_average else ""),
            (
                "lake generation (s, not in total)",
                lambda r: f"{r.generate_seconds:.0f}" if r.generate_seconds else "cached",
            ),
        ]
        for title, cell in rows:
            lines.append(f"| {title} | " + " | ".join(cell(r) for r in lakes) + " |")
        lines += [f"{r.size}: {CpuSplit(**r.cold_cpu).line()}" for r in lakes if r.cold_cpu]
    if deltas:
        lines += [
            "",
            "| Delta table files | delta-rs full vacuum (s) | graph in this process (s) | cold CLI (s) | warm CLI (s) "
            "| cold / delta-rs | warm / delta-rs | Spark jobs (in process / warm) | candidates (delta-rs / graph) "
            "| equal | load (1 min) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        ]
        for d in deltas:
            if d.graph_seconds is None:
                lines.append(
                    f"| {d.files:,} | {d.delta_rs_seconds:.2f} | n/a | | | | | "
                    f"| {d.delta_rs_candidates:,} / n/a | {d.note} | |"
                )
                continue
            lines.append(
                f"| {d.files:,} | {d.delta_rs_seconds:.2f} | {d.graph_seconds:.1f} "
                f"| {_seconds(d.cold_seconds)} | {_seconds(d.warm_seconds)} "
                f"| {_ratio(d.cold_seconds, d.delta_rs_seconds)} | {_ratio(d.warm_seconds, d.delta_rs_seconds)} "
                f"| {d.spark_jobs} / {d.warm_spark_jobs if d.warm_spark_jobs is not None else 'n/a'} "
                f"| {d.delta_rs_candidates:,} / {d.graph_candidates:,} | {'yes' if d.candidates_agree else '**NO**'} "
                f"| {d.load_average[0] if d.load_average else float('nan'):.2f} |"
            )
        lines += [f"{d.files:,} files: {CpuSplit(**d.cold_cpu).line()}" for d in deltas if d.cold_cpu]
        lines += [
            f"{d.files:,} files: the warm run timed is the server's second of the size; its first took "
            f"{d.warm_first_seconds:.1f} s"
            for d in deltas
            if d.warm_first_seconds
        ]
        detailed = [d for d in deltas if d.steps]
        if detailed:
            lines += [
                "",
                "| step of the in-process run (s) | " + " | ".join(f"{d.files:,} files" for d in detailed) + " |",
            ]
            lines.append("|---|" + "---:|" * len(detailed))
            for step in dict.fromkeys(step for d in detailed for step in d.steps):
                lines.append(f"| {step} | " + " | ".join(f"{d.steps.get(step, 0):.1f}" for d in detailed) + " |")
    return "\n".join(lines)


def plot(lakes: list[LakeResult], path: Path) -> None:
    """Time against objects on log-log axes, with the graph's steps stacked by phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objects = [r.objects for r in lakes]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(objects, [r.graph["seconds"] for r in lakes], "o-", label="run total (dry run)")
    ax.plot(objects, [r.scandir_seconds for r in lakes], "s--", label="os.scandir + set difference (1 process)")
    for step in ("object_inventory", "orphan_candidates", "live_files"):
        ax.plot(objects, [r.graph["steps"].get(step, float("nan")) for r in lakes], ".:", label=f"step {step}")
    for r in lakes:  # the machine is shared: say how busy it was at each point
        ax.annotate(
            f"load {r.load_average[0]:.1f}",
            (r.objects, r.graph["seconds"]),
            textcoords="offset points",
            xytext=(4, 6),
            fontsize=7,
        )
    linear = [lakes[0].graph["seconds"] * n / objects[0] for n in objects]
    ax.plot(objects, linear, color="grey", linewidth=0.8, label="linear from the smallest size")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("objects in the namespace")
    ax.set_ylabel("wall time (s)")
    ax.set_title("gc_assets dry run on a 2-core machine")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_results(lakes: list[LakeResult], deltas: list[DeltaResult], failures: list[str]) -> None:
    print(format_tables(lakes, deltas))
    for failure in failures:
        print(f"\nFAILED {failure}")


def report(paths: list[str], plot_path: Optional[str]) -> int:
    """Tables (and the plot) of results saved by earlier runs, e.g. sizes measured separately."""
    lakes: list[LakeResult] = []
    deltas: list[DeltaResult] = []
    catalogs: list[CatalogResult] = []
    failures: list[str] = []
    for path in paths:
        saved = json.loads(Path(path).read_text())
        lakes += [LakeResult(**r) for r in saved["lakes"]]
        deltas += [DeltaResult(**d) for d in saved["delta"]]
        catalogs += [CatalogResult(**c) for c in saved.get("catalogs", [])]
        failures += saved.get("failures", [])
    lakes.sort(key=lambda r: r.objects)
    deltas.sort(key=lambda d: d.files)
    print_results(lakes, deltas, failures)
    if catalogs:
        print("\n" + format_catalog_table(catalogs))
    if plot_path and len(lakes) > 1:
        plot(lakes, Path(plot_path))
    return 0


def _catalog_config(path: Path, state_dir: Path, repos: list[dict[str, Any]]) -> Path:
    shutil.rmtree(state_dir, ignore_errors=True)
    return write_config(path, state_dir, repos)


def _labels(text: str, known: dict[str, Any]) -> list[str]:
    labels = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in labels if t not in known]
    if unknown:
        raise SystemExit(f"unknown size(s) {unknown}; choose from {', '.join(known)}")
    return labels


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100k,1M", help=f"lake sizes, from {', '.join(SIZES)} (default 100k,1M)")
    parser.add_argument("--with-10m", action="store_true", help="also run 10M objects (about 10 GB of inodes and time)")
    parser.add_argument(
        "--delta", default="100,200k", help=f"Delta table sizes in files, from {', '.join(DELTA_SIZES)}; empty to skip"
    )
    parser.add_argument(
        "--with-2m",
        action="store_true",
        help="also the 2M-file Delta table (1,000 appends: about 2.2 GB in 2 M small files, "
        "9 GB of disk blocks, 50 minutes to write on 2 cores)",
    )
    parser.add_argument(
        "--catalog", default="1M", help=f"file catalog sizes in rows, from {', '.join(CATALOG_SIZES)}; empty to skip"
    )
    parser.add_argument(
        "--catalog-only", action="store_true", help="run only the file catalog sizes (no lakes, no Delta tables)"
    )
    parser.add_argument(
        "--no-cold", dest="cold", action="store_false", help="skip the cold `gc-assets run` of each size"
    )
    parser.add_argument(
        "--no-warm", dest="warm", action="store_false", help="skip the warm runs (no Spark Connect server)"
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="also run each lake in lakeFS's own layout (format: lakefs) beside its export",
    )
    parser.add_argument("--work-dir", default="bench/results", help="lakes, state and results (reused between runs)")
    parser.add_argument("--json", dest="json_path", help="write the results as JSON here")
    parser.add_argument("--plot", help="write the scaling plot (PNG) here; needs matplotlib (the bench extra)")
    parser.add_argument(
        "--report", nargs="+", metavar="JSON", help="only print the tables (and plot) of earlier --json files"
    )
    return parser


@dataclass
class _Results:
    """Every finished size, and the failures, saved after each one when --json is given."""

    json_path: Optional[str]
    lakes: list[LakeResult] = field(default_factory=list)
    deltas: list[DeltaResult] = field(default_factory=list)
    catalogs: list[CatalogResult] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def save(self) -> None:
        """Results so far, so that a long run that is stopped keeps its finished sizes."""
        if self.json_path:
            results = {
                "lakes": [asdict(r) for r in self.lakes],
                "delta": [asdict(d) for d in self.deltas],
                "catalogs": [asdict(c) for c in self.catalogs],
                "failures": self.failures,
            }
            Path(self.json_path).write_text(json.dumps(results, indent=1))

    def measure(self, what: str, run: Callable[[], Any], results: list[Any]) -> None:
        try:
            results.append(run())
        except (SizeFailed, RuntimeError) as failure:
            self.failures.append(f"{what}: {failure}")
            print(f"{what} FAILED: {failure}", file=sys.stderr, flush=True)
        self.save()

    def agree(self) -> bool:
        return (
            all(r.candidates_agree for r in self.lakes)
            and all(d.candidates_agree is not False for d in self.deltas)
            and all(c.agree for c in self.catalogs)
        )


def _run_lakes_and_deltas(args: argparse.Namespace, work: Path, results: _Results) -> None:
    """The lakes (and their native layout) and the Delta tables, sharing one warm Spark Connect server."""
    sizes = [] if args.catalog_only else _labels(args.sizes, SIZES) + (["10M"] if args.with_10m else [])
    delta_labels = (
        []
        if args.catalog_only
        else (_labels(args.delta, DELTA_SIZES) if args.delta else []) + (["2M"] if args.with_2m else [])
    )
    with ExitStack() as stack:
        warm = stack.enter_context(warm_spark(work)) if args.warm else None
        for label in sizes:
            print(f"lake {label}: generating (or reusing) and running it ...", file=sys.stderr, flush=True)
            results.measure(
                f"lake {label}", lambda: bench_lake(work, label, SIZES[label], args.cold, warm), results.lakes
            )
            if args.native:
                print(
                    f"lake {label} in lakeFS's own layout: writing (or reusing) and running it ...",
                    file=sys.stderr,
                    flush=True,
                )
                results.measure(
                    f"lake {label} native",
                    lambda: bench_lake(work, label, SIZES[label], args.cold, warm, native=True),
                    results.lakes,
                )
        for label in dict.fromkeys(delta_labels):
            print(
                f"Delta table {label}: writing (or reusing), delta-rs vacuum and a run ...",
                file=sys.stderr,
                flush=True,
            )
            results.measure(
                f"Delta table {label}",
                lambda: bench_delta(work, label, DELTA_SIZES[label], args.cold, warm),
                results.deltas,
            )


def _run_catalogs(args: argparse.Namespace, work: Path, results: _Results) -> None:
    for label in _labels(args.catalog, CATALOG_SIZES) if args.catalog else []:
        print(f"file catalog {label}: generating (or reusing) and running it ...", file=sys.stderr, flush=True)
        results.measure(
            f"file catalog {label}",
            lambda: bench_catalog(work, label, run_graph, _catalog_config),
            results.catalogs,
        )


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.report:
        return report(args.report, args.plot)

    from gc_assets.core.spark import prepare_environment
    from gc_assets.stores.local import TRUST_MTIME_ENV_VAR

    prepare_environment()
    os.environ[TRUST_MTIME_ENV_VAR] = "1"  # generated lakes back-date their files' modification times
    work = Path(args.work_dir).resolve()
    results = _Results(args.json_path)
    _run_lakes_and_deltas(args, work, results)
    _run_catalogs(args, work, results)
    print_results(results.lakes, results.deltas, results.failures)
    if results.catalogs:
        print("\n" + format_catalog_table(results.catalogs))
    if args.plot and len(results.lakes) > 1:
        plot(results.lakes, Path(args.plot))
    return 0 if results.agree() and not results.failures else 1


if __name__ == "__main__":
    sys.exit(main())
