"""Runs that cover many repositories (docs/design.md §9).

`fleet_job` is one run per date for any number of repositories: the daily schedule and
backfills launch it for every registered repository, the new-commit sensor for the
repositories that moved (mark only), and `gc-assets run --all` does the same work from the
command line. One process reads gc.yaml once, keeps one JVM and judges every repository at
the fleet run's as-of.

Its repositories, one or many, whatever their format (Delta and Iceberg tables, lakeFS
repositories native or exported, file catalogs) and store (local, S3, Azure, GCS), are one
set (sweep.together): marked, listed and judged together (mark.sets), then each receipted in
its own mode in the same run, those that trash or delete swept as one set (sweep.set_sweep,
defs.set_records; each file catalog's rows cleaned first, under its lease). Each (date, repo)
partition still gets its own materializations and check results, each table its own lease
and journal rows. A repository outside the run whose retained versions reach into one of
its tables (mark.shared.referrers_of) is marked with them, only for what it needs there. A
failed repository does not stop the next: the fleet run fails at the end, naming every one
that failed.
"""

import datetime as dt
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from dagster import (
    AssetCheckEvaluation,
    Config,
    DagsterEventType,
    EventLogEntry,
    ExecuteInProcessResult,
    Failure,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    RunConfig,
    job,
    op,
)
from dagster_pyspark import LazyPySparkResource

from gc_assets.core.config import GcConfig, RepositoryConfig
from gc_assets.core.names import ASSETS, Mode
from gc_assets.core.spark import session_summary
from gc_assets.core.time import format_timestamp
from gc_assets.defs.concurrency import not_sole_runs
from gc_assets.defs.metadata import ROW_COUNT
from gc_assets.defs.partitions import REPOSITORIES, date_partitions, run_as_of, split_partition_key
from gc_assets.defs.resources import GcConfigResource, share_reading
from gc_assets.defs.set_records import recorded, utc_now
from gc_assets.sweep.guard_table import GUARDS
from gc_assets.sweep.together import LIVE, RECEIPTS, Acting, Collected, Judged, Store, collect, readers_of

FLEET_JOB = "fleet_job"
FLEET_TAG = "gc_assets/fleet"  # on every fleet run: dagster.yaml's queue runs one at a time
FAILED_METADATA = "failed"  # on a fleet run's failure: repository -> why it failed
GC_JOB_CHECKS = [guard.name for guard in GUARDS if guard.is_check]
MARK_CHECKS = [guard.name for guard in GUARDS if guard.is_check and guard.asset in ASSETS[:2]]  # mark_job's


@dataclass
class RunOutcome:
    success: bool
    summary: dict[str, Any]
    error: Optional[str] = None


def checks_not_passed(checks: Mapping[str, str]) -> Optional[str]:
    """Why a repository whose run went through did not succeed: a check of its summary's
    `checks` not passed (failed, warned or skipped), or None."""
    unpassed = [f"{name} {status}" for name, status in checks.items() if status != "passed"]
    return "checks not passed: " + ", ".join(unpassed) if unpassed else None


def collected_failure(collected: Collected, repo: str, check_names: Sequence[str]) -> Optional[str]:
    """Why a repository a fleet run collected together failed, from what it refused and judged
    of it (the reasons fleet_outcomes reads from its events), or None."""
    if repo in collected.refused:
        asset, message = collected.refused[repo]
        return f"{asset}: {message}"
    judged = {v.name: status(v.passed, v.severity) for v in collected.verdicts.get(repo, [])}
    return checks_not_passed(every_check(check_names, judged))


# The events of a fleet run its outcomes are read from (fleet_outcomes).
TOLD = {DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_CHECK_EVALUATION, DagsterEventType.STEP_FAILURE}


def fleet_outcomes(
    heard: Iterable[EventLogEntry],
    result: ExecuteInProcessResult,
    repos: Sequence[str],
    date: dt.date,
    as_of: dt.datetime,
    check_names: Sequence[str],
    mode_of: Callable[[str], str],
) -> list[RunOutcome]:
    """The outcome of each repository of `repos` that fleet run `result` collected (or marked)
    together, in its mode, from the events the instance stored for it and handed to a listener
    (`heard`: reading 14,000 events of 1,000 tables back takes seconds): each partition's
    materializations and check evaluations, and the reason the run's failure gives for it. A
    check of `check_names` not judged was skipped; any other failure of the run fails every one."""
    failed: dict[str, str] = {}
    metadata: dict[str, dict[str, dict[str, Any]]] = {repo: {} for repo in repos}
    checks: dict[str, dict[str, str]] = {repo: {} for repo in repos}
    for entry in heard:
        event = entry.get_dagster_event()
        if event.event_type == DagsterEventType.STEP_FAILURE:
            if event.step_failure_data and event.step_failure_data.user_failure_data:
                named = event.step_failure_data.user_failure_data.metadata.get(FAILED_METADATA)
                failed |= named.value if named is not None else {}
        elif event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
            materialization = event.step_materialization_data.materialization
            _, repo = split_partition_key(materialization.partition)
            if repo in metadata:
                metadata[repo][materialization.asset_key.path[-1]] = {
                    k: v.value for k, v in materialization.metadata.items()
                }
        elif event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
            evaluation = event.asset_check_evaluation_data
            _, repo = split_partition_key(evaluation.partition)
            if repo in checks:
                checks[repo][evaluation.check_name] = check_status(evaluation)
    crashed = first_failure(result) if not result.success and not failed else None
    outcomes = []
    for repo in repos:
        summary_of_repo = summary(
            metadata[repo], checks[repo], check_names, repo, date, as_of, mode_of(repo), result.run_id
        )
        error = failed.get(repo) or crashed or checks_not_passed(summary_of_repo["checks"])
        outcomes.append(RunOutcome(error is None, summary_of_repo, error))
    return outcomes


def check_status(evaluation: AssetCheckEvaluation) -> str:
    return status(evaluation.passed, evaluation.severity.value)


def status(passed: bool, severity: str) -> str:
    """A check's status in the JSON summary."""
    if passed:
        return "passed"
    return "warning" if severity == "WARN" else "failed"


def every_check(check_names: Sequence[str], judged: Mapping[str, str]) -> dict[str, str]:
    """The status of each check of `check_names` and of each judged one: one not judged was skipped."""
    return {**{name: "skipped" for name in check_names}, **judged}


def summary(
    metadata: dict[str, dict[str, Any]],
    checks: dict[str, str],
    check_names: Sequence[str],
    repo: str,
    date: dt.date,
    as_of: dt.datetime,
    mode: str,
    run_id: str,
) -> dict[str, Any]:
    """The JSON summary from the materialization metadata of each asset and the status of each
    check judged (by name); a check of `check_names` not judged was skipped."""
    checks = every_check(check_names, checks)

    def value(asset: str, key: str) -> int:
        return int(metadata.get(asset, {}).get(key, 0) or 0)

    receipts = {
        key.removeprefix("receipts_"): int(v)
        for key, v in metadata.get("deletion_receipts", {}).items()
        if key.startswith("receipts_")
    }
    return {
        "repo": repo,
        "date": date.isoformat(),
        "as_of": format_timestamp(as_of),
        "mode": mode,
        "run_id": run_id,
        "retained_commits": value("retained_commits", "retained_commits"),
        "expired_commits": value("retained_commits", "expired_commits"),
        "live_objects": value("live_files", "live_objects"),
        "inventory_objects": value("object_inventory", ROW_COUNT),
        "inventory_bytes": value("object_inventory", "bytes"),
        "orphan_candidates": value("orphan_candidates", "orphan_candidates"),
        "reclaimable_bytes": value("orphan_candidates", "reclaimable_bytes"),
        "receipts": receipts,
        "checks": dict(sorted(checks.items())),
        "outputs": {asset: str(metadata[asset]["path"]) for asset in ASSETS if asset in metadata},
    }


def first_failure(result: ExecuteInProcessResult) -> str:
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data is not None:
            error = event.step_failure_data.error
            while error is not None and error.cause is not None:  # the user code's own error
                error = error.cause
            message = error.message.strip() if error else "step failed"
            return f"{event.step_key}: {message}"
    return "the run failed"


class FleetConfig(Config):
    """Which repositories a fleet run covers and how."""

    repositories: list[str] = []  # names or globs such as 'sales/*'; empty: every configured repository
    mode: str = ""  # dry_run / trash / delete; empty: each repository's configured mode
    mark_only: bool = False  # mark_job instead of gc_job: never touches storage (the new-commit sensor's runs)


def fleet_run_config(repositories: Sequence[str] = (), mode: str = "", mark_only: bool = False) -> RunConfig:
    return RunConfig(
        ops={"collect_fleet": FleetConfig(repositories=list(repositories), mode=mode, mark_only=mark_only)}
    )


def chosen_modes(repositories: Sequence[RepositoryConfig], mode: Optional[str]) -> dict[str, Mode]:
    """Each repository's mode in a run that asks for `mode` (empty or None: its configured one)."""
    return {repo.name: Mode.chosen(mode or None, repo.mode) for repo in repositories}


def selected_repositories(config: GcConfig, patterns: Sequence[str]) -> list[RepositoryConfig]:
    names = config.selected(patterns) if patterns else [repo.name for repo in config.repositories]
    return [config.repository(name) for name in names]


def build_fleet_job(start_date: dt.date) -> JobDefinition:
    @op(
        name="collect_fleet",
        description="Collects (or marks) the chosen Delta and Iceberg tables, lakeFS repositories and file catalogs "
        "on local storage, Azure, GCS or S3 as one set: marked and judged in one set of Spark jobs, each partition "
        "materialized and checked on its own, those that trash or delete swept together, each table under its own "
        "lease. A repository outside the choice whose retained versions reach into a chosen one is marked with "
        "them, for what it needs there. All at this run's as-of; fails at the end naming those that failed.",
    )
    def collect_fleet(
        context: OpExecutionContext, config: FleetConfig, gc_config: GcConfigResource, pyspark: LazyPySparkResource
    ) -> None:
        lake = gc_config.load()
        repositories = selected_repositories(lake, config.repositories)
        date = dt.date.fromisoformat(context.partition_key)
        as_of = run_as_of(context.instance, context.run, date)
        share_reading(lake)
        context.instance.add_dynamic_partitions(REPOSITORIES.name, [repo.name for repo in repositories])
        mode = Mode.DRY_RUN.value if config.mark_only else config.mode or None  # a mark touches no storage
        modes = chosen_modes(repositories, mode)
        readers = readers_of(lake, repositories)
        work = "marking" if config.mark_only else "collecting"
        also = f", with {len(readers)} repositories reaching into them marked for what they need" if readers else ""
        context.log.info(f"{work} {len(repositories)} tables together{also}")
        acting = Acting(
            modes.__getitem__, context.log, lambda names: not_sole_runs(context.instance, names, context.run_id)
        )
        spark = pyspark.spark_session
        context.log.info(session_summary(spark))
        through = LIVE if config.mark_only else RECEIPTS

        def work(store: Store, judged: Judged) -> Collected:
            return collect(
                spark, lake, repositories, date, as_of, context.run_id, store, utc_now, judged, through, acting, readers
            )

        collected = recorded(context, gc_config, spark, date, work)
        checks = MARK_CHECKS if config.mark_only else GC_JOB_CHECKS
        errors = {repo.name: collected_failure(collected, repo.name, checks) for repo in repositories}
        failed = {name: error for name, error in errors.items() if error}
        context.log.info(f"{len(repositories) - len(failed)} of {len(repositories)} repositories succeeded")
        if failed:
            raise Failure(
                description=f"{len(failed)} of {len(repositories)} repositories failed: "
                + "; ".join(f"{repo}: {error}" for repo, error in failed.items()),
                metadata={FAILED_METADATA: MetadataValue.json(failed)},
            )

    @job(
        name=FLEET_JOB,
        partitions_def=date_partitions(start_date),
        tags={FLEET_TAG: "fleet"},
        description=__doc__.split("\n\n")[1],
    )
    def fleet_job() -> None:
        collect_fleet()

    return fleet_job
