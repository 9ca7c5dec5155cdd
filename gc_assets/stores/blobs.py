"""The engine the Azure and GCS stores share (docs/design.md §7): the Spark side of listing,
deleting, moving and checking objects, written once against `BlobClient`, the few calls a
cloud's SDK must provide.

Executors build one client per partition from plain settings (endpoints, never secrets).
Every call is retried on the cloud's throttling codes with the stores' backoff, within a
deadline of one attempt at the settings' timeouts (an endpoint that never answers is named
within two attempts: NoAnswer; stores/retries.py). Unlike S3, both clouds delete and copy on
a condition: the delete of a candidate is conditional on the version (ETag, generation) its
pre-delete check saw, so an object rewritten in between is never deleted; a move copies only
when the destination is missing and the source has that version. Slices are the S3 store's
too (stores/slices.py).
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Optional, TypeVar

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from gc_assets.core.spark import local_frame
from gc_assets.core.uris import is_plain_key
from gc_assets.stores import executor
from gc_assets.stores.base import INVENTORY_SCHEMA, NamespaceReader, ObjectIO, ObjectRow, Store, StoreError
from gc_assets.stores.executor import Receipt, floor_to_second
from gc_assets.stores.retries import Failures, RetryPolicy, Timeouts, call_with_retries
from gc_assets.stores.slices import (
    DISCOVERY_PAGE_SIZE,
    MAX_FANOUT,
    SLICE_DEPTH,
    SLICE_SCHEMA,
    DelimiterPage,
    Slice,
    discover_slices,
)

log = logging.getLogger("gc_assets.stores.blobs")

R = TypeVar("R")

ABSENT = "already_absent"  # what BlobClient.delete_batch reports for a key that was not there


@dataclass(frozen=True)
class BlobInfo:
    key: str  # the full key in the container or bucket
    size: int
    modified: dt.datetime
    version: str  # Azure ETag, GCS generation: what conditional requests name
    digest: Optional[str] = None  # the content's MD5 as the store keeps it (base64), when it keeps one

    def same_bytes(self, other: Optional["BlobInfo"]) -> bool:
        """Whether `other` holds this object's bytes, as far as the store can tell: equal sizes and
        equal digests; an unknown digest is never equal."""
        return other is not None and other.size == self.size and self.digest is not None and other.digest == self.digest


class BlobClient(ABC):
    """One cloud's calls on one container or bucket; raises the SDK's own errors."""

    batch_size: int  # keys per batch delete request (Azure 256, GCS 100)

    @abstractmethod
    def error_code(self, exc: BaseException) -> str:
        """The service's error code (`ServerBusy`, `429`, `BlobNotFound`), else the exception's type."""

    @abstractmethod
    def is_retryable(self, exc: BaseException) -> bool:
        """Throttling, 5xx and connection failures; never a 4xx such as 403 or 404."""

    @abstractmethod
    def timed_out_endpoint(self, exc: BaseException) -> Optional[str]:
        """The endpoint (`scheme://host:port`) when `exc` is a connect or read timeout, else None."""

    @abstractmethod
    def is_absent(self, exc: BaseException) -> bool:
        """The object (or container) is not there."""

    @abstractmethod
    def is_condition_failed(self, exc: BaseException) -> bool:
        """A conditional request was refused: the destination exists, or the version changed."""

    @abstractmethod
    def children(self, prefix: str, page_size: int) -> DelimiterPage:
        """The first delimiter page under `prefix` (driver-side slice discovery)."""

    @abstractmethod
    def list(self, piece: Slice, policy: RetryPolicy) -> Iterator[BlobInfo]:
        """Objects of one slice, in key order, a page at a time (each page one call retried under `policy`)."""

    @abstractmethod
    def head(self, key: str) -> Optional[BlobInfo]:
        """The object's properties, or None when it is absent."""

    @abstractmethod
    def delete_batch(self, items: list[tuple[str, str]]) -> dict[str, Optional[str]]:
        """Delete (key, version) pairs in one batch request, each only at its version: per key
        None (deleted), ABSENT, or the error code; a failure of the whole request raises."""

    @abstractmethod
    def copy_if_absent(self, source: str, destination: str, version: str) -> str:
        """Copy `source` at `version` to a missing `destination`; the destination's new version."""

    @abstractmethod
    def read(self, key: str) -> bytes:
        """The whole content of a small object."""

    @abstractmethod
    def write(self, key: str, data: bytes, exclusive: bool) -> None:
        """Write a small object; with `exclusive` only when none exists (a refusal is a condition failure)."""

    @abstractmethod
    def remove(self, key: str) -> None:
        """Delete one object unconditionally."""

    @abstractmethod
    def keys(self, prefix: str) -> list[str]:
        """Every key under `prefix`."""


class BlobSettings(ABC):
    """Where a cloud's service is and how to reach one container: plain, picklable data."""

    timeouts: Timeouts  # what each request waits at most; the store's retry deadline follows them

    @abstractmethod
    def client(self, container: str) -> BlobClient:
        """A client for `container` (bucket), credentials from the cloud's standard chain."""


def settings_client(settings: BlobSettings, container: str) -> BlobClient:
    return settings.client(container)


def retried(client: BlobClient, what: str, operation: Callable[[], R], policy: RetryPolicy) -> R:
    failures = Failures(client.is_retryable, client.error_code, client.timed_out_endpoint)
    return call_with_retries(what, operation, policy, failures)


def inventory_frame(items: list[BlobInfo], key_prefix: str) -> pd.DataFrame:
    """Objects as INVENTORY_SCHEMA rows, keys relative to the namespace; folder markers left out."""
    rows = [(i.key[len(key_prefix) :], i.size, i.modified, i.version) for i in items if not i.key.endswith("/")]
    frame = pd.DataFrame(rows, columns=["address", "size", "last_modified", "etag"])
    frame["last_modified"] = pd.to_datetime(frame["last_modified"], utc=True)
    return frame


def head(client: BlobClient, key: str, policy: RetryPolicy) -> tuple[Optional[BlobInfo], Optional[str]]:
    """(properties, None), (None, None) when absent, or (None, error code)."""
    try:
        return retried(client, f"head {key}", lambda: client.head(key), policy), None
    except Exception as exc:  # noqa: BLE001 - every failure becomes a receipt
        return None, client.error_code(exc)


def check_unchanged(
    client: BlobClient, key_prefix: str, address: str, size: Any, modified: Any, policy: RetryPolicy
) -> tuple[Optional[BlobInfo], Optional[Receipt]]:
    """The object's properties when it may be acted on, else the receipt that says why not."""
    if not is_plain_key(address):
        return None, Receipt(address, "failed", "unsafe_key")
    found, code = head(client, key_prefix + address, policy)
    if code is not None:
        return None, Receipt(address, "failed", code)
    if found is None:
        return None, Receipt(address, ABSENT)
    expected = floor_to_second(modified)
    if (expected is not None and floor_to_second(found.modified) != expected) or (
        size is not None and not pd.isna(size) and found.size != int(size)
    ):
        return None, Receipt(address, "failed", "modified_since_inventory")
    return found, None


def delete_checked(
    client: BlobClient, key_prefix: str, checked: list[tuple[str, str]], policy: RetryPolicy
) -> list[Receipt]:
    """Delete (address, version) pairs in batches of the client's size; per-key throttling is
    retried with backoff, per-key final errors become `failed`, a key without an answer too,
    unless the key is gone (see failed_unless_gone)."""
    receipts: dict[str, Receipt] = {}
    for start in range(0, len(checked), client.batch_size):
        pending = checked[start : start + client.batch_size]
        for attempt in range(policy.attempts):
            batch = [(key_prefix + a, v) for a, v in pending]
            try:
                answers = retried(
                    client, f"batch delete ({len(batch)} keys)", lambda: client.delete_batch(batch), policy
                )
            except Exception as exc:  # noqa: BLE001 - the whole batch failed for good
                receipts.update({a: Receipt(a, "failed", client.error_code(exc)) for a, _ in pending})
                break
            retry = []
            for address, version in pending:
                key = key_prefix + address
                if key not in answers:
                    receipts[address] = failed_unless_gone(client, key_prefix, address, "no_result", policy)
                elif answers[key] is None:
                    receipts[address] = Receipt(address, "deleted")
                elif answers[key] == ABSENT:
                    receipts[address] = Receipt(address, ABSENT)
                elif answers[key] in RETRYABLE_KEY_CODES and attempt + 1 < policy.attempts:
                    retry.append((address, version))
                else:
                    receipts[address] = failed_unless_gone(client, key_prefix, address, answers[key], policy)
            if not retry:
                break
            pause = policy.delay(attempt, random.Random())
            log.warning("batch delete: %d keys throttled, retrying in %.3fs", len(retry), pause)
            time.sleep(pause)
            pending = retry
    return [receipts.get(a, Receipt(a, "failed", "no_result")) for a, _ in checked]


def failed_unless_gone(client: BlobClient, key_prefix: str, address: str, code: str, policy: RetryPolicy) -> Receipt:
    """A key its batch refused, looked at once more: when a batch's answer is lost after it acted,
    its retry's conditional delete of the removed object is refused (Azure answers 412), and an
    object that is gone must not be reported as left in place."""
    found, error = head(client, key_prefix + address, policy)
    return Receipt(address, ABSENT) if found is None and error is None else Receipt(address, "failed", code)


# Per-key answers of a batch that are worth another try (Azure's and GCS's throttling and 5xx).
RETRYABLE_KEY_CODES = frozenset({"ServerBusy", "OperationTimedOut", "InternalError", "429", "500", "502", "503", "504"})


def move_checked(
    client: BlobClient, key_prefix: str, source: str, destination: str, modified: Any, policy: RetryPolicy
) -> tuple[Receipt, Optional[str]]:
    """Copy an unchanged source to a missing destination: (receipt, the source version copied).

    A destination that already holds the source's bytes (same size and digest) is the copy of
    an earlier attempt whose answer was lost, or of a move killed before its source was
    removed: the move goes on to remove the source. Any other destination is never overwritten.
    """
    if not is_plain_key(destination):
        return Receipt(source, "failed", "unsafe_key"), None
    found, refused = check_unchanged(client, key_prefix, source, None, modified, policy)
    if refused is not None or found is None:
        return refused or Receipt(source, ABSENT), None
    # Checked first as well: an emulator may ignore the copy's condition (fake-gcs-server does).
    existing, code = head(client, key_prefix + destination, policy)
    if found.same_bytes(existing):
        return Receipt(source, "moved"), found.version
    if existing is not None or code is not None:
        return Receipt(source, "failed", code or "destination_exists"), None
    try:
        copied = retried(
            client,
            f"copy {source}",
            lambda: client.copy_if_absent(key_prefix + source, key_prefix + destination, found.version),
            policy,
        )
    except Exception as exc:  # noqa: BLE001 - every failure becomes a receipt
        if client.is_condition_failed(exc):  # often a retry after a copy whose answer was lost
            landed, _ = head(client, key_prefix + destination, policy)
            if found.same_bytes(landed):
                return Receipt(source, "moved"), found.version
            return Receipt(source, "failed", "destination_exists_or_source_changed"), None
        return (
            Receipt(source, ABSENT) if client.is_absent(exc) else Receipt(source, "failed", client.error_code(exc))
        ), None
    landed, code = head(client, key_prefix + destination, policy)
    if landed is None or landed.version != copied:
        return Receipt(source, "failed", code or "destination_changed"), None
    return Receipt(source, "moved"), found.version


@dataclass
class BlobStore(Store):
    """The store of one namespace on a cloud with a BlobClient (Azure Blob / ADLS Gen2, GCS)."""

    namespace: str
    container: str  # the Azure container or GCS bucket
    key_prefix: str  # '' or ends with '/'
    settings: BlobSettings
    policy: RetryPolicy = field(default_factory=RetryPolicy)  # its timeouts become the settings'
    # Builds an executor's client from (settings, container); replaceable (picklable) so tests inject faults.
    client_factory: Callable[[BlobSettings, str], BlobClient] = settings_client
    slice_depth: int = SLICE_DEPTH
    fanout: int = MAX_FANOUT
    discovery_page_size: int = DISCOVERY_PAGE_SIZE

    def __post_init__(self) -> None:
        self.policy = replace(self.policy, timeouts=self.settings.timeouts)
        self._client: Optional[BlobClient] = None

    def _driver(self) -> BlobClient:
        if self._client is None:
            self._client = self.client_factory(self.settings, self.container)
        return self._client

    def _parts(self) -> tuple[str, str, BlobSettings, RetryPolicy, Callable[[BlobSettings, str], BlobClient]]:
        return self.container, self.key_prefix, self.settings, self.policy, self.client_factory

    def slices(self, root: str) -> list[Slice]:
        client = self._driver()

        def page(prefix: str) -> DelimiterPage:
            return retried(
                client, f"list {prefix}", lambda: client.children(prefix, self.discovery_page_size), self.policy
            )

        try:
            return discover_slices(page, root, self.slice_depth, self.fanout)
        except Exception as exc:
            raise StoreError(f"namespace {self.namespace} cannot be listed: {client.error_code(exc)}") from None

    def list(self, spark: SparkSession, prefix: str = "") -> DataFrame:
        """Every object of the namespace, or only those under `prefix` (a directory key inside it)."""
        rows = executor.slice_rows(self.namespace, self.key_prefix, prefix, self.slices, log)
        if rows is None:
            return local_frame(spark, [], INVENTORY_SCHEMA)
        container, key_prefix, settings, policy, factory = self._parts()
        body = executor.listing(
            lambda: factory(settings, container),
            lambda client, row: client.list(Slice.of_row(row), policy),
            lambda batch: inventory_frame(batch, key_prefix),
            self.namespace,
            log,
        )
        return executor.over_slices(spark, rows, SLICE_SCHEMA, body)

    def delete(self, spark: SparkSession, candidates: DataFrame) -> DataFrame:
        acts = _Acts(self.key_prefix, self.policy)
        return executor.deleting(spark, candidates, self.reader().connect, _batch_size, acts.check, acts.delete)

    def move(self, spark: SparkSession, moves: DataFrame) -> DataFrame:
        acts = _Acts(self.key_prefix, self.policy)
        return executor.moving(spark, moves, self.reader().connect, _batch_size, acts.copy, acts.delete)

    def exists(self, spark: SparkSession, addresses: DataFrame) -> DataFrame:
        container, key_prefix, settings, policy, factory = self._parts()
        body = executor.existence(
            lambda: factory(settings, container), lambda client, address: head(client, key_prefix + address, policy)
        )
        return executor.over_addresses(addresses, body)

    def object_io(self) -> "BlobObjectIO":
        return BlobObjectIO(*self._parts())

    def reader(self) -> "BlobReader":
        return BlobReader(*self._parts())

    def read_text(self, key: str) -> Optional[str]:
        """A small object of the namespace (such as a lease), or None when there is none."""
        client = self._driver()
        try:
            return retried(client, f"read {key}", lambda: client.read(self._key(key)), self.policy).decode("utf-8")
        except StoreError:
            raise
        except Exception as exc:
            if client.is_absent(exc):
                return None
            raise StoreError(f"cannot read {key} in {self.namespace}: {client.error_code(exc)}") from None

    def write_text(self, key: str, text: str, exclusive: bool = False) -> bool:
        """Write a small object; with `exclusive`, only if none exists (If-None-Match: *, ifGenerationMatch=0)."""
        client = self._driver()
        try:
            retried(
                client,
                f"write {key}",
                lambda: client.write(self._key(key), text.encode("utf-8"), exclusive),
                self.policy,
            )
        except StoreError:
            raise
        except Exception as exc:
            return self._write_failed(key, exclusive, client.is_condition_failed(exc), client.error_code(exc))
        return True

    def keys(self, prefix: str) -> list[str]:
        """Keys of the small objects under `prefix` (a lease's records, a hold's records), on the driver."""
        client = self._driver()
        start = self.key_prefix + self._under(prefix)
        try:
            found = retried(client, f"list {prefix}", lambda: client.keys(start), self.policy)
        except Exception as exc:
            raise StoreError(f"cannot list {prefix} in {self.namespace}: {client.error_code(exc)}") from None
        return sorted(k[len(self.key_prefix) :] for k in found)

    def modified_time(self, key: str) -> Optional[dt.datetime]:
        """The object's modification time as the storage service stamped it (None when absent)."""
        client = self._driver()
        found, code = head(client, self._key(key), self.policy)
        if code is not None:
            raise StoreError(f"cannot read the time of {key} in {self.namespace}: {code}")
        return None if found is None else found.modified.astimezone(dt.timezone.utc)

    def remove(self, key: str) -> None:
        client = self._driver()
        try:
            retried(client, f"delete {key}", lambda: client.remove(self._key(key)), self.policy)
        except Exception as exc:
            if not client.is_absent(exc):
                raise StoreError(f"cannot remove {key} in {self.namespace}: {client.error_code(exc)}") from None

    def _key(self, key: str) -> str:
        return self.key_prefix + self._plain(key)


@dataclass(frozen=True)
class BlobObjectIO(ObjectIO):
    """Whole objects of an Azure or GCS namespace, read and written by an executor's client."""

    container: str
    key_prefix: str
    settings: BlobSettings
    policy: RetryPolicy
    client_factory: Callable[[BlobSettings, str], BlobClient]

    def connect(self) -> BlobClient:
        return self.client_factory(self.settings, self.container)

    def get(self, client: BlobClient, key: str) -> bytes:
        try:
            return retried(client, f"read {key}", lambda: client.read(self.key_prefix + key), self.policy)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(
                f"cannot read {self.key_prefix}{key} in {self.container}: {client.error_code(exc)}"
            ) from None

    def put(self, client: BlobClient, key: str, data: bytes) -> None:
        try:
            retried(client, f"write {key}", lambda: client.write(self.key_prefix + key, data, False), self.policy)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(
                f"cannot write {self.key_prefix}{key} in {self.container}: {client.error_code(exc)}"
            ) from None


@dataclass(frozen=True)
class _Acts:
    """The per-key check and copy and the batch delete of one namespace's actions, as
    executor.deleting and executor.moving call them and as BlobReader calls them itself."""

    key_prefix: str
    policy: RetryPolicy

    def check(self, client: BlobClient, address: str, size: Any, modified: Any) -> tuple[Optional[Receipt], Any]:
        found, refused = check_unchanged(client, self.key_prefix, address, size, modified, self.policy)
        return refused, (None if found is None else (address, found.version))

    def copy(self, client: BlobClient, source: str, destination: str, modified: Any) -> tuple[Receipt, Any]:
        copied, version = move_checked(client, self.key_prefix, source, destination, modified, self.policy)
        return copied, (None if version is None else (copied.address, version))

    def delete(self, client: BlobClient, checked: list[tuple[str, str]]) -> list[Receipt]:
        return delete_checked(client, self.key_prefix, checked, self.policy)


@dataclass(frozen=True)
class BlobReader(NamespaceReader):
    """An Azure or GCS namespace listed whole by one task, probed and acted on beside other
    namespaces (a set's tables are many and small), with the store's own checks: a delete is
    conditional on the version its check saw, a move never overwrites."""

    container: str
    key_prefix: str
    settings: BlobSettings
    policy: RetryPolicy
    client_factory: Callable[[BlobSettings, str], BlobClient]

    def connection(self) -> tuple[BlobSettings, str, Callable[[BlobSettings, str], BlobClient]]:
        return self.settings, self.container, self.client_factory

    def connect(self) -> BlobClient:
        return self.client_factory(self.settings, self.container)

    def listed(self, client: BlobClient) -> Iterator[ObjectRow]:
        for item in client.list(Slice(self.key_prefix), self.policy):
            if not item.key.endswith("/"):  # a folder marker
                modified_us = pd.Timestamp(item.modified).value // 1000
                yield item.key[len(self.key_prefix) :], item.size, modified_us, item.version

    def present(self, client: BlobClient, addresses: list[str]) -> list[bool]:
        def probe(client: BlobClient, address: str) -> tuple[Optional[BlobInfo], Optional[str]]:
            return head(client, self.key_prefix + address, self.policy)

        with ThreadPoolExecutor(executor.CLIENT_THREADS) as pool:
            return executor.probed(pool, client, probe, addresses)

    def deleted(
        self, client: BlobClient, keys: list[str], mtimes_us: list[int], sizes: list[int]
    ) -> list[executor.Row]:
        return executor.deleted_rows(client, _Acts(self.key_prefix, self.policy), keys, mtimes_us, sizes)

    def moved(
        self, client: BlobClient, keys: list[str], destinations: list[str], mtimes_us: list[int]
    ) -> list[executor.Row]:
        return executor.moved_rows(client, _Acts(self.key_prefix, self.policy), keys, destinations, mtimes_us)


def _batch_size(client: BlobClient) -> int:
    """Keys per batch delete request: the client's (Azure 256, GCS 100)."""
    return client.batch_size
