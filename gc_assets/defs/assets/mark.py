"""The mark phase: which commits are retained, and which objects they keep alive."""

from typing import Iterator

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetsDefinition,
    Failure,
    MetadataValue,
    MultiPartitionsDefinition,
    Output,
    asset,
)
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core import retention
from gc_assets.core.addresses import with_relative_keys
from gc_assets.defs.assets.common import gc_partition, utc_now
from gc_assets.defs.assets.guard_checks import in_step_check_specs, judge_in_step
from gc_assets.defs.resources import GcConfigResource
from gc_assets.mark.live import deduplicated, refuse_unlisted_outside

_RETENTION_SCHEMA = T.StructType(
    [
        T.StructField("commit_id", T.StringType(), False),
        T.StructField("created_at", T.TimestampType(), False),
        T.StructField("retained", T.BooleanType(), False),
        T.StructField("retained_by", T.StringType(), True),
        T.StructField("threshold", T.TimestampType(), True),
        T.StructField("ref_head", T.BooleanType(), False),
    ]
)


def build_mark_assets(partitions: MultiPartitionsDefinition) -> list[AssetsDefinition]:
    @asset(
        partitions_def=partitions,
        group_name="mark",
        kinds={"spark", "parquet"},
        check_specs=in_step_check_specs("retained_commits"),
        description=(
            "Every commit of the repository graph and whether it is retained as of the partition's "
            "time: branch heads, tags and dangling commits are walked along first parents "
            "under the retention rules; the most lenient threshold wins."
        ),
    )
    def retained_commits(
        context: AssetExecutionContext, gc_config: GcConfigResource, pyspark: LazyPySparkResource
    ) -> Iterator[Output[DataFrame] | AssetCheckResult]:
        partition = gc_partition(context, gc_config)
        spark = pyspark.spark_session
        source = partition.source
        commits, refs = source.commit_graph(spark)
        if not commits:
            # Every repository has at least its first commit: none means a broken or truncated
            # source, which would make every object look untracked.
            raise Failure(f"repository {partition.repo.name} has no commits: refusing to mark an empty history")
        verdicts = source.evaluate_retention(spark, partition.repo, commits, refs, partition.as_of)
        heads = retention.ref_heads(refs)
        rows = [
            (
                c.commit_id,
                c.created_at,
                verdicts[c.commit_id].retained,
                verdicts[c.commit_id].retained_by,
                verdicts[c.commit_id].threshold,
                c.commit_id in heads,
            )
            for c in commits
        ]
        counters = source.state_columns()
        metadata = {"as_of": MetadataValue.timestamp(partition.as_of), "refs": MetadataValue.int(len(refs))}
        metadata.update({name: MetadataValue.int(value) for name, value in counters.items()})
        frame = spark.createDataFrame(rows, _RETENTION_SCHEMA)
        if counters:  # Spark Connect refuses withColumns of nothing
            frame = frame.withColumns({name: F.lit(value).cast("long") for name, value in counters.items()})
        yield Output(partition.with_partition_columns(frame), metadata=metadata)
        yield from judge_in_step(context, gc_config, pyspark, "retained_commits", {})

    @asset(
        partitions_def=partitions,
        group_name="mark",
        kinds={"spark", "parquet"},
        description=(
            "Every object a retained commit references, plus staged entries and format metadata, "
            "as keys relative to the storage namespace. Imported objects outside the namespace "
            "are listed with in_namespace=false and are never collected."
        ),
    )
    def live_files(
        context: AssetExecutionContext,
        gc_config: GcConfigResource,
        pyspark: LazyPySparkResource,
        retained_commits: DataFrame,
    ) -> DataFrame:
        partition = gc_partition(context, gc_config)
        mark_time = utc_now()
        spark = pyspark.spark_session
        source = partition.source
        retained = retained_commits.filter("retained").select("commit_id", "threshold")
        heads = retained_commits.filter("ref_head").select("commit_id")
        # Computed once and kept with the executors (a local checkpoint, not a cache: Spark
        # matches cached plans by their file paths, and the next run in this session reads the
        # same paths with new content); the refusal below and the write both read it.
        keyed = with_relative_keys(
            source.live_entries(spark, retained, heads),
            partition.repo.storage_namespace,
            partition.repo.external_prefixes,
        ).localCheckpoint()
        refuse_unlisted_outside(spark, source, partition.repo, keyed, retained)
        source_time = source.source_time(spark)
        context.add_output_metadata(
            {"mark_time": MetadataValue.timestamp(mark_time), "source_time": MetadataValue.timestamp(source_time)}
        )
        return partition.with_partition_columns(deduplicated(keyed))

    return [retained_commits, live_files]
