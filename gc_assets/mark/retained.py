"""Which commits are retained: every commit of the graph judged under the repository's
retention as of the partition's time (the first half of the mark, docs/design.md §3)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core import retention
from gc_assets.core.config import RepositoryConfig
from gc_assets.core.retention import Commit, Ref, Retention
from gc_assets.core.spark import local_frame
from gc_assets.mark.partition import GcPartition, MarkRefusal
from gc_assets.sources.base import RepositorySource

RETENTION_SCHEMA = T.StructType(
    [
        T.StructField("commit_id", T.StringType(), False),
        T.StructField("created_at", T.TimestampType(), False),
        T.StructField("retained", T.BooleanType(), False),
        T.StructField("retained_by", T.StringType(), True),
        T.StructField("threshold", T.TimestampType(), True),
        T.StructField("ref_head", T.BooleanType(), False),
    ]
)


@dataclass(frozen=True)
class Retained:
    frame: DataFrame  # RETENTION_SCHEMA, then the format's state counters as long columns
    refs: int  # how many refs the graph has
    counters: dict[str, int]  # the format's state counters (source.state_columns())


def retained(spark: SparkSession, partition: GcPartition) -> Retained:
    """Every commit of the graph with its verdict; refused when the graph has no commit."""
    source = partition.source
    commits, refs, verdicts = judged(spark, source, partition.repo, partition.as_of)
    rows = verdict_rows(commits, refs, verdicts)
    counters = source.state_columns()
    frame = local_frame(spark, rows, RETENTION_SCHEMA)
    if counters:  # Spark Connect refuses withColumns of nothing
        frame = frame.withColumns({name: F.lit(value).cast("long") for name, value in counters.items()})
    return Retained(frame, len(refs), counters)


def judged(
    spark: SparkSession,
    source: RepositorySource,
    repo: RepositoryConfig,
    as_of: dt.datetime,
    graph: Optional[tuple[list[Commit], list[Ref]]] = None,
) -> tuple[list[Commit], list[Ref], dict[str, Retention]]:
    """The repository's commit graph (`graph` when it was read with others') and each commit's
    verdict as of `as_of`; refused when the graph has no commit."""
    commits, refs = graph or source.commit_graph(spark)
    if not commits:
        # Every repository has at least its first commit: none means a broken or truncated
        # source, which would make every object look untracked.
        raise MarkRefusal(f"repository {repo.name} has no commits: refusing to mark an empty history")
    return commits, refs, source.evaluate_retention(spark, repo, commits, refs, as_of)


def verdict_rows(
    commits: Sequence[Commit], refs: Sequence[Ref], verdicts: Mapping[str, Retention]
) -> list[tuple[Any, ...]]:
    """RETENTION_SCHEMA's rows: each commit with its verdict, and whether a ref points at it."""
    heads = retention.ref_heads(refs)
    return [
        (c.commit_id, c.created_at, v.retained, v.retained_by, v.threshold, c.commit_id in heads)
        for c in commits
        for v in (verdicts[c.commit_id],)
    ]
