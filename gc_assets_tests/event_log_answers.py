"""Events of a fleet run's one step, and what Dagster's UI and the runner read back of them from an
event log: the witness that an event log storing a batch at once (defs.instance,
defs.postgres_instance) answers as Dagster's own given the same events one at a time."""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

import sqlalchemy
from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterEventType,
    EventLogEntry,
    EventRecordsFilter,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationPlanned,
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.partitions.subset import DefaultPartitionsSubset
from dagster._core.events import DagsterEvent, StepMaterializationData
from dagster._core.storage.event_log import SqlEventLogStorage
from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable
from dagster._serdes import deserialize_value

from gc_assets.defs.instance import EVENTS_PER_STATEMENT

RUN = "run-1"
ASSETS = ("live_files", "orphan_candidates")
PARTITIONS = [f"2026-12-06|table-{i:04d}" for i in range(EVENTS_PER_STATEMENT + 7)]  # two statements
CHECKED = PARTITIONS[:40]  # the partitions whose live_objects_present is evaluated


def entry(kind: DagsterEventType, data: Any) -> EventLogEntry:
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


def materializations(asset: str) -> list[EventLogEntry]:
    return [
        entry(
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


def planned() -> EventLogEntry:
    """Planned evaluations of live_objects_present on some partitions: theirs update these rows."""
    return entry(
        DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED,
        AssetCheckEvaluationPlanned(
            asset_key=AssetKey("live_files"),
            check_name="live_objects_present",
            partitions_subset=DefaultPartitionsSubset(set(PARTITIONS[::3])),
        ),
    )


def checks(storage: SqlEventLogStorage) -> list[EventLogEntry]:
    """One check evaluation of each live_files partition, naming its materialization in `storage`."""
    records = storage.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey("live_files")), limit=10_000)
    targets = {r.partition_key: r for r in records.records}
    return [
        entry(
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


def answers(storage: SqlEventLogStorage) -> dict[str, object]:
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
        (e.partition, e.status.value, e.event.dagster_event_type, target(e.event), judged(e.event)) for e in history
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


def judged(event: EventLogEntry) -> object:
    """What an evaluation row holds of its event: its verdict and description (a planned one: none)."""
    evaluation = event.get_dagster_event().event_specific_data
    return getattr(evaluation, "passed", None), getattr(evaluation, "description", None)


def target(event: EventLogEntry) -> object:
    """The storage id of the materialization a check evaluation judged; a planned one judged none."""
    judged = getattr(event.get_dagster_event().event_specific_data, "target_materialization_data", None)
    return judged and judged.storage_id
