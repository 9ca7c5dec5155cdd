"""Runs that cover many repositories (docs/design.md §9).

`fleet_job` is one run per date for any number of repositories: the daily schedule and
backfills launch it for every registered repository, the new-commit sensor for the
repositories that moved (mark only), and `gc-assets run --all` does the same work from the
command line. One process reads gc.yaml once, keeps one JVM and judges every repository at
the fleet run's as-of.

Its Delta and Iceberg tables, lakeFS repositories and file catalogs that go together
(sweep.together.goes_together), one or many, are marked, listed and judged together in one
run (mark.sets), then each receipted in its own
mode in the same run, those that trash or delete swept as one set (sweep.together,
sweep.set_sweep, defs.fleet_engine; each file catalog's rows cleaned first, under its
lease): each (date, repo) partition still gets its own
materializations and check results, each table its own lease and journal rows. Every
other repository stays a Dagster run of its own (gc_job or mark_job on its partition), so
its materializations, check results, receipts and lease are those of a run launched alone,
and the run queue's one-run-per-repository limit sees it by its partition tag. A failed
repository does not stop the next: the fleet run fails at the end, naming every one that failed.
"""

import datetime as dt
import itertools
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

from dagster import (
    AssetCheckEvaluation,
    Config,
    DagsterEventType,
    DagsterInstance,
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
from gc_assets.core.time import AS_OF_TAG, format_timestamp
from gc_assets.defs.concurrency import not_sole_runs
from gc_assets.defs.fleet_engine import record_together
from gc_assets.defs.partitions import REPOSITORIES, date_partitions, partition_key, run_as_of, split_partition_key
from gc_assets.defs.resources import GcConfigResource, share_reading
from gc_assets.mark.shared import referrers_of
from gc_assets.sweep.guard_table import GUARDS
from gc_assets.sweep.together import Acting, Collected, goes_together

FLEET_JOB = "fleet_job"
FLEET_RUN_TAG = "gc_assets/fleet_run"  # on each repository's run: the fleet run that launched it
FLEET_TAG = "gc_assets/fleet"  # on every fleet run: dagster.yaml's queue runs one at a time
FAILED_METADATA = "failed"  # on a fleet run's failure: repository -> why it failed
GC_JOB_CHECKS = [guard.name for guard in GUARDS if guard.is_check]
MARK_CHECKS = [guard.name for guard in GUARDS if guard.is_check and guard.asset in ASSETS[:2]]  # mark_job's


@dataclass
class RunOutcome:
    success: bool
    summary: dict[str, Any]
    error: Optional[str] = None


def mode_run_config(mode: str) -> dict[str, Any]:
    """gc_job's run config naming the sweep's mode; empty means the repository's configured one."""
    return {"ops": {"deletion_receipts": {"config": {"mode": mode}}}}


def each_partition(
    job_def: JobDefinition,
    instance: DagsterInstance,
    repositories: Sequence[RepositoryConfig],
    date: dt.date,
    as_of: dt.datetime,
    tags: dict[str, str],
    mode: Optional[str] = None,
    listen: Callable[[str, str], None] = lambda repo, run_id: None,
) -> Iterator[RunOutcome]:
    """Run `job_def` (gc_job or mark_job) on (date, repo) of each repository, one after another
    in this process, each a run of its own; `listen(repo, run_id)` hears of each run before it starts."""
    sweeps = "deletion_receipts" in {node.name for node in job_def.graph.node_dict.values()}
    for repository in repositories:
        chosen = Mode.chosen(mode, repository.mode)
        run_id = str(uuid.uuid4())  # known before the run starts, to listen to its events
        listen(repository.name, run_id)
        result = job_def.execute_in_process(
            instance=instance,
            run_id=run_id,
            partition_key=partition_key(date, repository.name),
            tags=tags,
            run_config=mode_run_config(chosen.value) if sweeps else None,
            raise_on_error=False,
        )
        summary = summarize(result, repository.name, date, as_of, chosen.value)
        error = checks_not_passed(summary["checks"]) if result.success else first_failure(result)
        yield RunOutcome(error is None, summary, error)


def marks_first(repositories: Sequence[RepositoryConfig], mode: Optional[str]) -> bool:
    """Whether every repository of a run is marked before any is swept: when it covers more than
    one and trashes or deletes any, so that what any of them reads in another's namespace is
    recorded (mark.shared) before that namespace is swept, whichever comes first in the run."""
    return len(repositories) > 1 and any(Mode.chosen(mode, repo.mode) is not Mode.DRY_RUN for repo in repositories)


def collect_each(
    job_named: Callable[[str], JobDefinition],
    instance: DagsterInstance,
    config: GcConfig,
    repositories: Sequence[RepositoryConfig],
    alone: Sequence[RepositoryConfig],
    collect_together: Callable[[], Iterable[RunOutcome]],
    date: dt.date,
    as_of: dt.datetime,
    tags: dict[str, str],
    mode: Optional[str],
    announce: Callable[[str], None] = lambda line: None,
    listen: Callable[[str, str], None] = lambda repo, run_id: None,
) -> Iterator[RunOutcome]:
    """Collect `repositories`: those that go together by `collect_together` (marked, judged and
    swept in one run: collected_together), each of `alone` by gc_job on (date, repo), a run of
    its own. When marks_first says so, each of `alone` is marked first (mark_job) and those that
    go together are collected before any of `alone` is swept. One of `alone` whose mark passed
    and whose referrers stayed the same while the others were marked is then only swept:
    sweep_job on that mark, its summary telling both runs. Any other runs gc_job: marked again,
    it reads a referrer another's mark found reaching into it, or fails again and reports why."""
    if not alone or not marks_first(repositories, mode):
        yield from collect_together()
        yield from each_partition(job_named("gc_job"), instance, alone, date, as_of, tags, mode, listen)
        return
    announce(f"marking {len(repositories)} repositories before any is swept")
    before = {repo.name: referrer_names(config, repo.name) for repo in alone}
    marks = list(each_partition(job_named("mark_job"), instance, alone, date, as_of, tags))
    yield from collect_together()
    reusable = {
        outcome.summary["repo"]: outcome
        for outcome in marks
        if outcome.success and referrer_names(config, outcome.summary["repo"]) == before[outcome.summary["repo"]]
    }
    for repository in alone:
        if repository.name not in reusable:
            yield from each_partition(job_named("gc_job"), instance, [repository], date, as_of, tags, mode, listen)
            continue
        swept = next(each_partition(job_named("sweep_job"), instance, [repository], date, as_of, tags, mode, listen))
        yield marked_then_swept(reusable[repository.name], swept)


def referrer_names(config: GcConfig, name: str) -> set[str]:
    """The repositories a mark of `name` reads as referrers, as they stand now."""
    return {referrer.name for referrer in referrers_of(config, name)}


def marked_then_swept(mark: RunOutcome, swept: RunOutcome) -> RunOutcome:
    """One repository's outcome from its mark (a passed one) and the sweep run that followed it."""
    told = {**mark.summary["outputs"], **swept.summary["outputs"]}
    merged = {
        **swept.summary,
        **{key: mark.summary[key] for key in ("retained_commits", "expired_commits", "live_objects")},
        "checks": dict(
            sorted(({name: mark.summary["checks"][name] for name in MARK_CHECKS} | swept.summary["checks"]).items())
        ),
        "outputs": {asset: told[asset] for asset in ASSETS if asset in told},
    }
    return RunOutcome(swept.success, merged, swept.error)


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


def summarize(
    result: ExecuteInProcessResult, repo: str, date: dt.date, as_of: dt.datetime, mode: str
) -> dict[str, Any]:
    """The JSON summary of docs/design.md §9, from the run's materializations and check evaluations."""
    metadata: dict[str, dict[str, Any]] = {}
    for event in result.get_asset_materialization_events():
        materialization = event.materialization
        metadata[materialization.asset_key.path[-1]] = {k: v.value for k, v in materialization.metadata.items()}
    checks = {evaluation.check_name: check_status(evaluation) for evaluation in result.get_asset_check_evaluations()}
    check_names = [key.name for key in result.job_def.asset_layer.asset_graph.asset_check_keys]
    return summary(metadata, checks, check_names, repo, date, as_of, mode, result.run_id)


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
        "inventory_objects": value("object_inventory", "dagster/row_count"),
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


def collected_together(config: GcConfig, repositories: Sequence[RepositoryConfig]) -> list[RepositoryConfig]:
    """The repositories a fleet run collects together, marked and judged in one set of Spark jobs
    and each receipted or swept in its mode (sweep.together): the goes_together
    ones whose referrers (mark.shared) go with them, one or many, whether the state directory is
    on local disk or on an object store. A table another repository reaches into from outside
    the set runs alone: its own run reads what that repository needs there (a set would refuse it)."""
    chosen = [repo for repo in repositories if goes_together(repo)]
    referrers = {repo.name: referrer_names(config, repo.name) for repo in chosen}
    while True:
        names = {repo.name for repo in chosen}
        kept = [repo for repo in chosen if referrers[repo.name] <= names]
        if len(kept) == len(chosen):
            return chosen
        chosen = kept


def chosen_modes(repositories: Sequence[RepositoryConfig], mode: Optional[str]) -> dict[str, Mode]:
    """Each repository's mode in a run that asks for `mode` (empty or None: its configured one)."""
    return {repo.name: Mode.chosen(mode or None, repo.mode) for repo in repositories}


def selected_repositories(config: GcConfig, patterns: Sequence[str]) -> list[RepositoryConfig]:
    names = config.selected(patterns) if patterns else [repo.name for repo in config.repositories]
    return [config.repository(name) for name in names]


def build_fleet_job(start_date: dt.date, job_named: Callable[[str], JobDefinition]) -> JobDefinition:
    """fleet_job; `job_named` resolves gc_job, mark_job and sweep_job in the Definitions that hold them all."""

    @op(
        name="collect_fleet",
        description="Collects (or marks) the chosen Delta and Iceberg tables, lakeFS repositories and file catalogs "
        "on local storage, Azure, GCS or S3 together: marked and judged in one set of Spark jobs, each partition "
        "materialized and checked on its own, "
        "those that trash or delete swept as one set, each table under its own lease. Runs gc_job (or mark_job) on "
        "this date's partition of each other chosen repository, one after another: each a run of its own (when it "
        "trashes or deletes several, every one is marked first, then each is swept). All at this run's as-of;"
        " fails at the end naming those that failed.",
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
        together = collected_together(lake, repositories)
        alone = [repo for repo in repositories if repo not in together]
        tags = {AS_OF_TAG: format_timestamp(as_of), FLEET_RUN_TAG: context.run_id}
        failed: dict[str, str] = {}

        def collect_together() -> list[RunOutcome]:
            if not together:
                return []
            work = "marking" if config.mark_only else "collecting"
            context.log.info(f"{work} {len(together)} tables together")
            acting = Acting(
                modes.__getitem__, context.log, lambda names: not_sole_runs(context.instance, names, context.run_id)
            )
            spark = pyspark.spark_session
            context.log.info(session_summary(spark))
            collected = record_together(
                context, gc_config, spark, lake, together, date, as_of, config.mark_only, acting
            )
            checks = MARK_CHECKS if config.mark_only else GC_JOB_CHECKS
            errors = {repo.name: collected_failure(collected, repo.name, checks) for repo in together}
            failed.update((name, error) for name, error in errors.items() if error)
            succeeded = sum(error is None for error in errors.values())
            context.log.info(f"{succeeded} of {len(together)} tables together succeeded")
            return []  # told above, in one line: a fleet's tables are too many to log each

        outcomes = (
            itertools.chain(
                collect_together(), each_partition(job_named("mark_job"), context.instance, alone, date, as_of, tags)
            )
            if config.mark_only
            else collect_each(
                job_named,
                context.instance,
                lake,
                repositories,
                alone,
                collect_together,
                date,
                as_of,
                tags,
                mode,
                context.log.info,
            )
        )
        for count, outcome in enumerate(outcomes, start=1):
            summary = outcome.summary
            verdict = "succeeded" if outcome.success else f"FAILED: {outcome.error}"
            context.log.info(
                f"[{count}/{len(alone)}] {summary['repo']} {verdict} (run {summary['run_id']}; "
                f"{summary['orphan_candidates']} candidates, receipts {summary['receipts']})"
            )
            if not outcome.success:
                failed[summary["repo"]] = outcome.error or "failed"
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
