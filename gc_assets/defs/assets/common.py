"""What a partition's step needs: its repository, its day, its as-of time and its latest mark."""

from __future__ import annotations

import datetime as dt
from contextlib import contextmanager
from typing import Iterator

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    Failure,
)

from gc_assets.defs.partitions import run_as_of, split_partition_key
from gc_assets.defs.resources import GcConfigResource
from gc_assets.mark.partition import GcPartition, Mark


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@contextmanager
def refusals_as_failure(*errors: type[Exception]) -> Iterator[None]:
    """A refusal of the layers below (`errors`) ends the step as a Dagster Failure with the
    refusal's own message, and nothing else: no traceback of the layer below."""
    try:
        yield
    except errors as exc:
        raise Failure(str(exc)) from None


def gc_partition(context: AssetExecutionContext, gc_config: GcConfigResource) -> GcPartition:
    date_text, repo_name = split_partition_key(context.partition_key)
    config = gc_config.load()
    date = dt.date.fromisoformat(date_text)
    if date < config.partitions_start_date:
        raise Failure(f"partition date {date} is before partitions_start_date {config.partitions_start_date}")
    as_of = run_as_of(context.instance, context.run, date)  # fixed at launch, never this step's clock
    return GcPartition(config, config.repository(repo_name), date, as_of)


def latest_mark(context: AssetExecutionContext) -> Mark:
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("live_files"), asset_partitions=[str(context.partition_key)]), limit=1
    ).records
    if not records:
        raise Failure(f"live_files has no materialization for partition {context.partition_key}")
    event = records[0].event_log_entry
    materialization = event.asset_materialization
    assert materialization is not None
    if "source_time" not in materialization.metadata:
        raise Failure(
            f"the live_files materialization of partition {context.partition_key} (run {event.run_id}) does not say "
            "when its source state was current: materialize the mark again"
        )

    def moment(key: str) -> dt.datetime:
        return dt.datetime.fromtimestamp(float(materialization.metadata[key].value), tz=dt.timezone.utc)

    return Mark(event.run_id, moment("mark_time"), moment("source_time"))
