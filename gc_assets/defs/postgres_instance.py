"""Dagster's instance on PostgreSQL, its event log storing a batch of check evaluations at once.

dagster-postgres stores a batch of materializations in one statement, but a check evaluation
one at a time (its event row, then an UPDATE of a planned row, then an INSERT when none was
planned: three round trips, each on a connection of its own unless the process keeps one). A
run of a thousand tables records 9,000 check evaluations. This event log stores a batch of
them in one transaction: the event rows in one INSERT, the rows of those nobody planned in
another, an UPDATE of each planned one's row; the rows are those Dagster writes one at a time.

dagster.yaml (the documented `storage: postgres` block, as `custom`):

    storage:
      custom:
        module: gc_assets.defs.postgres_instance
        class: PostgresStorage
        config:
          postgres_db: {hostname: db.example.com, username: dagster, password: {env: DAGSTER_PG_PASSWORD},
                        db_name: dagster, port: 5432, scheme: postgresql+psycopg2}
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import sqlalchemy as db
from dagster import DagsterEventType, EventLogEntry
from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable, SqlEventLogStorageTable
from dagster._serdes import ConfigurableClassData
from dagster_postgres import DagsterPostgresStorage, PostgresEventLogStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config

from gc_assets.defs.instance import check_execution_row

# Each row's id in the order of the rows given (SQLAlchemy's insertmanyvalues sorts them).
_INSERT_EVENTS = SqlEventLogStorageTable.insert().returning(SqlEventLogStorageTable.c.id, sort_by_parameter_order=True)
# What identifies an evaluation's row: Dagster's UPDATE of a planned one matches these.
_ROW_KEY = ("run_id", "asset_key", "check_name", "partition")


class CheckBatchingPostgresEventLogStorage(PostgresEventLogStorage):
    """dagster-postgres's event log, a batch of check evaluations stored in one transaction."""

    @classmethod
    def from_config_value(
        cls, inst_data: Optional[ConfigurableClassData], config_value: Any
    ) -> CheckBatchingPostgresEventLogStorage:
        return cls(**_storage_arguments(inst_data, config_value))

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        """Check evaluations of runs: their event rows, then their asset_check_executions rows
        as Dagster writes each (a row already there for the run, planned or not, is updated).
        In one transaction: a batch that fails stores none, and Dagster then stores each alone."""
        kinds = {event.dagster_event_type for event in events}
        if kinds != {DagsterEventType.ASSET_CHECK_EVALUATION} or not all(event.run_id for event in events):
            super().store_event_batch(events)
            return
        with self.index_transaction() as conn:
            rows = [self._event_to_row(event) for event in events]
            ids = [row[0] for row in conn.execute(_INSERT_EVENTS, rows)]
            executions = {}  # by _ROW_KEY: a later evaluation of the same row replaces an earlier
            for event, row, id_ in zip(events, rows, ids):
                execution = check_execution_row(event, row, id_)
                executions[tuple(execution[column] for column in _ROW_KEY)] = execution
            there = _rows_there(conn, executions.values())
            for key in sorted(there & executions.keys(), key=str):
                conn.execute(_update(key), _without(executions.pop(key), _ROW_KEY))
            if executions:
                conn.execute(AssetCheckExecutionsTable.insert(), list(executions.values()))


def _rows_there(conn: db.Connection, executions: Any) -> set[tuple[Any, ...]]:
    """The keys of the asset_check_executions rows already stored for these runs' checks."""
    columns = [AssetCheckExecutionsTable.c[column] for column in _ROW_KEY]
    query = db.select(*columns).where(
        *(column.in_({execution[column.name] for execution in executions}) for column in columns[:3])
    )
    return {tuple(row) for row in conn.execute(query)}


def _update(key: tuple[Any, ...]) -> Any:
    """Dagster's UPDATE of the row `key` names (a partition of None matches NULL)."""
    table = AssetCheckExecutionsTable.c
    matches = [table[column] == value for column, value in zip(_ROW_KEY[:3], key[:3])]
    partition = table.partition.is_(None) if key[3] is None else table.partition == key[3]
    return AssetCheckExecutionsTable.update().where(*matches, partition)


def _without(row: dict[str, Any], columns: Sequence[str]) -> dict[str, Any]:
    return {column: value for column, value in row.items() if column not in columns}


def _storage_arguments(inst_data: Optional[ConfigurableClassData], config_value: Any) -> dict[str, Any]:
    """dagster-postgres's own reading of its `postgres_db` or `postgres_url` block."""
    return {
        "inst_data": inst_data,
        "postgres_url": pg_url_from_config(config_value),
        "should_autocreate_tables": config_value.get("should_autocreate_tables", True),
        "token_provider": get_token_provider_from_config(config_value),
    }


class PostgresStorage(DagsterPostgresStorage):
    """dagster-postgres's runs, schedules and events, the events in CheckBatchingPostgresEventLogStorage."""

    def __init__(self, postgres_url: str, should_autocreate_tables: bool = True, **rest: Any) -> None:
        super().__init__(postgres_url, should_autocreate_tables, **rest)
        self._event_log_storage = CheckBatchingPostgresEventLogStorage(
            postgres_url, should_autocreate_tables, token_provider=rest.get("token_provider")
        )

    @classmethod
    def from_config_value(cls, inst_data: Optional[ConfigurableClassData], config_value: Any) -> PostgresStorage:
        return cls(**_storage_arguments(inst_data, config_value))
