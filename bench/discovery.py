"""Benchmark: what a lake of many tables costs before any Spark job (docs/BENCHMARKS.md).

For each count N a warehouse of N Delta tables (two levels of directories, one real
commit each, written as delta-rs writes a first commit) is made under the work directory,
and the bench times, in one process:
- loading a gc.yaml that lists the N tables as repositories (parse, validation, overlap check);
- loading a gc.yaml with one `discover:` entry that finds the same N tables (directory walk);
- one tick of the `repository_registry` sensor and one of `new_commits` (a fingerprint per
  table) on a SQLite Dagster instance, as the daemon evaluates them.

Usage: python -m bench.discovery [--tables 1000,10000] [--work-dir bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import yaml

COMMIT = {
    "protocol": {"minReaderVersion": 1, "minWriterVersion": 2},
    "metaData": {
        "id": "bench",
        "format": {"provider": "parquet", "options": {}},
        "schemaString": '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}}]}',
        "partitionColumns": [],
        "configuration": {},
        "createdTime": 0,
    },
}


def warehouse(root: Path, tables: int) -> Path:
    """N tables as team-<i // 100>/table-<i>, made once and kept (a bench run never changes them)."""
    done = root / f".complete-{tables}"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    lines = "\n".join(json.dumps({key: value}) for key, value in COMMIT.items()) + "\n"
    for i in range(tables):
        log = root / f"team-{i // 100:03d}" / f"table-{i:05d}" / "_delta_log"
        log.mkdir(parents=True)
        (log / "00000000000000000000.json").write_text(lines)
    done.touch()
    return root


def timed(what) -> tuple[float, object]:
    start = time.perf_counter()
    result = what()
    return time.perf_counter() - start, result


def measure(root: Path, tables: int) -> dict[str, float]:
    from dagster import build_sensor_context, instance_for_test

    from gc_assets.core.config import load_config
    from gc_assets.defs.build import build_definitions
    from gc_assets.sources.discovery import load_lake

    place = warehouse(root / f"warehouse-{tables}", tables)
    names = sorted(str(p.parent.relative_to(place)) for p in place.glob("*/*/_delta_log"))
    assert len(names) == tables
    listed = root / f"listed-{tables}.yaml"
    repos = [{"name": n, "format": "delta", "storage_namespace": (place / n).as_uri()} for n in names]
    listed.write_text(yaml.safe_dump({"repositories": repos}))
    discovering = root / f"discover-{tables}.yaml"
    discovering.write_text(
        yaml.safe_dump({"repositories": [{"discover": {"format": "delta", "under": place.as_uri()}}]})
    )

    row: dict[str, float] = {"tables": tables}
    row["config_listed_s"], config = timed(lambda: load_config(listed))
    row["config_discovered_s"], lake = timed(lambda: load_lake(discovering))
    assert [r.name for r in lake.repositories] == [r.name for r in config.repositories] == names
    defs = build_definitions(lake, str(discovering))
    with tempfile.TemporaryDirectory() as home, instance_for_test(temp_dir=home) as instance:
        for sensor in ("repository_registry", "new_commits"):
            context = build_sensor_context(
                instance=instance, instance_ref=instance.get_ref(), repository_def=defs.get_repository_def()
            )
            row[f"{sensor}_tick_s"], result = timed(lambda: defs.get_sensor_def(sensor).evaluate_tick(context))
            for request in result.dynamic_partitions_requests or []:  # registered as the daemon would
                instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        row["run_requests"] = len(result.run_requests or [])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="1000,10000", help="comma-separated table counts")
    parser.add_argument("--work-dir", default="bench/results", type=Path)
    args = parser.parse_args()
    rows = [measure(args.work_dir / "discovery", int(n)) for n in args.tables.split(",")]
    load = os.getloadavg()[0]
    print("| tables | config, listed (s) | config, discovered (s) | registry tick (s) | new_commits tick (s) |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['tables']:,} | {r['config_listed_s']:.2f} | {r['config_discovered_s']:.2f} "
            f"| {r['repository_registry_tick_s']:.2f} | {r['new_commits_tick_s']:.2f} |"
        )
    print(f"run requests of the new_commits tick: {', '.join(str(r['run_requests']) for r in rows)}")
    print(f"load average (1 min) at the end: {load:.1f}")


if __name__ == "__main__":
    main()
