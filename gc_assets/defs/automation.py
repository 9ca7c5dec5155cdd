"""Sensors and schedules: keep partitions in step with gc.yaml, mark on new commits, GC daily.

Every evaluation re-reads gc.yaml, so adding a repository needs no code reload. None of
them starts Spark: the new-commit sensor asks each connector for a cheap fingerprint.
The schedule and the sensor request fleet runs (gc_assets.defs.set_runs): one run per tick
or day covers many repositories, each of which still gets a run of its own on its
partition. Every request carries the as-of tag that fixes the run's as-of when it is
requested (docs/design.md §2).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from dagster import (
    AssetKey,
    DagsterInstance,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    schedule,
    sensor,
)

from gc_assets.core.config import GcConfig, RepositoryConfig
from gc_assets.core.names import ASSETS
from gc_assets.core.time import as_of_tags
from gc_assets.defs.partitions import REPOSITORIES, split_partition_key
from gc_assets.defs.set_runs import fleet_run_config
from gc_assets.sources import source_for
from gc_assets.sources.discovery import load_lake

MAX_MARKS_PER_TICK = 1000  # repositories one mark run of the new-commit sensor covers
DAILY_CRON = "0 3 * * *"  # 03:00 UTC: yesterday's partition, well after midnight


# --- repository registry ---------------------------------------------------------------


@dataclass(frozen=True)
class RegistryPlan:
    add: list[str]  # configured, no partition yet
    drop: list[str]  # partition without materializations, no longer configured
    keep_removed: list[str]  # no longer configured, but its partitions hold materializations


def plan_registry(configured: list[str], existing: list[str], materialized_repos: set[str]) -> RegistryPlan:
    """What the registry does: add new repositories; drop only partitions that never materialized."""
    removed = [name for name in existing if name not in set(configured)]
    return RegistryPlan(
        add=[name for name in configured if name not in set(existing)],
        drop=[name for name in removed if name not in materialized_repos],
        keep_removed=[name for name in removed if name in materialized_repos],
    )


def materialized_repositories(instance: DagsterInstance) -> set[str]:
    """Repositories with at least one materialized partition of any GC asset."""
    repos: set[str] = set()
    for asset in ASSETS:
        repos.update(split_partition_key(key)[1] for key in instance.get_materialized_partitions(AssetKey(asset)))
    return repos


# --- new commits -----------------------------------------------------------------------


@dataclass
class CommitScan:
    """One tick of the new-commit sensor, decided from fingerprints alone."""

    changed: list[str] = field(default_factory=list)  # mark these, in one run
    deferred: list[str] = field(default_factory=list)  # changed, over the per-tick cap
    errors: dict[str, str] = field(default_factory=dict)
    cursor: dict[str, str] = field(default_factory=dict)


def scan_commits(
    fingerprints: Mapping[str, str | Exception], previous: Mapping[str, str], cap: int = MAX_MARKS_PER_TICK
) -> CommitScan:
    """Compare fingerprints with the cursor. A repository whose fingerprint failed, or that is
    over the cap, keeps its previous cursor entry, so a later tick picks it up."""
    scan = CommitScan()
    for repo, fingerprint in fingerprints.items():
        if isinstance(fingerprint, Exception):
            scan.errors[repo] = f"{type(fingerprint).__name__}: {fingerprint}"
        elif previous.get(repo) == fingerprint:
            scan.cursor[repo] = fingerprint
            continue
        elif len(scan.changed) < cap:
            scan.changed.append(repo)
            scan.cursor[repo] = fingerprint
            continue
        else:
            scan.deferred.append(repo)
        if repo in previous:
            scan.cursor[repo] = previous[repo]
    return scan


def fingerprint_of(repo: RepositoryConfig) -> str:
    """The connector's digest of the repository's refs and latest commits (no Spark)."""
    return source_for(repo).fingerprint(None)


def read_cursor(text: Optional[str]) -> dict[str, str]:
    """The sensor's cursor: {repository: fingerprint} as JSON; anything else starts afresh."""
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# --- daily schedule --------------------------------------------------------------------


def daily_request(
    config: GcConfig, registered: set[str], day: dt.date, now: dt.datetime
) -> tuple[Optional[RunRequest], list[str]]:
    """One fleet run for `day` over every registered repository, each in its configured mode,
    as of `min(end of day, now)`; and the configured repositories still waiting for their partition."""
    if day < config.partitions_start_date:
        return None, []
    names = [repo.name for repo in config.repositories if repo.name in registered]
    waiting = [repo.name for repo in config.repositories if repo.name not in registered]
    if not names:
        return None, waiting
    request = RunRequest(
        run_key=f"gc:{day.isoformat()}",
        partition_key=day.isoformat(),
        run_config=fleet_run_config(names),
        tags=as_of_tags(day, now),
    )
    return request, waiting


def mark_request(changed: Mapping[str, str], now: dt.datetime) -> RunRequest:
    """One mark-only fleet run for today over the repositories whose fingerprints moved; its run
    key names their new fingerprints, so the same change is never marked twice."""
    today = now.date()
    digest = hashlib.sha256(json.dumps(sorted(changed.items())).encode()).hexdigest()[:16]
    return RunRequest(
        run_key=f"mark:{today.isoformat()}:{digest}",
        partition_key=today.isoformat(),
        run_config=fleet_run_config(sorted(changed), mark_only=True),
        tags=as_of_tags(today, now),
    )


# --- definitions -----------------------------------------------------------------------


def _repository_registry(current_config: Callable[[], GcConfig]) -> SensorDefinition:
    """Partitions in step with gc.yaml."""

    @sensor(
        name="repository_registry",
        minimum_interval_seconds=60,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "Keeps the `repositories` partitions in step with gc.yaml: adds a partition for every new "
            "repository; a removed repository's partition is dropped only if it never materialized, "
            "otherwise it is kept and reported in the tick."
        ),
    )
    def repository_registry(context: SensorEvaluationContext):
        configured = [repo.name for repo in current_config().repositories]
        existing = list(context.instance.get_dynamic_partitions(REPOSITORIES.name))
        plan = plan_registry(configured, existing, materialized_repositories(context.instance))
        requests = []
        if plan.add:
            requests.append(REPOSITORIES.build_add_request(plan.add))
        if plan.drop:
            requests.append(REPOSITORIES.build_delete_request(plan.drop))
        notes = [f"added {', '.join(plan.add)}"] if plan.add else []
        notes += [f"dropped {', '.join(plan.drop)} (never materialized)"] if plan.drop else []
        if plan.keep_removed:
            kept = ", ".join(plan.keep_removed)
            context.log.warning(f"no longer in gc.yaml but kept because they hold materializations: {kept}")
            notes.append(f"kept {kept} (removed from gc.yaml, has materializations)")
        reason = "; ".join(notes) or "every configured repository has a partition"
        return SensorResult(dynamic_partitions_requests=requests, skip_reason=reason)

    return repository_registry


def _new_commits(current_config: Callable[[], GcConfig], fleet_job: JobDefinition) -> SensorDefinition:
    """One mark run covering the repositories whose fingerprints changed."""

    @sensor(
        name="new_commits",
        job=fleet_job,
        minimum_interval_seconds=300,
        default_status=DefaultSensorStatus.STOPPED,
        description=(
            "Marks today's partition of every repository whose refs or commits changed, judged by the "
            "connector's fingerprint (no Spark), in one mark-only fleet run per tick (each repository "
            f"still a run of its own). Cursor: JSON {{repository: fingerprint}}. At most {MAX_MARKS_PER_TICK} "
            "repositories per tick, the rest on the next; a repository that cannot be read is reported "
            "and does not hold up the others."
        ),
    )
    def new_commits(context: SensorEvaluationContext):
        config = current_config()
        fingerprints: dict[str, str | Exception] = {}
        for repo in config.repositories:
            try:
                fingerprints[repo.name] = fingerprint_of(repo)
            except Exception as exc:  # one broken repository must not stop the others
                fingerprints[repo.name] = exc
        scan = scan_commits(fingerprints, read_cursor(context.cursor))
        for repo, error in scan.errors.items():
            context.log.error(f"repository {repo}: cannot fingerprint: {error}")
        if scan.deferred:
            named = ", ".join(scan.deferred[:10]) + (", ..." if len(scan.deferred) > 10 else "")
            context.log.info(
                f"{len(scan.deferred)} changed repositories over the cap of {MAX_MARKS_PER_TICK} "
                f"wait for the next ticks: {named}"
            )
        cursor = json.dumps(scan.cursor, sort_keys=True)
        if scan.changed:
            request = mark_request({repo: scan.cursor[repo] for repo in scan.changed}, utc_now())
            return SensorResult(run_requests=[request], cursor=cursor)
        problems = "; ".join(f"{repo}: {error}" for repo, error in scan.errors.items())
        reason = f"no repository changed; errors: {problems}" if problems else "no repository changed"
        return SensorResult(skip_reason=reason, cursor=cursor)

    return new_commits


def _daily_gc(current_config: Callable[[], GcConfig], fleet_job: JobDefinition) -> ScheduleDefinition:
    """The whole graph for yesterday, every day, in one fleet run."""

    @schedule(
        name="daily_gc",
        job=fleet_job,
        cron_schedule=DAILY_CRON,
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.STOPPED,
        description=(
            "Every day at 03:00 UTC, one fleet run over yesterday's partition of every registered "
            "repository (each a gc_job run of its own), in the repository's configured mode "
            "(dry_run unless gc.yaml says otherwise)."
        ),
    )
    def daily_gc(context: ScheduleEvaluationContext):
        scheduled = context.scheduled_execution_time or dt.datetime.now(dt.timezone.utc)
        day = scheduled.astimezone(dt.timezone.utc).date() - dt.timedelta(days=1)
        registered = set(context.instance.get_dynamic_partitions(REPOSITORIES.name))
        request, waiting = daily_request(current_config(), registered, day, utc_now())
        if waiting:
            context.log.warning(f"no partition yet (repository_registry adds it): {', '.join(waiting)}")
        return request or SkipReason("no registered repository to collect")

    return daily_gc


def build_automation(
    config_path: str, fleet_job: JobDefinition
) -> tuple[list[SensorDefinition], list[ScheduleDefinition]]:
    """The sensors and schedules of a gc.yaml (empty path: $GC_ASSETS_CONFIG, else ./gc.yaml)."""

    def current_config() -> GcConfig:
        return load_lake(config_path or None)

    sensors = [_repository_registry(current_config), _new_commits(current_config, fleet_job)]
    return sensors, [_daily_gc(current_config, fleet_job)]
