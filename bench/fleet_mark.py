"""Benchmark: the mark of N small Delta tables at once (mark.delta_tables), cold, against a delta-rs loop.

The tables are bench.fleet's (N tables of about `--files` data files, found by one `discover:`
entry). For each count a subprocess, cold (it starts its own JVM), marks every table
(mark_tables), lists every namespace (stores.many.list_many) and decides the candidates
(candidates_of); it reports its seconds from before the Spark session to the collected
candidates, its Spark jobs, and each table's candidates. Beside it, delta-rs's
`vacuum(dry_run=True, full=True)` over the same tables in this process, timed on its second
loop (the first fills the page cache, which the subprocess then also finds warm). Every table's
candidates must equal delta-rs's; a count that disagrees fails the bench.

Usage: python -m bench.fleet_mark [--tables 20,200] [--files 270] [--work-dir bench/results]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.fleet import fleet_config, fleet_tables, require_delta_rs_candidates
from bench.run import delta_rs_vacuum


def child(config: Path) -> None:
    """Mark every discovered table as of now and print one JSON line (runs in the subprocess)."""
    from gc_assets.core.spark import local_frame, spark_session
    from gc_assets.mark.delta_tables import mark_tables
    from gc_assets.mark.sets import candidates_of
    from gc_assets.sources.discovery import load_lake
    from gc_assets.stores.local import LocalStore
    from gc_assets.stores.many import list_many

    lake = load_lake(config)
    started = time.perf_counter()
    spark = spark_session()
    jvm_ready = time.perf_counter()
    now = dt.datetime.now(dt.timezone.utc)
    fleet = mark_tables(spark, lake.repositories, now)
    stores = {name: LocalStore(table.repo.storage_namespace) for name, table in fleet.tables.items()}
    held = local_frame(spark, [], "repo string, address string")
    decided = candidates_of(spark, lake, fleet, now, now, list_many(spark, stores), held, list(fleet.repos))
    rows = decided.frame.select("repo", "address").collect()
    seconds = time.perf_counter() - started
    jobs = int(spark.sparkContext._jsc.sc().dagScheduler().numTotalJobs())
    candidates: dict[str, list[str]] = {name: [] for name in fleet.tables}
    for row in rows:
        candidates[row["repo"]].append(row["address"])
    refusals = {**fleet.refused, **decided.refused}
    print(
        json.dumps(
            {
                "seconds": seconds,
                "jvm": jvm_ready - started,
                "jobs": jobs,
                "candidates": candidates,
                "refused": refusals,
            }
        )
    )


def measure(work: Path, tables: int, files: int) -> dict[str, float]:
    paths = fleet_tables(work, tables, files)
    expected = {path.name: delta_rs_vacuum(path)[1] for path in paths}  # also reads every file into the page cache
    started = time.perf_counter()
    for path in paths:
        delta_rs_vacuum(path)
    loop_seconds = time.perf_counter() - started  # the second loop: delta-rs at its fastest
    command = [sys.executable, "-m", "bench.fleet_mark", "--child", str(fleet_config(work, tables))]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if report["refused"]:
        raise SystemExit(f"{tables} tables: refused {report['refused']}")
    require_delta_rs_candidates(expected, {name: set(keys) for name, keys in report["candidates"].items()})
    return {
        "tables": tables,
        "candidates": sum(len(c) for c in expected.values()),
        "delta_rs_s": loop_seconds,
        "fleet_s": report["seconds"],
        "jvm_s": report["jvm"],
        "spark_jobs": report["jobs"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="20,200", help="two or more comma-separated table counts")
    parser.add_argument("--files", default=270, type=int, help="data files per table")
    parser.add_argument("--work-dir", default="bench/results", type=Path)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    work = (args.work_dir / "fleet").absolute()
    rows = [measure(work, int(n), args.files) for n in args.tables.split(",")]
    lines = [
        "| tables | candidates | delta-rs loop, warm (s) | fleet mark, cold (s) | JVM start (s) | ratio | Spark jobs |",
        "|---:" * 7 + "|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tables']:,} | {r['candidates']:,} | {r['delta_rs_s']:.2f} | {r['fleet_s']:.1f} | {r['jvm_s']:.1f} "
            f"| {r['fleet_s'] / r['delta_rs_s']:.1f}× | {r['spark_jobs']} |"
        )
    first, last = rows[0], rows[-1]
    extra = last["tables"] - first["tables"]
    lines.append(f"one more table: {(last['fleet_s'] - first['fleet_s']) / extra * 1000:.0f} ms")
    lines.append(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
