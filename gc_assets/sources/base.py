"""What every repository connector provides (DESIGN §6).

A connector turns one repository's metadata into the same DataFrames: its commit
graph (collected to the driver, where retention is evaluated as pure Python) and
the live entries of a set of retained commits, computed on executors.
"""

from __future__ import annotations

import datetime as dt
from typing import Optional, Protocol, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from gc_assets.config import RepositoryConfig, Rules
from gc_assets import retention
from gc_assets.retention import Commit, Ref, Retention

# Live entries as connectors produce them, before the mark joins and de-duplicates.
LIVE_ENTRY_SCHEMA = T.StructType(
    [
        T.StructField("address", T.StringType(), False),  # relative key, or absolute URI outside
        T.StructField("size", T.LongType(), True),
        T.StructField("source", T.StringType(), False),  # committed / staged / metadata
        T.StructField("at_head", T.BooleanType(), False),  # referenced by a ref's own commit
    ]
)


class SourceError(ValueError):
    """The repository's metadata is malformed or unreadable; the message names dataset and row."""


class RepositorySource(Protocol):
    """Connectors subclass this explicitly, to share the default retention evaluation."""

    # Keys under these prefixes are never candidates (format metadata, e.g. `_delta_log/`).
    protected_prefixes: tuple[str, ...]
    # Keys matching these regular expressions are never candidates (e.g. Delta's hidden files).
    protected_patterns: tuple[str, ...]

    def retention_rules(self, spark: SparkSession, repo: RepositoryConfig) -> Optional[Rules]:
        """The rules to evaluate: the configured ones, or the format's default when none are given.

        Raises SourceError when configured rules are unsafe for the format.
        """

    def evaluate_retention(
        self,
        spark: SparkSession,
        repo: RepositoryConfig,
        commits: Sequence[Commit],
        refs: Sequence[Ref],
        as_of: dt.datetime,
    ) -> dict[str, Retention]:
        """Retention of every commit. The mark and the sweep's re-validation both judge
        through here, so they always agree. By default the lakeFS rules (DESIGN §3);
        a format with semantics of its own (Iceberg's) overrides this."""
        return retention.evaluate(commits, refs, self.retention_rules(spark, repo), as_of)

    def commit_graph(self, spark: SparkSession) -> tuple[list[Commit], list[Ref]]:
        """Every commit and ref, validated."""

    def live_entries(self, spark: SparkSession, retained: DataFrame, heads: DataFrame) -> DataFrame:
        """Entries (LIVE_ENTRY_SCHEMA) of the `retained` commit_ids plus staged and metadata entries.

        `heads` holds the commit_ids refs point at, to mark entries the current data needs.
        """

    def committed_addresses(self, spark: SparkSession) -> DataFrame:
        """`address` of every entry of every commit, retained or not (to tell expired from untracked)."""

    def commits_referencing(self, spark: SparkSession, retained: DataFrame, addresses: DataFrame) -> DataFrame:
        """(address, commit_id) pairs: which retained commits reference the given addresses."""

    def fingerprint(self, spark: Optional[SparkSession]) -> str:
        """A cheap digest of the refs and the latest commits: it changes whenever a commit or ref does.

        The new-commit sensor calls it for every repository on every tick, with spark=None:
        read only small metadata on the driver (refs, file listings, a log's last entry),
        never the whole commit graph. A false change costs one extra mark run; a missed
        change only delays the mark to the daily schedule.
        """

