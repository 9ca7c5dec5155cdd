"""The mark phase: which commits are retained, and which objects they keep alive."""


from dagster import Failure, AssetExecutionContext, AssetsDefinition, MetadataValue, MultiPartitionsDefinition, asset
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets import retention
from gc_assets.addresses import with_relative_keys
from gc_assets.assets.common import gc_partition, utc_now
from gc_assets.config import RepositoryConfig
from gc_assets.guards import SAMPLE
from gc_assets.resources import GcConfigResource
from gc_assets.sources import RepositorySource, SourceError

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
        source = partition.source
        retained = retained_commits.filter("retained").select("commit_id")
        heads = retained_commits.filter("ref_head").select("commit_id")
        # Not cached: Spark matches cached plans by their file paths, and the next run in this
        # session reads the same paths with new content.
        keyed = with_relative_keys(
            source.live_entries(spark, retained, heads), partition.repo.storage_namespace, partition.repo.external_prefixes
        )
        refuse_unlisted_outside(spark, source, partition.repo, keyed, retained)
        source_time = source.source_time(spark)
        context.add_output_metadata(
            {"mark_time": MetadataValue.timestamp(mark_time), "source_time": MetadataValue.timestamp(source_time)}
        )
        return partition.with_partition_columns(deduplicated(keyed))

    return [retained_commits, live_files]


def live_set(entries: DataFrame, namespace: str, external_prefixes: tuple[str, ...] = ()) -> DataFrame:
    """One row per live key: connector entries normalized and de-duplicated."""
    return deduplicated(with_relative_keys(entries, namespace, external_prefixes))


def deduplicated(keyed: DataFrame) -> DataFrame:
    """One row per key of with_relative_keys' output.

    An entry staged anywhere counts as staged; any head reference makes it at_head.
    """
    priority = F.create_map(*[F.lit(x) for pair in _SOURCE_PRIORITY.items() for x in pair])
    return keyed.groupBy("address").agg(
        F.max("size").alias("size"),
        F.min_by("source", priority[F.col("source")]).alias("source"),
        F.max("at_head").alias("at_head"),
        F.max("in_namespace").alias("in_namespace"),
        F.max("required").alias("required"),
    )


def refuse_unlisted_outside(
    spark: SparkSession, source: RepositorySource, repo: RepositoryConfig, keyed: DataFrame, retained: DataFrame
) -> None:
    """An address outside the namespace and under no external prefix is refused (DESIGN §10).

    It is either an alias of the namespace the product cannot see through (a second
    mount, another endpoint) or an object of another location: either way what it
    names is unknown, and objects it may keep alive could be collected.
    """
    outside = keyed.filter(~F.col("in_namespace") & ~F.col("external")).select("address", "spelled").distinct()
    sample = outside.limit(SAMPLE).collect()
    if not sample:
        return
    spellings = spark.createDataFrame([(r["spelled"],) for r in sample], "address string")
    try:
        holders = sorted({r["commit_id"] for r in source.commits_referencing(spark, retained, spellings).collect()})
    except Exception:  # naming the commit is a courtesy; the refusal stands either way
        holders = []
    held_by = f"held by commit(s) {holders[:5]}" if holders else "held by a retained commit, staging area or the format's metadata"
    raise SourceError(
        f"repository {repo.name!r}: {outside.count()} live address(es) lie outside the storage namespace "
        f"{repo.storage_namespace} and under no external_prefixes, e.g. {sample[0]['spelled']!r}; {held_by}. "
        "If they belong to another location on purpose, list its prefix under external_prefixes; if they are "
        "another spelling of the namespace (a second mount, another endpoint), refusing is the only safe answer."
    )
