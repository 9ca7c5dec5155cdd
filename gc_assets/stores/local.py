"""Local filesystem store (`file://` namespaces).

The driver discovers directory slices a bounded depth down; executors walk each
slice with os.scandir. Symlinks are never followed and never listed: an object is a
regular file inside the namespace's real directory, and deletion re-checks that the
file it unlinks is still that regular file, unchanged since the inventory.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import stat
import threading
from dataclasses import dataclass
from typing import Iterator

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core.spark import local_frame
from gc_assets.core.uris import is_plain_key, local_path
from gc_assets.stores.base import (
    DELETE_BATCH_SIZE,
    EXISTS_SCHEMA,
    INVENTORY_SCHEMA,
    NamespaceReader,
    ObjectRow,
    Store,
    StoreError,
    rows_to_frame,
)
from gc_assets.stores.executor import over_rows, over_slices

SLICE_DEPTH = 2
LISTING_BATCH_ROWS = 10_000
_SLICE_SCHEMA = T.StructType(
    [T.StructField("directory", T.StringType(), False), T.StructField("recursive", T.BooleanType(), False)]
)


def discover_slices(root: str, depth: int = SLICE_DEPTH) -> list[tuple[str, bool]]:
    """Directories to list: those at `depth` recursively, shallower ones for their own files."""
    slices: list[tuple[str, bool]] = []
    frontier = [("", 0)]
    while frontier:
        relative, level = frontier.pop()
        if level == depth:
            slices.append((relative, True))
            continue
        slices.append((relative, False))
        with os.scandir(os.path.join(root, relative) if relative else root) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    frontier.append((f"{relative}/{entry.name}" if relative else entry.name, level + 1))
    return slices


# Simulated histories only (the demo, tests): judge local files by their modification time
# alone. A real lake must never set it: a file copied in with its mtime preserved would look old.
TRUST_MTIME_ENV_VAR = "GC_ASSETS_TRUST_LOCAL_MTIME"


def trust_mtime_from_environment() -> bool:
    return os.environ.get(TRUST_MTIME_ENV_VAR) == "1"


def changed_us(info: os.stat_result, trust_mtime: bool = False) -> int:
    """When a file last changed, in microseconds: max(mtime, ctime).

    A file copied or moved in with its modification time preserved is young by its
    ctime, so a writer's fresh file never looks old (docs/design.md §10).
    """
    if trust_mtime:
        return info.st_mtime_ns // 1000
    return max(info.st_mtime_ns, info.st_ctime_ns) // 1000


def _walk_slice(root: str, directory: str, recursive: bool, trust_mtime: bool) -> Iterator[ObjectRow]:
    """The regular files (no etag); symlinks are skipped."""
    pending = [directory]
    while pending:
        relative = pending.pop()
        try:
            entries = list(os.scandir(os.path.join(root, relative) if relative else root))
        except FileNotFoundError:
            continue  # removed since discovery: nothing to list
        for entry in entries:
            key = f"{relative}/{entry.name}" if relative else entry.name
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:
                continue  # not representable as a key; never a candidate
            if entry.is_dir(follow_symlinks=False):
                if recursive:
                    pending.append(key)
            elif entry.is_file(follow_symlinks=False):
                info = entry.stat(follow_symlinks=False)
                yield key, info.st_size, changed_us(info, trust_mtime), None


class LocalStore(Store):
    """The store of one `file://` namespace (see the module docstring); always listed, never from a report."""

    def __init__(self, namespace: str, trust_mtime: bool | None = None):
        self.namespace = namespace
        self.root = local_path(namespace)
        self.trust_mtime = trust_mtime_from_environment() if trust_mtime is None else trust_mtime

    def _real_root(self) -> str:
        if not os.path.isdir(self.root):
            raise StoreError(f"namespace {self.namespace} is not a readable directory")
        return os.path.realpath(self.root)

    def list(self, spark: SparkSession, prefix: str = "") -> DataFrame:
        """Every regular file under the namespace, or under `prefix` (a directory key) within it."""
        root = self._real_root()
        trust_mtime = self.trust_mtime
        start = prefix.strip("/")
        if start and not (is_plain_key(start) and os.path.isdir(os.path.join(root, start))):
            return local_frame(spark, [], INVENTORY_SCHEMA)
        slices = [
            (f"{start}/{d}" if d else start, r) if start else (d, r)
            for d, r in discover_slices(os.path.join(root, start))
        ]

        def list_slices(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            for frame in frames:
                for directory, recursive in zip(frame["directory"], frame["recursive"]):
                    batch: list[ObjectRow] = []
                    for row in _walk_slice(root, directory, bool(recursive), trust_mtime):
                        batch.append(row)
                        if len(batch) >= LISTING_BATCH_ROWS:
                            yield rows_to_frame(batch)
                            batch = []
                    if batch:
                        yield rows_to_frame(batch)

        return over_slices(spark, slices, _SLICE_SCHEMA, list_slices)

    def delete(self, spark: SparkSession, candidates: DataFrame) -> DataFrame:
        root = self._real_root()
        trust_mtime = self.trust_mtime

        def delete_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            for frame in frames:
                for start in range(0, len(frame), DELETE_BATCH_SIZE):
                    chunk = frame.iloc[start : start + DELETE_BATCH_SIZE]
                    results = [
                        _delete_one(root, key, int(expected), trust_mtime)
                        for key, expected in zip(chunk["address"], chunk["mtime_us"])
                    ]
                    yield pd.DataFrame(results, columns=["address", "action", "error"])

        columns = ["address", F.unix_micros("last_modified").alias("mtime_us")]
        return over_rows(spark, candidates, columns, delete_batches)

    def move(self, spark: SparkSession, moves: DataFrame) -> DataFrame:
        """Rename (address, destination) pairs inside the namespace; never overwrites a destination."""
        root = self._real_root()
        trust_mtime = self.trust_mtime
        has_mtime = "last_modified" in moves.columns

        def move_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            for frame in frames:
                for start in range(0, len(frame), DELETE_BATCH_SIZE):
                    chunk = frame.iloc[start : start + DELETE_BATCH_SIZE]
                    expected = chunk["mtime_us"] if has_mtime else [None] * len(chunk)
                    results = [
                        _move_one(
                            root,
                            source,
                            destination,
                            None if mtime is None or pd.isna(mtime) else int(mtime),
                            trust_mtime,
                        )
                        for source, destination, mtime in zip(chunk["address"], chunk["destination"], expected)
                    ]
                    yield pd.DataFrame(results, columns=["address", "action", "error"])

        columns = ["address", "destination"] + ([F.unix_micros("last_modified").alias("mtime_us")] if has_mtime else [])
        return over_rows(spark, moves, columns, move_batches)

    def read_text(self, key: str) -> str | None:
        try:
            with open(self._path(key), encoding="utf-8") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def write_text(self, key: str, text: str, exclusive: bool = False) -> bool:
        """Write a small object; with `exclusive`, only if it does not exist (False when it does).

        Either way a reader sees the old content or the new, never a partial file: the text
        is written to a temporary file first, then linked (exclusive) or renamed into place.
        """
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            if not exclusive:
                os.replace(temporary, path)
                return True
            try:
                os.link(temporary, path)  # fails when the name exists, atomically
            except FileExistsError:
                return False
            return True
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)

    def keys(self, prefix: str) -> list[str]:
        """Keys of the regular files under the directory key `prefix` (small objects, on the driver)."""
        start = self._plain(prefix.rstrip("/"))
        root = self._real_root()  # resolved once, not per key: a set reads the leases of every repository
        found = []
        for directory, _, files in os.walk(os.path.join(root, start)):
            relative = os.path.relpath(directory, root)
            found.extend(name if relative == "." else f"{relative}/{name}" for name in files)
        paths = {key: os.path.join(root, self._plain(key)) for key in found}
        return sorted(key for key, path in paths.items() if os.path.isfile(path) and not os.path.islink(path))

    def modified_time(self, key: str) -> dt.datetime | None:
        """The file's modification time as the filesystem stamped it (None when absent)."""
        try:
            return dt.datetime.fromtimestamp(os.stat(self._path(key)).st_mtime, tz=dt.timezone.utc)
        except FileNotFoundError:
            return None

    def remove(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def _path(self, key: str) -> str:
        plain = self._plain(key)  # refused before the root is looked at
        return os.path.join(self._real_root(), plain)

    def reader(self) -> "LocalReader":
        return LocalReader(self._real_root(), self.trust_mtime)

    def exists(self, spark: SparkSession, addresses: DataFrame) -> DataFrame:
        reader = self.reader()

        def check(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            for frame in frames:
                present = reader.present(None, list(frame["address"]))
                yield pd.DataFrame({"address": frame["address"], "exists": present})

        return addresses.select("address").mapInPandas(check, EXISTS_SCHEMA)


def _delete_one(root: str, key: str, expected_mtime_us: int, trust_mtime: bool) -> tuple[str, str, str | None]:
    """Unlink one regular file inside `root`, or say exactly why not."""
    if not is_plain_key(key):
        return key, "failed", "unsafe_key"
    path = os.path.join(root, key)
    try:
        refused = _refusal(root, key, path, expected_mtime_us, trust_mtime)
    except OSError as exc:
        return key, "failed", errno.errorcode.get(exc.errno or 0, "OSError")
    if refused is not None:
        return refused
    try:
        os.unlink(path)
    except FileNotFoundError:
        return key, "already_absent", None
    except OSError as exc:
        return key, "failed", errno.errorcode.get(exc.errno or 0, "OSError")
    return key, "deleted", None


def _move_one(
    root: str, key: str, destination: str, expected_mtime_us: int | None, trust_mtime: bool
) -> tuple[str, str, str | None]:
    """Move one regular file to `destination`, both inside `root`; an existing destination is kept.

    A hard link then an unlink: the bytes and modification time stay as they were, and a
    destination that appears meanwhile makes the link fail instead of being overwritten.
    """
    if not is_plain_key(key) or not is_plain_key(destination):
        return key, "failed", "unsafe_key"
    source_path, target_path = os.path.join(root, key), os.path.join(root, destination)
    refused = _refusal(root, key, source_path, expected_mtime_us, trust_mtime)
    if refused is not None:
        return refused
    try:
        os.makedirs(os.path.dirname(target_path), exist_ok=True)
        if not _inside(root, target_path):
            return key, "failed", "outside_namespace"
        os.link(source_path, target_path)
        os.unlink(source_path)
    except FileExistsError:
        return key, "failed", "destination_exists"
    except OSError as exc:
        return key, "failed", errno.errorcode.get(exc.errno or 0, "OSError")
    return key, "moved", None


def _refusal(
    root: str, key: str, path: str, expected_mtime_us: int | None, trust_mtime: bool
) -> tuple[str, str, str | None] | None:
    """None when `path` is a regular file inside `root`, unchanged since `expected_mtime_us`
    (when given), else the receipt that says why not; other OSErrors of its lstat are raised."""
    if not _inside(root, path):
        return key, "failed", "outside_namespace"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return key, "already_absent", None
    if not stat.S_ISREG(info.st_mode):
        return key, "failed", "not_a_regular_file"
    if expected_mtime_us is not None and changed_us(info, trust_mtime) != expected_mtime_us:
        return key, "failed", "modified_since_inventory"
    return None


def _inside(root: str, path: str) -> bool:
    """Whether the directory holding `path`, symlinks resolved, is `root` or below it."""
    parent = os.path.realpath(os.path.dirname(path))
    return parent == root or parent.startswith(root + os.sep)


@dataclass(frozen=True)
class LocalReader(NamespaceReader):
    """A local namespace walked whole by one task (a fleet's are many and small)."""

    root: str  # the namespace's real directory
    trust_mtime: bool

    def connection(self) -> None:
        return None

    def connect(self) -> None:
        return None

    def listed(self, client: None) -> Iterator[ObjectRow]:
        return _walk_slice(self.root, "", True, self.trust_mtime)

    def present(self, client: None, addresses: list[str]) -> list[bool]:
        return [os.path.lexists(os.path.join(self.root, key)) for key in addresses]

    def deleted(
        self, client: None, keys: list[str], mtimes_us: list[int], sizes: list[int]
    ) -> list[tuple[str, str, str | None]]:
        """LocalStore.delete's rule: a file is unchanged while its modification time is."""
        return [_delete_one(self.root, key, int(mtime), self.trust_mtime) for key, mtime in zip(keys, mtimes_us)]

    def moved(
        self, client: None, keys: list[str], destinations: list[str], mtimes_us: list[int]
    ) -> list[tuple[str, str, str | None]]:
        return [
            _move_one(self.root, key, destination, int(mtime), self.trust_mtime)
            for key, destination, mtime in zip(keys, destinations, mtimes_us)
        ]
