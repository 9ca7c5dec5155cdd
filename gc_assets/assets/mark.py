"""The mark phase: which commits are retained, and which objects they keep alive."""


from dagster import Failure, AssetExecutionContext, AssetsDefinition, MetadataValue, MultiPartitionsDefinition, asset
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets import retention
from gc_assets.addresses import with_relative_keys
from gc_assets.assets.common import gc_partition, utc_now
from gc_assets.resources import GcConfigResource

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
_SOURCE_PRIORITY = {"staged": 0, "committed": 1, "metadata": 2}


def build_mark_assets(partitions: MultiPartitionsDefinition) -> list[AssetsDefinition]:
    @asset(
        partitions_def=partitions,
        group_name="mark",
        kinds={"spark", "parquet"},
        description=(
            "Every commit of the repository graph and whether it is retained as of the partition's "
            "time: branch heads, tags and dangling commits are walked along first parents "
            "under the retention rules; the most lenient threshold wins."
        ),
    )
    def retained_commits(
        context: AssetExecutionContext, gc_config: GcConfigResource, pyspark: LazyPySparkResource
    ) -> DataFrame:
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
        context.add_output_metadata(
            {"as_of": MetadataValue.timestamp(partition.as_of), "refs": MetadataValue.int(len(refs))}
        )
        frame = spark.createDataFrame(rows, _RETENTION_SCHEMA)
        return partition.with_partition_columns(frame)

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
        retained = retained_commits.filter("retained").select("commit_id")
        heads = retained_commits.filter("ref_head").select("commit_id")
        entries = partition.source.live_entries(spark, retained, heads)
        live = live_set(entries, partition.repo.storage_namespace)
        context.add_output_metadata({"mark_time": MetadataValue.timestamp(mark_time)})
        return partition.with_partition_columns(live)

    return [retained_commits, live_files]


def live_set(entries: DataFrame, namespace: str) -> DataFrame:
    """One row per live key: connector entries normalized and de-duplicated.

    An entry staged anywhere counts as staged; any head reference makes it at_head.
    """
    priority = F.create_map(*[F.lit(x) for pair in _SOURCE_PRIORITY.items() for x in pair])
    return with_relative_keys(entries, namespace).groupBy("address").agg(
        F.max("size").alias("size"),
        F.min_by("source", priority[F.col("source")]).alias("source"),
        F.max("at_head").alias("at_head"),
        F.max("in_namespace").alias("in_namespace"),
        F.max("required").alias("required"),
    )
