"""Run the GC graph for one partition through the project's Definitions, and summarize it."""

from __future__ import annotations

import datetime as dt
import os
import uuid
import warnings
from typing import Iterator, Optional, Sequence

import pyarrow as pa
from dagster import (
    DagsterEventType,
    DagsterInstance,
    EventLogEntry,
    JobDefinition,
)
from pyspark.sql import DataFrame, SparkSession

from gc_assets.core.config import GcConfig, RepositoryConfig
from gc_assets.core.time import AS_OF_TAG, as_of_tags, format_timestamp, parse_timestamp
from gc_assets.defs.build import build_definitions
from gc_assets.defs.instance import ephemeral_instance
from gc_assets.defs.partitions import REPOSITORIES, partition_key
from gc_assets.defs.resources import GcConfigResource, recorded_mark, share_reading
from gc_assets.defs.set_runs import (
    FLEET_JOB,
    GC_JOB_CHECKS,
    TOLD,
    RunOutcome,
    chosen_modes,
    fleet_outcomes,
    fleet_run_config,
)
from gc_assets.mark.partition import Mark
from gc_assets.sources.discovery import load_lake
from gc_assets.stores.state import state_files
from gc_assets.terminal import Progress


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def instance_for_run() -> DagsterInstance:
    """The instance under $DAGSTER_HOME when set, else an ephemeral one."""
    if os.environ.get("DAGSTER_HOME"):
        return DagsterInstance.get()
    return ephemeral_instance()


def run_partition(
    config_path: str,
    repo: str,
    date: dt.date,
    as_of: Optional[dt.datetime] = None,
    mode: Optional[str] = None,
    instance: Optional[DagsterInstance] = None,
    progress: Optional[Progress] = None,
) -> RunOutcome:
    """Materialize the five assets and their checks for (date, repo), a set of one; `progress`
    hears of each asset and check as the run goes."""
    return next(run_partitions(load_lake(config_path), [repo], date, as_of, mode, instance, progress))


def run_partitions(
    config: GcConfig,
    repos: Sequence[str],
    date: dt.date,
    as_of: Optional[dt.datetime] = None,
    mode: Optional[str] = None,
    instance: Optional[DagsterInstance] = None,
    progress: Optional[Progress] = None,
) -> Iterator[RunOutcome]:
    """Collect (date, repo) of each of `repos` in this process, as one fleet_job run: the
    configuration, the Definitions, the instance and the Spark session are made once, and every
    repository is judged at the same as-of, fixed once here. A failed one does not stop the next."""
    share_reading(config)  # one reading, one list of discovered tables, for every run below
    state_files(config)  # a state directory that cannot be written refuses before any run
    repositories = [config.repository(repo) for repo in repos]  # an unknown name refuses before any run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        defs = build_definitions(config, config.source_path or "")
    # The as-of, fixed now at launch: every step of every run reads this tag, the summaries report it.
    tags = as_of_tags(date, utc_now(), format_timestamp(as_of) if as_of else None)
    instance = instance or instance_for_run()
    instance.add_dynamic_partitions(REPOSITORIES.name, [repo.name for repo in repositories])
    fleet_job = defs.resolve_job_def(FLEET_JOB)
    as_of_time = parse_timestamp(tags[AS_OF_TAG])
    yield from collect_fleet(fleet_job, instance, repositories, date, as_of_time, tags, mode, progress)


def collect_fleet(
    fleet_job: JobDefinition,
    instance: DagsterInstance,
    repositories: Sequence[RepositoryConfig],
    date: dt.date,
    as_of: dt.datetime,
    tags: dict[str, str],
    mode: Optional[str],
    progress: Optional[Progress],
) -> list[RunOutcome]:
    """One fleet_job run that collects `repositories` as one set, each in `mode` (None: its configured one)."""
    names = [repo.name for repo in repositories]
    run_id = str(uuid.uuid4())
    heard: list[EventLogEntry] = []
    # One table's run is told asset by asset and check by check; a fleet's, phase by phase.
    tell = report if len(names) == 1 else report_fleet

    def hear(entry: EventLogEntry) -> None:
        if entry.dagster_event is not None and entry.dagster_event.event_type in TOLD:
            heard.append(entry)
        if progress is not None:
            tell(progress, entry)

    instance.add_event_listener(run_id, hear)
    result = fleet_job.execute_in_process(
        instance=instance,
        run_id=run_id,
        partition_key=date.isoformat(),
        tags=tags,
        run_config=fleet_run_config(names, mode=mode or ""),
        raise_on_error=False,
    )
    modes = chosen_modes(repositories, mode)
    return fleet_outcomes(heard, result, names, date, as_of, GC_JOB_CHECKS, lambda name: modes[name].value)


def report_fleet(progress: Progress, entry: EventLogEntry) -> None:
    """Tell `progress` what a fleet run logs (each asset stored for every table at once), not
    each of its thousands of partitions."""
    if entry.dagster_event is None and entry.user_message:
        progress.line(f"  {entry.user_message}")
    elif entry.dagster_event is not None and entry.dagster_event.event_type == DagsterEventType.STEP_FAILURE:
        report(progress, entry)


def report(progress: Progress, entry: EventLogEntry) -> None:
    """Tell `progress` about one event of the run: a step started, an asset or check done, a failure."""
    event = entry.dagster_event
    if event is None:
        return
    if event.event_type == DagsterEventType.STEP_START:
        progress.started(event.step_key or "")
    elif event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
        materialization = event.step_materialization_data.materialization
        progress.materialized(
            materialization.asset_key.path[-1], {k: v.value for k, v in materialization.metadata.items()}
        )
    elif event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
        evaluation = event.asset_check_evaluation_data
        progress.checked(evaluation.check_name, evaluation.passed)
    elif event.event_type == DagsterEventType.STEP_FAILURE and event.step_failure_data is not None:
        error = event.step_failure_data.error
        while error is not None and error.cause is not None:
            error = error.cause
        progress.failed(event.step_key or "", error.message.strip().splitlines()[0] if error else "step failed")


def format_summary(outcome: RunOutcome, elapsed: float) -> str:
    """A few readable lines for people; scripts read the JSON summary."""
    s = outcome.summary
    lines = [
        f"repository {s['repo']}  partition {s['date']}  as of {s['as_of']}  mode {s['mode']}",
        f"  commits      {s['retained_commits']} retained, {s['expired_commits']} expired",
        f"  live objects {s['live_objects']}",
        f"  inventory    {s['inventory_objects']} objects, {s['inventory_bytes']} bytes",
        f"  candidates   {s['orphan_candidates']} objects, {s['reclaimable_bytes']} bytes reclaimable",
        f"  receipts     {', '.join(f'{k}={v}' for k, v in sorted(s['receipts'].items())) or 'none'}",
        "  checks       " + ", ".join(f"{name}: {status}" for name, status in s["checks"].items()),
        f"  run {s['run_id']} {'succeeded' if outcome.success else 'FAILED'} in {elapsed:.1f}s",
    ]
    if outcome.error:
        lines.append(f"  error: {outcome.error}")
    return "\n".join(lines)


def stored_location(config_path: str, asset: str, date: dt.date, repo: str) -> str:
    """Where the partition (date, repo) of `asset` is stored: a path, or a URI on an object store."""
    gc_config = GcConfigResource(config_path=config_path)
    return gc_config.state().uri(gc_config.partition_at(asset, partition_key(date, repo)))


def stored_table(config_path: str, asset: str, date: dt.date, repo: str) -> Optional[pa.Table]:
    """The partition (date, repo) of `asset` read on this machine, without Spark; None when never stored."""
    gc_config = GcConfigResource(config_path=config_path)
    return gc_config.state().read_table(gc_config.partition_at(asset, partition_key(date, repo)))


def stored_frames(
    spark: SparkSession, config_path: str, date: dt.date, repo: str, assets: Sequence[str]
) -> dict[str, DataFrame]:
    """The partition's stored assets as Spark frames; assets never materialized are left out."""
    gc_config = GcConfigResource(config_path=config_path)
    found = {asset: gc_config.stored(spark, asset, partition_key(date, repo)) for asset in assets}
    return {asset: frame for asset, frame in found.items() if frame is not None}


def stored_mark(config_path: str, date: dt.date, repo: str) -> Optional[tuple[dt.datetime, Mark]]:
    """The as-of and the mark the partition's stored mark was made with, or None."""
    return recorded_mark(GcConfigResource(config_path=config_path), partition_key(date, repo))
