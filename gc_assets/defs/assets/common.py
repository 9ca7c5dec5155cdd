"""What every asset of one partition needs: its repository, its day and its as-of time."""

from __future__ import annotations

import datetime as dt
import hashlib
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

from dagster import (
    AssetCheckExecutionContext,
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    Failure,
    MultiPartitionsDefinition,
)
from dagster import asset as dagster_asset

from gc_assets.defs.partitions import run_as_of, split_partition_key
from gc_assets.defs.resources import GcConfigResource
from gc_assets.mark.partition import GcPartition, Mark, MarkRefusal
from gc_assets.sweep.guard_table import CheckEvaluation, Guard, reusable_verdicts

PartitionedContext = AssetExecutionContext | AssetCheckExecutionContext
INPUTS_METADATA = "inputs_fingerprint"  # on each check result: what it judged


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def partitioned_asset(
    partitions: MultiPartitionsDefinition, group: str, description: str, **settings: Any
) -> Callable[..., Any]:
    """The decorator of a GC asset: one partition per (date, repository), computed on Spark and
    stored as Parquet."""
    return dagster_asset(
        partitions_def=partitions,
        group_name=group,
        kinds={"spark", "parquet"},
        description=description,
        **settings,
    )


@contextmanager
def refusals_as_failure(*errors: type[Exception]) -> Iterator[None]:
    """A refusal of the layers below (the mark's, or `errors`) ends the step as a Dagster Failure
    with the refusal's own message, and nothing else: no traceback of the layer below."""
    try:
        yield
    except (MarkRefusal, *errors) as exc:
        raise Failure(str(exc)) from None


def gc_partition(context: PartitionedContext, gc_config: GcConfigResource) -> GcPartition:
    date_text, repo_name = split_partition_key(context.partition_key)
    config = gc_config.load()
    date = dt.date.fromisoformat(date_text)
    if date < config.partitions_start_date:
        raise Failure(f"partition date {date} is before partitions_start_date {config.partitions_start_date}")
    as_of = run_as_of(context.instance, context.run, date)  # fixed at launch, never this step's clock
    return GcPartition(config, config.repository(repo_name), date, as_of)


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


def inputs_fingerprint(gc_config: GcConfigResource, partition_key: str, assets: Iterable[str]) -> str:
    """The stored files of these asset partitions, by name, size and modification time.

    Every write gives a partition new part file names, so two equal fingerprints mean the
    same materializations. live_files is always included: it carries the mark.
    """
    digest, files = hashlib.sha256(), gc_config.state()
    for asset in sorted({*assets, "live_files"}):
        digest.update(f"{asset}\0{files.fingerprint(gc_config.partition_at(asset, partition_key))}\n".encode())
    return digest.hexdigest()


def checked_inputs(guard: Guard) -> tuple[str, ...]:
    return (guard.asset, *guard.reads)


def passed_in_this_run(context: AssetExecutionContext, gc_config: GcConfigResource) -> set[str]:
    """The guards whose checks this run already passed on the inputs as they are now."""
    records = context.instance.all_logs(context.run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    evaluations = []
    for record in records:
        evaluation = record.get_dagster_event().event_specific_data
        inputs = evaluation.metadata.get(INPUTS_METADATA)
        evaluations.append(CheckEvaluation(evaluation.check_name, evaluation.passed, inputs.value if inputs else None))
    key = str(context.partition_key)
    return reusable_verdicts(evaluations, lambda guard: inputs_fingerprint(gc_config, key, checked_inputs(guard)))
