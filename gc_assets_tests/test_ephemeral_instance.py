"""The event log of a run without $DAGSTER_HOME (defs.instance): one connection, materializations
and check evaluations stored a batch at a time. Its witness is Dagster's own in-memory event log, given the same events
one at a time: every answer the UI and the runner read back must be the same."""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from typing import Any

import pytest
import sqlalchemy
from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    EventLogEntry,
    EventRecordsFilter,
    GraphDefinition,
    JobDefinition,
    op,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationPlanned,
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.partitions.subset import DefaultPartitionsSubset
from dagster._core.events import DagsterEvent, StepMaterializationData
from dagster._core.storage.event_log import InMemoryEventLogStorage
from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable
from dagster._serdes import deserialize_value

from gc_assets.core.guards import Verdict
from gc_assets.defs.instance import EVENTS_PER_STATEMENT, OneConnectionEventLogStorage, ephemeral_instance
from gc_assets.defs.set_records import _record_checks, record_materializations, store_many_events

RUN = "run-1"
ASSETS = ("live_files", "orphan_candidates")
PARTITIONS = [f"2026-12-06|table-{i:04d}" for i in range(EVENTS_PER_STATEMENT + 7)]  # two statements
CHECKED = PARTITIONS[:40]  # the partitions whose live_objects_present is evaluated
JUDGED_ON = dt.date(2026, 12, 6)


def _entry(kind: DagsterEventType, data: Any) -> EventLogEntry:
    """An event of the run's one step, as the fleet run records it."""
    return EventLogEntry(
        error_info=None,
        level=logging.DEBUG,
        user_message="",
        run_id=RUN,
        timestamp=time.time(),
        step_key="fleet",
        job_name="fleet_job",
        dagster_event=DagsterEvent(kind.value, job_name="fleet_job", step_key="fleet", event_specific_data=data),
    )


def _materializations(asset: str) -> list[EventLogEntry]:
    return [
        _entry(
            DagsterEventType.ASSET_MATERIALIZATION,
            StepMaterializationData(
                AssetMaterialization(
                    AssetKey(asset),
                    partition=partition,
                    metadata={"objects": n},
                    tags={"dagster/data_version": f"{asset}-{n}"},
                )
            ),
        )
        for n, partition in enumerate(PARTITIONS)
    ]


def _planned() -> EventLogEntry:
    """Planned evaluations of live_objects_present on some partitions: theirs update these rows."""
    return _entry(
        DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED,
        AssetCheckEvaluationPlanned(
            asset_key=AssetKey("live_files"),
            check_name="live_objects_present",
            partitions_subset=DefaultPartitionsSubset(set(PARTITIONS[::3])),
        ),
    )


def _checks(storage: InMemoryEventLogStorage) -> list[EventLogEntry]:
    """One check evaluation of each live_files partition, naming its materialization in `storage`."""
    records = storage.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey("live_files")), limit=10_000)
    targets = {r.partition_key: r for r in records.records}
    return [
        _entry(
            DagsterEventType.ASSET_CHECK_EVALUATION,
            AssetCheckEvaluation(
                asset_key=AssetKey("live_files"),
                check_name="live_objects_present",
                passed=n % 4 != 0,
                partition=partition,
                description=f"{n} live objects present",
                target_materialization_data=AssetCheckEvaluationTargetMaterializationData(
                    storage_id=targets[partition].storage_id, run_id=RUN, timestamp=targets[partition].timestamp
                ),
            ),
        )
        for n, partition in enumerate(CHECKED)
    ]


def _answers(storage: InMemoryEventLogStorage) -> dict[str, object]:
    """What Dagster's UI and the runner read back of the events, storage ids included."""
    answers: dict[str, object] = {}
    for asset in ASSETS:
        key = AssetKey(asset)
        records = storage.get_event_records(EventRecordsFilter(DagsterEventType.ASSET_MATERIALIZATION, key), limit=5000)
        answers[f"{asset} records"] = sorted(
            (r.storage_id, r.partition_key, r.asset_materialization.metadata["objects"].value) for r in records
        )
        answers[f"{asset} tags"] = [
            (r.storage_id, storage.get_event_tags_for_asset(key, filter_event_id=r.storage_id)) for r in records[::5]
        ]
        answers[f"{asset} partitions"] = sorted(storage.get_materialized_partitions(key))
        answers[f"{asset} latest by partition"] = sorted(
            storage.get_latest_storage_id_by_partition(key, DagsterEventType.ASSET_MATERIALIZATION).items()
        )
        (record,) = storage.get_asset_records([key])
        latest = record.asset_entry.last_materialization_record
        answers[f"{asset} latest"] = (latest.storage_id, latest.partition_key)
        answers[f"{asset} by partition"] = [
            [
                r.storage_id
                for r in storage.fetch_materializations(AssetRecordsFilter(key, asset_partitions=[p]), 10).records
            ]
            for p in PARTITIONS[::97]
        ]
    check_key = AssetCheckKey(AssetKey("live_files"), "live_objects_present")
    history = storage.get_asset_check_execution_history(check_key, limit=100)
    answers["checks"] = sorted(
        (e.partition, e.status.value, e.event.dagster_event_type, _target(e.event), _judged(e.event)) for e in history
    )
    answers["check partitions"] = sorted(
        (
            i.partition_key,
            i.latest_execution_status.value,
            i.latest_check_event_storage_id,
            i.latest_target_materialization_storage_id,
        )
        for i in storage.get_asset_check_partition_info([check_key])
    )
    with storage.index_connection() as conn:  # all of each row, its time too (which no query reads)
        rows = conn.execute(sqlalchemy.select(AssetCheckExecutionsTable)).mappings().all()
    answers["check rows"] = sorted(
        (
            *(row[c] for c in ("partition", "execution_status", "evaluation_event_storage_id", "run_id")),
            row["materialization_event_storage_id"],
            row["evaluation_event_timestamp"] == _utc(deserialize_value(row["evaluation_event"], EventLogEntry)),
        )
        for row in rows
    )
    return answers


def _utc(event: EventLogEntry) -> dt.datetime:
    return dt.datetime.fromtimestamp(event.timestamp, dt.timezone.utc).replace(tzinfo=None)


def _judged(event: EventLogEntry) -> object:
    """What an evaluation row holds of its event: its verdict and description (a planned one: none)."""
    evaluation = event.get_dagster_event().event_specific_data
    return getattr(evaluation, "passed", None), getattr(evaluation, "description", None)


def _target(event: EventLogEntry) -> object:
    """The storage id of the materialization a check evaluation judged; a planned one judged none."""
    judged = getattr(event.get_dagster_event().event_specific_data, "target_materialization_data", None)
    return judged and judged.storage_id


def test_the_runs_event_log_answers_as_dagsters_own_given_the_events_one_at_a_time():
    dagsters, ours = InMemoryEventLogStorage(), OneConnectionEventLogStorage()
    told: list[str] = []
    ours.watch(RUN, None, lambda event, cursor: told.append(cursor))
    statements: list[str] = []  # what our log asked SQLite to do, the first three words of each
    sqlalchemy.event.listen(
        ours._one, "before_cursor_execute", lambda *args: statements.append(" ".join(args[2].split()[:3]))
    )
    both = [_materializations(asset) for asset in ASSETS]
    for events in both:
        for event in events:
            dagsters.store_event(event)
    # From another thread than the one that made it, as the run's event recorder stores them.
    storing = threading.Thread(target=lambda: [ours.store_event_batch(events) for events in both])
    storing.start()
    storing.join()
    for storage in (dagsters, ours):
        storage.store_event(_planned())
    for event in _checks(dagsters):
        dagsters.store_event(event)
    ours.store_event_batch(_checks(ours))

    assert _answers(ours) == _answers(dagsters)
    assert len(told) == 2 * len(PARTITIONS) + 1 + len(CHECKED) and len(set(told)) == len(told)
    # A batch is an INSERT each EVENTS_PER_STATEMENT; of evaluations, one more of those nothing
    # planned, and an UPDATE of each planned one's row (every third partition was planned).
    inserts = math.ceil(len(PARTITIONS) / EVENTS_PER_STATEMENT) * len(ASSETS) + 1 + 1
    assert statements.count("INSERT INTO event_logs") == inserts
    assert statements.count("INSERT INTO asset_check_executions") == 1 + 1
    assert statements.count("UPDATE asset_check_executions SET") == len(CHECKED[::3])


def test_a_run_without_dagster_home_records_in_the_one_connection_event_log():
    instance = ephemeral_instance()
    assert isinstance(instance.event_log_storage, OneConnectionEventLogStorage)
    assert instance.is_ephemeral


def test_a_batch_that_fails_part_way_stores_none_of_it_so_that_dagster_stores_each_once(monkeypatch):
    ours = OneConnectionEventLogStorage()
    store_tags = OneConnectionEventLogStorage._store_asset_event_tags
    statements: list[int] = []

    def failing_second(self, conn, events, event_ids):
        statements.append(len(events))
        if len(statements) == 2:
            raise sqlalchemy.exc.OperationalError("INSERT", {}, Exception("disk I/O error"))
        store_tags(self, conn, events, event_ids)

    monkeypatch.setattr(OneConnectionEventLogStorage, "_store_asset_event_tags", failing_second)
    events = _materializations("live_files")
    with pytest.raises(sqlalchemy.exc.OperationalError):
        ours.store_event_batch(events)
    materialized = EventRecordsFilter(DagsterEventType.ASSET_MATERIALIZATION, AssetKey("live_files"))
    assert ours.get_event_records(materialized, limit=5000) == []
    ours.store_event(events[0])  # as Dagster does next, one at a time
    assert [r.partition_key for r in ours.get_event_records(materialized, limit=5000)] == [PARTITIONS[0]]


def _judging_job(verdicts: dict[str, list[Verdict]]) -> JobDefinition:
    """A step that records materializations of object_inventory and orphan_candidates and then the
    verdicts, as a collection's step does (set_records)."""

    @op
    def judge(context) -> None:  # noqa: ANN001 - Dagster reads the annotation, here a string
        store_many_events(context.instance)
        first = context.instance.event_log_storage.get_maximum_record_id() or 0
        for asset in ("object_inventory", "orphan_candidates"):
            record_materializations(context, asset, JUDGED_ON, {name: {"objects": 1} for name in verdicts})
        _record_checks(context, first, JUDGED_ON, verdicts, {})

    return GraphDefinition(name="judging", node_defs=[judge]).to_job()


def _evaluations(instance: DagsterInstance, run_id: str) -> list[tuple[Any, ...]]:
    """Each check evaluation of the run as the UI shows it: its line and its verdict on what."""
    return [
        (e.user_message, e.get_dagster_event().partition, *_judged(e), _judged_partition(instance, e))
        for e in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    ]


def _judged_partition(instance: DagsterInstance, event: EventLogEntry) -> object:
    judged = AssetRecordsFilter(
        event.get_dagster_event().asset_check_evaluation_data.asset_key, storage_ids=[_target(event)]
    )
    (record,) = instance.fetch_materializations(judged, limit=1).records
    return record.partition_key


def test_a_runs_check_evaluations_reach_its_own_log_as_one_batch_and_read_as_dagster_logs_each(monkeypatch):
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "1000")
    batches: list[set[DagsterEventType]] = []
    store_batch = OneConnectionEventLogStorage.store_event_batch
    monkeypatch.setattr(
        OneConnectionEventLogStorage,
        "store_event_batch",
        lambda self, events: (batches.append({e.dagster_event_type for e in events}), store_batch(self, events)),
    )
    tables = [f"table-{i}" for i in range(30)]
    verdicts = {
        name: [
            Verdict("live_objects_present", passed=i % 7 != 0, description=f"{i} present"),
            Verdict("candidates_not_live", passed=True, description="none live"),
        ]
        for i, name in enumerate(tables)
    }
    job = _judging_job(verdicts)
    read = []
    for instance in (DagsterInstance.ephemeral(), ephemeral_instance()):  # Dagster's own: log_event, each alone
        result = job.execute_in_process(instance=instance)
        stepped = [(e.check_name, e.partition, e.passed) for e in result.get_asset_check_evaluations()]
        read.append((_evaluations(instance, result.run_id), stepped))  # logged, and among the step's events
    (dagsters, dagsters_step), ours = read
    assert ours == read[0] and len(dagsters) == len(dagsters_step) == 2 * len(tables)
    assert (
        dagsters[0][0]
        == "Asset check 'live_objects_present' on 'object_inventory' did not pass. Description: '0 present'"
    )
    kinds = {DagsterEventType.ASSET_MATERIALIZATION}, {DagsterEventType.ASSET_CHECK_EVALUATION}
    assert batches == [kinds[0], kinds[0], kinds[1]]
