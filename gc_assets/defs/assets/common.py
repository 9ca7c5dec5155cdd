"""What every asset of one partition needs: its repository, its day and its as-of time."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from dagster import (
    AssetCheckExecutionContext,
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    Failure,
)

from gc_assets.core.config import RepositoryConfig
from gc_assets.defs.partitions import AS_OF_TAG, resolve_as_of, split_partition_key
from gc_assets.defs.resources import GcConfigResource
from gc_assets.mark.partition import GcPartition

PartitionedContext = AssetExecutionContext | AssetCheckExecutionContext


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def gc_partition(context: PartitionedContext, gc_config: GcConfigResource) -> GcPartition:
    date_text, repo_name = split_partition_key(context.partition_key)
    config = gc_config.load()
    date = dt.date.fromisoformat(date_text)
    if date < config.partitions_start_date:
        raise Failure(f"partition date {date} is before partitions_start_date {config.partitions_start_date}")
    as_of = resolve_as_of(date, utc_now(), context.run.tags.get(AS_OF_TAG))
    return GcPartition(config, config.repository(repo_name), date, as_of)


@dataclass(frozen=True)
class Mark:
    """The live_files materialization a sweep relies on."""

    run_id: str
    mark_time: dt.datetime
    source_time: dt.datetime  # when the state the mark read was current (docs/design.md §10)


def latest_mark(context: PartitionedContext) -> Mark:
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


def knowledge_time(partition: GcPartition, mark: Mark) -> dt.datetime:
    """The latest moment the mark's knowledge covers: nothing written after it was seen by it."""
    return min(mark.mark_time, partition.as_of, mark.source_time)


def candidate_cutoff(partition: GcPartition, mark: Mark) -> dt.datetime:
    """No object modified at or after this time is ever a candidate (docs/design.md §2, §10)."""
    return knowledge_time(partition, mark) - partition.repo.min_object_age


def untracked_guard(repo: RepositoryConfig, format_guard: dt.timedelta) -> dt.timedelta:
    """How old an untracked object must be: the format's window for in-flight writers, or the
    configured override (below the format's window only with allow_unsafe_min_age)."""
    if repo.untracked_min_age_hours is None:
        return max(format_guard, repo.min_object_age)
    override = dt.timedelta(hours=repo.untracked_min_age_hours)
    if override < format_guard and not repo.allow_unsafe_min_age:
        raise Failure(
            f"repository {repo.name!r}: untracked_min_age_hours {repo.untracked_min_age_hours:g} is below the "
            f"format's own guard for in-flight writers ({format_guard.total_seconds() / 3600:g} hours); "
            "that needs allow_unsafe_min_age: true"
        )
    return max(override, repo.min_object_age)


def untracked_cutoff(partition: GcPartition, mark: Mark, format_guard: dt.timedelta) -> dt.datetime:
    """No untracked object modified at or after this time is a candidate (docs/design.md §10)."""
    return knowledge_time(partition, mark) - untracked_guard(partition.repo, format_guard)
