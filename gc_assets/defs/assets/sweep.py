"""The sweep phase: list storage, decide the candidates, and act on them.

Deciding what to delete (orphan_candidates) is separate from the act
(deletion_receipts), and the act re-verifies every guard first.
"""

import time
from functools import partial, reduce
from typing import Any, Iterator

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetsDefinition,
    Config,
    Failure,
    MetadataValue,
    MultiPartitionsDefinition,
    Output,
    asset,
)
from dagster_pyspark import LazyPySparkResource
from pydantic import Field
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.names import REPO, Mode, ModeError
from gc_assets.core.time import TimeError, refuse_future_as_of
from gc_assets.defs.assets.common import (
    gc_partition,
    latest_mark,
    partitioned_asset,
    passed_in_this_run,
    refusals_as_failure,
    utc_now,
)
from gc_assets.defs.assets.guard_checks import in_step_check_specs, judge_in_step
from gc_assets.defs.concurrency import ensure_sole_run
from gc_assets.defs.resources import GcConfigResource
from gc_assets.mark.candidates import candidates
from gc_assets.mark.partition import GcPartition, Mark
from gc_assets.stores import store_for
from gc_assets.sweep import together
from gc_assets.sweep.guard_table import Evidence, SweepRefused, refuse_unless_guards_pass
from gc_assets.sweep.holds import held_frame


class SweepConfig(Config):
    mode: str = Field(
        default="",
        description=(
            "dry_run (report only), trash (move to _gc_trash/<run_id>/, restorable) or delete; "
            "empty uses the repository's configured mode"
        ),
    )


def _object_inventory(partitions: MultiPartitionsDefinition) -> AssetsDefinition:
    @partitioned_asset(
        partitions,
        "sweep",
        "Every object in the storage namespace, listed on Spark executors over prefix slices. "
        "An unreachable namespace fails the listing; an empty one fails the candidates.",
        # Listed after the mark read the source's state: an object a commit of that state names
        # was written before it, so it is listed (a commit between a listing and the mark's read
        # would name an object the listing missed, and the live-objects check would fail).
        deps=["retained_commits"],
    )
    def object_inventory(
        context: AssetExecutionContext, gc_config: GcConfigResource, pyspark: LazyPySparkResource
    ) -> DataFrame:
        partition = gc_partition(context, gc_config)
        store = store_for(partition.repo)
        listing = store.list(pyspark.spark_session)
        context.add_output_metadata({"listed_at": MetadataValue.timestamp(utc_now())})
        if store.listed_from_report is not None:
            report = store.listed_from_report
            context.add_output_metadata(
                {
                    "inventory_date": MetadataValue.timestamp(report.created_at),
                    "inventory_manifest": MetadataValue.text(report.manifest),
                }
            )
        return partition.with_partition_columns(listing)

    return object_inventory


def _orphan_candidates(partitions: MultiPartitionsDefinition) -> AssetsDefinition:
    """The candidates the mark decides (gc_assets.mark.candidates), stored in group `sweep`:
    what the sweep may act on."""

    @partitioned_asset(
        partitions,
        "sweep",
        "Objects no retained commit or staging area references, inside the namespace, outside "
        "protected prefixes and older than the minimum object age. reason: expired (only "
        "expired commits reference it) or untracked (no commit does).",
        check_specs=in_step_check_specs("orphan_candidates", partitions),
    )
    def orphan_candidates(
        context: AssetExecutionContext,
        gc_config: GcConfigResource,
        pyspark: LazyPySparkResource,
        object_inventory: DataFrame,
        live_files: DataFrame,
        retained_commits: DataFrame,
    ) -> Iterator[Output[DataFrame] | AssetCheckResult]:
        partition = gc_partition(context, gc_config)
        spark = pyspark.spark_session
        with refusals_as_failure():
            decided = candidates(
                spark,
                partition,
                object_inventory,
                live_files,
                lambda: latest_mark(context),
                lambda: held_frame(spark, partition, object_inventory, utc_now()),
            )
        metadata = {
            "cutoff": MetadataValue.timestamp(decided.bounds.cutoff),
            "untracked_cutoff": MetadataValue.timestamp(decided.bounds.untracked_cutoff),
            "protected_prefixes": MetadataValue.json(list(decided.bounds.protected)),
        }
        yield Output(partition.with_partition_columns(decided.frame), metadata=metadata)
        inputs = {"object_inventory": object_inventory, "live_files": live_files, "retained_commits": retained_commits}
        yield from judge_in_step(context, gc_config, pyspark, "orphan_candidates", inputs)

    return orphan_candidates


def build_sweep_assets(partitions: MultiPartitionsDefinition) -> list[AssetsDefinition]:
    return [_object_inventory(partitions), _orphan_candidates(partitions), _deletion_receipts(partitions)]


def _deletion_receipts(partitions: MultiPartitionsDefinition) -> AssetsDefinition:
    """The act: the sweep of one partition in its mode, after every guard is judged again."""

    @asset(
        partitions_def=partitions,
        group_name="sweep",
        kinds={"spark", "parquet"},
        check_specs=in_step_check_specs("deletion_receipts", partitions),
        description=(
            "What the sweep did with each candidate. dry_run writes would_delete receipts and leaves "
            "storage untouched; delete removes the objects on Spark executors in batches. Every "
            "guard is re-verified here before storage is touched."
        ),
    )
    def deletion_receipts(
        context: AssetExecutionContext,
        config: SweepConfig,
        gc_config: GcConfigResource,
        pyspark: LazyPySparkResource,
        orphan_candidates: DataFrame,
        live_files: DataFrame,
        object_inventory: DataFrame,
        retained_commits: DataFrame,
    ) -> Iterator[Output[DataFrame] | AssetCheckResult]:
        started = time.monotonic()
        partition = gc_partition(context, gc_config)
        mode = sweep_mode(config, partition)
        ensure_sole_run(context.instance, partition.repo.name, context.run.run_id)
        mark = latest_mark(context)
        spark = pyspark.spark_session
        reused = passed_in_this_run(context, gc_config)
        verify_guards(spark, partition, mark, reused, retained_commits, live_files, object_inventory, orphan_candidates)
        frames = {
            "retained_commits": retained_commits,
            "live_files": live_files,
            "object_inventory": object_inventory,
            "orphan_candidates": orphan_candidates,
        }
        receipts, metadata = swept_alone(context, spark, partition, mode, mark, frames)
        handled = orphan_candidates.count()  # one receipt per candidate: the sweep's throughput
        sweep_metadata = {
            "mode": MetadataValue.text(mode.value),
            "mark_id": MetadataValue.text(mark.run_id),
            "guards_reused": MetadataValue.json(sorted(reused)),
            "files_per_second": MetadataValue.float(round(handled / max(time.monotonic() - started, 1e-3), 1)),
            **metadata,
        }
        yield Output(partition.with_partition_columns(receipts), metadata=sweep_metadata)
        inputs = {
            "orphan_candidates": orphan_candidates,
            "live_files": live_files,
            "object_inventory": object_inventory,
        }
        yield from judge_in_step(context, gc_config, pyspark, "deletion_receipts", inputs)

    return deletion_receipts


def swept_alone(
    context: AssetExecutionContext,
    spark: SparkSession,
    partition: GcPartition,
    mode: Mode,
    mark: Mark,
    frames: dict[str, DataFrame],
) -> tuple[DataFrame, dict[str, Any]]:
    """The receipts and sweep metadata of the partition's repository in `mode`, on the stored
    frames of `mark`, as a set of one (sweep.together: the set's dry run, or its sweep of an
    earlier mark, expiry first where the format wants it); a refusal ends the step with its
    message, storage untouched from there on."""
    name, run_id = partition.repo.name, context.run.run_id
    mine = {asset: with_repository(frame, name) for asset, frame in frames.items()}
    stores = {name: store_for(partition.repo)}
    if mode is Mode.DRY_RUN:
        acted, refused = together.dry_run_receipts(
            spark, {name: partition.repo}, stores, mine, run_id, utc_now(), mark.run_id
        )
        metadata: dict[str, Any] = {"expired_in_metadata": 0, "expiry_attempts": 0}  # a dry run expires nothing
    else:
        acting = together.Acting(lambda _: mode, context.log, lambda _: {})  # the sole run: ensure_sole_run
        acted, noted, refused = together.sweep_set(
            spark, partition.config, {name: partition}, {name: mode}, run_id, {}, mine, acting, utc_now, mark.run_id
        )
        metadata = noted.get(name, {})
    if name in refused:
        raise Failure(description=refused[name])
    receipts = reduce(partial(DataFrame.unionByName, allowMissingColumns=True), acted)
    return receipts.drop(REPO), metadata


def with_repository(frame: DataFrame, name: str) -> DataFrame:
    """A stored partition's frame with its repository as the `repo` column, as a set's frames have it."""
    return frame.withColumn(REPO, F.lit(name))


def sweep_mode(config: SweepConfig, partition: GcPartition) -> Mode:
    """The mode the run asks for, else the repository's configured one; a future as-of only in dry run."""
    with refusals_as_failure(ModeError, TimeError):
        mode = Mode.chosen(config.mode, partition.repo.mode)
        refuse_future_as_of(mode is Mode.DRY_RUN, partition.as_of, utc_now())
    return mode


def verify_guards(
    spark: SparkSession,
    partition: GcPartition,
    mark: Mark,
    passed_in_this_run: set[str],
    retained_commits: DataFrame,
    live_files: DataFrame,
    inventory: DataFrame,
    candidates: DataFrame,
) -> None:
    """Judge again every guard a sweep must pass (the checks' own table) that this run has not
    already passed on the same inputs; refuse on any ERROR."""
    frames = {
        "retained_commits": retained_commits,
        "live_files": live_files,
        "object_inventory": inventory,
        "orphan_candidates": candidates,
    }
    with refusals_as_failure(SweepRefused):
        refuse_unless_guards_pass(Evidence(spark, partition, frames, lambda: mark, utc_now()), passed_in_this_run)
