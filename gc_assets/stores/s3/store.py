"""The S3 store (`s3://bucket/prefix` namespaces), for AWS S3 and S3-compatible endpoints.

The driver talks to S3 through a dagster-aws `S3Resource`; executors build one plain boto3
client per partition from `S3Settings` (endpoint and region only; credentials come from the
standard AWS environment or profile on each executor and never travel in a closure, a log
line or metadata).

The bucket's versioning is read once per store (GetBucketVersioning) before it lists, deletes
or moves anything; on a versioned bucket (Enabled or Suspended) the listing names each
object's current version and every delete and move acts on exactly that version
(gc_assets.stores.s3.actions). A bucket whose versioning cannot be read is refused."""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Optional

from pyspark.sql import DataFrame, SparkSession

from gc_assets.core.config import InventoryReport
from gc_assets.core.spark import local_frame
from gc_assets.stores import executor
from gc_assets.stores.base import (
    DELETE_BATCH_SIZE,
    INVENTORY_SCHEMA,
    VERSIONED_INVENTORY_SCHEMA,
    ListingReport,
    NamespaceReader,
    ObjectIO,
    ObjectRow,
    Store,
    StoreError,
    with_version_id,
)
from gc_assets.stores.executor import Receipt
from gc_assets.stores.retries import RetryPolicy, call_with_retries
from gc_assets.stores.s3 import inventory as reports
from gc_assets.stores.s3.actions import check_before_delete, delete_batch, head, move_one
from gc_assets.stores.s3.client import (
    ABSENT_CODES,
    S3_FAILURES,
    S3Settings,
    error_code,
    executor_client,
    log,
    split_s3_uri,
)
from gc_assets.stores.s3.listing import (
    inventory_rows,
    list_current_versions,
    list_slice,
    object_row,
    versioned_inventory_rows,
)
from gc_assets.stores.slices import (
    DISCOVERY_PAGE_SIZE,
    MAX_FANOUT,
    SLICE_DEPTH,
    SLICE_SCHEMA,
    DelimiterPage,
    Slice,
    discover_slices,
)

VERSIONED_STATES = ("Enabled", "Suspended")  # GetBucketVersioning's Status; absent when never enabled


def bucket_versioning(client: Any, bucket: str, namespace: str, policy: RetryPolicy) -> str:
    """GetBucketVersioning's Status ("" when never enabled); StoreError naming the bucket when unknown."""
    try:
        answer = call_with_retries(
            f"GetBucketVersioning {bucket}", lambda: client.get_bucket_versioning(Bucket=bucket), policy, S3_FAILURES
        )
    except Exception as exc:
        raise StoreError(
            f"bucket {bucket!r} (namespace {namespace}): its versioning cannot be read "
            f"({error_code(exc)}); grant s3:GetBucketVersioning. Nothing was listed, moved or deleted"
        ) from None
    return str(answer.get("Status") or "")


@dataclass
class S3Store(Store):
    """The store of one `s3://bucket/prefix` namespace (see the module docstring)."""

    namespace: str
    settings: S3Settings = field(default_factory=S3Settings.from_environment)
    policy: RetryPolicy = field(default_factory=RetryPolicy)  # its timeouts become the settings'
    # Builds an executor's client; replaceable (picklable) so tests can inject faults client-side.
    client_factory: Callable[[S3Settings], Any] = executor_client
    slice_depth: int = SLICE_DEPTH
    fanout: int = MAX_FANOUT
    discovery_page_size: int = DISCOVERY_PAGE_SIZE
    # Read this S3 Inventory report (gc.yaml `inventory`) instead of listing.
    inventory: Optional[InventoryReport] = None

    def __post_init__(self) -> None:
        self.policy = replace(self.policy, timeouts=self.settings.timeouts)
        self.bucket, self.key_prefix = split_s3_uri(self.namespace)
        self._client: Any = None  # the driver's client, made on first use
        self._versioning: Optional[str] = None  # the bucket's versioning status, read on first use
        self.listed_from_report: Optional[ListingReport] = None

    def versioning(self) -> str:
        """The bucket's versioning status: "Enabled", "Suspended" or "" (never enabled), read once.

        StoreError naming the bucket when it cannot be read: deleting by key on a bucket that is
        versioned after all would reclaim nothing and hide versions written since the listing.
        """
        if self._versioning is None:
            self._versioning = bucket_versioning(self._driver_client(), self.bucket, self.namespace, self.policy)
            log.info("bucket %s: versioning %s", self.bucket, self._versioning or "never enabled")
        return self._versioning

    @property
    def versioned(self) -> bool:
        """Whether the bucket keeps versions (Enabled or Suspended): actions name listed versions."""
        return self.versioning() in VERSIONED_STATES

    def slices(self, root: str) -> list[Slice]:
        client = self._driver_client()

        def list_page(prefix: str) -> DelimiterPage:
            page = call_with_retries(
                f"ListObjectsV2 s3://{self.bucket}/{prefix}",
                lambda: client.list_objects_v2(
                    Bucket=self.bucket, Prefix=prefix, Delimiter="/", MaxKeys=self.discovery_page_size
                ),
                self.policy,
                S3_FAILURES,
            )
            children = sorted(p["Prefix"] for p in page.get("CommonPrefixes", []))
            return DelimiterPage(children, bool(page.get("Contents")), bool(page.get("IsTruncated")))

        try:
            return discover_slices(list_page, root, self.slice_depth, self.fanout)
        except Exception as exc:
            raise StoreError(f"namespace {self.namespace} cannot be listed: {error_code(exc)}") from None

    def list(self, spark: SparkSession, prefix: str = "") -> DataFrame:
        """Every object of the namespace, or only those under `prefix` (a directory key inside it).

        The whole namespace comes from the inventory report when one is configured.
        """
        versioned = self.versioned
        if self.inventory is not None and not prefix:
            return self.list_from_report(spark, self.inventory)
        listed = VERSIONED_INVENTORY_SCHEMA if versioned else INVENTORY_SCHEMA
        rows = executor.slice_rows(self.namespace, self.key_prefix, prefix, self.slices, log)
        if rows is None:
            return local_frame(spark, [], listed)
        bucket, key_prefix, settings, policy, factory = self._parts()
        list_pages, to_rows = (
            (list_current_versions, versioned_inventory_rows) if versioned else (list_slice, inventory_rows)
        )
        body = executor.listing(
            lambda: factory(settings),
            lambda client, row: list_pages(client, bucket, Slice.of_row(row), policy),
            lambda batch: to_rows(batch, key_prefix),
            f"s3://{bucket}/{key_prefix}",
            log,
        )
        return executor.over_slices(spark, rows, SLICE_SCHEMA, body, listed)

    def list_from_report(self, spark: SparkSession, report: InventoryReport) -> DataFrame:
        """The inventory according to an S3 Inventory report, refused when stale or for another bucket."""
        manifest = reports.read_manifest(self._driver_client(), report.manifest, self.policy)
        now = dt.datetime.now(dt.timezone.utc)
        versioned = self.versioned
        reports.check_report(manifest, self.bucket, now, dt.timedelta(days=report.max_age_days), versioned)
        log.info(
            "inventory of %s from the report of %s (%d data files)",
            self.namespace,
            manifest.created_at.isoformat(),
            len(manifest.files),
        )
        self.listed_from_report = ListingReport(manifest.uri, manifest.created_at)
        return reports.inventory_from_report(
            spark, manifest, self.namespace, self.settings, self.policy, self.client_factory, versioned
        )

    def _parts(self) -> tuple[str, str, S3Settings, RetryPolicy, Callable[[S3Settings], Any]]:
        """What an executor needs (never the store itself: it holds the driver's client)."""
        return self.bucket, self.key_prefix, self.settings, self.policy, self.client_factory

    def delete(self, spark: SparkSession, candidates: DataFrame) -> DataFrame:
        """On a versioned bucket each candidate's listed `version_id` is deleted (a candidate
        without one is `failed`: version_not_listed); receipts then name it (VERSIONED_ACTION_SCHEMA)."""
        versioned = self.versioned
        acts = _Acts(self.bucket, self.key_prefix, self.policy, versioned)
        rows = _with_versions(candidates, versioned)
        connect = S3Reader(*self._parts()).connect  # plain data to executors, never the driver's client
        return executor.deleting(spark, rows, connect, _batch_size, acts.check, acts.delete, versioned)

    def move(self, spark: SparkSession, moves: DataFrame) -> DataFrame:
        """On a versioned bucket each pair's listed `version_id` is copied, then that version deleted."""
        versioned = self.versioned
        acts = _Acts(self.bucket, self.key_prefix, self.policy, versioned)
        rows = _with_versions(moves, versioned)
        connect = S3Reader(*self._parts()).connect
        return executor.moving(spark, rows, connect, _batch_size, acts.copy, acts.delete, versioned)

    def reader(self) -> "S3Reader":
        """Its listing is refused when an S3 Inventory report lists this namespace: that report is
        read by `list`; its probes and actions are those of any namespace. Its task reads the
        bucket's versioning where it lists (S3Reader.listed_versions), so the driver asks nothing."""
        return S3Reader(*self._parts(), reported=self.inventory is not None)

    def object_io(self) -> "S3ObjectIO":
        return S3ObjectIO(*self._parts())

    def exists(self, spark: SparkSession, addresses: DataFrame) -> DataFrame:
        bucket, key_prefix, settings, policy, factory = self._parts()
        body = executor.existence(
            lambda: factory(settings), lambda client, address: head(client, bucket, key_prefix + address, policy)
        )
        return executor.over_addresses(addresses, body)

    def read_text(self, key: str) -> Optional[str]:
        """A small object of the namespace (such as a lease), or None when there is none."""
        client = self._driver_client()
        try:
            body = call_with_retries(
                f"GetObject {key}",
                lambda: client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read(),
                self.policy,
                S3_FAILURES,
            )
        except Exception as exc:
            if error_code(exc) in ABSENT_CODES:
                return None
            raise StoreError(f"cannot read {key} in {self.namespace}: {error_code(exc)}") from None
        return body.decode("utf-8")

    def write_text(self, key: str, text: str, exclusive: bool = False) -> bool:
        """Write a small object; with `exclusive`, only if none exists (S3 conditional write, If-None-Match)."""
        client = self._driver_client()
        request: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key), "Body": text.encode("utf-8")}
        if exclusive:
            request["IfNoneMatch"] = "*"
        try:
            call_with_retries(f"PutObject {key}", lambda: client.put_object(**request), self.policy, S3_FAILURES)
        except Exception as exc:
            exists = error_code(exc) in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
            return self._write_failed(key, exclusive, exists, error_code(exc))
        return True

    def keys(self, prefix: str) -> list[str]:
        """Keys of the small objects under `prefix` (a lease's records, a hold's records), on the driver."""
        client = self._driver_client()
        start = self.key_prefix + self._under(prefix)

        def listed() -> list[str]:
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start)
            return [item["Key"][len(self.key_prefix) :] for page in pages for item in page.get("Contents", [])]

        try:
            return sorted(call_with_retries(f"ListObjectsV2 {start}", listed, self.policy, S3_FAILURES))
        except Exception as exc:
            raise StoreError(f"cannot list {prefix} in {self.namespace}: {error_code(exc)}") from None

    def modified_time(self, key: str) -> Optional[dt.datetime]:
        """The object's LastModified as the storage service stamped it (None when absent)."""
        client = self._driver_client()
        try:
            response = call_with_retries(
                f"HeadObject {key}",
                lambda: client.head_object(Bucket=self.bucket, Key=self._key(key)),
                self.policy,
                S3_FAILURES,
            )
        except Exception as exc:
            if error_code(exc) in ABSENT_CODES or error_code(exc) == "404":
                return None
            raise StoreError(f"cannot read the time of {key} in {self.namespace}: {error_code(exc)}") from None
        return response["LastModified"].astimezone(dt.timezone.utc)

    def remove(self, key: str) -> None:
        client = self._driver_client()
        try:
            call_with_retries(
                f"DeleteObject {key}",
                lambda: client.delete_object(Bucket=self.bucket, Key=self._key(key)),
                self.policy,
                S3_FAILURES,
            )
        except Exception as exc:
            raise StoreError(f"cannot remove {key} in {self.namespace}: {error_code(exc)}") from None

    def _key(self, key: str) -> str:
        return self.key_prefix + self._plain(key)

    def _driver_client(self) -> Any:
        if self._client is None:
            self._client = self.settings.resource().get_client()
        return self._client


@dataclass(frozen=True)
class S3Reader(NamespaceReader):
    """An S3 namespace listed whole, page after page, by one task (a fleet's are many and small)."""

    bucket: str
    key_prefix: str
    settings: S3Settings
    policy: RetryPolicy
    client_factory: Callable[[S3Settings], Any]
    reported: bool = False  # an S3 Inventory report lists the namespace: never listed here

    def connection(self) -> tuple[S3Settings, Callable[[S3Settings], Any]]:
        return self.settings, self.client_factory

    def connect(self) -> Any:
        return self.client_factory(self.settings)

    def listed(self, client: Any) -> Iterator[ObjectRow]:
        return (row for _, row in self.listed_versions(client))

    def listed_versions(self, client: Any) -> Iterator[tuple[Optional[str], ObjectRow]]:
        """Every object, each with its current version on a versioned bucket (its versioning read
        here, as S3Store.list reads it: StoreError naming the bucket when it cannot be)."""
        namespace = f"s3://{self.bucket}/{self.key_prefix}"
        if self.reported:
            raise StoreError(f"{namespace}: listed from an inventory report, not beside others")
        versioned = bucket_versioning(client, self.bucket, namespace, self.policy) in VERSIONED_STATES
        pages = list_current_versions if versioned else list_slice
        for item in pages(client, self.bucket, Slice(self.key_prefix), self.policy):
            row = object_row(item, self.key_prefix)
            if row is not None:
                yield (item.get("VersionId") or "null") if versioned else None, row

    def present(self, client: Any, addresses: list[str]) -> list[bool]:
        def probe(client: Any, address: str) -> tuple[Optional[Any], Optional[str]]:
            return head(client, self.bucket, self.key_prefix + address, self.policy)

        with ThreadPoolExecutor(executor.CLIENT_THREADS) as pool:
            return executor.probed(pool, client, probe, addresses)

    def deleted(self, client: Any, keys: list[str], mtimes_us: list[int], sizes: list[int]) -> list[executor.Row]:
        """S3Store.delete's rules on a bucket listed without versions: each key checked, then
        deleted by key; one that only got a delete marker (versioned since) is `failed`, its bytes kept."""
        acts = _Acts(self.bucket, self.key_prefix, self.policy, False)
        return executor.deleted_rows(client, acts, keys, mtimes_us, sizes)

    def deleted_versions(
        self, client: Any, keys: list[str], mtimes_us: list[int], sizes: list[int], versions: list[Optional[str]]
    ) -> list[executor.VersionedRow]:
        """S3Store.delete's rules on a versioned bucket: each key's current version must still be
        the listed one, and exactly that version is deleted."""
        acts = _Acts(self.bucket, self.key_prefix, self.policy, True)
        return executor.deleted_versions(client, acts, keys, mtimes_us, sizes, versions)

    def moved(self, client: Any, keys: list[str], destinations: list[str], mtimes_us: list[int]) -> list[executor.Row]:
        """S3Store.move's rules on a bucket listed without versions: never over an existing
        destination, the copied sources then deleted by key."""
        acts = _Acts(self.bucket, self.key_prefix, self.policy, False)
        return executor.moved_rows(client, acts, keys, destinations, mtimes_us)

    def moved_versions(
        self,
        client: Any,
        keys: list[str],
        destinations: list[str],
        mtimes_us: list[int],
        versions: list[Optional[str]],
    ) -> list[executor.VersionedRow]:
        """S3Store.move's rules on a versioned bucket: the listed version copied, then that version deleted."""
        acts = _Acts(self.bucket, self.key_prefix, self.policy, True)
        return executor.moved_versions(client, acts, keys, destinations, mtimes_us, versions)


@dataclass(frozen=True)
class _Acts:
    """The per-key check and copy and the batch delete of one namespace's actions (the listed
    versions on a `versioned` bucket, else the keys), as executor.deleting and executor.moving
    call them and as S3Reader calls them itself."""

    bucket: str
    key_prefix: str
    policy: RetryPolicy
    versioned: bool

    def check(
        self, client: Any, address: str, size: Any, modified: Any, version: Optional[str] = None
    ) -> tuple[Optional[Receipt], tuple[str, Optional[str]]]:
        refused = check_before_delete(
            client, self.bucket, self.key_prefix, address, size, modified, self.policy, version, self.versioned
        )
        return refused, (address, version)

    def copy(
        self, client: Any, source: str, destination: str, modified: Any, version: Optional[str] = None
    ) -> tuple[Receipt, Optional[tuple[str, Optional[str]]]]:
        copied = move_one(
            client, self.bucket, self.key_prefix, source, destination, modified, self.policy, version, self.versioned
        )
        return copied, ((copied.address, version) if copied.action == "moved" else None)

    def delete(self, client: Any, listed: list[tuple[str, Optional[str]]]) -> list[Receipt]:
        return _delete_listed(client, self.bucket, self.key_prefix, listed, self.policy, self.versioned)


@dataclass(frozen=True)
class S3ObjectIO(ObjectIO):
    """Whole objects of an S3 namespace, read and written by an executor's client."""

    bucket: str
    key_prefix: str
    settings: S3Settings
    policy: RetryPolicy
    client_factory: Callable[[S3Settings], Any]

    def connect(self) -> Any:
        return self.client_factory(self.settings)

    def get(self, client: Any, key: str) -> bytes:
        def read() -> bytes:
            return client.get_object(Bucket=self.bucket, Key=self.key_prefix + key)["Body"].read()

        try:
            return call_with_retries(f"GetObject {key}", read, self.policy, S3_FAILURES)
        except Exception as exc:
            raise StoreError(f"cannot read s3://{self.bucket}/{self.key_prefix}{key}: {error_code(exc)}") from None

    def put(self, client: Any, key: str, data: bytes) -> None:
        def write() -> None:
            client.put_object(Bucket=self.bucket, Key=self.key_prefix + key, Body=data)

        try:
            call_with_retries(f"PutObject {key}", write, self.policy, S3_FAILURES)
        except Exception as exc:
            raise StoreError(f"cannot write s3://{self.bucket}/{self.key_prefix}{key}: {error_code(exc)}") from None


def _batch_size(client: Any) -> int:
    """Keys per DeleteObjects request."""
    return DELETE_BATCH_SIZE


def _with_versions(rows: DataFrame, versioned: bool) -> DataFrame:
    """`rows` with a `version_id` column on a versioned bucket (null where none was listed: such
    a row is refused, never deleted by key)."""
    return with_version_id(rows) if versioned else rows


def _delete_listed(
    client: Any,
    bucket: str,
    key_prefix: str,
    listed: list[tuple[str, Optional[str]]],
    policy: RetryPolicy,
    versioned: bool,
) -> list[Receipt]:
    """One DeleteObjects of (address, listed version) pairs: the versions on a versioned bucket, else the keys."""
    addresses = [address for address, _ in listed]
    versions = [str(version) for _, version in listed] if versioned else None
    return delete_batch(client, bucket, key_prefix, addresses, policy, versions)
