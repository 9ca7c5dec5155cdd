"""The mark phase: which commits are retained, and which objects they keep alive (the plan
itself is gc_assets.mark; these assets store it and judge its checks)."""

from typing import Iterator

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetsDefinition,
    MetadataValue,
    MultiPartitionsDefinition,
    Output,
)
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame

from gc_assets.core.spark import session_summary
from gc_assets.defs.assets.common import gc_partition, partitioned_asset, refusals_as_failure, utc_now
from gc_assets.defs.assets.guard_checks import in_step_check_specs, judge_in_step
from gc_assets.defs.resources import GcConfigResource
from gc_assets.mark.live import live
from gc_assets.mark.retained import retained


def build_mark_assets(partitions: MultiPartitionsDefinition) -> list[AssetsDefinition]:
    return [_retained_commits(partitions), _live_files(partitions)]


def _retained_commits(partitions: MultiPartitionsDefinition) -> AssetsDefinition:
    @partitioned_asset(
        partitions,
        "mark",
        "Every commit of the repository graph and whether it is retained as of the partition's "
        "time: branch heads, tags and dangling commits are walked along first parents "
        "under the retention rules; the most lenient threshold wins.",
        check_specs=in_step_check_specs("retained_commits", partitions),
    )
    def retained_commits(
        context: AssetExecutionContext, gc_config: GcConfigResource, pyspark: LazyPySparkResource
    ) -> Iterator[Output[DataFrame] | AssetCheckResult]:
        partition = gc_partition(context, gc_config)
        context.log.info(session_summary(pyspark.spark_session))
        with refusals_as_failure():
            judged = retained(pyspark.spark_session, partition)
        metadata = {"as_of": MetadataValue.timestamp(partition.as_of), "refs": MetadataValue.int(judged.refs)}
        metadata.update({name: MetadataValue.int(value) for name, value in judged.counters.items()})
        yield Output(partition.with_partition_columns(judged.frame), metadata=metadata)
        yield from judge_in_step(context, gc_config, pyspark, "retained_commits", {})

    return retained_commits


def _live_files(partitions: MultiPartitionsDefinition) -> AssetsDefinition:
    @partitioned_asset(
        partitions,
        "mark",
        "Every object a retained commit references, plus staged entries and format metadata, "
        "as keys relative to the storage namespace. Imported objects outside the namespace "
        "are listed with in_namespace=false and are never collected.",
    )
    def live_files(
        context: AssetExecutionContext,
        gc_config: GcConfigResource,
        pyspark: LazyPySparkResource,
        retained_commits: DataFrame,
    ) -> DataFrame:
        partition = gc_partition(context, gc_config)
        mark_time = utc_now()
        frame, source_time = live(pyspark.spark_session, partition, retained_commits)
        context.add_output_metadata(
            {"mark_time": MetadataValue.timestamp(mark_time), "source_time": MetadataValue.timestamp(source_time)}
        )
        return partition.with_partition_columns(frame)

    return live_files
