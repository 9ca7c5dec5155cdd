"""The five assets of one (date, repository) partition as one step: the collection of a set of
one (sweep.together), exactly as fleet_job collects a thousand, recorded asset by asset and
check by check. gc_job, mark_job, sweep_job, a materialization picked in the UI and a backfill
all run it; the selection decides how far it goes:

- any selection with an asset before the receipts: the mark, then up to the last asset
  selected (the mark alone: storage is not listed; the candidates: no receipts; all five);
- deletion_receipts alone: the sweep of the partition's latest stored mark, every guard a
  sweep must pass judged again first (docs/design.md §1).
"""

from typing import Any, Iterator

from dagster import (
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    AssetSpec,
    Config,
    Failure,
    MetadataValue,
    MultiPartitionsDefinition,
    Output,
    multi_asset,
)
from dagster_pyspark import LazyPySparkResource
from pydantic import Field
from pyspark.sql import SparkSession

from gc_assets.core.names import ASSETS, Mode, ModeError
from gc_assets.core.spark import session_summary
from gc_assets.core.time import TimeError, refuse_future_as_of
from gc_assets.defs.assets.common import gc_partition, latest_mark, refusals_as_failure, utc_now
from gc_assets.defs.concurrency import ensure_sole_run, not_sole_runs
from gc_assets.defs.resources import GcConfigResource
from gc_assets.defs.set_records import recorded
from gc_assets.defs.set_runs import FAILED_METADATA, collected_failure
from gc_assets.mark.partition import GcPartition
from gc_assets.sweep import together
from gc_assets.sweep.guard_table import GUARDS
from gc_assets.sweep.together import CANDIDATES, LIVE, RECEIPTS, Acting, Collected, Judged, Store

STEP = "collect_partition"  # the step's name: the launchpad's run config names it (mode_run_config)
MARK = ("retained_commits", "live_files")
DESCRIPTIONS = {
    "retained_commits": "Every commit of the repository graph and whether it is retained as of the partition's "
    "time: branch heads, tags and dangling commits are walked along first parents under the retention rules; "
    "the most lenient threshold wins.",
    "live_files": "Every object a retained commit references, plus staged entries and format metadata, as keys "
    "relative to the storage namespace. Imported objects outside the namespace are listed with in_namespace=false "
    "and are never collected.",
    "object_inventory": "Every object in the storage namespace, listed on Spark executors over prefix slices, "
    "after the mark read the source's state. An unreachable namespace fails the listing; an empty one fails the "
    "candidates.",
    "orphan_candidates": "Objects no retained commit or staging area references, inside the namespace, outside "
    "protected prefixes and older than the minimum object age. reason: expired (only expired commits reference "
    "it) or untracked (no commit does).",
    "deletion_receipts": "What the sweep did with each candidate. dry_run writes would_delete receipts and leaves "
    "storage untouched; delete removes the objects on Spark executors in batches. Every guard is re-verified "
    "before storage is touched.",
}
# What each asset is computed from: the graph the UI draws. The listing follows the mark's read
# of the source: an object a commit of that state names was written before it, so it is listed.
DEPS = {
    "retained_commits": [],
    "live_files": ["retained_commits"],
    "object_inventory": ["retained_commits"],
    "orphan_candidates": ["retained_commits", "live_files", "object_inventory"],
    "deletion_receipts": ["retained_commits", "live_files", "object_inventory", "orphan_candidates"],
}


class SweepConfig(Config):
    mode: str = Field(
        default="",
        description=(
            "dry_run (report only), trash (move to _gc_trash/<run_id>/, restorable) or delete; "
            "empty uses the repository's configured mode"
        ),
    )


def build_partition_assets(partitions: MultiPartitionsDefinition, kinds: dict[str, set[str]]) -> AssetsDefinition:
    """The five assets and their nine checks, partitioned (date × repository), as one subsettable
    step; `kinds`: what the UI shows of each beyond spark and parquet."""
    specs = [
        AssetSpec(
            asset,
            deps=DEPS[asset],
            description=DESCRIPTIONS[asset],
            group_name="mark" if asset in MARK else "sweep",
            kinds={"spark", "parquet", *kinds.get(asset, set())},
            partitions_def=partitions,
            skippable=True,  # stored and recorded by the set's own writes, not yielded as outputs
        )
        for asset in ASSETS
    ]
    checks = [
        AssetCheckSpec(
            guard.name,
            asset=guard.asset,
            blocking=guard.blocking,
            description=guard.description,
            partitions_def=partitions,
        )
        for guard in GUARDS
        if guard.is_check
    ]

    @multi_asset(
        name=STEP,
        specs=specs,
        check_specs=checks,
        can_subset=True,
        description="Collects one (date, repository) partition as a set of one, as fleet_job collects many.",
    )
    def collect_partition(
        context: AssetExecutionContext, config: SweepConfig, gc_config: GcConfigResource, pyspark: LazyPySparkResource
    ) -> Iterator[Output[None]]:
        partition = gc_partition(context, gc_config)
        selected = {key.path[-1] for key in context.selected_asset_keys}
        spark = pyspark.spark_session
        context.log.info(session_summary(spark))
        if selected == {RECEIPTS}:
            collected = _sweep_of_latest_mark(context, config, gc_config, spark, partition)
        else:
            collected = _collected(context, config, gc_config, spark, partition, selected)
        checks = [key.name for key in context.selected_asset_check_keys]
        error = collected_failure(collected, partition.repo.name, checks)
        if error:  # named as fleet_job names each repository that failed
            raise Failure(
                description=error, metadata={FAILED_METADATA: MetadataValue.json({partition.repo.name: error})}
            )
        yield from ()  # a generator yielding no outputs: each partition is stored and recorded by the set's writes

    return collect_partition


def _collected(
    context: AssetExecutionContext,
    config: SweepConfig,
    gc_config: GcConfigResource,
    spark: SparkSession,
    partition: GcPartition,
    selected: set[str],
) -> Collected:
    """The partition's repository collected as a set of one with the repositories reaching into
    it, up to the last asset of `selected`: the mark's, the candidates' or the receipts'."""
    through = RECEIPTS if RECEIPTS in selected else CANDIDATES if selected - set(MARK) else LIVE
    mode = sweep_mode(config, partition) if through == RECEIPTS else Mode.DRY_RUN
    lake, repos = partition.config, [partition.repo]
    readers = together.readers_of(lake, repos)
    run_id = context.run.run_id
    acting = Acting(lambda _: mode, context.log, lambda names: not_sole_runs(context.instance, names, run_id))

    def work(store: Store, judged: Judged) -> Collected:
        return together.collect(
            spark,
            lake,
            repos,
            partition.date,
            partition.as_of,
            run_id,
            store,
            utc_now,
            judged,
            through,
            acting,
            readers,
        )

    return recorded(context.op_execution_context, gc_config, spark, partition.date, work)


def _sweep_of_latest_mark(
    context: AssetExecutionContext,
    config: SweepConfig,
    gc_config: GcConfigResource,
    spark: SparkSession,
    partition: GcPartition,
) -> Collected:
    """deletion_receipts alone: the partition's sweep on what its latest mark stored, once every
    guard a sweep must pass judged those frames again (a sweep launched on its own is not stopped
    by an earlier run's failed check: sweep.together.judged_again)."""
    mode = sweep_mode(config, partition)
    run_id = context.run.run_id
    ensure_sole_run(context.instance, partition.repo.name, run_id)
    mark = latest_mark(context)
    frames = {}
    for asset in ASSETS[:4]:
        frame = gc_config.stored(spark, asset, context.partition_key)
        if frame is None:
            raise Failure(f"{asset} has no stored partition {context.partition_key}: materialize the mark first")
        frames[asset] = frame
    acting = Acting(lambda _: mode, context.log, lambda _: {})  # the sole run: ensure_sole_run

    def work(store: Store, judged: Judged) -> Collected:
        return together.sweep_stored(
            spark, partition.config, partition, mark, frames, run_id, store, judged, acting, utc_now
        )

    return recorded(context.op_execution_context, gc_config, spark, partition.date, work)


def sweep_mode(config: SweepConfig, partition: GcPartition) -> Mode:
    """The mode the run asks for, else the repository's configured one; a future as-of only in dry run."""
    with refusals_as_failure(ModeError, TimeError):
        mode = Mode.chosen(config.mode, partition.repo.mode)
        refuse_future_as_of(mode is Mode.DRY_RUN, partition.as_of, utc_now())
    return mode


def mode_run_config(mode: str) -> dict[str, Any]:
    """gc_job's run config naming the sweep's mode; empty means the repository's configured one."""
    return {"ops": {STEP: {"config": {"mode": mode}}}}
