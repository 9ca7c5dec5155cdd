"""gc-assets: the command line of docs/design.md §9. Others script against it; keep it exact."""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from gc_assets.core.config import ConfigError, load_config
from gc_assets.core.names import ASSETS, MODES
from gc_assets.defs.partitions import TimeError, parse_timestamp, partition_date_of
from gc_assets.runner import format_summary, run_partition
from gc_assets.sweep.sweeper import RunIdError

CLI_MODES = {mode.replace("_", "-"): mode for mode in MODES}  # dry-run, trash, delete


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gc-assets", description="Garbage collection for versioned data lakes.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="build a demo lake and GC it end to end (dry run)")
    demo.add_argument("--dir", default="demo", help="where to build the demo lake (default: ./demo)")

    run = commands.add_parser("run", help="materialize the five assets and their checks for one partition")
    run.add_argument("--config", required=True)
    run.add_argument("--repo", required=True)
    when = run.add_mutually_exclusive_group()
    when.add_argument("--date", help="partition date YYYY-MM-DD (default: today, UTC)")
    when.add_argument("--as-of", dest="as_of", help="GC as of this instant (ISO 8601 with zone)")
    run.add_argument("--mode", choices=sorted(CLI_MODES), help="default: the repository's configured mode")
    run.add_argument("--json", action="store_true", help="print the JSON summary as the last line")

    export = commands.add_parser("export", help="write an asset partition as JSON Lines or CSV")
    export.add_argument("asset", choices=ASSETS)
    export.add_argument("--config", required=True)
    export.add_argument("--repo", required=True)
    export.add_argument("--date", required=True)
    export.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")

    restore = commands.add_parser("restore", help="move a trash run's objects back")
    restore.add_argument("--config", required=True)
    restore.add_argument("--repo", required=True)
    restore.add_argument("--run-id", dest="run_id", required=True)

    release = commands.add_parser("release", help="lift the holds a restore placed on the objects it brought back")
    release.add_argument("--config", required=True)
    release.add_argument("--repo", required=True)
    release.add_argument("--run-id", dest="run_id", required=True)
    return parser


def _parse_date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise TimeError(f"--date {text!r} is not a date like 2022-03-31") from None


def _run(args: argparse.Namespace) -> int:
    as_of: Optional[dt.datetime] = None
    if args.as_of:
        as_of = parse_timestamp(args.as_of)
        date = partition_date_of(as_of)
    elif args.date:
        date = _parse_date(args.date)
    else:
        date = dt.datetime.now(dt.timezone.utc).date()
    started = time.monotonic()
    outcome = run_partition(args.config, args.repo, date, as_of=as_of, mode=CLI_MODES[args.mode] if args.mode else None)
    print(format_summary(outcome, time.monotonic() - started), flush=True)
    if args.json:
        print(json.dumps(outcome.summary, sort_keys=False), flush=True)
    return 0 if outcome.success else 1


def _export(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from gc_assets.defs.partitions import partition_key
    from gc_assets.defs.resources import GcConfigResource

    date = _parse_date(args.date)
    config = load_config(args.config)
    config.repository(args.repo)
    location = Path(GcConfigResource(config_path=args.config).state_location(args.asset, partition_key(date, args.repo)))
    if not location.is_dir():
        print(f"gc-assets: {args.asset} has no materialization for {args.repo} on {date} (looked in {location})", file=sys.stderr)
        return 1
    table = pq.read_table(location)
    rows = table.to_pylist()
    if args.format == "jsonl":
        for row in rows:
            sys.stdout.write(json.dumps({k: _jsonable(v) for k, v in row.items()}) + "\n")
    else:
        writer = csv.DictWriter(sys.stdout, fieldnames=table.column_names)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _jsonable(v) for k, v in row.items()})
    sys.stdout.flush()
    return 0


def _restore(args: argparse.Namespace) -> int:
    """Put a trash run's objects back, under the repository's lease; receipts go to the state dir."""
    from pyspark.sql import SparkSession

    from gc_assets.core.spark import default_spark_config
    from gc_assets.defs.partitions import partition_key
    from gc_assets.defs.resources import GcConfigResource, spark_path
    from gc_assets.stores import store_for
    from gc_assets.sweep import lease
    from gc_assets.sweep.sweeper import (
        TRASH_RUNS_PREFIX,
        checked_run_id,
        record_hold,
        restore_run,
    )

    config = load_config(args.config)
    repo = config.repository(args.repo)
    store = store_for(repo)
    checked_run_id(store, args.run_id, TRASH_RUNS_PREFIX)
    builder = SparkSession.builder
    for key, value in default_spark_config().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    now = dt.datetime.now(dt.timezone.utc)
    held = lease.acquire(store, f"restore-{args.run_id}", f"restore|{repo.name}", now)
    try:
        location = GcConfigResource(config_path=args.config).state_location(
            "restores", partition_key(now.date(), repo.name), f"run_id={args.run_id}"
        )
        restore_run(spark, store, args.run_id).write.mode("overwrite").parquet(spark_path(location))
        rows = spark.read.parquet(spark_path(location)).collect()
        record_hold(store, args.run_id, [r["address"] for r in rows if r["action"] == "restored"], now)
    finally:
        lease.release(store, held)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["action"]] = counts.get(row["action"], 0) + 1
    if rows and set(counts) == {"restored"}:
        store.remove(f"{TRASH_RUNS_PREFIX}{args.run_id}.json")
    failed = [row["address"] for row in rows if row["action"] != "restored"]
    print(json.dumps({"repo": repo.name, "run_id": args.run_id, "receipts": counts, "failed": failed[:20], "output": location}), flush=True)
    if not rows:
        print(f"gc-assets: nothing in the trash of run {args.run_id}", file=sys.stderr)
        return 1
    return 0 if not failed else 1


def _release(args: argparse.Namespace) -> int:
    """Lift the holds of one restore: its objects may become candidates again."""
    from gc_assets.stores import store_for
    from gc_assets.sweep.sweeper import HOLDS_PREFIX, checked_run_id

    repo = load_config(args.config).repository(args.repo)
    store = store_for(repo)
    run_id = checked_run_id(store, args.run_id, HOLDS_PREFIX)
    record = json.loads(store.read_text(f"{HOLDS_PREFIX}{run_id}.json") or "{}")
    store.remove(f"{HOLDS_PREFIX}{run_id}.json")
    print(json.dumps({"repo": repo.name, "run_id": run_id, "released": len(record.get("addresses", []))}), flush=True)
    return 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def _demo(args: argparse.Namespace) -> int:
    from gc_assets.demo import run_demo

    return run_demo(Path(args.dir))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "export":
            return _export(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "release":
            return _release(args)
        return _restore(args)
    except (ConfigError, TimeError, RunIdError) as exc:
        print(f"gc-assets: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
