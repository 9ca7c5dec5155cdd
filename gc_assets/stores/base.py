"""The small interface every storage backend implements (docs/design.md §7).

Listing, existence checks and deletion all run on Spark executors through
DataFrame APIs (mapInPandas), so the same code runs locally, on a cluster and over
Spark Connect; the driver only discovers prefix slices.
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core.uris import is_plain_key

INVENTORY_SCHEMA = T.StructType(
    [
        T.StructField("address", T.StringType(), False),
        T.StructField("size", T.LongType(), False),
        T.StructField("last_modified", T.TimestampType(), False),
        T.StructField("etag", T.StringType(), True),
    ]
)

ACTION_SCHEMA = T.StructType(
    [
        T.StructField("address", T.StringType(), False),
        T.StructField("action", T.StringType(), False),
        T.StructField("error", T.StringType(), True),
    ]
)

# On a versioned S3 bucket, each object's current version as listed (VersionId; "null" for a
# version written while versioning was off or suspended), and the version an action named.
VERSION_ID = T.StructField("version_id", T.StringType(), True)
VERSIONED_INVENTORY_SCHEMA = T.StructType([*INVENTORY_SCHEMA.fields, VERSION_ID])
VERSIONED_ACTION_SCHEMA = T.StructType([*ACTION_SCHEMA.fields, VERSION_ID])


def with_version_id(frame: DataFrame) -> DataFrame:
    """`frame` with a `version_id` column: its own, else null (a store that keeps no versions)."""
    return frame if "version_id" in frame.columns else frame.withColumn("version_id", F.lit(None).cast("string"))


def with_listed_versions(candidates: DataFrame, inventory: DataFrame, on: tuple[str, ...] = ("address",)) -> DataFrame:
    """The candidates with the version each was listed as (`version_id`, matched `on` the
    inventory's columns), when the inventory has versions."""
    if "version_id" not in inventory.columns or "version_id" in candidates.columns:
        return candidates
    return candidates.join(inventory.select(*on, "version_id"), list(on), "left")


EXISTS_SCHEMA = T.StructType(
    [T.StructField("address", T.StringType(), False), T.StructField("exists", T.BooleanType(), False)]
)

DELETE_BATCH_SIZE = 1000


class StoreError(RuntimeError):
    """The namespace cannot be listed or acted on; nothing was deleted."""


@dataclass(frozen=True)
class ListingReport:
    """Where a listing came from when not from storage itself: an S3 Inventory report."""

    manifest: str
    created_at: dt.datetime


# (key relative to the namespace, size, last change in microseconds since the epoch, etag or None)
ObjectRow = tuple[str, int, int, Optional[str]]


def rows_to_frame(rows: list[tuple[Any, ...]], carried: tuple[str, ...] = ()) -> pd.DataFrame:
    """Listed rows, (*carried, *ObjectRow), as (*carried, *INVENTORY_SCHEMA's columns)."""
    frame = pd.DataFrame(rows, columns=[*carried, "address", "size", "mtime_us", "etag"])
    frame["last_modified"] = pd.to_datetime(frame["mtime_us"], unit="us", utc=True)
    return frame[[*carried, "address", "size", "last_modified", "etag"]]


class NamespaceReader(ABC):
    """One namespace listed whole and probed from an executor, beside many others in the same
    tasks (stores.many, a fleet's small tables): plain data, so it travels to executors."""

    @abstractmethod
    def connection(self) -> Any:
        """What `connect` needs: readers with equal connections share one client in a task."""

    @abstractmethod
    def connect(self) -> Any:
        """The client `listed` and `present` use (None when they need none)."""

    @abstractmethod
    def listed(self, client: Any) -> Iterator[ObjectRow]:
        """Every object of the namespace: rows, not frames, so that a task's many small
        namespaces leave it in a few large batches (rows_to_frame)."""

    def listed_versions(self, client: Any) -> Iterator[tuple[Optional[str], ObjectRow]]:
        """Every object with the version an action must name (None where the store keeps no
        versions): a versioned S3 bucket's deletes and moves name the version that was listed."""
        return ((None, row) for row in self.listed(client))

    @abstractmethod
    def present(self, client: Any, addresses: list[str]) -> list[bool]:
        """Whether each address exists; StoreError when any answer is unknown (never False for it)."""

    def deleted(
        self, client: Any, keys: list[str], mtimes_us: list[int], sizes: list[int]
    ) -> list[tuple[str, str, Optional[str]]]:
        """Delete each key unchanged since its listing (its listed time and size, as far as
        Store.delete compares them), beside other namespaces' (a set of repositories swept
        together): (address, action, error) rows as Store.delete's. A store that cannot refuses,
        and its repositories are swept one by one."""
        raise StoreError("this store cannot act beside other namespaces")

    def moved(
        self, client: Any, keys: list[str], destinations: list[str], mtimes_us: list[int]
    ) -> list[tuple[str, str, Optional[str]]]:
        """Move each key to its destination (Store.move's rules), beside other namespaces'."""
        raise StoreError("this store cannot act beside other namespaces")

    def deleted_versions(
        self, client: Any, keys: list[str], mtimes_us: list[int], sizes: list[int], versions: list[Optional[str]]
    ) -> list[tuple[str, str, Optional[str], Optional[str]]]:
        """`deleted`, each key's listed version deleted (listed_versions): (address, action, error,
        version_id) rows as Store.delete's on a versioned bucket."""
        raise StoreError("this store lists no versions")

    def moved_versions(
        self,
        client: Any,
        keys: list[str],
        destinations: list[str],
        mtimes_us: list[int],
        versions: list[Optional[str]],
    ) -> list[tuple[str, str, Optional[str], Optional[str]]]:
        """`moved`, each key's listed version copied and then deleted (Store.move's rules on a
        versioned bucket)."""
        raise StoreError("this store lists no versions")


class ObjectIO(ABC):
    """Whole objects of one namespace read and written from an executor (gc_assets' state on an
    object store: Parquet parts of its frames): plain data, so it travels to executors."""

    @abstractmethod
    def connect(self) -> Any:
        """The client `get` and `put` use; one per task."""

    @abstractmethod
    def get(self, client: Any, key: str) -> bytes:
        """The object at `key` (relative to the namespace); StoreError when it cannot be read."""

    @abstractmethod
    def put(self, client: Any, key: str, data: bytes) -> None:
        """Write `data` at `key` (relative to the namespace); StoreError when it cannot be written."""


class Store(ABC):
    """One namespace's storage: distributed listing and actions, and small objects on the driver."""

    namespace: str
    listed_from_report: Optional[ListingReport] = None  # set by list() when it read a report

    @abstractmethod
    def list(self, spark: SparkSession, prefix: str = "") -> DataFrame:
        """Every object under the namespace (or under the directory key `prefix`), in INVENTORY_SCHEMA
        (VERSIONED_INVENTORY_SCHEMA where the store lists versions), keys relative to the namespace."""

    @abstractmethod
    def delete(self, spark: SparkSession, candidates: DataFrame) -> DataFrame:
        """Delete `candidates` (address, last_modified[, size][, version_id]) on executors; rows in
        ACTION_SCHEMA, or VERSIONED_ACTION_SCHEMA where a store deletes listed versions."""

    @abstractmethod
    def move(self, spark: SparkSession, moves: DataFrame) -> DataFrame:
        """Move each (address, destination) pair, both relative to the namespace; rows in ACTION_SCHEMA.

        action is `moved`, `already_absent` (the source is gone) or `failed` with the error
        code; the caller names a move (`trashed`, `restored`) in its receipts. A store that lists
        versions (VERSIONED_INVENTORY_SCHEMA) moves the `version_id` of each pair.
        """

    @abstractmethod
    def exists(self, spark: SparkSession, addresses: DataFrame) -> DataFrame:
        """Whether each address still exists, in EXISTS_SCHEMA."""

    def reader(self) -> NamespaceReader:
        """This namespace listed and probed beside others' (stores.many); a store that cannot be
        refuses, and its tables are collected one by one."""
        raise StoreError(f"namespace {self.namespace}: cannot be listed beside other namespaces")

    def object_io(self) -> ObjectIO:
        """Whole objects of this namespace from executors; a store that has no such client refuses."""
        raise StoreError(f"namespace {self.namespace}: cannot hold gc_assets' state")

    @abstractmethod
    def read_text(self, key: str) -> Optional[str]:
        """A small object of the namespace (a lease, a record), or None when there is none."""

    @abstractmethod
    def write_text(self, key: str, text: str, exclusive: bool = False) -> bool:
        """Write a small object; with `exclusive`, only if none exists (False when one does)."""

    @abstractmethod
    def keys(self, prefix: str) -> list[str]:
        """Keys of the small objects under `prefix`, listed on the driver."""

    @abstractmethod
    def remove(self, key: str) -> None:
        """Remove a small object; an absent one is not an error."""

    @abstractmethod
    def modified_time(self, key: str) -> Optional[dt.datetime]:
        """The object's modification time as the storage stamped it (None when absent)."""

    def _plain(self, key: str) -> str:
        """`key` itself when it is a plain key inside the namespace, else StoreError."""
        if not is_plain_key(key):
            raise StoreError(f"{key!r} is not a plain key inside {self.namespace}")
        return key

    def _write_failed(self, key: str, exclusive: bool, exists: bool, code: str) -> bool:
        """A failed write_text: False when it was exclusive and the object exists, else StoreError."""
        if exclusive and exists:
            return False
        raise StoreError(f"cannot write {key} in {self.namespace}: {code}") from None

    def _under(self, prefix: str) -> str:
        """The directory key `prefix`, checked plain, with its trailing '/' when it has one."""
        return self._plain(prefix.rstrip("/")) + ("/" if prefix.endswith("/") else "")
