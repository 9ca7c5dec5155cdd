"""A collection of one table or many in one set of Spark jobs (sweep.together), by fleet_job or
by one partition's step, recorded as Dagster sees a run of each: every (date, repo) partition
of the five assets gets its own materialization, and every guard its own check evaluation
naming that partition and the materialization it judged. What fails is named per repository;
the others go on.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    MetadataValue,
    OpExecutionContext,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.events import DagsterEvent, DagsterEventBatchMetadata, generate_event_batch_id
from pyspark.sql import DataFrame, SparkSession

from gc_assets.core.guards import Verdict
from gc_assets.defs.instance import OneConnectionEventLogStorage
from gc_assets.defs.metadata import ROW_COUNT
from gc_assets.defs.partitions import partition_key
from gc_assets.defs.postgres_instance import CheckBatchingPostgresEventLogStorage
from gc_assets.defs.resources import GcConfigResource
from gc_assets.defs.set_partitions import store_partitions
from gc_assets.sweep.guard_table import GUARDS
from gc_assets.sweep.together import Collected, Judged, Store

# Dagster's own switch for storing a batch of materializations at once (read at each event).
EVENT_BATCH_SIZE_ENV = "DAGSTER_EVENT_BATCH_SIZE"
EVENT_BATCH_SIZE = "1000"
GUARDS_BY_NAME = {guard.name: guard for guard in GUARDS}
# The event logs that store a batch of check evaluations at once (Dagster's own store none).
CHECK_BATCHING_EVENT_LOGS = (OneConnectionEventLogStorage, CheckBatchingPostgresEventLogStorage)
_KEEPING_CONNECTIONS: "weakref.WeakSet[DagsterInstance]" = weakref.WeakSet()


def store_many_events(instance: DagsterInstance) -> None:
    """Ready `instance` for the thousands of events a run of many tables stores, in this process
    (the command line's, or the run worker the UI, a schedule or a sensor launched).

    dagster-postgres opens a connection for each statement (two an event, 14 ms at 2,000 events
    measured) unless told it lives long, as the webserver tells it: then it keeps one (5 ms), and
    a batch of materializations is one statement (0.7 ms an event) when DAGSTER_EVENT_BATCH_SIZE
    is set; it is, unless the environment sets it. The ephemeral instance's log (defs.instance)
    keeps one connection anyway and stores a batch too; SQLite on disk ignores both."""
    os.environ.setdefault(EVENT_BATCH_SIZE_ENV, EVENT_BATCH_SIZE)
    if instance not in _KEEPING_CONNECTIONS:
        instance.optimize_for_webserver(statement_timeout=0, pool_recycle=3600, max_overflow=4)
        _KEEPING_CONNECTIONS.add(instance)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def recorded(
    context: OpExecutionContext,
    gc_config: GcConfigResource,
    spark: SparkSession,
    date: dt.date,
    work: Callable[[Store, Judged], Collected],
) -> Collected:
    """Do `work` (sweep.together's collect of a set, or a sweep of a stored mark) on `date`,
    every partition it stores and every verdict it hands over recorded as Dagster sees a run of
    each partition: each one's verdicts, as recorded, and each refused one's asset and why.

    Dagster stores an event in 0.7 to 10 ms, by instance: the events are recorded by one
    thread of their own, in order, while the driver waits on Spark's next phase; the same thread
    first puts each asset's partitions in place (a few renames each, about 0.4 s for 1,000
    tables on a local state directory), then records them. Every one is in place and recorded before
    the step ends (before a sweep acts, at the Store's `settle`), and a failure to put one in
    place or to record one fails the step."""
    store_many_events(context.instance)
    first_event = context.instance.event_log_storage.get_maximum_record_id() or 0
    phase_started = [time.monotonic()]

    def phase_seconds() -> float:
        """Seconds since the last phase ended: where a fleet run's time goes."""
        now = time.monotonic()
        seconds, phase_started[0] = now - phase_started[0], now
        return seconds

    def timed(record: Callable[..., int], *args: Any) -> tuple[int, float]:
        """(events recorded, seconds): Dagster's own cost of a fleet run, reported at the end."""
        started = time.monotonic()
        return record(*args), time.monotonic() - started

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-events") as recorder:
        recording: list[Future[tuple[int, float]]] = []
        committing: list[Future[None]] = []

        def store(
            asset: str, frame: DataFrame, notes: Mapping[str, Mapping[str, Any]]
        ) -> tuple[DataFrame, dict[str, str], dict[str, int]]:
            stored = store_partitions(spark, gc_config, asset, frame, notes, date, context.run_id)
            committing.append(recorder.submit(stored.commit))
            recording.append(
                recorder.submit(
                    _if_committed, committing[-1], timed, record_materializations, context, asset, date, stored.metadata
                )
            )
            refused = f"; refused: {sorted(stored.refused)}" if stored.refused else ""
            context.log.info(f"{asset}: {len(stored.metadata)} partitions stored in {phase_seconds():.1f} s{refused}")
            rows = {name: int(metadata[ROW_COUNT].value) for name, metadata in stored.metadata.items()}
            return stored.frame, stored.refused, rows

        targets: dict[tuple[str, str], AssetCheckEvaluationTargetMaterializationData] = {}

        def judged(verdicts: dict[str, list[Verdict]]) -> None:
            recording.append(recorder.submit(timed, _record_checks, context, first_event, date, verdicts, targets))

        outcome = work(_SettledStore(store, committing), judged)
        for commit in committing:
            commit.result()
        recorded = [future.result() for future in recording]
    context.log.info(f"checks: {sum(map(len, outcome.verdicts.values()))} results recorded in {phase_seconds():.1f} s")
    events, seconds = sum(n for n, _ in recorded), sum(s for _, s in recorded)
    context.log.info(f"events: {events} stored by Dagster in {seconds:.1f} s, beside the phases above")
    return outcome


class _SettledStore:
    """sweep.together's Store: `store`, each asset's partitions put in place by the futures
    `committing` holds; `settle` waits for those."""

    def __init__(
        self, store: Callable[..., tuple[DataFrame, dict[str, str], dict[str, int]]], committing: list[Future[None]]
    ):
        self._store, self._committing = store, committing

    def __call__(
        self, asset: str, frame: DataFrame, notes: dict[str, Any]
    ) -> tuple[DataFrame, dict[str, str], dict[str, int]]:
        return self._store(asset, frame, notes)

    def settle(self) -> None:
        for commit in list(self._committing):
            commit.result()


def _if_committed(committed: Future[None], record: Callable[..., tuple[int, float]], *args: Any) -> tuple[int, float]:
    """`record(*args)` once `committed` succeeded (the recorder ran it before): a partition not
    in place is never recorded as materialized; its failure is raised where it is awaited."""
    if committed.exception() is not None:
        return 0, 0.0
    return record(*args)


def record_materializations(
    context: OpExecutionContext, asset: str, date: dt.date, metadata: Mapping[str, Mapping[str, Any]]
) -> int:
    """Every partition's materialization of `asset`, as one batch: an instance that stores a batch
    at once (dagster-postgres, the ephemeral instance of defs.instance; DAGSTER_EVENT_BATCH_SIZE
    set) gets one per DAGSTER_EVENT_BATCH_SIZE events, SQLite on disk stores them one at a time.
    `log_event` gives an event no batch in Dagster 1.13: they are built as Dagster's own step
    builds a partitioned output's (execute_step._dagster_event_for_asset_event), and handed on
    as `log_event` does."""
    step = context.get_step_execution_context()
    for (name, theirs), batch in zip(metadata.items(), _one_batch(len(metadata))):
        materialization = AssetMaterialization(AssetKey(asset), partition=partition_key(date, name), metadata=theirs)
        event = DagsterEvent.asset_materialization(step, materialization, batch)
        context._events.append(event)  # what log_event does with the event it stored
    return len(metadata)


def _one_batch(count: int) -> list[DagsterEventBatchMetadata]:
    """The batch metadata of `count` events handed to Dagster as one batch: the last ends it."""
    batch = generate_event_batch_id()
    return [DagsterEventBatchMetadata(batch, i == count - 1) for i in range(count)]


def _record_checks(
    context: OpExecutionContext,
    first_event: int,
    date: dt.date,
    verdicts: dict[str, list[Verdict]],
    targets: dict[tuple[str, str], AssetCheckEvaluationTargetMaterializationData],
) -> int:
    """Each verdict as its partition's check evaluation, naming the materialization it judged
    (recorded before it: the recorder keeps their order). `targets` keeps the materializations
    of each asset already looked up: all of an asset's are recorded before any check of it."""
    assets = {GUARDS_BY_NAME[v.name].asset for theirs in verdicts.values() for v in theirs}
    looked_up = {asset for asset, _ in targets}
    targets.update(_materializations(context, first_event, assets - looked_up))
    evaluations = [
        check_evaluation(verdict, key, targets.get((GUARDS_BY_NAME[verdict.name].asset, key)))
        for key, theirs in ((partition_key(date, name), theirs) for name, theirs in verdicts.items())
        for verdict in theirs
    ]
    return record_check_evaluations(context, evaluations)


def record_check_evaluations(context: OpExecutionContext, evaluations: list[AssetCheckEvaluation]) -> int:
    """Each check evaluation, as `log_event` records it: as one batch where the instance's event
    log stores a batch of them at once (the ephemeral instance's, defs.instance; PostgreSQL's of
    defs.postgres_instance), else one at a time (Dagster 1.13 gives `log_event` no batch, and
    dagster-postgres's own event log stores no batch of them)."""
    if not isinstance(context.instance.event_log_storage, CHECK_BATCHING_EVENT_LOGS):
        for evaluation in evaluations:
            context.log_event(evaluation)
        return len(evaluations)
    step = context.get_step_execution_context()
    for evaluation, batch in zip(evaluations, _one_batch(len(evaluations))):
        kind = DagsterEventType.ASSET_CHECK_EVALUATION
        event = DagsterEvent.from_step(kind, step, evaluation, _check_message(evaluation), batch)
        context._events.append(event)  # what log_event does with the event it stored
    return len(evaluations)


def _check_message(evaluation: AssetCheckEvaluation) -> str:
    """The line Dagster's log shows for a check evaluation (DagsterEvent.asset_check_evaluation's)."""
    verdict = "passed." if evaluation.passed else "did not pass."
    described = "" if evaluation.description is None else f" Description: '{evaluation.description}'"
    return f"Asset check '{evaluation.check_name}' on '{evaluation.asset_key.to_user_string()}' {verdict}{described}"


def _materializations(
    context: OpExecutionContext, after: int, assets: set[str]
) -> dict[tuple[str, str], AssetCheckEvaluationTargetMaterializationData]:
    """The materializations this run recorded of `assets`, by (asset, partition): what each check judged."""
    found = {}
    for asset in assets:
        cursor = None
        while True:
            page = context.instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(asset), after_storage_id=after), limit=1000, cursor=cursor
            )
            for record in page.records:
                if record.run_id == context.run_id and record.partition_key is not None:
                    found[(asset, record.partition_key)] = AssetCheckEvaluationTargetMaterializationData(
                        storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp
                    )
            if not page.has_more:
                break
            cursor = page.cursor
    return found


def check_evaluation(
    verdict: Verdict, partition: str, target: Optional[AssetCheckEvaluationTargetMaterializationData]
) -> AssetCheckEvaluation:
    """The verdict of one partition's guard, naming its partition and the materialization it judged."""
    guard = GUARDS_BY_NAME[verdict.name]
    return AssetCheckEvaluation(
        asset_key=AssetKey(guard.asset),
        check_name=verdict.name,
        passed=verdict.passed,
        metadata=_metadata(verdict),
        target_materialization_data=target,
        severity=_severity(verdict),
        description=verdict.description,
        blocking=guard.blocking,
        partition=partition,
    )


def _severity(verdict: Verdict) -> AssetCheckSeverity:
    return AssetCheckSeverity.WARN if verdict.severity == "WARN" else AssetCheckSeverity.ERROR


def _metadata(verdict: Verdict) -> dict[str, Any]:
    return {
        key: MetadataValue.json(value) if isinstance(value, list) else value for key, value in verdict.metadata.items()
    }
