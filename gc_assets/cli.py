"""gc-assets: the command line of docs/design.md §9. Others script against it; keep it exact."""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from gc_assets.core.config import ConfigError
from gc_assets.core.names import ASSETS, Mode
from gc_assets.core.spark import spark_session, start_session_early
from gc_assets.core.time import TimeError, parse_timestamp, partition_date_of
from gc_assets.sources.discovery import load_lake
from gc_assets.stores.state import state_files
from gc_assets.sweep.run_ids import RunIdError
from gc_assets.terminal import Progress, log_path, quiet

CLI_MODES = {mode.value.replace("_", "-"): mode for mode in Mode}  # dry-run, trash, delete


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gc-assets", description="Garbage collection for versioned data lakes.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="build a demo lake and GC it end to end (dry run)")
    demo.add_argument("--dir", default="demo", help="where to build the demo lake (default: ./demo)")
    demo.add_argument(
        "--verbose", action="store_true", help="show Dagster's and Spark's logs instead of writing them to a file"
    )

    run = commands.add_parser(
        "run", help="materialize the five assets and their checks for one partition of each chosen repository"
    )
    run.add_argument("--config", required=True)
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--repo",
        action="append",
        dest="repos",
        metavar="REPO",
        help="a repository name or a glob such as 'sales/*'; repeat for several",
    )
    which.add_argument("--all", action="store_true", help="every configured and discovered repository")
    when = run.add_mutually_exclusive_group()
    when.add_argument("--date", help="partition date YYYY-MM-DD (default: today, UTC)")
    when.add_argument("--as-of", dest="as_of", help="GC as of this instant (ISO 8601 with zone)")
    run.add_argument("--mode", choices=sorted(CLI_MODES), help="default: the repository's configured mode")
    run.add_argument("--json", action="store_true", help="print the JSON summary as the last line")
    run.add_argument(
        "--verbose", action="store_true", help="show Dagster's and Spark's logs instead of writing them to a file"
    )

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

    explain = commands.add_parser("explain", help="why an object is live, a candidate, or neither")
    explain.add_argument("address", help="a key in the namespace, a full URI, or a logical path")
    explain.add_argument("--config", required=True)
    explain.add_argument("--repo", required=True)
    explain.add_argument("--date", help="partition date YYYY-MM-DD (default: today, UTC)")
    explain.add_argument("--json", action="store_true", help="print the explanation as one JSON object")
    explain.add_argument("--verbose", action="store_true", help="show Spark's logs instead of writing them to a file")

    plan = commands.add_parser("plan", help="what-if retention: candidates under other rules, nothing deleted")
    plan.add_argument("--config", required=True)
    plan.add_argument("--repo", required=True)
    plan.add_argument("--date", help="partition date YYYY-MM-DD (default: today, UTC)")
    plan.add_argument(
        "--rules",
        action="append",
        default=[],
        help="a rules JSON file; repeat to compare (default: the repository's own rules)",
    )
    plan.add_argument("--json", action="store_true", help="print the plans as one JSON object on the last line")
    plan.add_argument("--verbose", action="store_true", help="show Spark's logs instead of writing them to a file")

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


def _run(args: argparse.Namespace, own_process: bool) -> int:
    as_of: Optional[dt.datetime] = None
    if args.as_of:
        as_of = parse_timestamp(args.as_of)
        date = partition_date_of(as_of)
    elif args.date:
        date = _parse_date(args.date)
    else:
        date = dt.datetime.now(dt.timezone.utc).date()
    config = load_lake(args.config)
    repos = [repo.name for repo in config.repositories] if args.all else config.selected(args.repos)
    if not repos:
        raise ConfigError(f"{args.config}: no repositories configured or discovered")
    outcomes = []
    with quiet(log_path(config.logs_path, "run"), args.verbose), Progress() as progress:
        start_session_early()  # its JVM writes to the log, as every start under quiet
        if own_process:  # what the imports make lives as long as the process: never walked again
            gc.disable()
        from gc_assets.runner import format_summary, run_partitions

        if own_process:
            gc.freeze()
            gc.enable()
        runs = run_partitions(
            config, repos, date, as_of=as_of, mode=CLI_MODES[args.mode] if args.mode else None, progress=progress
        )
        started = time.monotonic()
        for outcome in runs:
            progress.line(format_summary(outcome, time.monotonic() - started))
            outcomes.append(outcome)
            started = time.monotonic()
    for outcome in outcomes:
        if not outcome.success:
            print(f"gc-assets: repository {outcome.summary['repo']} failed: {outcome.error}", file=sys.stderr)
    if args.json:
        for outcome in outcomes:
            print(json.dumps(outcome.summary, sort_keys=False), flush=True)
    return 0 if all(outcome.success for outcome in outcomes) else 1


def _export(args: argparse.Namespace) -> int:
    from gc_assets.runner import stored_location, stored_table

    date = _parse_date(args.date)
    config = load_lake(args.config)
    config.repository(args.repo)
    table = stored_table(args.config, args.asset, date, args.repo)
    if table is None:
        location = stored_location(args.config, args.asset, date, args.repo)
        print(
            f"gc-assets: {args.asset} has no materialization for {args.repo} on {date} (looked in {location})",
            file=sys.stderr,
        )
        return 1
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


def _today_or(text: Optional[str]) -> dt.date:
    return _parse_date(text) if text else dt.datetime.now(dt.timezone.utc).date()


def _partition(args: argparse.Namespace, date: dt.date, as_of: Optional[dt.datetime] = None) -> Any:
    """The partition as of `as_of`, by default `min(end of day, now)`."""
    from gc_assets.core.time import resolve_as_of
    from gc_assets.mark.partition import GcPartition

    config = load_lake(args.config)
    return GcPartition(
        config, config.repository(args.repo), date, as_of or resolve_as_of(date, dt.datetime.now(dt.timezone.utc), None)
    )


def _materialized(spark: Any, args: argparse.Namespace, date: dt.date, assets: Sequence[str]) -> dict[str, Any]:
    """The partition's materialized assets as Spark frames; missing ones are left out."""
    from gc_assets.runner import stored_frames

    return stored_frames(spark, args.config, date, args.repo, assets)


def _explain(args: argparse.Namespace) -> int:
    """Why one object is kept or collected, from the partition's materialized assets."""
    from gc_assets.questions.explain import explain_address

    date = _today_or(args.date)
    partition = _partition(args, date)
    needed = ("retained_commits", "live_files", "object_inventory", "orphan_candidates")
    with quiet(log_path(partition.config.logs_path, "explain"), args.verbose, announce=not args.json):
        spark = spark_session()
        frames = _materialized(spark, args, date, needed)
        missing = [asset for asset in needed if asset not in frames]
        if not missing:
            explanation = explain_address(spark, partition, frames, args.address, dt.datetime.now(dt.timezone.utc))
    if missing:
        print(
            f"gc-assets: {', '.join(missing)} not materialized for {args.repo} on {date}: run `gc-assets run` first",
            file=sys.stderr,
        )
        return 1
    if args.json:
        print(json.dumps(explanation.as_json()), flush=True)
    else:
        print(f"{explanation.address}: {explanation.status}", flush=True)
        for reason in explanation.reasons:
            print(f"  {reason}", flush=True)
    return 0


def _plan(args: argparse.Namespace) -> int:
    """Candidates and bytes under each rules file, over one graph and one inventory; nothing written."""
    from gc_assets.core.config import Rules
    from gc_assets.questions.whatif import RulesChoice, plan_retention, plan_text
    from gc_assets.runner import stored_mark
    from gc_assets.stores import store_for

    date = _today_or(args.date)
    # The as-of and mark the partition's stored mark was made with, when there is one.
    recorded = stored_mark(args.config, date, args.repo)
    partition = _partition(args, date, recorded[0] if recorded else None)
    choices = []
    for path in args.rules:
        try:
            rules = Rules.model_validate(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--rules {path}: {exc}") from None
        choices.append(RulesChoice(path, rules))
    with quiet(log_path(partition.config.logs_path, "plan"), args.verbose), Progress() as progress:
        spark = spark_session()
        inventory = _materialized(spark, args, date, ["object_inventory"]).get("object_inventory")
        if inventory is None:
            progress.started("listing the namespace")
            inventory = store_for(partition.repo).list(spark)
        if not choices:
            choices = [RulesChoice(args.config, None, configured=True)]
        plans = plan_retention(
            spark,
            partition,
            inventory,
            choices,
            dt.datetime.now(dt.timezone.utc),
            mark=recorded[1] if recorded else None,
            started=lambda label: progress.started(f"evaluating {label}"),
            planned=lambda plan: progress.line(
                f"  {'rules':<18} {plan.rules}: {plan.orphan_candidates} candidates, "
                f"{plan.reclaimable_bytes} bytes reclaimable"
            ),
        )
    print(plan_text(plans), flush=True)
    if args.json:
        print(json.dumps({"plans": [plan.as_json() for plan in plans]}), flush=True)
    return 0


def _restore(args: argparse.Namespace) -> int:
    """Put a trash run's objects back, under the repository's lease; receipts go to the state dir."""
    from gc_assets.stores import store_for
    from gc_assets.sweep.trash import restore

    config = load_lake(args.config)
    repo = config.repository(args.repo)
    done = restore(store_for(repo), repo, args.run_id, state_files(config), spark_session)
    failed = done.failed
    print(
        json.dumps(
            {
                "repo": repo.name,
                "run_id": args.run_id,
                "receipts": done.counts,
                "failed": failed[:20],
                "output": str(done.location),
            }
        ),
        flush=True,
    )
    if not done.rows:
        print(f"gc-assets: nothing in the trash of run {args.run_id}", file=sys.stderr)
        return 1
    return 0 if not failed else 1


def _release(args: argparse.Namespace) -> int:
    """Lift the holds of one restore: its objects may become candidates again."""
    from gc_assets.stores import store_for
    from gc_assets.sweep.holds import release

    repo = load_lake(args.config).repository(args.repo)
    released = release(store_for(repo), args.run_id)
    print(json.dumps({"repo": repo.name, "run_id": args.run_id, "released": released}), flush=True)
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
    from gc_assets.demo.embedded import run_demo

    return run_demo(Path(args.dir), verbose=args.verbose)


def main(argv: Optional[Sequence[str]] = None, own_process: bool = False) -> int:
    """The command of `argv`; `own_process`: the process is the command's alone (`entry`), and
    the collector may leave the run's imports alone."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args, own_process)
        if args.command == "export":
            return _export(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "release":
            return _release(args)
        if args.command == "explain":
            return _explain(args)
        if args.command == "plan":
            return _plan(args)
        return _restore(args)
    except (ConfigError, TimeError, RunIdError) as exc:
        print(f"gc-assets: {exc}", file=sys.stderr)
        return 2


def entry() -> None:
    """The `gc-assets` command: main in a process of its own, then an exit that skips the
    interpreter's last full collection, which walks every object a run made only to free it
    with the process (2.4 s after a run over 1,000 tables); frozen (`gc.freeze`), they go back
    with the process's memory. A run's imports are frozen too, as soon as they are made: the
    collector then walked its objects for 2.7 s of a run over 1,000 tables, not 4.3."""
    code = main(own_process=True)
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
