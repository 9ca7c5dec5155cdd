"""Delta Lake tables as repositories (docs/design.md §6.2).

A table is a repository with one branch, `main`, and one commit per version. The
live set of the retained versions v0..head is snapshot(v0) plus every file added
after v0: data files, deletion-vector files and CDC files. Everything else the
table directory holds is a candidate once old enough, except `_delta_log/` and the
paths Delta itself treats as hidden.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence
from urllib.parse import unquote

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.config import RepositoryConfig, Rules, redacted
from gc_assets.core.retention import Commit, Ref, branch_retention_days
from gc_assets.core.spark import local_frame
from gc_assets.core.uris import SCHEME_PATTERN, azure_parts, canonical_address, namespace_contains
from gc_assets.sources import delta_log
from gc_assets.sources.base import (
    LIVE_ENTRY_SCHEMA,
    RepositorySource,
    SourceError,
    metadata_settings,
    witness_on_executors,
)
from gc_assets.stores.s3.client import S3Settings
from gc_assets.stores.settings import StoreSettings, is_blob_uri

BRANCH = "main"
UNIFORM_PROPERTY = "delta.universalFormat.enabledFormats"
ICEBERG_COMPAT_PROPERTIES = tuple(f"delta.enableIcebergCompatV{n}" for n in (1, 2, 3))
READ, IMPLEMENTED, REFUSED = "read", "implemented", "refused"


@dataclass(frozen=True)
class FeatureJudgement:
    """What one Delta table feature means for a GC (docs/DELTA_FEATURES.md).

    `read`: it changes neither which files a version names nor when, so replaying the log as
    ever is exact. `implemented`: it does, and this reader follows it. `refused`: the log on
    storage is not the whole truth, so nothing may be decided from it (docs/design.md §10).
    """

    readers: bool  # a reader-writer feature; False: writers only
    decision: str
    why: str


_OUTSIDE_LOG = (
    "keeps commits outside _delta_log/<version>.json (catalog-managed or coordinated commits): "
    "gc_assets cannot see every commit"
)
# Every table feature the Delta protocol, Delta on Spark, the Delta kernels or Databricks name, judged
# one by one; a feature not listed here is refused as unknown.
TABLE_FEATURES: Mapping[str, FeatureJudgement] = {
    "appendOnly": FeatureJudgement(False, READ, "forbids writers to remove data; the log names files as ever"),
    "invariants": FeatureJudgement(False, READ, "column invariants checked on write"),
    "checkConstraints": FeatureJudgement(False, READ, "CHECK constraints checked on write"),
    "generatedColumns": FeatureJudgement(False, READ, "column values computed on write"),
    "allowColumnDefaults": FeatureJudgement(False, READ, "column defaults filled in on write"),
    "identityColumns": FeatureJudgement(
        False, READ, "identity values assigned on write; the high-water mark is in the schema"
    ),
    "changeDataFeed": FeatureJudgement(
        False, IMPLEMENTED, "cdc actions name files under _change_data/; they are live and never hidden"
    ),
    "columnMapping": FeatureJudgement(
        True, READ, "physical column names and random file prefixes; add paths still name every file"
    ),
    "deletionVectors": FeatureJudgement(
        True, IMPLEMENTED, "deletion_vector_<uuid>.bin files named by add/remove deletionVector; live with their file"
    ),
    "rowTracking": FeatureJudgement(False, READ, "row ids in add fields and a domain; no files of its own"),
    "domainMetadata": FeatureJudgement(False, READ, "domainMetadata actions hold configuration, not files"),
    "timestampNtz": FeatureJudgement(True, READ, "a data type"),
    "v2Checkpoint": FeatureJudgement(
        True, IMPLEMENTED, "UUID-named checkpoints with sidecars in _delta_log/_sidecars/; read, and protected"
    ),
    "icebergCompatV1": FeatureJudgement(
        False, IMPLEMENTED, "UniForm's Iceberg metadata/ is protected while UniForm or this compatibility is on"
    ),
    "icebergCompatV2": FeatureJudgement(
        False, IMPLEMENTED, "UniForm's Iceberg metadata/ is protected while UniForm or this compatibility is on"
    ),
    "icebergCompatV3": FeatureJudgement(
        False, IMPLEMENTED, "UniForm's Iceberg metadata/ is protected while UniForm or this compatibility is on"
    ),
    "icebergWriterCompatV1": FeatureJudgement(False, READ, "constrains writers' schemas for Iceberg readers"),
    "icebergWriterCompatV3": FeatureJudgement(False, READ, "constrains writers' schemas for Iceberg readers"),
    "clustering": FeatureJudgement(
        False,
        READ,
        "liquid clustering: a delta.clustering domain and clusteringProvider on adds; OPTIMIZE "
        "rewrites with ordinary add/remove",
    ),
    "liquid": FeatureJudgement(
        False, READ, "Databricks' preview spelling of clustering (a delta.liquid domain); the same actions"
    ),
    "inCommitTimestamp": FeatureJudgement(
        False, IMPLEMENTED, "commitInfo.inCommitTimestamp dates each version; the retention window is judged by it"
    ),
    "typeWidening": FeatureJudgement(True, READ, "older files keep narrower column types; schema only"),
    "typeWidening-preview": FeatureJudgement(True, READ, "the preview spelling of typeWidening"),
    "variantType": FeatureJudgement(True, READ, "a data type"),
    "variantType-preview": FeatureJudgement(True, READ, "the preview spelling of variantType"),
    "variantShredding": FeatureJudgement(
        True, READ, "variant values stored as typed Parquet columns in the same files"
    ),
    "variantShredding-preview": FeatureJudgement(True, READ, "the preview spelling of variantShredding"),
    "collations": FeatureJudgement(True, READ, "string collations in the schema and statistics"),
    "collations-preview": FeatureJudgement(True, READ, "the preview spelling of collations"),
    "geospatial": FeatureJudgement(True, READ, "geometry and geography data types"),
    "materializePartitionColumns": FeatureJudgement(False, READ, "partition values also written into data files"),
    "checkpointProtection": FeatureJudgement(
        False, READ, "constrains cleanup of _delta_log/, which gc_assets never touches"
    ),
    "vacuumProtocolCheck": FeatureJudgement(
        True, IMPLEMENTED, "a vacuum must check the writer features too; every feature of every table is judged here"
    ),
    "catalogManaged": FeatureJudgement(True, REFUSED, _OUTSIDE_LOG),
    "catalogOwned-preview": FeatureJudgement(True, REFUSED, _OUTSIDE_LOG),
    "coordinatedCommits-preview": FeatureJudgement(False, REFUSED, _OUTSIDE_LOG),
    "adaptiveMetadata-preview": FeatureJudgement(
        True, REFUSED, "requires catalog-managed commits: gc_assets cannot see every commit"
    ),
    "redirectReaderWriter-preview": FeatureJudgement(
        True, REFUSED, "redirects readers and writers to another table, whose log may name these files"
    ),
    "redirectWriterOnly-preview": FeatureJudgement(
        False, REFUSED, "redirects writers to another table, whose log may name these files"
    ),
}
# Table properties that move commits outside `_delta_log/<version>.json` whatever the protocol says.
OUTSIDE_LOG_PROPERTIES = ("delta.coordinatedCommits.commitCoordinator-preview", "delta.catalogManaged")


def judged(decision: str) -> frozenset[str]:
    """The table features judged `decision` (READ, IMPLEMENTED or REFUSED)."""
    return frozenset(name for name, judgement in TABLE_FEATURES.items() if judgement.decision == decision)


MAX_READER_VERSION = 3
MAX_WRITER_VERSION = 7
RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
DEFAULT_RETENTION = "interval 1 weeks"
_UNIT_SECONDS = {
    "week": 7 * 86400.0,
    "day": 86400.0,
    "hour": 3600.0,
    "minute": 60.0,
    "second": 1.0,
    "millisecond": 1e-3,
    "microsecond": 1e-6,
    "nanosecond": 1e-9,
}
_INTERVAL_PART = re.compile(r"(-?\d+(?:\.\d+)?)\s*([a-z]+?)s?\b")


def interval_days(text: str) -> float:
    """Days in a Delta interval property such as `interval 7 days` or `interval 1 weeks 12 hours`."""
    body = text.strip().lower().removeprefix("interval").strip()
    parts = _INTERVAL_PART.findall(body)
    if not parts or _INTERVAL_PART.sub("", body).strip():
        raise SourceError(
            f"table property {RETENTION_PROPERTY} = {text!r} is not an interval such as 'interval 7 days'"
        )
    seconds = 0.0
    for amount, unit in parts:
        if unit not in _UNIT_SECONDS:
            raise SourceError(f"table property {RETENTION_PROPERTY} = {text!r}: unit {unit!r} is not supported")
        seconds += float(amount) * _UNIT_SECONDS[unit]
    return seconds / 86400.0


def hidden_path_patterns(partition_columns: list[str]) -> tuple[str, ...]:
    """Delta's hidden-path rule as one regular expression (Java and Python syntax alike).

    A path component starting with `_` or `.` is hidden unless it starts with
    `_delta_index`, `_change_data` or `<partition column>=`. The rule applies to every
    component, as Delta on Spark applies it while listing; delta-rs checks only the first.
    """
    exempt = ["_delta_index", "_change_data"] + [_literal(c) + "=" for c in partition_columns]
    return (rf"(^|/)(?!{'|'.join(exempt)})[._]",)


def _literal(text: str) -> str:
    """`text` as a regex literal valid in Java and Python (no \\Q...\\E, which Python lacks)."""
    return "".join(c if c.isalnum() or c in "_ " else "\\" + c if c.isascii() else c for c in text)


def check_protocol(log_uri: str, protocol: Optional[dict], configuration: dict[str, str]) -> None:
    """Refuse a table whose protocol lets commits or files live where this reader does not look.

    Legacy protocols (writer < 7) carry no feature lists and are understood. With table
    features, every reader and writer feature is judged (TABLE_FEATURES): one refused there, or
    one not there at all, refuses the table. This is what `vacuumProtocolCheck` asks of a vacuum,
    and gc_assets asks it of every table.
    """
    if protocol is None:
        raise delta_log.DeltaLogError(f"{log_uri}: no protocol action up to the head version")
    reader, writer = protocol.get("minReaderVersion") or 1, protocol.get("minWriterVersion") or 1
    if reader > MAX_READER_VERSION or writer > MAX_WRITER_VERSION:
        raise delta_log.DeltaLogError(
            f"{log_uri}: protocol minReaderVersion {reader} / minWriterVersion {writer} is newer than gc_assets "
            f"understands ({MAX_READER_VERSION} / {MAX_WRITER_VERSION}): refusing to collect"
        )
    features = set(protocol.get("readerFeatures") or []) | set(protocol.get("writerFeatures") or [])
    refused = [(name, TABLE_FEATURES[name].why) for name in sorted(features & judged(REFUSED))]
    refused += [(name, _OUTSIDE_LOG) for name in OUTSIDE_LOG_PROPERTIES if name in configuration]
    if refused:
        name, why = refused[0]
        raise delta_log.DeltaLogError(f"{log_uri}: table feature {name} {why}: refusing to collect")
    unknown = sorted(features - TABLE_FEATURES.keys())
    if unknown:
        raise delta_log.DeltaLogError(
            f"{log_uri}: table feature(s) {unknown} are not supported by gc_assets"
            + (" (the table requires vacuumProtocolCheck)" if "vacuumProtocolCheck" in features else "")
            + ": refusing to collect"
        )


class DeltaSource(RepositorySource):
    fingerprint_only_grows = True

    @classmethod
    def from_config(cls, repo: RepositoryConfig) -> "DeltaSource":
        return cls(repo.source_uri, repo.storage_namespace, metadata_settings(repo))

    def __init__(self, table_uri: str, namespace: Optional[str] = None, settings: Optional[S3Settings] = None):
        self.table_uri = table_uri.rstrip("/")
        self.settings = settings or StoreSettings.from_environment()
        if namespace is not None and namespace_contains(namespace, self.table_uri) != "":
            raise SourceError(
                f"the Delta table at {self.table_uri} is not the storage namespace {namespace}: "
                "set storage_namespace to the table root"
            )
        self._read_at: Optional[dt.datetime] = None
        self._listing: Optional[delta_log.LogListing] = None
        self._commits: Optional[DataFrame] = None
        self._checkpoints: dict[int, DataFrame] = {}
        self._metadata: Optional[tuple[list[str], dict[str, str]]] = None
        self._created: Optional[dict[int, dt.datetime]] = None

    # ------------------------------------------------------------------ the log

    def listing(self) -> delta_log.LogListing:
        if self._listing is None:
            self._read_at = dt.datetime.now(dt.timezone.utc)
            self._listing = delta_log.list_log(self.table_uri, self.settings)
        return self._listing

    def source_time(self, spark: SparkSession) -> dt.datetime:
        """When the log was listed: a commit after that was never seen."""
        self.listing()
        assert self._read_at is not None
        return self._read_at

    def untracked_min_age(self, spark: SparkSession, repo: RepositoryConfig) -> dt.timedelta:
        """delta.deletedFileRetentionDuration, the window delta-rs full vacuum keeps untracked files for."""
        return deleted_file_retention(self.metadata(spark)[1])

    def witness_heads(self, spark: SparkSession, head_ids: Sequence[str]) -> DataFrame:
        """The head versions' files as delta-rs reads them: `file_uris()` plus the deletion-vector
        files of their add actions, decoded here independently of the Spark replay; read on
        executors (witness_on_executors)."""
        table_uri, settings = self.table_uri, self.settings
        return witness_on_executors(spark, head_ids, lambda: functools.partial(delta_rs_files, table_uri, settings))

    def fingerprint(self, spark: Optional[SparkSession] = None) -> str:
        """The newest version from a fresh listing of the log: every commit adds a version, and
        `main` (the only ref) is always the newest one."""
        listing = delta_log.list_log(self.table_uri, self.settings)
        return hashlib.sha256(f"{self.table_uri} {listing.head}".encode()).hexdigest()

    def commits(self, spark: SparkSession) -> DataFrame:
        """Every JSON commit's actions, parsed and validated once per source."""
        if self._commits is None:
            delta_log.verify_last_checkpoint(self.listing())
            self._commits = delta_log.read_commits(spark, self.listing())
        return self._commits

    def checkpoint(self, spark: SparkSession, checkpoint: delta_log.Checkpoint) -> DataFrame:
        if checkpoint.version not in self._checkpoints:
            self._checkpoints[checkpoint.version] = delta_log.read_checkpoint(spark, self.listing(), checkpoint)
        return self._checkpoints[checkpoint.version]

    def _replay_actions(self, spark: SparkSession, version: int) -> tuple[DataFrame, DataFrame]:
        """(commits after the base checkpoint of `version` up to head, that checkpoint's actions or an empty frame)."""
        base = self.listing().checkpoint_at_or_before(version)
        first = base.version + 1 if base else 0
        commits = self.commits(spark).filter(F.col("version") >= first)
        if base is None:
            return commits, commits.limit(0).select("version", *delta_log.ACTION_SCHEMA.names)
        return commits, self.checkpoint(spark, base)

    def metadata(self, spark: SparkSession) -> tuple[list[str], dict[str, str]]:
        """Partition columns and configuration of the latest version."""
        if self._metadata is None:
            commits, checkpoint = self._replay_actions(spark, self.listing().head)
            actions = commits.select("version", "metaData", "protocol").unionByName(
                checkpoint.select("version", "metaData", "protocol")
            )
            latest = (
                actions.filter(F.col("metaData").isNotNull())
                .orderBy(F.col("version").desc())
                .select("metaData.partitionColumns", "metaData.configuration")
                .limit(1)
                .collect()
            )
            if not latest:
                raise delta_log.DeltaLogError(
                    f"{self.listing().log_uri}: no metaData action up to version {self.listing().head}"
                )
            protocol = (
                actions.filter(F.col("protocol").isNotNull())
                .orderBy(F.col("version").desc())
                .select("protocol")
                .limit(1)
                .collect()
            )
            self._metadata = table_metadata(
                self.listing().log_uri,
                latest[0]["partitionColumns"],
                latest[0]["configuration"],
                protocol[0]["protocol"].asDict() if protocol else None,
            )
        return self._metadata

    @property
    def protected_prefixes(self) -> tuple[str, ...]:
        """`_delta_log/`, and UniForm's Iceberg `metadata/` when UniForm writes it."""
        spark = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
        return table_prefixes(self.metadata(spark)[1])

    @property
    def protected_patterns(self) -> tuple[str, ...]:
        spark = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
        return hidden_path_patterns(self.metadata(spark)[0])

    # ------------------------------------------------------------------ the protocol

    def retention_rules(self, spark: SparkSession, repo: RepositoryConfig) -> Optional[Rules]:
        """The configured rules, else the table's deletedFileRetentionDuration; shorter rules need
        allow_unsafe_retention, like Delta's retentionDurationCheck."""
        return table_rules(repo, self.metadata(spark)[1])

    def commit_graph(self, spark: SparkSession) -> tuple[list[Commit], list[Ref]]:
        """One commit per replayable version; created_at from inCommitTimestamp, else
        commitInfo.timestamp, else the log file's modification time."""
        listing = self.listing()
        commits = self.commits(spark).filter(F.col("version") >= listing.start)
        times = {
            row["version"]: row
            for row in commits.groupBy("version")
            .agg(
                F.max("commitInfo.inCommitTimestamp").alias("in_commit"),
                F.max("commitInfo.timestamp").alias("commit_info"),
                F.max("file_mtime").alias("file_mtime"),
            )
            .collect()
        }
        return version_graph(listing, times, lambda checkpoint: checkpoint_written(spark, checkpoint))

    def live_entries(self, spark: SparkSession, retained: DataFrame, heads: DataFrame) -> DataFrame:
        """snapshot(v0) ∪ files added after v0 (data, deletion vectors, CDC) ∪ files the log's
        tombstones show were removed after the retention threshold; at_head marks the latest snapshot.

        `retained` may carry each version's `threshold` (retained_frame): the tombstones are
        judged against it, and a state at the threshold older than the log can rebuild is
        bounded by them or refused (docs/design.md §6.2)."""
        oldest = retained.agg(F.min("commit_id")).first()[0]
        if oldest is None:  # nothing retained (e.g. no new version since the mark): no entries
            return local_frame(spark, [], LIVE_ENTRY_SCHEMA)
        v0 = int(oldest)
        commits, checkpoint = self._replay_actions(spark, v0)
        bound = self._tombstone_bound(spark, v0, retained, checkpoint)
        # The head is the newest version the log lists, and events run up to it.
        events = delta_log.file_events(commits).unionByName(delta_log.file_events(checkpoint))
        cdc_later = delta_log.cdc_files(commits).filter(F.col("version") > v0)
        replayed = delta_log.live_files(events, cdc_later, v0)
        tombstoned = delta_log.tombstoned_files(self.commits(spark), bound).unionByName(
            delta_log.tombstoned_files(checkpoint, bound)
        )
        return replayed.unionByName(tombstoned.select("address", "size", F.lit(False).alias("at_head"))).select(
            "address",
            F.col("size").cast("long").alias("size"),
            F.lit("committed").alias("source"),
            F.coalesce("at_head", F.lit(False)).alias("at_head"),
        )

    def _created_at(self, spark: SparkSession) -> dict[int, dt.datetime]:
        """Each replayable version's time (commit_graph's rule), computed once per source."""
        if self._created is None:
            self._created = {int(c.commit_id): c.created_at for c in self.commit_graph(spark)[0]}
        return self._created

    def _tombstone_bound(
        self, spark: SparkSession, v0: int, retained: DataFrame, checkpoint: DataFrame
    ) -> delta_log.Bound:
        """The deletion time after which a tombstone keeps its file live, or a refusal when the
        state at the threshold is older than the log and its tombstones cannot bound it."""
        if "threshold" in retained.columns:
            row = retained.agg(
                F.max(F.col("threshold").isNull()).alias("whole"), F.min(F.unix_millis("threshold")).alias("millis")
            ).first()
            thresholds: Optional[Thresholds] = Thresholds(bool(row["whole"]), row["millis"])
        else:
            thresholds = None
        listing = self.listing()

        def written() -> dt.datetime:
            return checkpoint_written(spark, listing.checkpoints[listing.start])

        return tombstone_bound(
            listing, self._created_at(spark), v0, thresholds, written, lambda: checkpoint_retention(checkpoint)
        )

    def committed_addresses(self, spark: SparkSession) -> DataFrame:
        """Every file any add, remove or cdc action of the log names (with deletion-vector files)."""
        listing = self.listing()
        commits = self.commits(spark)
        named = delta_log.physical_files(delta_log.file_events(commits)).unionByName(
            delta_log.cdc_files(commits).select("address", "size")
        )
        latest = max(listing.checkpoints, default=None)
        if latest is not None:
            checkpoint = self.checkpoint(spark, listing.checkpoints[latest])
            named = named.unionByName(delta_log.physical_files(delta_log.file_events(checkpoint)))
        return named.select(F.col("address").alias("address")).distinct()

    def commits_referencing(self, spark: SparkSession, retained: DataFrame, addresses: DataFrame) -> DataFrame:
        """(address, commit_id): retained versions whose snapshot holds the file (delta_log.commits_holding)."""
        listing = self.listing()
        oldest = retained.agg(F.min("commit_id")).first()[0]
        if oldest is None:
            return local_frame(spark, [], "address string, commit_id string")
        v0 = int(oldest)
        commits, checkpoint = self._replay_actions(spark, v0)
        events = delta_log.file_events(commits).unionByName(delta_log.file_events(checkpoint))
        return (
            delta_log.commits_holding(events, addresses, v0, listing.head)
            .join(retained.select("commit_id"), "commit_id")
            .select("address", "commit_id")
            .distinct()
        )


def table_metadata(
    log_uri: str, partition_columns: Optional[list[str]], configuration: Optional[dict], protocol: Optional[dict]
) -> tuple[list[str], dict[str, str]]:
    """Partition columns and configuration of the newest metaData action, once its protocol is
    one this reader understands (check_protocol)."""
    settings = dict(configuration or {})
    check_protocol(log_uri, protocol, settings)
    return list(partition_columns or []), settings


def deleted_file_retention(configuration: dict[str, str]) -> dt.timedelta:
    """The table's delta.deletedFileRetentionDuration (a week by default)."""
    return dt.timedelta(days=interval_days(configuration.get(RETENTION_PROPERTY, DEFAULT_RETENTION)))


def table_prefixes(configuration: dict[str, str]) -> tuple[str, ...]:
    """`_delta_log/`, and UniForm's Iceberg `metadata/` when the configuration has UniForm write it or
    keeps an Iceberg compatibility enabled (UniForm turned off leaves its metadata for Iceberg readers)."""
    formats = configuration.get(UNIFORM_PROPERTY, "")
    uniform = "iceberg" in {f.strip().lower() for f in formats.split(",")}
    compatible = any(configuration.get(p, "").strip().lower() == "true" for p in ICEBERG_COMPAT_PROPERTIES)
    return (f"{delta_log.LOG_DIR}/",) + (("metadata/",) if uniform or compatible else ())


def table_rules(repo: RepositoryConfig, configuration: dict[str, str]) -> Rules:
    """The configured rules, else the table's deletedFileRetentionDuration; shorter rules need
    allow_unsafe_retention, like Delta's retentionDurationCheck."""
    table_days = interval_days(configuration.get(RETENTION_PROPERTY, DEFAULT_RETENTION))
    if repo.rules is None:
        return Rules(default_retention_days=table_days)
    days = branch_retention_days(repo.rules, BRANCH)
    if days is not None and days < table_days and not repo.allow_unsafe_retention:
        raise SourceError(
            f"repository {repo.name!r}: retention of {days:g} days for {BRANCH} is shorter than the table's "
            f"{RETENTION_PROPERTY} ({table_days:g} days); readers of versions inside it would break. "
            "Set allow_unsafe_retention: true to accept that."
        )
    return repo.rules


def version_graph(
    listing: delta_log.LogListing,
    times: Mapping[int, Mapping[str, Any]],
    written: Callable[[delta_log.Checkpoint], dt.datetime],
) -> tuple[list[Commit], list[Ref]]:
    """One commit per replayable version, each the child of the one before, and `main` at the head.

    `times` holds each commit file's newest `in_commit` (inCommitTimestamp), `commit_info`
    (commitInfo.timestamp) and `file_mtime`, tried in that order; a version known only from a
    checkpoint (its commit file cleaned up) takes the time that checkpoint was written.
    """
    graph: list[Commit] = []
    for version in listing.versions:
        row = times.get(version)
        if row is None:
            created = written(listing.checkpoints[version])
        elif row["in_commit"] is not None or row["commit_info"] is not None:
            millis = row["in_commit"] if row["in_commit"] is not None else row["commit_info"]
            created = dt.datetime.fromtimestamp(millis / 1000.0, tz=dt.timezone.utc)
        else:
            created = row["file_mtime"].replace(tzinfo=dt.timezone.utc)
        parents = (delta_log.commit_id(version - 1),) if version > listing.start else ()
        graph.append(Commit(delta_log.commit_id(version), parents, created))
    return graph, [Ref(BRANCH, "branch", delta_log.commit_id(listing.head))]


def checkpoint_written(spark: SparkSession, checkpoint: delta_log.Checkpoint) -> dt.datetime:
    """When the checkpoint was written: the newest modification time of its parts."""
    row = spark.read.text(list(checkpoint.files)).select(F.max("_metadata.file_modification_time")).first()
    return row[0].replace(tzinfo=dt.timezone.utc)


def checkpoint_retention(checkpoint: DataFrame) -> str:
    """The deletedFileRetentionDuration a checkpoint's metaData sets (Delta's default without one)."""
    settings = checkpoint.filter(F.col("metaData").isNotNull()).select("metaData.configuration").first()
    return (settings[0] or {}).get(RETENTION_PROPERTY, DEFAULT_RETENTION) if settings else DEFAULT_RETENTION


@dataclass(frozen=True)
class Thresholds:
    """The retention thresholds of the retained versions: whether any has none (the whole
    history is kept) and the oldest, in epoch milliseconds."""

    whole: bool
    oldest_millis: Optional[int]

    @classmethod
    def of(cls, thresholds: Sequence[Optional[dt.datetime]]) -> "Thresholds":
        """From the retained versions' thresholds (None: that version keeps the whole history),
        in whole milliseconds as Spark's unix_millis floors them."""
        if any(t is None for t in thresholds):
            return cls(True, None)
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        return cls(False, min((t - epoch) // dt.timedelta(milliseconds=1) for t in thresholds))  # type: ignore[operator]


def tombstone_bound(
    listing: delta_log.LogListing,
    created: Mapping[int, dt.datetime],
    v0: int,
    thresholds: Optional[Thresholds],
    written: Callable[[], dt.datetime],
    configured: Callable[[], str],
) -> delta_log.Bound:
    """The deletion time after which a tombstone keeps its file live, or a refusal when the
    state at the threshold is older than the log and its tombstones cannot bound it.

    `thresholds` is None when the retained versions carry none; `written` (when the oldest
    checkpoint was written) and `configured` (its deletedFileRetentionDuration) are asked only
    when the log no longer holds the state at the threshold."""
    lost = listing.start > 0 and v0 <= listing.start  # the oldest retained state is the log's oldest
    if thresholds is None:
        if lost:
            raise delta_log.DeltaLogError(
                f"{listing.log_uri}: versions {missing_versions(listing)} are no longer in the log; without the "
                f"retention threshold the state before version {listing.start} cannot be judged: "
                "refusing to collect"
            )
        return delta_log.Bound(_millis(created[v0]), unknown_is_newer=False)
    if thresholds.whole:
        if listing.start > 0:
            raise delta_log.DeltaLogError(
                f"{listing.log_uri}: the whole history is retained but versions {missing_versions(listing)} "
                "are no longer in the log: refusing to collect"
            )
        return delta_log.Bound(None, unknown_is_newer=False)
    threshold = int(thresholds.oldest_millis)  # type: ignore[arg-type]
    if not lost or _millis(created[listing.start]) <= threshold:
        return delta_log.Bound(threshold, unknown_is_newer=False)
    # The state at the threshold is a version the log no longer holds: every file it held is in
    # snapshot(start) or was removed since, and the checkpoint keeps every tombstone newer than
    # its writer's time minus deletedFileRetentionDuration (the protocol's tombstone expiry).
    retention = configured()
    horizon = written() - dt.timedelta(days=interval_days(retention))
    if _millis(horizon) > threshold:
        cutoff = dt.datetime.fromtimestamp(threshold / 1000, tz=dt.timezone.utc)
        raise delta_log.DeltaLogError(
            f"{listing.log_uri}: versions {missing_versions(listing)} are no longer in the log, "
            f"and the state at the retention threshold {cutoff.isoformat()} is older than checkpoint "
            f"{listing.start} ({created[listing.start].isoformat()}); that checkpoint keeps tombstones "
            f"only since {horizon.isoformat()} ({RETENTION_PROPERTY} = {retention!r} before it was written), "
            "so files removed in between are unknown: refusing to collect"
        )
    return delta_log.Bound(threshold, unknown_is_newer=True)


def missing_versions(listing: delta_log.LogListing) -> str:
    """The versions below the replayable range whose commit files are gone, as ranges (`0..4, 7`)."""
    gone = [v for v in range(listing.start) if v not in listing.commits]
    spans: list[list[int]] = []
    for version in gone:
        if spans and spans[-1][1] == version - 1:
            spans[-1][1] = version
        else:
            spans.append([version, version])
    return ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in spans)


def _millis(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1000)


def delta_rs_files(table_uri: str, settings: S3Settings, head: str) -> list[str]:
    """The files of version `head` as delta-rs lists it, with its deletion-vector files."""
    from deltalake import DeltaTable

    try:
        table = DeltaTable(table_uri, version=int(head), storage_options=delta_rs_storage_options(table_uri, settings))
        uris = list(table.file_uris())
        actions = pa.table(table.get_add_actions(flatten=True))
    except Exception as exc:  # delta-rs raises its own error types; the witness must not pass silently
        raise SourceError(
            redacted(f"delta-rs cannot read version {int(head)} of {table_uri}: {type(exc).__name__}: {exc}")
        ) from None
    # An add action may name its file by absolute URI (a shallow clone): delta-rs keeps that path
    # as written but joins it to the table root in file_uris(), so the path itself is the file.
    paths = actions.column("path").to_pylist()
    paired = len(paths) == len(uris) and all(
        SCHEME_PATTERN.match(path) or uri.endswith(unquote(path)) for path, uri in zip(paths, uris)
    )
    if not paired:  # the pairing below relies on delta-rs listing both in one order
        raise SourceError(f"delta-rs lists the files of version {int(head)} of {table_uri} unlike its add actions")
    files = [path if SCHEME_PATTERN.match(path) else uri for path, uri in zip(paths, uris)]
    if "deletionVector.storageType" in actions.column_names:
        for kind, stored in zip(
            actions.column("deletionVector.storageType").to_pylist(),
            actions.column("deletionVector.pathOrInlineDv").to_pylist(),
        ):
            if kind == "u":
                length = delta_log.Z85_UUID_LENGTH
                prefix, encoded = stored[:-length], stored[-length:]
                name = f"deletion_vector_{delta_log.z85_uuid(encoded)}.bin"
                files.append(f"{prefix}/{name}" if prefix else name)
            elif kind == "p":
                files.append(stored)
    return files


def delta_rs_storage_options(table_uri: str, settings: S3Settings) -> dict[str, str]:
    """delta-rs (object_store) options for the table's store: endpoints, and on Azure the
    connection string's key or SAS (object_store reads no connection string itself)."""
    if is_blob_uri(table_uri):
        return blob_storage_options(table_uri, StoreSettings.of(settings))
    if not table_uri.startswith(("s3://", "s3a://", "s3n://")):
        return {}
    options = {
        "AWS_REGION": settings.region or "us-east-1",
        **{k.upper(): v for k, v in settings.credentials().items()},
    }
    if settings.endpoint_url:
        options["AWS_ENDPOINT_URL"] = settings.endpoint_url
        if settings.endpoint_url.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    return options


def blob_storage_options(uri: str, settings: StoreSettings) -> dict[str, str]:
    """object_store's options for an Azure or GCS table (an http:// endpoint is an emulator)."""
    canonical = canonical_address(uri)
    if canonical.startswith("gs://"):
        key = settings.gcs_settings.credentials
        given = {"google_service_account_key": key.reveal()} if key is not None else {}
        endpoint = settings.gcs_endpoint or os.environ.get("STORAGE_EMULATOR_HOST")
        if not endpoint:
            return given
        emulator = endpoint.startswith("http://") and not given
        options = {
            "google_base_url": endpoint,
            **given,
            **({"allow_http": "true"} if endpoint.startswith("http://") else {}),
        }
        return {**options, **({"google_skip_signature": "true"} if emulator else {})}
    _, account, suffix, _ = azure_parts(canonical)
    url, secret = settings.azure(account, suffix).resolve()
    options = {"azure_storage_account_name": account, **{f"azure_storage_{k}": v for k, v in secret.items()}}
    if url != f"https://{account}.blob.{suffix}":
        options["azure_storage_endpoint"] = url
    return {**options, **({"allow_http": "true"} if url.startswith("http://") else {})}
