"""lakeFS as lakeFS stores it (docs/design.md §6.4): the repository's storage namespace.

Commits, branches and tags come from a refs dump (`lakectl refs-dump`): ordinary metaranges
and ranges under the block storage prefix (`_lakefs/` unless `block_storage_prefix` names
another) whose property `entity` says what they hold, named by the
manifest JSON at `refs_dump`. Each commit names a metarange, a metarange lists ranges, and a
range maps logical paths to objects (catalog.Entry). Metaranges and ranges are read on
executors, the distinct range ids of every commit once (ranges are shared by many commits,
as lakeFS's own GC de-duplicates them), and kept cached while their files do not change.

A dump is a snapshot, and staged objects live only in lakeFS's key-value store. So what
storage alone cannot know is refused or kept: an object no dumped range names is never a
candidate (`collects_untracked` is False), every table written at or after the dump (less
the minimum object age, for commits made while the dump ran) is live with all its entries,
the dump's time bounds the cutoff, and a dump older than `refs_dump_max_age_hours` is
refused (a branch moved back since would be invisible).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core.config import BranchRule, RepositoryConfig, Rules
from gc_assets.core.retention import Commit, Ref
from gc_assets.core.spark import local_frame
from gc_assets.core.uris import is_absolute_uri
from gc_assets.sources.base import RepositorySource, SourceError, metadata_settings, witness_on_executors
from gc_assets.sources.files import ParsedFiles, file_stamp, map_files, read_small_file
from gc_assets.sources.lakefs.records import (
    AddressType,
    BranchData,
    CommitData,
    GarbageCollectionRules,
    TagData,
    entry_location,
    split_value,
)
from gc_assets.sources.lakefs.sstable import read_sstable
from gc_assets.sources.lakefs.witness import head_reader
from gc_assets.stores import store_for
from gc_assets.stores.settings import StoreSettings

TABLE_NAME = re.compile(r"^[0-9a-f]{16,128}$")
# Under the repository's block storage prefix (lakeFS `committed.block_storage_prefix`, `_lakefs`
# unless configured): metaranges and ranges are the files directly under it, named by their hex id.
RULES_KEY = "retention/gc/rules/config.json"
DUMP_ENTITIES = {"commits_meta_range_id": "commit", "branches_meta_range_id": "branch", "tags_meta_range_id": "tag"}
EMPTY_METARANGE = ""  # an empty tree, as lakeFS spells a commit's metarange with no ranges
METARANGES, RANGES = "metaranges", "ranges"
ERROR = "error"  # a table that could not be read: the driver refuses with its message
# Schemes lakeFS resolves an address of unknown type (BY_PREFIX_DEPRECATED) as a full URI by.
FULL_SCHEMES = re.compile(r"^(s3|gs|https?|mem|memory|local)://", re.IGNORECASE)
# lakeFS spells an Azure location https://<account>.blob.<suffix>/<container>/<path>.
AZURE_HTTPS = re.compile(
    r"^https?://(?P<account>[A-Za-z0-9]+)\.blob\.(?P<suffix>[A-Za-z0-9.-]+)/(?P<container>[^/]+)/(?P<key>.*)$"
)
SAMPLE = 5

# One row per record of a metarange or range read on executors.
TABLE_ROWS = T.StructType(
    [
        T.StructField("table_id", T.StringType(), False),
        T.StructField("kind", T.StringType(), False),  # metaranges / ranges / error
        T.StructField("path", T.StringType(), True),  # a range's logical path (a metarange's: the range's max key)
        T.StructField(
            "ref", T.StringType(), True
        ),  # a range: the object's address; a metarange: the range id; error: why
        T.StructField("size", T.LongType(), True),
    ]
)
_TABLE_ARROW = pa.schema(
    [pa.field(f.name, pa.string() if f.name != "size" else pa.int64(), f.nullable) for f in TABLE_ROWS.fields]
)


@dataclass(frozen=True)
class Listing:
    """The tables under the block storage prefix (id -> last change), as the namespace's store lists them."""

    changed: dict[str, dt.datetime]


@dataclass(frozen=True)
class Dump:
    """What a refs dump says, and when it was written."""

    commits: list[Commit]
    metaranges: dict[str, str]  # commit id -> metarange id
    refs: list[Ref]
    tables: tuple[str, ...]  # the dump's own metaranges and ranges
    written_at: dt.datetime  # the oldest of its tables: the state it describes is no later


_PARSED = ParsedFiles(capacity=6)


class LakeFSSource(RepositorySource):
    protected_patterns: tuple[str, ...] = ()
    collects_untracked = False  # staged objects are invisible in storage: only dumped ranges name candidates

    @classmethod
    def from_config(cls, repo: RepositoryConfig) -> "LakeFSSource":
        return cls(repo)

    def __init__(self, repo: RepositoryConfig, settings: Optional[StoreSettings] = None):
        assert repo.refs_dump is not None, "config validation requires refs_dump for format lakefs"
        self.repo = repo
        self.namespace = repo.storage_namespace
        self.refs_dump = repo.refs_dump
        self.tables = repo.block_storage_prefix
        self.protected_prefixes = (f"{self.tables}/",)
        self.settings = settings or metadata_settings(repo)
        self._listing: Optional[Listing] = None
        self._dump: Optional[Dump] = None

    # ------------------------------------------------------------------ the namespace and the dump

    @property
    def rules_uri(self) -> str:
        return f"{self.namespace}/{self.tables}/{RULES_KEY}"

    def table_uri(self, table_id: str) -> str:
        return f"{self.namespace}/{self.tables}/{table_id}"

    def listing(self, spark: SparkSession) -> Listing:
        """Every table directly under the block storage prefix, listed once per connector by the namespace's store."""
        if self._listing is None:
            listed = (
                store_for(self.repo)
                .list(spark, self.tables)
                .filter(F.col("address").rlike(rf"^{re.escape(self.tables)}/[0-9a-f]{{16,128}}$"))
                .select("address", "last_modified")
                .collect()
            )
            self._listing = Listing(
                {r["address"][len(self.tables) + 1 :]: r["last_modified"].astimezone(dt.timezone.utc) for r in listed}
            )
        return self._listing

    def manifest(self) -> dict[str, str]:
        """The dump's manifest: the three metarange ids `lakectl refs-dump` prints."""
        content = read_small_file(self.refs_dump, self.settings)
        try:
            manifest = json.loads(content)
        except ValueError as exc:
            raise SourceError(f"refs dump {self.refs_dump}: not valid JSON ({exc})") from None
        if not isinstance(manifest, dict):
            raise SourceError(f"refs dump {self.refs_dump}: expected a JSON object with {sorted(DUMP_ENTITIES)}")
        for key in DUMP_ENTITIES:
            value = manifest.get(key)
            if not isinstance(value, str) or (value and not TABLE_NAME.match(value)):
                raise SourceError(f"refs dump {self.refs_dump}: {key} is {value!r}, not a metarange id")
        if not manifest["commits_meta_range_id"]:
            raise SourceError(f"refs dump {self.refs_dump}: commits_meta_range_id is empty (a repository has commits)")
        return {key: manifest[key] for key in DUMP_ENTITIES}

    def dump(self, spark: SparkSession) -> Dump:
        """Commits and refs of the dump, read on the driver (a dump is a few tables), once per connector."""
        if self._dump is None:
            self._dump = self._read_dump(spark)
        return self._dump

    def _read_dump(self, spark: SparkSession) -> Dump:
        listing = self.listing(spark)
        tables: list[str] = []
        records: dict[str, list[tuple[str, bytes, bytes]]] = {}
        for key, entity in DUMP_ENTITIES.items():
            metarange_id = self.manifest()[key]
            records[entity] = []
            if not metarange_id:
                continue
            for range_id, _ in self._dump_table(metarange_id, METARANGES, entity, key, listing, tables):
                for path, value in self._dump_table(range_id, RANGES, entity, key, listing, tables):
                    identity, data = _split(value, self.table_uri(range_id), path)
                    records[entity].append((path, identity, data))
        commits, metaranges = [], {}
        for path, _, data in records["commit"]:
            commit = _decoded(CommitData, data, self.refs_dump, path)
            if commit.id != path:
                raise SourceError(f"refs dump {self.refs_dump}: commit record {path!r} holds commit {commit.id!r}")
            if commit.creation_date is None:
                raise SourceError(f"refs dump {self.refs_dump}: commit {commit.id} has no creation_date")
            commits.append(Commit(commit.id, main_parent_first(commit), commit.creation_date.to_datetime()))
            metaranges[commit.id] = commit.meta_range_id
        refs = [
            Ref(path, "branch", _decoded(BranchData, data, self.refs_dump, path).commit_id)
            for path, _, data in records["branch"]
        ]
        refs += [
            Ref(path, "tag", _decoded(TagData, data, self.refs_dump, path).commit_id)
            for path, _, data in records["tag"]
        ]
        missing = sorted({m for m in metaranges.values() if m != EMPTY_METARANGE} - set(listing.changed))
        if missing:
            holder = next(c for c, m in metaranges.items() if m == missing[0])
            raise SourceError(
                f"refs dump {self.refs_dump}: metarange {missing[0]} of commit {holder} is missing from "
                f"{self.namespace}/{self.tables}/ ({len(missing)} metarange(s) missing): refusing to mark"
            )
        written_at = min(listing.changed[t] for t in tables)
        age = dt.datetime.now(dt.timezone.utc) - written_at
        if age > dt.timedelta(hours=self.repo.refs_dump_max_age_hours):
            raise SourceError(
                f"repository {self.repo.name!r}: the refs dump {self.refs_dump} was written at "
                f"{written_at.isoformat()}, {age.total_seconds() / 3600:.1f} hours ago, more than "
                f"refs_dump_max_age_hours ({self.repo.refs_dump_max_age_hours:g}): a branch moved back to an old "
                "commit since would be invisible. "
                "Dump the refs again (lakectl refs-dump) before collecting"
            )
        return Dump(commits, metaranges, refs, tuple(tables), written_at)

    def _dump_table(
        self, table_id: str, kind: str, entity: str, key: str, listing: Listing, tables: list[str]
    ) -> Iterator[tuple[str, bytes]]:
        """(key, value) of one of the dump's tables: a metarange yields its range ids, a range its records."""
        uri = self.table_uri(table_id)
        if table_id not in listing.changed:
            raise SourceError(
                f"refs dump {self.refs_dump}: its {entity} {kind[:-1]} {uri} ({key}) is missing: refusing to mark"
            )
        table = read_sstable(read_small_file(uri, self.settings), uri)
        properties = {name: value.decode("utf-8", "replace") for name, value in table.properties.items()}
        if properties.get("type") != kind or properties.get("entity") != entity:
            raise SourceError(
                f"refs dump {self.refs_dump}: {uri} has type {properties.get('type')!r} and entity "
                f"{properties.get('entity')!r}, not a {entity} {kind[:-1]} of a refs dump"
            )
        tables.append(table_id)
        for path, value in table.records():
            if kind == METARANGES:
                identity, _ = _split(value, uri, path)
                yield identity.decode("ascii", "replace"), b""
            else:
                yield path.decode("utf-8", "replace"), value

    def written_since_dump(self, spark: SparkSession) -> list[str]:
        """Tables written at or after the dump, less the minimum object age (a commit made while the
        dump ran wrote its metarange just before the dump's first table): all of them are live."""
        dump = self.dump(spark)
        since = dump.written_at - self.repo.min_object_age
        own = set(dump.tables)
        return sorted(t for t, changed in self.listing(spark).changed.items() if changed >= since and t not in own)

    # ------------------------------------------------------------------ the connector

    def retention_rules(self, spark: SparkSession, repo: RepositoryConfig) -> Optional[Rules]:
        """The configured rules, else the namespace's own (none when lakeFS has no rules file)."""
        if repo.rules is not None:
            return repo.rules
        return self.namespace_rules()

    def namespace_rules(self) -> Optional[Rules]:
        uri = self.rules_uri
        if not self._exists(uri):
            return None
        content = read_small_file(uri, self.settings)
        if not content:
            return None  # lakeFS reads an empty rules file as no rules
        try:
            decoded = GarbageCollectionRules.decode(content)
        except ValueError as exc:
            raise SourceError(f"{uri}: not a GarbageCollectionRules protobuf ({exc})") from None
        return rules_of(decoded)

    def _exists(self, uri: str) -> bool:
        try:
            file_stamp(uri, self.settings)
        except (FileNotFoundError, SourceError):
            return False
        except OSError as exc:
            if "not found" in str(exc).lower() or "does not exist" in str(exc).lower():
                return False
            raise SourceError(f"cannot read {uri}: {exc}") from None
        return True

    def commit_graph(self, spark: SparkSession) -> tuple[list[Commit], list[Ref]]:
        dump = self.dump(spark)
        return list(dump.commits), list(dump.refs)

    def source_time(self, spark: SparkSession) -> dt.datetime:
        """The dump's time: the oldest of its tables (objects written later may belong to commits it missed)."""
        return self.dump(spark).written_at

    def untracked_min_age(self, spark: SparkSession, repo: RepositoryConfig) -> dt.timedelta:
        """lakeFS GC's own guard for uncommitted uploads (moot: untracked objects are never candidates)."""
        return repo.min_object_age

    # ------------------------------------------------------------------ tables on executors

    def _tables(self, spark: SparkSession, expected: dict[str, Optional[str]]) -> DataFrame:
        """TABLE_ROWS of the tables `expected` names (id -> metaranges / ranges / None for either),
        read on executors a few per task and cached while their files stay as listed."""
        listing = self.listing(spark)
        key = (self.namespace, tuple(sorted((t, k or "", listing.changed[t].isoformat()) for t, k in expected.items())))
        uris = [self.table_uri(t) for t in sorted(expected)]

        def parse() -> DataFrame:
            namespace, kinds = self.namespace, dict(expected)

            def rows(uri: str, content: bytes, modified: dt.datetime) -> pa.RecordBatch:
                return table_rows(uri, content, kinds[uri.rsplit("/", 1)[1]], namespace)

            frame = map_files(spark, uris, self.settings, rows, TABLE_ROWS).cache()
            failed = frame.filter(F.col("kind") == ERROR).select("ref").limit(1).collect()
            if failed:
                frame.unpersist()
                raise SourceError(f"repository {self.repo.name!r}: {failed[0]['ref']}: refusing to mark")
            return frame

        if not expected:
            return local_frame(spark, [], TABLE_ROWS)
        return _PARSED.get(spark, key, parse)

    def _metarange_rows(self, spark: SparkSession) -> DataFrame:
        """Every dumped commit's metarange and every table written since the dump, in TABLE_ROWS."""
        dump = self.dump(spark)
        expected: dict[str, Optional[str]] = {m: METARANGES for m in dump.metaranges.values() if m != EMPTY_METARANGE}
        for table in self.written_since_dump(spark):
            expected.setdefault(table, None)
        return self._tables(spark, expected)

    def _range_rows(self, spark: SparkSession) -> DataFrame:
        """Every range those metaranges list, and the ranges written since the dump, each read once."""
        tables = self._metarange_rows(spark)
        listed = self.listing(spark).changed
        range_ids = [r["ref"] for r in tables.filter(F.col("kind") == METARANGES).select("ref").distinct().collect()]
        missing = sorted(set(range_ids) - set(listed))
        if missing:
            holder = (
                tables.filter((F.col("kind") == METARANGES) & (F.col("ref") == missing[0])).select("table_id").first()
            )
            raise SourceError(
                f"repository {self.repo.name!r}: range {self.table_uri(missing[0])}, listed by metarange "
                f"{holder['table_id'] if holder else '?'}, is missing ({len(missing)} range(s) missing): "
                "refusing to mark"
            )
        since = set(self.written_since_dump(spark))
        ranges = self._tables(spark, {r: RANGES for r in range_ids if r not in since})
        return ranges.unionByName(tables.filter(F.col("kind") == RANGES))

    def _commit_metaranges(self, spark: SparkSession) -> DataFrame:
        rows = [(c, m) for c, m in self.dump(spark).metaranges.items()]
        return local_frame(spark, rows, "commit_id string, metarange_id string")

    def live_entries(self, spark: SparkSession, retained: DataFrame, heads: DataFrame) -> DataFrame:
        """Entries of the distinct ranges of the retained commits, and of every table written since the dump."""
        tables = self._metarange_rows(spark)
        flagged = (
            retained.select("commit_id")
            .join(self._commit_metaranges(spark), "commit_id")
            .join(heads.select("commit_id").distinct().withColumn("head", F.lit(True)), "commit_id", "left")
            .groupBy("metarange_id")
            .agg(F.max(F.coalesce("head", F.lit(False))).alias("at_head"))
        )
        since = local_frame(spark, [(t,) for t in self.written_since_dump(spark)], "metarange_id string").withColumn(
            "at_head", F.lit(False)
        )
        listed = tables.filter(F.col("kind") == METARANGES).select(
            F.col("table_id").alias("metarange_id"), F.col("ref").alias("range_id")
        )
        needed = (
            flagged.unionByName(since)
            .join(listed, "metarange_id")
            .select("range_id", "at_head")
            .unionByName(since.withColumnRenamed("metarange_id", "range_id"))
            .groupBy("range_id")
            .agg(F.max("at_head").alias("at_head"))
        )
        ranges = self._range_rows(spark).select(
            F.col("table_id").alias("range_id"), F.col("ref").alias("address"), "size"
        )
        return ranges.join(needed, "range_id").select("address", "size", F.lit("committed").alias("source"), "at_head")

    def committed_addresses(self, spark: SparkSession) -> DataFrame:
        return self._range_rows(spark).select(F.col("ref").alias("address")).distinct()

    def _commit_ranges(self, spark: SparkSession) -> DataFrame:
        """(commit_id, range_id) of every dumped commit."""
        listed = (
            self._metarange_rows(spark)
            .filter(F.col("kind") == METARANGES)
            .select(F.col("table_id").alias("metarange_id"), F.col("ref").alias("range_id"))
        )
        return self._commit_metaranges(spark).join(listed, "metarange_id").select("commit_id", "range_id")

    def commits_referencing(self, spark: SparkSession, retained: DataFrame, addresses: DataFrame) -> DataFrame:
        ranges = self._range_rows(spark).select(F.col("table_id").alias("range_id"), F.col("ref").alias("address"))
        return (
            ranges.join(addresses.select("address").distinct(), "address")
            .join(self._commit_ranges(spark), "range_id")
            .join(retained.select("commit_id"), "commit_id")
            .select("address", "commit_id")
            .distinct()
        )

    def logical_addresses(self, spark: SparkSession, path: str) -> DataFrame:
        ranges = self._range_rows(spark).filter(F.col("path") == path)
        return (
            ranges.select(F.col("table_id").alias("range_id"), F.col("ref").alias("address"))
            .join(self._commit_ranges(spark), "range_id")
            .select("address", "commit_id")
            .distinct()
        )

    def fingerprint(self, spark: Optional[SparkSession] = None) -> str:
        """sha256 of the dump's manifest and the rules file (content and stamp), without Spark; with
        Spark (the sweep, before it acts) also of every table under the block storage prefix, so that a commit
        made after the dump, which writes a metarange, is seen."""
        digest = hashlib.sha256()
        for uri in (self.refs_dump, self.rules_uri):
            if uri == self.refs_dump or self._exists(uri):
                size, mtime_ns = file_stamp(uri, self.settings)
                digest.update(f"{uri} {size} {mtime_ns}\n".encode())
                digest.update(read_small_file(uri, self.settings))
            else:
                digest.update(f"{uri} absent\n".encode())
        if spark is not None:
            self._listing = None  # listed now, not when this connector first listed
            for table, changed in sorted(self.listing(spark).changed.items()):
                digest.update(f"{table} {changed.isoformat()}\n".encode())
        return digest.hexdigest()

    def witness_heads(self, spark: SparkSession, head_ids: Sequence[str]) -> DataFrame:
        """What each head needs, read by RocksDB itself (gc_assets.sources.lakefs.witness): the dump,
        the heads' metaranges and their ranges, through no code of the mark's reader."""
        opener = head_reader(self.namespace, self.tables, self.refs_dump, self.settings)
        return witness_on_executors(spark, list(dict.fromkeys(head_ids)), opener)


def main_parent_first(commit: CommitData) -> tuple[str, ...]:
    """Parents with the main one first: before lakeFS 1.0 (commit version 0) it was the last."""
    parents = tuple(commit.parents)
    if commit.version == 0 and len(parents) > 1:
        return (parents[-1],) + parents[:-1]
    return parents


def rules_of(rules: GarbageCollectionRules) -> Rules:
    """lakeFS's binary rules as the product's rules (whole days; tags as the product keeps them)."""
    branches = tuple(BranchRule(branch_id=b, retention_days=d) for b, d in sorted(rules.branch_retention_days.items()))
    return Rules(default_retention_days=rules.default_retention_days, branches=branches)


def resolve_address(address: str, address_type: int, namespace: str) -> str:
    """An entry's address as the mark reads addresses: a key relative to the namespace, or an
    absolute URI (lakeFS's Azure https spelling as abfss://). BY_PREFIX_DEPRECATED is a full URI
    when lakeFS would parse it as one, else relative, as lakeFS resolves it."""
    if address_type == AddressType.BY_PREFIX_DEPRECATED:
        address_type = AddressType.FULL if FULL_SCHEMES.match(address) else AddressType.RELATIVE
    if address_type == AddressType.RELATIVE:
        # A relative key that looks absolute ("x:y") is spelled under the namespace, never misread.
        return f"{namespace}/{address}" if is_absolute_uri(address) and not address.startswith("/") else address
    if address_type == AddressType.FULL:
        azure = AZURE_HTTPS.match(address)
        if azure:
            return f"abfss://{azure['container']}@{azure['account']}.dfs.{azure['suffix']}/{azure['key']}"
        return address
    raise ValueError(f"unknown address_type {address_type}")


def table_rows(uri: str, content: bytes, expected: Optional[str], namespace: str) -> pa.RecordBatch:
    """TABLE_ROWS of one table (on executors). A table that cannot be read, or is not of the
    `expected` type, becomes one `error` row naming it; a refs dump's own tables (property
    `entity`) hold no objects and yield nothing."""
    table_id = uri.rsplit("/", 1)[1]
    columns: dict[str, list[Any]] = {name: [] for name in TABLE_ROWS.fieldNames()}

    def add(kind: str, path: Optional[str], ref: Optional[str], size: Optional[int]) -> None:
        for name, value in zip(TABLE_ROWS.fieldNames(), (table_id, kind, path, ref, size)):
            columns[name].append(value)

    try:
        table = read_sstable(content, uri)
        kind = table.properties.get("type", b"").decode("utf-8", "replace")
        if b"entity" in table.properties and expected is None:
            return pa.RecordBatch.from_pydict(columns, schema=_TABLE_ARROW)
        if (
            kind not in (METARANGES, RANGES)
            or (expected is not None and kind != expected)
            or b"entity" in table.properties
        ):
            raise SourceError(f"{uri} has type {kind!r}, not {expected or 'a metarange or range'} of data")
        for key, value in table.records():
            path = key.decode("utf-8", "replace")
            identity, data = _split(value, uri, path)
            if kind == METARANGES:
                add(METARANGES, path, identity.decode("ascii"), None)
                continue
            try:
                address, address_type, size = entry_location(data)
                add(RANGES, path, resolve_address(address, address_type, namespace), size)
            except ValueError as exc:
                raise SourceError(f"{uri}: entry {path!r}: {exc}") from None
    except (SourceError, ValueError, UnicodeDecodeError) as exc:
        columns = {name: [] for name in TABLE_ROWS.fieldNames()}
        add(ERROR, None, str(exc), None)
    return pa.RecordBatch.from_pydict(columns, schema=_TABLE_ARROW)


def _split(value: bytes, uri: str, path: Any) -> tuple[bytes, bytes]:
    try:
        return split_value(value)
    except ValueError as exc:
        raise SourceError(f"{uri}: record {path!r}: {exc}") from None


def _decoded(message: Any, data: bytes, where: str, path: str) -> Any:
    try:
        return message.decode(data)
    except ValueError as exc:
        raise SourceError(f"{where}: record {path!r} is not a {message.__name__} ({exc})") from None
