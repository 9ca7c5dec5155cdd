"""Iceberg tables as repositories (docs/design.md §6.3), read through pyiceberg.

Commits are snapshots (commit_id = the snapshot id as a string, the parent snapshot
as the only parent, created_at = timestamp-ms in UTC) and refs are the table's
branches and tags. A parent that is no longer in the metadata (expired earlier)
is dropped: that history is already truncated.

Live set of the retained snapshots: their manifest lists, the manifests those list,
the data and delete files (position, equality, deletion vectors) that the manifests
hold as ADDED or EXISTING, plus metadata the table still needs: the current
metadata.json and the previous ones its metadata log lists, the version hint when
there is one, and every statistics and partition-statistics file the current
metadata lists (readers open them by path from the metadata). Manifest lists and then
the de-duplicated manifests are read on executors with pyiceberg's own readers, so a
manifest shared by many snapshots is read once. metadata.json files beyond the metadata
log, manifests and manifest lists of expired snapshots and files no snapshot references
are candidates; hidden paths follow Iceberg's orphan-file rule (a name starting with '.'
or '_', except partition directories such as `_p=1`) and are never candidates.

Paths are absolute URIs. s3a/s3n become s3 and file spellings become file:///, then a
live file must lie inside the storage namespace or under a configured
`external_prefixes` entry (live, never collected); anything else is refused by the mark
(mark.live, as for every format: like Iceberg's prefix-mismatch ERROR mode), after what it
reaches in other repositories' namespaces is recorded there (mark.shared). The table's
location must be the storage namespace itself, so no other table's files can ever
look untracked.

Iceberg's own order holds (docs/design.md §6.3): before a trash or delete sweep acts, the
snapshots the rules expire are expired through the table's catalog (commit_expiry, see
gc_assets.sources.iceberg_expiry), so no snapshot the metadata still lists needs a file the
sweep removes. A table located by its metadata.json has no catalog to commit to: every
snapshot of its current metadata is retained, those the rules expire with retained_by
`not_committed`, in every mode, so a dry run shows what a delete run would do.

Retention: `rules` in gc.yaml are evaluated by gc_assets.core.retention exactly as for
lakeFS. `retention: iceberg` instead applies Iceberg's own expire-snapshots rules
from table and ref properties, which the first-parent walk cannot express (a count
of snapshots to keep, refs that age out), so `evaluate_retention` computes it here:

- a branch keeps its ancestors while fewer than min-snapshots-to-keep are kept or
  the snapshot is not older than as_of - max-snapshot-age-ms (ref value, else the
  table's `history.expire.*`, else Iceberg's defaults: 5 days, 1 snapshot);
- a tag keeps its own snapshot;
- a ref older than max-ref-age-ms (never `main`) is one Iceberg would drop: it keeps
  only its own snapshot, because the metadata still names it and gc_assets never
  removes a ref; its history is then unreferenced;
- a snapshot in no kept branch's history and not tagged is kept while it is not
  older than as_of - the table's max-snapshot-age-ms.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, cast
from urllib.parse import urlsplit

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core import retention
from gc_assets.core.addresses import relative_key_column
from gc_assets.core.config import RepositoryConfig, Rules, redacted
from gc_assets.core.names import REPO
from gc_assets.core.retention import Commit, Ref, Retention
from gc_assets.core.spark import local_frame, shuffle_partitions
from gc_assets.core.uris import S3_SCHEMES, SCHEME_PATTERN, azure_parts
from gc_assets.sources.base import (
    LIVE_ENTRY_SCHEMA,
    CommittedExpiry,
    LiveRead,
    RepositorySource,
    SourceError,
    metadata_settings,
    witness_on_executors,
)
from gc_assets.sources.files import list_files
from gc_assets.stores.s3.client import S3Settings
from gc_assets.stores.settings import StoreSettings

# Iceberg's defaults for expire_snapshots (TableProperties in the Java library).
MAX_SNAPSHOT_AGE_MS_DEFAULT = 5 * 24 * 3600 * 1000
MIN_SNAPSHOTS_TO_KEEP_DEFAULT = 1
MAX_SNAPSHOT_AGE_PROPERTY = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS_TO_KEEP_PROPERTY = "history.expire.min-snapshots-to-keep"
MAX_REF_AGE_PROPERTY = "history.expire.max-ref-age-ms"
MAIN_BRANCH = "main"
VERSION_HINT = "metadata/version-hint.text"
# Iceberg's hidden-path rule for orphan files: '.'/'_' names, except partition directories like `_p=1`.
HIDDEN_PATH_PATTERN = r"(^|/)(\.|_(?![^/]*=))[^/]*(/|$)"
METADATA_VERSION = re.compile(r"^v?(\d+)[-.]")
UNTRACKED_MIN_AGE = dt.timedelta(days=3)
# The verdict of a snapshot the rules expire in a table without a catalog to expire it through.
NOT_COMMITTED = Retention(True, "not_committed", None)

_REPO_FIELD = T.StructField(REPO, T.StringType(), False)  # the frames below hold many tables at once
SNAPSHOT_SCHEMA = T.StructType(
    [
        _REPO_FIELD,
        T.StructField("snapshot_id", T.StringType(), False),
        T.StructField("manifest_list", T.StringType(), False),
        T.StructField("manifest_list_address", T.StringType(), False),  # canonical_uri of manifest_list
        T.StructField("at_head", T.BooleanType(), False),
    ]
)
_MANIFEST_SCHEMA = T.StructType(
    [
        _REPO_FIELD,
        T.StructField("snapshot_id", T.StringType(), False),
        T.StructField("manifest_path", T.StringType(), False),
        T.StructField("manifest_address", T.StringType(), False),  # canonical_uri of manifest_path
        T.StructField("manifest_length", T.LongType(), False),
        T.StructField("partition_spec_id", T.IntegerType(), False),
        T.StructField("content", T.IntegerType(), False),
        T.StructField("sequence_number", T.LongType(), True),
        T.StructField("min_sequence_number", T.LongType(), True),
        T.StructField("added_snapshot_id", T.LongType(), True),
        T.StructField("at_head", T.BooleanType(), False),
    ]
)
_MANIFEST_FIELDS = [
    f.name for f in _MANIFEST_SCHEMA.fields if f.name not in (REPO, "snapshot_id", "manifest_address", "at_head")
]
_FILE_SCHEMA = T.StructType(
    [
        _REPO_FIELD,
        T.StructField("manifest_path", T.StringType(), False),
        T.StructField("address", T.StringType(), False),
        T.StructField("size", T.LongType(), True),
    ]
)
# Where each table's files are read: repository -> (pyiceberg FileIO properties, table location).
Readers = dict[str, tuple[dict[str, str], str]]


def canonical_uri(uri: str) -> str:
    """One spelling per object: s3a/s3n become s3, file:/p, file://localhost/p and /p become file:///p."""
    if uri.startswith("/"):
        return "file://" + uri
    match = SCHEME_PATTERN.match(uri)
    if match is None:
        return uri
    scheme, rest = match.group(0)[:-1].lower(), uri[match.end() :]
    if scheme in S3_SCHEMES:
        return "s3:" + rest
    if scheme == "file":
        if rest.startswith("//localhost/"):
            rest = rest[len("//localhost") :]
        elif rest.startswith("///"):
            rest = rest[2:]
        if rest.startswith("/") and not rest.startswith("//"):
            return "file://" + rest
    return f"{scheme}:{rest}"


# ---------------------------------------------------------------- retention: iceberg


@dataclass(frozen=True)
class RefPolicy:
    """A ref's own expire-snapshots settings; None falls back to the table's."""

    max_snapshot_age_ms: Optional[int] = None
    min_snapshots_to_keep: Optional[int] = None
    max_ref_age_ms: Optional[int] = None


@dataclass(frozen=True)
class IcebergPolicy:
    """Iceberg's expire-snapshots settings of one table (table properties plus per-ref values)."""

    max_snapshot_age_ms: int = MAX_SNAPSHOT_AGE_MS_DEFAULT
    min_snapshots_to_keep: int = MIN_SNAPSHOTS_TO_KEEP_DEFAULT
    max_ref_age_ms: Optional[int] = None
    refs: dict[str, RefPolicy] = field(default_factory=dict)

    def ref(self, name: str) -> RefPolicy:
        return self.refs.get(name, RefPolicy())


def iceberg_retention(
    commits: Sequence[Commit], refs: Sequence[Ref], policy: IcebergPolicy, as_of: dt.datetime
) -> dict[str, Retention]:
    """Retention of every snapshot under Iceberg's own rules (see the module docstring)."""
    retention.validate_graph(commits, refs)
    now_ms = _ms(as_of)
    created = {c.commit_id: _ms(c.created_at) for c in commits}
    parent = {c.commit_id: c.parents[0] for c in commits if c.parents}
    kept: dict[str, tuple[int, str]] = {}  # commit_id -> (threshold ms, label); the oldest threshold wins

    def keep(commit_id: str, threshold: int, label: str) -> None:
        if commit_id not in kept or threshold < kept[commit_id][0]:
            kept[commit_id] = (threshold, label)

    referenced: set[str] = set()
    for ref in sorted(refs, key=lambda r: (r.kind, r.name)):
        settings = policy.ref(ref.name)
        keep(ref.commit_id, created[ref.commit_id], ref.name)
        max_ref_age = settings.max_ref_age_ms if settings.max_ref_age_ms is not None else policy.max_ref_age_ms
        if ref.name != MAIN_BRANCH and max_ref_age is not None and now_ms - created[ref.commit_id] > max_ref_age:
            continue  # Iceberg would drop this ref: only its own snapshot stays
        if ref.kind == "tag":
            referenced.add(ref.commit_id)
            continue
        max_age = (
            settings.max_snapshot_age_ms if settings.max_snapshot_age_ms is not None else policy.max_snapshot_age_ms
        )
        min_keep = (
            settings.min_snapshots_to_keep
            if settings.min_snapshots_to_keep is not None
            else policy.min_snapshots_to_keep
        )
        threshold = now_ms - max_age
        walking: Optional[str] = ref.commit_id
        count = 0
        while walking is not None and (count < min_keep or created[walking] >= threshold):
            keep(walking, threshold, ref.name)
            count += 1
            walking = parent.get(walking)
        ancestor: Optional[str] = ref.commit_id
        while ancestor is not None and ancestor not in referenced:
            referenced.add(ancestor)
            ancestor = parent.get(ancestor)
    default_threshold = now_ms - policy.max_snapshot_age_ms
    for commit in commits:
        if commit.commit_id not in referenced and created[commit.commit_id] >= default_threshold:
            keep(commit.commit_id, default_threshold, retention.DANGLING)

    return {
        c.commit_id: Retention(True, kept[c.commit_id][1], _datetime(kept[c.commit_id][0]))
        if c.commit_id in kept
        else Retention(False, None, None)
        for c in commits
    }


def _ms(moment: dt.datetime) -> int:
    return round(moment.timestamp() * 1000)


def _datetime(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)


def _int_property(properties: dict[str, str], key: str) -> Optional[int]:
    value = properties.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise SourceError(f"table property {key} = {value!r} is not an integer") from None


def policy_of(metadata: Any) -> IcebergPolicy:
    """The expire-snapshots settings of a pyiceberg TableMetadata."""
    properties = metadata.properties
    return IcebergPolicy(
        max_snapshot_age_ms=_int_property(properties, MAX_SNAPSHOT_AGE_PROPERTY) or MAX_SNAPSHOT_AGE_MS_DEFAULT,
        min_snapshots_to_keep=_int_property(properties, MIN_SNAPSHOTS_TO_KEEP_PROPERTY)
        or MIN_SNAPSHOTS_TO_KEEP_DEFAULT,
        max_ref_age_ms=_int_property(properties, MAX_REF_AGE_PROPERTY),
        refs={
            name: RefPolicy(ref.max_snapshot_age_ms, ref.min_snapshots_to_keep, ref.max_ref_age_ms)
            for name, ref in metadata.refs.items()
        },
    )


# ---------------------------------------------------------------- executor-side readers


class _FileIOs:
    """Each table's pyiceberg FileIO, opened once per executor task when first needed."""

    def __init__(self, readers: Readers):
        self.readers = readers
        self.opened: dict[str, Any] = {}

    def __call__(self, repo: str) -> Any:
        if repo not in self.opened:
            from pyiceberg.io import load_file_io

            self.opened[repo] = load_file_io(*self.readers[repo])
        return self.opened[repo]


def _read_manifest_lists(readers: Readers):
    """mapInPandas function: (repo, snapshot_id, manifest_list, at_head) -> one row per listed manifest."""

    def read(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from pyiceberg.manifest import read_manifest_list

        io_of = _FileIOs(readers)
        for frame in frames:
            rows = [
                (
                    repo,
                    snapshot_id,
                    manifest.manifest_path,
                    canonical_uri(manifest.manifest_path),
                    manifest.manifest_length,
                    manifest.partition_spec_id,
                    int(manifest.content),
                    manifest.sequence_number,
                    manifest.min_sequence_number,
                    manifest.added_snapshot_id,
                    bool(at_head),
                )
                for repo, snapshot_id, manifest_list, at_head in zip(
                    frame[REPO], frame["snapshot_id"], frame["manifest_list"], frame["at_head"]
                )
                for manifest in read_manifest_list(io_of(repo).new_input(manifest_list))
            ]
            yield pd.DataFrame(rows, columns=_MANIFEST_SCHEMA.fieldNames())

    return read


def _read_manifests(readers: Readers):
    """mapInPandas function: one row per manifest -> its ADDED and EXISTING files (canonical URIs)."""

    def read(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from pyiceberg.manifest import ManifestContent, ManifestFile

        io_of = _FileIOs(readers)
        for frame in frames:
            for record in frame.to_dict("records"):
                manifest = ManifestFile.from_args(
                    manifest_path=record["manifest_path"],
                    manifest_length=int(record["manifest_length"]),
                    partition_spec_id=int(record["partition_spec_id"]),
                    content=ManifestContent(int(record["content"])),
                    sequence_number=_optional_int(record["sequence_number"]),
                    min_sequence_number=_optional_int(record["min_sequence_number"]),
                    added_snapshot_id=_optional_int(record["added_snapshot_id"]),
                )
                rows = [
                    (
                        record[REPO],
                        record["manifest_path"],
                        canonical_uri(entry.data_file.file_path),
                        entry.data_file.file_size_in_bytes,
                    )
                    for entry in manifest.fetch_manifest_entry(io_of(record[REPO]), discard_deleted=True)
                ]
                yield pd.DataFrame(rows, columns=_FILE_SCHEMA.fieldNames())

    return read


def _optional_int(value: Any) -> Optional[int]:
    return None if value is None or pd.isna(value) else int(value)


def snapshot_files(table: Any, snapshot_id: str) -> list[str]:
    """The files snapshot `snapshot_id` of `table` needs, as pyiceberg's scan planning finds them
    (data and delete files; its manifest reader where planning refuses equality deletes),
    with the snapshot's manifest list and manifests."""
    try:
        snapshot = table.metadata.snapshot_by_id(int(snapshot_id))
        manifests = snapshot.manifests(table.io)
        files = [snapshot.manifest_list, *(manifest.manifest_path for manifest in manifests)]
        try:
            tasks = list(table.scan(snapshot_id=snapshot.snapshot_id).plan_files())
        except ValueError:
            # pyiceberg cannot plan a scan with equality deletes: its manifest reader says
            # what the snapshot holds instead (every live data and delete file).
            return files + [
                entry.data_file.file_path
                for manifest in manifests
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
            ]
        for task in tasks:
            files.append(task.file.file_path)
            files += [delete.file_path for delete in task.delete_files]
        return files
    except Exception as exc:  # pyiceberg raises many kinds; the witness must not pass silently
        raise SourceError(
            redacted(
                f"pyiceberg cannot read snapshot {snapshot_id} of {table.metadata_location}: "
                f"{type(exc).__name__}: {exc}"
            )
        ) from None


# ---------------------------------------------------------------- one table or many, the repository a column

METADATA_SCHEMA = T.StructType([_REPO_FIELD, *LIVE_ENTRY_SCHEMA.fields])


def snapshot_rows(name: str, metadata: Any, snapshot_ids: Optional[set[str]], heads: set[str]) -> list[tuple[Any, ...]]:
    """SNAPSHOT_SCHEMA rows of table `name`'s snapshots of `snapshot_ids` (None: every one)."""
    rows = []
    for snapshot in metadata.snapshots:
        snapshot_id = str(snapshot.snapshot_id)
        if snapshot_ids is not None and snapshot_id not in snapshot_ids:
            continue
        if not snapshot.manifest_list:
            raise SourceError(f"snapshot {snapshot_id}: v1 snapshots without a manifest list are not supported")
        manifest_list = snapshot.manifest_list
        rows.append((name, snapshot_id, manifest_list, canonical_uri(manifest_list), snapshot_id in heads))
    return rows


def metadata_rows(name: str, table: Any, heads: set[str]) -> list[tuple[Any, ...]]:
    """METADATA_SCHEMA rows of what table `name` still needs besides its snapshots: its current
    metadata.json, those of its metadata log, its version hint and its statistics files."""
    metadata = table.metadata
    rows: list[tuple[str, Optional[int], str, bool]] = [(table.metadata_location, None, "metadata", True)]
    rows += [(entry.metadata_file, None, "metadata", False) for entry in metadata.metadata_log]
    hint = f"{metadata.location.rstrip('/')}/{VERSION_HINT}"
    if table.io.new_input(hint).exists():
        rows.append((hint, None, "metadata", True))
    for statistics in list(metadata.statistics) + list(metadata.partition_statistics):
        at_head = str(statistics.snapshot_id) in heads
        rows.append((statistics.statistics_path, statistics.file_size_in_bytes, "metadata", at_head))
    return [(name, canonical_uri(a), s, src, h) for a, s, src, h in rows]


def statistics_rows(name: str, metadata: Any) -> list[tuple[str, str]]:
    """(repo, address) of every statistics and partition-statistics file `metadata` lists."""
    files = list(metadata.statistics) + list(metadata.partition_statistics)
    return [(name, canonical_uri(s.statistics_path)) for s in files]


def _manifests(snapshots: DataFrame, readers: Readers) -> DataFrame:
    """(repo, snapshot_id, manifest fields, at_head): the manifest lists, read on executors."""
    return snapshots.mapInPandas(_read_manifest_lists(readers), _MANIFEST_SCHEMA)


def _files(spark: SparkSession, manifests: DataFrame, readers: Readers) -> DataFrame:
    """(repo, manifest_path, address, size, at_head): each distinct manifest read once, on executors."""
    distinct = manifests.groupBy(REPO, "manifest_path").agg(
        *[F.first(name).alias(name) for name in _MANIFEST_FIELDS if name != "manifest_path"],
        F.max("at_head").alias("at_head"),
    )
    files = (
        distinct.select(REPO, *_MANIFEST_FIELDS)
        .repartition(shuffle_partitions(spark), REPO, "manifest_path")
        .mapInPandas(_read_manifests(readers), _FILE_SCHEMA)
    )
    return files.join(distinct.select(REPO, "manifest_path", "at_head"), [REPO, "manifest_path"])


def live_of(spark: SparkSession, snapshots: DataFrame, readers: Readers, metadata: DataFrame) -> DataFrame:
    """(repo, *LIVE_ENTRY_SCHEMA) of every table of `snapshots` (its retained ones): their files,
    manifests and manifest lists, and `metadata` (metadata_rows)."""
    manifests = _manifests(snapshots, readers).persist()
    return (
        _files(spark, manifests, readers)
        .select(REPO, "address", "size", F.lit("committed").alias("source"), "at_head")
        .unionByName(
            manifests.groupBy(REPO, F.col("manifest_address").alias("address"))
            .agg(F.first("manifest_length").alias("size"), F.max("at_head").alias("at_head"))
            .select(REPO, "address", "size", F.lit("metadata").alias("source"), "at_head")
        )
        .unionByName(
            snapshots.select(
                REPO,
                F.col("manifest_list_address").alias("address"),
                F.lit(None).cast("long").alias("size"),
                F.lit("metadata").alias("source"),
                "at_head",
            )
        )
        .unionByName(metadata)
    )


def committed_of(spark: SparkSession, snapshots: DataFrame, readers: Readers, statistics: DataFrame) -> DataFrame:
    """(repo, address) of every file, manifest and manifest list of `snapshots`, and `statistics`."""
    manifests = _manifests(snapshots, readers).persist()
    return (
        _files(spark, manifests, readers)
        .select(REPO, "address")
        .unionByName(manifests.select(REPO, F.col("manifest_address").alias("address")))
        .unionByName(snapshots.select(REPO, F.col("manifest_list_address").alias("address")))
        .unionByName(statistics)
        .distinct()
    )


def snapshots_referencing(
    spark: SparkSession, snapshots: DataFrame, readers: Readers, namespace: str, addresses: DataFrame
) -> DataFrame:
    """(repo, address, commit_id): which of one table's `snapshots` reference `addresses`, keys
    relative to its `namespace` (the manifest list, manifests and files of each)."""
    manifests = _manifests(snapshots, readers).persist()
    files = _files(spark, manifests, readers).select(REPO, "manifest_path", "address")
    referenced = (
        manifests.select(REPO, "snapshot_id", "manifest_path")
        .join(files, [REPO, "manifest_path"])
        .select(REPO, "snapshot_id", "address")
        .unionByName(manifests.select(REPO, "snapshot_id", F.col("manifest_address").alias("address")))
        .unionByName(snapshots.select(REPO, "snapshot_id", F.col("manifest_list_address").alias("address")))
    )
    keyed = referenced.select(
        REPO,
        F.col("snapshot_id").alias("commit_id"),
        F.coalesce(relative_key_column(F.col("address"), namespace), F.col("address")).alias("address"),
    )
    return keyed.join(addresses.select("address").distinct(), "address").select(REPO, "address", "commit_id").distinct()


def head_reader(metadata_location: str, io_properties: dict[str, str]) -> Callable[[str], list[str]]:
    """On an executor: the function from a snapshot id to the files it needs (snapshot_files), on
    the table loaded once from the metadata file the mark loaded."""
    from pyiceberg.table import StaticTable

    return partial(snapshot_files, StaticTable.from_metadata(metadata_location, io_properties))


# ---------------------------------------------------------------- the connector


class IcebergSource(RepositorySource):
    protected_prefixes: tuple[str, ...] = ()
    protected_patterns: tuple[str, ...] = (HIDDEN_PATH_PATTERN,)
    fingerprint_only_grows = True

    @classmethod
    def from_config(cls, repo: RepositoryConfig) -> "IcebergSource":
        return cls(repo)

    def __init__(self, repo: RepositoryConfig):
        self.repo = repo
        self._read_at = dt.datetime.now(dt.timezone.utc)  # replaced when the table is loaded
        self.namespace = repo.storage_namespace

    # -- the table

    @cached_property
    def table(self) -> Any:
        """The pyiceberg Table, from the configured catalog or a metadata.json (or table location) URI."""
        try:
            if self.repo.catalog is not None:
                table = self._from_catalog()
            else:
                from pyiceberg.table import StaticTable

                assert self.repo.source is not None
                metadata_file = self.repo.source
                if not metadata_file.endswith(".metadata.json"):
                    metadata_file = newest_metadata_file(self.repo.source, self._metadata_listing(self.repo.source))
                table = StaticTable.from_metadata(metadata_file, self._io_overrides())
                if self.repo.source.endswith(".metadata.json"):
                    _refuse_stale_metadata(self.repo.source, table.metadata.metadata_log, metadata_settings(self.repo))
        except SourceError:
            raise
        except Exception as exc:  # pyiceberg raises many kinds; name the repository and the cause
            raise SourceError(
                redacted(f"repository {self.repo.name!r}: cannot load the Iceberg table: {type(exc).__name__}: {exc}")
            ) from None
        self._read_at = dt.datetime.now(dt.timezone.utc)
        missing = [
            e.metadata_file for e in table.metadata.metadata_log if not table.io.new_input(e.metadata_file).exists()
        ]
        if missing:
            raise SourceError(
                f"repository {self.repo.name!r}: the metadata log of {table.metadata_location} names {missing[0]}, "
                f"which does not exist ({len(missing)} missing): the table's history is damaged or partly copied"
            )
        location = canonical_uri(table.metadata.location).rstrip("/")
        if location != self.namespace:
            raise SourceError(
                f"repository {self.repo.name!r}: the table location {table.metadata.location} is not the storage "
                f"namespace {self.namespace}; set storage_namespace to the table location"
            )
        return table

    def _from_catalog(self) -> Any:
        """The table as its catalog has it now."""
        from pyiceberg.catalog import load_catalog

        catalog = self.repo.catalog
        assert catalog is not None
        properties = catalog.load_properties()
        return load_catalog(catalog.name, **self._io_overrides(), **properties).load_table(catalog.table)

    def _metadata_listing(self, location: str) -> list[str]:
        return list_files(f"{location.rstrip('/')}/metadata", metadata_settings(self.repo))

    def source_time(self, spark: SparkSession) -> dt.datetime:
        """When the table metadata was loaded: a commit after that was never seen."""
        self.table  # noqa: B018 - loading records the moment
        return self._read_at

    def untracked_min_age(self, spark: SparkSession, repo: RepositoryConfig) -> dt.timedelta:
        """Iceberg's DeleteOrphanFiles keeps files younger than 3 days by default: writers in flight."""
        return UNTRACKED_MIN_AGE

    def witness_heads(self, spark: SparkSession, head_ids: Sequence[str]) -> DataFrame:
        """What each head snapshot needs, through pyiceberg's own scan planning, read on
        executors (witness_on_executors) from the metadata file the mark loaded."""
        table = self.table
        for head in head_ids:
            if table.metadata.snapshot_by_id(int(head)) is None:
                raise SourceError(
                    f"repository {self.repo.name!r}: head snapshot {head} is not in {table.metadata_location}"
                )
        return witness_on_executors(spark, head_ids, partial(head_reader, table.metadata_location, self._io_properties))

    def _io_overrides(self) -> dict[str, str]:
        """pyiceberg FileIO properties for the table's store: the repository's endpoints (S3, Azure,
        GCS) and, on Azure, the connection string's key or SAS (pyarrow reads no connection string)."""
        overrides = {}
        if self.repo.s3.endpoint_url:
            overrides["s3.endpoint"] = self.repo.s3.endpoint_url
        if self.repo.s3.region:
            overrides["s3.region"] = self.repo.s3.region
        keys = {
            "aws_access_key_id": "s3.access-key-id",
            "aws_secret_access_key": "s3.secret-access-key",
            "aws_session_token": "s3.session-token",
        }
        overrides.update(
            {keys[name]: value for name, value in S3Settings.of_override(self.repo.s3).credentials().items()}
        )
        return {**overrides, **blob_io_properties(self.namespace, metadata_settings(self.repo))}

    @property
    def _io_properties(self) -> dict[str, str]:
        return dict(self.table.io.properties)

    # -- the commit graph and retention

    def retention_rules(self, spark: SparkSession, repo: RepositoryConfig) -> Optional[Rules]:
        """The gc.yaml rules; with `retention: iceberg` there are none (see evaluate_retention)."""
        return None if repo.retention == "iceberg" else repo.rules

    def evaluate_retention(
        self,
        spark: SparkSession,
        repo: RepositoryConfig,
        commits: Sequence[Commit],
        refs: Sequence[Ref],
        as_of: dt.datetime,
    ) -> dict[str, Retention]:
        return self._judged(self.table.metadata, spark, repo, commits, refs, as_of)

    def _judged(
        self,
        metadata: Any,
        spark: SparkSession,
        repo: RepositoryConfig,
        commits: Sequence[Commit],
        refs: Sequence[Ref],
        as_of: dt.datetime,
    ) -> dict[str, Retention]:
        """The rules (or the properties of `metadata`) over the graph; without a catalog, what they
        expire is kept as NOT_COMMITTED: no snapshot is expired, so none may lose a file."""
        if repo.retention == "iceberg":
            verdicts = iceberg_retention(commits, refs, policy_of(metadata), as_of)
        else:
            verdicts = super().evaluate_retention(spark, repo, commits, refs, as_of)
        if repo.catalog is None:
            return {commit_id: v if v.retained else NOT_COMMITTED for commit_id, v in verdicts.items()}
        return verdicts

    def commit_expiry(
        self, spark: SparkSession, repo: RepositoryConfig, as_of: dt.datetime, expired_at_mark: frozenset[str]
    ) -> CommittedExpiry:
        """Expire through the catalog the snapshots the mark expired that the rules, judged again
        on the catalog's metadata now, still expire; never one a ref names, never the current one.
        A snapshot the mark showed as retained is never expired."""
        if repo.catalog is None or not expired_at_mark:
            return CommittedExpiry()
        from gc_assets.sources.iceberg_expiry import commit_expiry

        def expiring(metadata: Any) -> set[str]:
            commits, refs = graph_of(metadata)
            verdicts = self._judged(metadata, spark, repo, commits, refs, as_of)
            named = {ref.commit_id for ref in refs} | {str(metadata.current_snapshot_id)}
            return {c for c, v in verdicts.items() if not v.retained and c in expired_at_mark} - named

        table_name = f"repository {repo.name!r}: Iceberg table {repo.catalog.table}"
        return commit_expiry(self._from_catalog, expiring, expired_at_mark, table_name)

    def commit_graph(self, spark: SparkSession) -> tuple[list[Commit], list[Ref]]:
        return graph_of(self.table.metadata)

    # -- live entries

    @property
    def readers(self) -> Readers:
        return {self.repo.name: (self._io_properties, self.table.metadata.location)}

    def _snapshots(self, spark: SparkSession, snapshot_ids: Optional[set[str]], heads: set[str]) -> DataFrame:
        return local_frame(
            spark, snapshot_rows(self.repo.name, self.table.metadata, snapshot_ids, heads), SNAPSHOT_SCHEMA
        )

    def live_entries(self, spark: SparkSession, retained: DataFrame, heads: DataFrame) -> DataFrame:
        retained_ids = sorted({r["commit_id"] for r in retained.select("commit_id").distinct().collect()})
        head_ids = sorted({r["commit_id"] for r in heads.select("commit_id").distinct().collect()})
        read = LiveRead(self, {}, retained_ids, head_ids)
        return self.live_entries_together(spark, {self.repo.name: read}).drop(REPO).persist()

    @classmethod
    def live_entries_together(cls, spark: SparkSession, reads: Mapping[str, LiveRead]) -> DataFrame:
        """Every table's live entries in one plan (live_of over the snapshots of all of them, as a
        set's mark reads them), each table's rows under its own name."""
        snapshots, metadata, readers = [], [], {}
        for live in reads.values():
            source = cast(IcebergSource, live.source)
            name, heads = source.repo.name, set(live.heads)
            snapshots += snapshot_rows(name, source.table.metadata, set(live.retained), heads)
            metadata += metadata_rows(name, source.table, heads)
            readers[name] = source.readers[name]
        return live_of(
            spark,
            local_frame(spark, snapshots, SNAPSHOT_SCHEMA),
            readers,
            local_frame(spark, metadata, METADATA_SCHEMA),
        )

    def committed_addresses(self, spark: SparkSession) -> DataFrame:
        """Every file, manifest, manifest list and statistics file of every snapshot in the metadata."""
        snapshots = self._snapshots(spark, None, set())
        statistics = local_frame(
            spark, statistics_rows(self.repo.name, self.table.metadata), f"{REPO} string, address string"
        )
        return committed_of(spark, snapshots, self.readers, statistics).drop(REPO)

    def fingerprint(self, spark: Optional[SparkSession] = None) -> str:
        """sha256 of the current metadata.json location and the refs: every commit writes a new metadata.json."""
        metadata = self.table.metadata
        refs = sorted(f"{name} {ref.snapshot_ref_type} {ref.snapshot_id}" for name, ref in metadata.refs.items())
        return hashlib.sha256("\n".join([self.table.metadata_location, *refs]).encode()).hexdigest()

    def commits_referencing(self, spark: SparkSession, retained: DataFrame, addresses: DataFrame) -> DataFrame:
        """(address, commit_id): which retained snapshots reference the given (namespace-relative) addresses."""
        retained_ids = {r["commit_id"] for r in retained.select("commit_id").distinct().collect()}
        snapshots = self._snapshots(spark, retained_ids, set())
        return snapshots_referencing(spark, snapshots, self.readers, self.namespace, addresses).drop(REPO)


def graph_of(metadata: Any) -> tuple[list[Commit], list[Ref]]:
    """The snapshots and refs of a pyiceberg TableMetadata as commits and refs."""
    known = {s.snapshot_id for s in metadata.snapshots}
    commits = [
        Commit(
            str(s.snapshot_id),
            (str(s.parent_snapshot_id),) if s.parent_snapshot_id in known else (),
            _datetime(s.timestamp_ms),
        )
        for s in metadata.snapshots
    ]
    refs = [Ref(name, str(ref.snapshot_ref_type), str(ref.snapshot_id)) for name, ref in sorted(metadata.refs.items())]
    return commits, refs


def _refuse_stale_metadata(metadata_location: str, metadata_log: Sequence[Any], settings: StoreSettings) -> None:
    """A configured metadata.json must be the newest: files of newer snapshots would look untracked."""
    directory, name = metadata_location.rsplit("/", 1)
    version = METADATA_VERSION.match(name)
    if version is None:
        return
    names = [uri.rsplit("/", 1)[-1] for uri in list_files(canonical_uri(directory), settings)]
    newer = sorted(
        base
        for base in names
        if base.endswith(".metadata.json")
        and (match := METADATA_VERSION.match(base)) is not None
        and int(match.group(1)) > int(version.group(1))
    )
    if newer:
        raise SourceError(
            f"metadata.json {metadata_location} is not the table's newest: {newer[-1]} is newer; point source at "
            "the newest metadata.json or configure the catalog"
        )


def newest_metadata_file(location: str, files: Sequence[str]) -> str:
    """The metadata.json with the highest version in a table's `metadata/` directory.

    As Iceberg's Hadoop tables do, the files themselves decide, not `version-hint.text`:
    a hint one commit behind would make the newest snapshot's files look untracked. Two
    files claiming the newest version are ambiguous, and refused.
    """
    versions: dict[int, list[str]] = {}
    for uri in files:
        name = uri.rsplit("/", 1)[-1]
        match = METADATA_VERSION.match(name)
        if name.endswith(".metadata.json") and match is not None:
            versions.setdefault(int(match.group(1)), []).append(uri)
    if not versions:
        raise SourceError(f"no metadata.json under {location.rstrip('/')}/metadata: not an Iceberg table location")
    newest = max(versions)
    if len(versions[newest]) > 1:
        raise SourceError(
            f"{location.rstrip('/')}/metadata holds {len(versions[newest])} metadata files of version {newest} "
            f"({sorted(u.rsplit('/', 1)[-1] for u in versions[newest])}): which one is current is ambiguous"
        )
    return versions[newest][0]


# pyiceberg would try fsspec (adlfs, gcsfs) first; pyarrow's own Azure and GCS filesystems need neither.
PYARROW_IO = {"py-io-impl": "gc_assets.sources.iceberg_io.BlobFileIO"}


def blob_io_properties(namespace: str, settings: StoreSettings) -> dict[str, str]:
    """pyiceberg's PyArrowFileIO properties for an Azure or GCS namespace (none for others).

    An http:// GCS endpoint is an emulator, reached with a placeholder token, as the stores reach
    it anonymously."""
    if namespace.startswith("gs://"):
        endpoint = settings.gcs_endpoint or os.environ.get("STORAGE_EMULATOR_HOST")
        properties = {"gcs.service.host": endpoint} if endpoint else {}
        if settings.gcs_project:
            properties["gcs.project-id"] = settings.gcs_project
        token = settings.gcs_settings.token
        if token is not None or (endpoint and endpoint.startswith("http://")):
            value = token.reveal() if token is not None else "emulator"
            properties.update({"gcs.oauth2.token": value, "gcs.oauth2.token-expires-at": str(2**42)})
        return {**PYARROW_IO, **properties}
    if not namespace.startswith("abfss://"):
        return {}
    _, account, suffix, _ = azure_parts(namespace)
    url, secret = settings.azure(account, suffix).resolve()
    properties = {
        **PYARROW_IO,
        "adls.account-name": account,
        **{f"adls.{k.replace('_', '-')}": v for k, v in secret.items()},
    }
    if url != f"https://{account}.blob.{suffix}":
        parts = urlsplit(url)
        for service in ("blob", "dfs"):
            properties[f"adls.{service}-storage-authority"] = parts.netloc
            properties[f"adls.{service}-storage-scheme"] = parts.scheme
    return properties
