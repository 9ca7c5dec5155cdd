"""What every repository connector provides (docs/design.md §6).

A connector turns one repository's metadata into the same DataFrames: its commit
graph (collected to the driver, where retention is evaluated as pure Python) and
the live entries of a set of retained commits, computed on executors.
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import reduce
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core import retention
from gc_assets.core.config import RepositoryConfig, Rules
from gc_assets.core.names import REPO
from gc_assets.core.retention import Commit, Ref, Retention
from gc_assets.core.spark import beside_task_count, local_frame, task_error
from gc_assets.stores.settings import StoreSettings

# Live entries as connectors produce them, before the mark joins and de-duplicates.
LIVE_ENTRY_SCHEMA = T.StructType(
    [
        T.StructField("address", T.StringType(), False),  # relative key, or absolute URI outside
        T.StructField("size", T.LongType(), True),
        T.StructField("source", T.StringType(), False),  # committed / staged / metadata
        T.StructField("at_head", T.BooleanType(), False),  # referenced by a ref's own commit
    ]
)


# Live entries of many repositories, each with its own.
LIVE_SCHEMA = T.StructType([T.StructField(REPO, T.StringType(), False), *LIVE_ENTRY_SCHEMA.fields])

# The retained commits live_entries reads, each with the threshold that retained it (null: the
# whole history), so a format can judge its own records (Delta's tombstones) by the same time.
RETAINED_SCHEMA = "commit_id string, threshold timestamp"


# A commit graph as commit_graph returns it, or why a repository's cannot be read.
Graph = Union[tuple[list[Commit], list[Ref]], Exception]


def retained_frame(spark: SparkSession, verdicts: Mapping[str, Retention], commit_ids: Iterable[str]) -> DataFrame:
    """RETAINED_SCHEMA rows of `commit_ids` from their verdicts."""
    return local_frame(spark, [(c, verdicts[c].threshold) for c in commit_ids], RETAINED_SCHEMA)


class SourceError(ValueError):
    """The repository's metadata is malformed or unreadable; the message names dataset and row."""


@dataclass(frozen=True)
class CommittedExpiry:
    """What a format's own expiry committed before a sweep acted (docs/design.md §6.3)."""

    expired: frozenset[str] = frozenset()  # commits this sweep expired in the format's metadata
    gone: frozenset[str] = frozenset()  # commits the mark expired that the committed metadata no longer lists
    attempts: int = 0  # commits tried, each conflict re-judged; 0 when there was nothing to commit
    metadata_before: Optional[str] = None  # the metadata the expiry replaced, to roll back to by hand


# What each ref head the mark saw needs, as the format's reference reader sees it (the independent witness).
WITNESS_SCHEMA = T.StructType(
    [
        T.StructField("commit_id", T.StringType(), False),
        T.StructField("address", T.StringType(), False),  # as the format spells it: relative key or absolute URI
    ]
)
WITNESS_OF_MANY = f"{REPO} string, commit_id string, address string"  # each repository's witness rows
WITNESS_BATCH_ROWS = 100_000  # addresses per Arrow batch a witness task yields


def witness_on_executors(
    spark: SparkSession, head_ids: Sequence[str], open_reader: Callable[[], Callable[[str], list[str]]]
) -> DataFrame:
    """WITNESS_SCHEMA rows of `head_ids`, read on executors (beside_task_count tasks, each reading a few
    heads): `open_reader()` runs once in each task and returns the function from a head to
    the addresses it needs, so an Iceberg table's metadata is loaded once per task.

    A head's file list never passes through the driver: built there, the 1.5 M files of a
    2 M-file Delta table's head became one plan of local rows and tasks of 84 MB each, and
    a 2 GiB driver ran out of heap."""

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        addresses_of = open_reader()
        for batch in batches:
            for head in batch.column("commit_id").to_pylist():
                addresses = addresses_of(head)
                for start in range(0, len(addresses), WITNESS_BATCH_ROWS):
                    chunk = addresses[start : start + WITNESS_BATCH_ROWS]
                    yield pa.record_batch(
                        [pa.array([head] * len(chunk), pa.string()), pa.array(chunk, pa.string())],
                        names=["commit_id", "address"],
                    )

    heads = local_frame(spark, [(head,) for head in head_ids], "commit_id string")
    return heads.repartition(beside_task_count(spark, len(head_ids))).mapInArrow(read, WITNESS_SCHEMA)


def metadata_settings(repo: RepositoryConfig) -> StoreSettings:
    """Metadata is read with the repository's own store settings (S3, Azure, GCS), like its objects."""
    return StoreSettings.of_repository(repo)


@dataclass(frozen=True)
class LiveRead:
    """What live_entries reads of one repository of a set: its connector, its retained commits
    with their verdicts, and the commits its refs point at."""

    source: "RepositorySource"
    verdicts: Mapping[str, Retention]
    retained: Sequence[str]
    heads: Sequence[str]

    def frames(self, spark: SparkSession) -> tuple[DataFrame, DataFrame]:
        """(retained, heads) as live_entries takes them."""
        heads = local_frame(spark, [(head,) for head in self.heads], "commit_id string")
        return retained_frame(spark, self.verdicts, self.retained), heads


class RepositorySource(ABC):
    """What every connector implements; missing knowledge is a SourceError, never a guess (docs/design.md §10)."""

    # Keys under these prefixes are never candidates (format metadata, e.g. `_delta_log/`).
    protected_prefixes: tuple[str, ...]
    # Keys matching these regular expressions are never candidates (e.g. Delta's hidden files).
    protected_patterns: tuple[str, ...]
    # False when storage cannot show every uncommitted writer (lakeFS's staged objects live in its
    # key-value store): then an object no commit references is never a candidate.
    collects_untracked: bool = True
    # True when fingerprint() never comes back to an earlier value, so the same one later means
    # no commit since (Delta's newest log version; an Iceberg commit's new metadata file). A
    # lakeFS dump or export restored from a copy that keeps its files' times would come back.
    fingerprint_only_grows: bool = False

    @classmethod
    @abstractmethod
    def from_config(cls, repo: RepositoryConfig) -> "RepositorySource":
        """The connector of a gc.yaml repository."""

    @abstractmethod
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
        through here, so they always agree. By default the lakeFS rules (docs/design.md §3);
        a format with semantics of its own (Iceberg's) overrides this."""
        return retention.evaluate(commits, refs, self.retention_rules(spark, repo), as_of)

    def commit_expiry(
        self, spark: SparkSession, repo: RepositoryConfig, as_of: dt.datetime, expired_at_mark: frozenset[str]
    ) -> CommittedExpiry:
        """Before a trash or delete sweep acts: expire, in the format's own metadata, the commits
        the rules expire (of `expired_at_mark`, the mark's expired commits), so that no commit
        the metadata still lists needs a file the sweep removes. Raises SourceError when the
        metadata refuses the commit. lakeFS and Delta keep their history as it is (a vacuumed
        Delta version stays in the log, as with delta-rs), so by default nothing is committed."""
        return CommittedExpiry()

    def state_columns(self) -> dict[str, int]:
        """Counters describing the state read, added to retained_commits as columns (the file
        catalog's rows); none for formats whose commits describe themselves."""
        return {}

    def check_inventory(self, spark: SparkSession, inventory: DataFrame) -> None:
        """Raise SourceError when the listing contradicts the source (the file catalog: objects
        modified ahead of the database's clock); nothing to check by default."""

    @classmethod
    def check_inventories(
        cls, spark: SparkSession, sources: Mapping[str, "RepositorySource"], inventory: DataFrame
    ) -> dict[str, str]:
        """Why each of `sources` is refused by check_inventory of its listing (`inventory`, with
        `repo`), by name. One after another by default; a format that checks many at once overrides it."""
        refused = {}
        for name, source in sources.items():
            try:
                source.check_inventory(spark, inventory.filter(F.col(REPO) == name).drop(REPO))
            except Exception as exc:  # noqa: BLE001 - this repository alone
                refused[name] = task_error(exc)
        return refused

    @abstractmethod
    def commit_graph(self, spark: SparkSession) -> tuple[list[Commit], list[Ref]]:
        """Every commit and ref, validated."""

    @classmethod
    def commit_graphs(cls, spark: SparkSession, sources: Mapping[str, "RepositorySource"]) -> dict[str, Graph]:
        """Each of `sources`' commit graph, or the error that refuses it: a set's mark reads many
        repositories of one format at once. One after another by default; a format that reads
        them all in one set of Spark jobs overrides it."""
        graphs: dict[str, Graph] = {}
        for name, source in sources.items():
            try:
                graphs[name] = source.commit_graph(spark)
            except Exception as exc:  # noqa: BLE001 - this repository's refusal alone
                graphs[name] = exc
        return graphs

    @classmethod
    def live_entries_together(cls, spark: SparkSession, reads: Mapping[str, "LiveRead"]) -> DataFrame:
        """(repo, LIVE_ENTRY_SCHEMA) of every repository of `reads`. Each source's own live_entries
        by default; a format that reads many in one plan overrides it."""
        frames = [
            read.source.live_entries(spark, *read.frames(spark)).select(
                F.lit(name).alias(REPO), *LIVE_ENTRY_SCHEMA.fieldNames()
            )
            for name, read in reads.items()
        ]
        return reduce(DataFrame.unionByName, frames, local_frame(spark, [], LIVE_SCHEMA))

    @abstractmethod
    def live_entries(self, spark: SparkSession, retained: DataFrame, heads: DataFrame) -> DataFrame:
        """Entries (LIVE_ENTRY_SCHEMA) of the `retained` commit_ids plus staged and metadata entries.

        `heads` holds the commit_ids refs point at, to mark entries the current data needs.
        `retained` is RETAINED_SCHEMA (retained_frame) wherever the verdicts are known.
        """

    @abstractmethod
    def committed_addresses(self, spark: SparkSession) -> DataFrame:
        """`address` of every entry of every commit, retained or not (to tell expired from untracked)."""

    @abstractmethod
    def commits_referencing(self, spark: SparkSession, retained: DataFrame, addresses: DataFrame) -> DataFrame:
        """(address, commit_id) pairs: which retained commits reference the given addresses."""

    def logical_addresses(self, spark: SparkSession, path: str) -> DataFrame:
        """(address, commit_id) of the objects a logical path named in each commit.

        Delta and Iceberg name files by their path in the table, which is already the
        key; lakeFS names them by a logical path that ranges map to physical addresses.
        """
        return local_frame(spark, [], "address string, commit_id string")

    @abstractmethod
    def fingerprint(self, spark: Optional[SparkSession]) -> str:
        """A cheap digest of the refs and the latest commits: it changes whenever a commit or ref does.

        The new-commit sensor calls it for every repository on every tick, with spark=None:
        read only small metadata on the driver (refs, file listings, a log's last entry),
        never the whole commit graph. A false change costs one extra mark run; a missed
        change only delays the mark to the daily schedule.
        """

    @abstractmethod
    def source_time(self, spark: SparkSession) -> dt.datetime:
        """When the state this connector read was current (UTC).

        Objects written after it may belong to commits the connector never saw, so the
        candidate cutoff is never later than this (an export's `exported_at`, else its
        oldest part file; for Delta and Iceberg, the moment the log or metadata was read).
        """

    @abstractmethod
    def untracked_min_age(self, spark: SparkSession, repo: RepositoryConfig) -> dt.timedelta:
        """The format's own guard for in-flight writers: an untracked file younger than this is kept.

        Delta: delta.deletedFileRetentionDuration; Iceberg: 3 days; lakeFS: min_object_age.
        The repository's untracked_min_age_hours replaces it when set.
        """

    @classmethod
    def witness_heads_together(
        cls, spark: SparkSession, heads: Mapping[str, tuple["RepositorySource", Sequence[str]]]
    ) -> DataFrame:
        """(repo, commit_id, address): witness_heads of each repository of `heads` (its connector
        and its head ids), all of this connector; by default each in turn."""
        frames = [
            source.witness_heads(spark, head_ids).select(F.lit(name).alias(REPO), "commit_id", "address")
            for name, (source, head_ids) in heads.items()
        ]
        return reduce(DataFrame.unionByName, frames, local_frame(spark, [], WITNESS_OF_MANY))

    @abstractmethod
    def witness_heads(self, spark: SparkSession, head_ids: Sequence[str]) -> DataFrame:
        """What each of `head_ids` (the commits the mark found at ref heads) needs, in
        WITNESS_SCHEMA, read with the format's reference reader.

        It must share no code with live_entries: it is the independent witness that no
        candidate is needed by the data the mark judged (delta-rs for Delta, pyiceberg scan
        planning for Iceberg, the export's raw rows for lakeFS). Changes after the mark are
        the sweep's re-validation's to find.
        """
