"""The event log of a run without $DAGSTER_HOME (defs.instance): one connection, materializations
and check evaluations stored a batch at a time. Its witness is Dagster's own in-memory event log, given the same events
one at a time: every answer the UI and the runner read back must be the same."""

from __future__ import annotations

import datetime as dt
import math
import threading
from typing import Any

import pytest
import sqlalchemy
from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    EventLogEntry,
    EventRecordsFilter,
    GraphDefinition,
    JobDefinition,
    op,
)
from dagster._core.storage.event_log import InMemoryEventLogStorage

from gc_assets.core.guards import Verdict
from gc_assets.defs.instance import EVENTS_PER_STATEMENT, OneConnectionEventLogStorage, ephemeral_instance
from gc_assets.defs.set_records import _record_checks, record_materializations, store_many_events
from gc_assets_tests.event_log_answers import (
    ASSETS,
    CHECKED,
    PARTITIONS,
    RUN,
    answers,
    checks,
    judged,
    materializations,
    planned,
    target,
)

JUDGED_ON = dt.date(2026, 12, 6)


def test_the_runs_event_log_answers_as_dagsters_own_given_the_events_one_at_a_time():
    dagsters, ours = InMemoryEventLogStorage(), OneConnectionEventLogStorage()
    told: list[str] = []
    ours.watch(RUN, None, lambda event, cursor: told.append(cursor))
    statements: list[str] = []  # what our log asked SQLite to do, the first three words of each
    sqlalchemy.event.listen(
        ours._one, "before_cursor_execute", lambda *args: statements.append(" ".join(args[2].split()[:3]))
    )
    both = [materializations(asset) for asset in ASSETS]
    for events in both:
        for event in events:
            dagsters.store_event(event)
    # From another thread than the one that made it, as the run's event recorder stores them.
    storing = threading.Thread(target=lambda: [ours.store_event_batch(events) for events in both])
    storing.start()
    storing.join()
    for storage in (dagsters, ours):
        storage.store_event(planned())
    for event in checks(dagsters):
        dagsters.store_event(event)
    ours.store_event_batch(checks(ours))

    assert answers(ours) == answers(dagsters)
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
    events = materializations("live_files")
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
        (e.user_message, e.get_dagster_event().partition, *judged(e), _judged_partition(instance, e))
        for e in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    ]


def _judged_partition(instance: DagsterInstance, event: EventLogEntry) -> object:
    judged = AssetRecordsFilter(
        event.get_dagster_event().asset_check_evaluation_data.asset_key, storage_ids=[target(event)]
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
