"""One table's live set refused when it names addresses outside its namespace, for the tests of
each format's reader: what the set's mark refuses (mark.sets), evaluated on one table."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.config import RepositoryConfig
from gc_assets.core.guards import SAMPLE
from gc_assets.mark.live import outside_refusal
from gc_assets.sources import RepositorySource, SourceError


def refuse_unlisted_outside(
    spark: SparkSession, source: RepositorySource, repo: RepositoryConfig, keyed: DataFrame, retained: DataFrame
) -> None:
    """docs/design.md §10 for one table, evaluated directly on its keyed live entries: an address
    outside the namespace and under no external prefix is refused, with the message the set's
    mark gives (mark.live.outside_refusal)."""
    outside = keyed.filter(~F.col("in_namespace") & ~F.col("external")).select("address", "spelled").distinct()
    sample = outside.limit(SAMPLE).collect()
    if not sample:
        return
    spellings = spark.createDataFrame([(r["spelled"],) for r in sample], "address string")
    try:
        holders = sorted({r["commit_id"] for r in source.commits_referencing(spark, retained, spellings).collect()})
    except Exception:  # naming the commit is a courtesy; the refusal stands either way
        holders = []
    raise SourceError(outside_refusal(repo, outside.count(), sample[0]["spelled"], holders))
