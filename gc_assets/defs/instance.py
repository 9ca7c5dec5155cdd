"""The instance a run records in when no $DAGSTER_HOME is set: Dagster's ephemeral one, with an
in-memory event log that keeps one connection, stores a batch of materializations or of check
evaluations at once, and inserts a check evaluation that none planned without first trying to
update one.

Dagster's own in-memory event log opens a SQLite connection for every statement (with two
PRAGMAs: about 0.1 ms, four times an event), stores a batch one event at a time, serializes a
check evaluation twice, and updates the row of a planned check evaluation before inserting one
when there was none; a run of a thousand tables stores 14,000 events beside its Spark jobs, in
the driver's interpreter. The rows are Dagster's own, written by its SqlEventLogStorage, a batch
of materializations as dagster-postgres writes one."""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

from dagster import AssetKey, DagsterEventType, DagsterInstance, EventLogEntry
from dagster._core.instance import InstanceType
from dagster._core.launcher.sync_in_memory_run_launcher import SyncInMemoryRunLauncher
from dagster._core.run_coordinator import DefaultRunCoordinator
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log import InMemoryEventLogStorage
from dagster._core.storage.event_log.base import EventLogCursor
from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable, SqlEventLogStorageTable
from dagster._core.storage.noop_compute_log_manager import NoOpComputeLogManager
from dagster._core.storage.root import TemporaryLocalArtifactStorage
from dagster._core.storage.runs import InMemoryRunStorage
from dagster._core.storage.sql import create_engine
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

# Events one statement inserts: SQLite binds at most 32,766 values, an event row about ten, its tags
# about twenty.
EVENTS_PER_STATEMENT = 250

_INSERT_EVENTS = SqlEventLogStorageTable.insert().returning(SqlEventLogStorageTable.c.id)


class OneConnectionEventLogStorage(InMemoryEventLogStorage):
    """Dagster's in-memory event log over one connection, which its lock lends one thread at a
    time, with a batch of materializations or of check evaluations stored in one statement a
    slice, and a check evaluation that nothing planned inserted without an UPDATE first."""

    def __init__(self, inst_data: Any = None) -> None:
        super().__init__(inst_data)
        self._planned: set[tuple[AssetKey, str, str, Optional[str]]] = set()  # every write is this log's
        self._db_lock = threading.RLock()  # a batch's transaction calls Dagster's own writes inside it
        engine = create_engine(self._engine.url, poolclass=NullPool, connect_args={"check_same_thread": False})
        self._one = engine.connect()
        with self._one.begin():
            self._one.exec_driver_sql("PRAGMA foreign_keys=ON;")

    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        with self._db_lock:
            if self._one.in_transaction():  # this thread's own, inside a batch
                yield self._one
            else:
                with self._one.begin():
                    yield self._one

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        """Materializations or check evaluations in one INSERT each EVENTS_PER_STATEMENT (others
        one at a time), as dagster-postgres stores a batch: in one transaction, so that a batch
        that fails stores none (Dagster then stores each alone)."""
        kinds = {event.dagster_event_type for event in events}
        batched = {
            DagsterEventType.ASSET_MATERIALIZATION: self._store_materializations,
            DagsterEventType.ASSET_CHECK_EVALUATION: self._store_check_evaluations,
        }
        store = batched.get(kinds.pop()) if len(kinds) == 1 else None
        if store is None:
            super().store_event_batch(events)
            return
        with self._connect() as conn:
            for start in range(0, len(events), EVENTS_PER_STATEMENT):
                part = events[start : start + EVENTS_PER_STATEMENT]
                rows = [self._event_to_row(event) for event in part]
                # One statement under the lock, compiled once (SQLAlchemy's "insertmanyvalues"): its rows
                # take consecutive ids in the order of its values.
                inserted = conn.execute(_INSERT_EVENTS, rows)
                store(conn, part, rows, sorted(row[0] for row in inserted))
        for event in events:
            self._stored(event)

    def _store_materializations(
        self, conn: Connection, events: Sequence[EventLogEntry], rows: list[dict[str, Any]], ids: list[int]
    ) -> None:
        """Their tags in one INSERT, and each asset's latest."""
        self._store_asset_event_tags(conn, events, ids)
        latest = {event.get_dagster_event().asset_key: (event, id_) for event, id_ in zip(events, ids)}
        for event, id_ in latest.values():
            self._store_asset_event(conn, event, id_)

    def _store_check_evaluations(
        self, conn: Connection, events: Sequence[EventLogEntry], rows: list[dict[str, Any]], ids: list[int]
    ) -> None:
        """Those nothing planned in one INSERT, each with the serialized event its row already
        holds; a planned one updates its row, as Dagster does."""
        unplanned = []
        for event, row, id_ in zip(events, rows, ids):
            if self._was_planned(event):
                super()._update_asset_check_evaluation(event, id_)
            else:
                unplanned.append(check_execution_row(event, row, id_))
        if unplanned:
            conn.execute(AssetCheckExecutionsTable.insert(), unplanned)

    def _store_asset_check_evaluation_planned(self, event: EventLogEntry, event_id: Optional[int]) -> None:
        super()._store_asset_check_evaluation_planned(event, event_id)
        planned = event.get_dagster_event().asset_check_planned_data
        partitions = planned.partitions_subset.get_partition_keys() if planned.partitions_subset else [None]
        self._planned.update((planned.asset_key, planned.check_name, event.run_id, key) for key in partitions)

    def _was_planned(self, event: EventLogEntry) -> bool:
        evaluation = event.get_dagster_event().asset_check_evaluation_data
        return (evaluation.asset_key, evaluation.check_name, event.run_id, evaluation.partition) in self._planned

    def _update_asset_check_evaluation(self, event: EventLogEntry, event_id: Optional[int]) -> None:
        """Dagster's UPDATE of the planned evaluation's row, then its INSERT when it updated none: the
        INSERT alone (the columns and values of the runless one's) where none was planned."""
        if self._was_planned(event):
            super()._update_asset_check_evaluation(event, event_id)
        else:
            self._store_runless_asset_check_evaluation(event, event_id)

    def _stored(self, event: EventLogEntry) -> None:
        """What the in-memory log's store_event does after storing an event: tell its watchers."""
        self._storage_id += 1
        cursor = str(EventLogCursor.from_storage_id(self._storage_id))
        for handler in list(self._handlers[event.run_id]):
            try:
                handler(event, cursor)
            except Exception:  # noqa: BLE001 - as Dagster's: a watcher's failure is logged, not the run's
                logging.exception("Exception in callback for event watch on run %s.", event.run_id)

    def dispose(self) -> None:
        self._one.close()
        super().dispose()


def check_execution_row(event: EventLogEntry, row: dict[str, Any], event_id: int) -> dict[str, Any]:
    """The asset_check_executions row Dagster's runless INSERT writes for `event`, whose event_logs
    `row` already holds it serialized and its time."""
    evaluation = event.get_dagster_event().asset_check_evaluation_data
    status = AssetCheckExecutionRecordStatus.SUCCEEDED if evaluation.passed else AssetCheckExecutionRecordStatus.FAILED
    target = evaluation.target_materialization_data
    return {
        "asset_key": evaluation.asset_key.to_string(),
        "check_name": evaluation.check_name,
        "run_id": event.run_id,
        "execution_status": status.value,
        "evaluation_event": row["event"],
        "evaluation_event_timestamp": row["timestamp"],
        "evaluation_event_storage_id": event_id,
        "materialization_event_storage_id": target.storage_id if target else None,
        "partition": evaluation.partition,
    }


def ephemeral_instance() -> DagsterInstance:
    """DagsterInstance.ephemeral(), its event log OneConnectionEventLogStorage."""
    return DagsterInstance(
        instance_type=InstanceType.EPHEMERAL,
        local_artifact_storage=TemporaryLocalArtifactStorage(),
        run_storage=InMemoryRunStorage(),
        event_storage=OneConnectionEventLogStorage(),
        compute_log_manager=NoOpComputeLogManager(),
        run_coordinator=DefaultRunCoordinator(),
        run_launcher=SyncInMemoryRunLauncher(),
    )
