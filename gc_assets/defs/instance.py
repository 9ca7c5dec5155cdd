"""The instance a run records in when no $DAGSTER_HOME is set: Dagster's ephemeral one, with an
in-memory event log that keeps one connection, stores a batch of materializations at once, and
inserts a check evaluation that none planned without first trying to update one.

Dagster's own in-memory event log opens a SQLite connection for every statement (with two
PRAGMAs: about 0.1 ms, four times an event), stores a batch one event at a time, and updates
the row of a planned check evaluation before inserting one when there was none; a run of a
thousand tables stores 14,000 events beside its Spark jobs, in the driver's interpreter. The rows
are Dagster's own, written by its SqlEventLogStorage, a batch as dagster-postgres writes one."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

from dagster import AssetKey, DagsterEventType, DagsterInstance, EventLogEntry
from dagster._core.instance import InstanceType
from dagster._core.launcher.sync_in_memory_run_launcher import SyncInMemoryRunLauncher
from dagster._core.run_coordinator import DefaultRunCoordinator
from dagster._core.storage.event_log import InMemoryEventLogStorage
from dagster._core.storage.event_log.base import EventLogCursor
from dagster._core.storage.event_log.schema import SqlEventLogStorageTable
from dagster._core.storage.noop_compute_log_manager import NoOpComputeLogManager
from dagster._core.storage.root import TemporaryLocalArtifactStorage
from dagster._core.storage.runs import InMemoryRunStorage
from dagster._core.storage.sql import create_engine
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

# Events one statement inserts: SQLite binds at most 32,766 values, an event row about ten, its tags
# about twenty.
EVENTS_PER_STATEMENT = 250


class OneConnectionEventLogStorage(InMemoryEventLogStorage):
    """Dagster's in-memory event log over one connection, which its lock lends one thread at a
    time, with a batch of materializations stored in one statement, and a check evaluation that
    nothing planned inserted without an UPDATE first."""

    def __init__(self, inst_data: Any = None) -> None:
        super().__init__(inst_data)
        self._planned: set[tuple[AssetKey, str, str, Optional[str]]] = set()  # every write is this log's
        engine = create_engine(self._engine.url, poolclass=NullPool, connect_args={"check_same_thread": False})
        self._one = engine.connect()
        with self._one.begin():
            self._one.exec_driver_sql("PRAGMA foreign_keys=ON;")

    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        with self._db_lock, self._one.begin():
            yield self._one

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        """Materializations in one INSERT each EVENTS_PER_STATEMENT (others one at a time), their
        tags in one more, and each asset's latest, as dagster-postgres stores a batch: in one
        transaction, so that a batch that fails stores none (Dagster then stores each alone)."""
        if any(event.dagster_event_type != DagsterEventType.ASSET_MATERIALIZATION for event in events):
            super().store_event_batch(events)
            return
        with self._connect() as conn:
            event_ids: list[int] = []
            for start in range(0, len(events), EVENTS_PER_STATEMENT):
                part = events[start : start + EVENTS_PER_STATEMENT]
                inserted = conn.execute(self.prepare_insert_event_batch(part).returning(SqlEventLogStorageTable.c.id))
                # One statement under the lock: its rows take consecutive ids in the order of its values.
                ids = sorted(row[0] for row in inserted)
                self._store_asset_event_tags(conn, part, ids)
                event_ids += ids
            latest = {event.get_dagster_event().asset_key: (event, id_) for event, id_ in zip(events, event_ids)}
            for event, id_ in latest.values():
                self._store_asset_event(conn, event, id_)
        for event in events:
            self._stored(event)

    def _store_asset_check_evaluation_planned(self, event: EventLogEntry, event_id: Optional[int]) -> None:
        super()._store_asset_check_evaluation_planned(event, event_id)
        planned = event.get_dagster_event().asset_check_planned_data
        partitions = planned.partitions_subset.get_partition_keys() if planned.partitions_subset else [None]
        self._planned.update((planned.asset_key, planned.check_name, event.run_id, key) for key in partitions)

    def _update_asset_check_evaluation(self, event: EventLogEntry, event_id: Optional[int]) -> None:
        """Dagster's UPDATE of the planned evaluation's row, then its INSERT when it updated none: the
        INSERT alone (the columns and values of the runless one's) where none was planned."""
        evaluation = event.get_dagster_event().asset_check_evaluation_data
        if (evaluation.asset_key, evaluation.check_name, event.run_id, evaluation.partition) in self._planned:
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
