"""The executor side of the S3, Azure and GCS stores, written once: the mapInPandas bodies
that list slices, check and delete, move and check existence, given each cloud's per-key and
per-batch calls.

Each body builds one client per partition (and, to act, one thread pool); actions go a chunk
at a time (at most one batch request's keys), every key ends in a receipt (`deleted`, `moved`,
`already_absent`, `failed` with the error code), never in a log line only.
"""

from __future__ import annotations

import datetime as dt
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from gc_assets.core.spark import local_frame, shuffle_partitions, task_count
from gc_assets.core.uris import is_plain_key
from gc_assets.stores.base import (
    ACTION_SCHEMA,
    EXISTS_SCHEMA,
    INVENTORY_SCHEMA,
    VERSIONED_ACTION_SCHEMA,
    StoreError,
)

CLIENT_THREADS = 16  # concurrent HEAD / copy requests per partition

PROGRESS_EVERY = 10_000  # objects between two progress lines of an executor

Body = Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]


@dataclass
class Receipt:
    address: str
    action: str
    error: Optional[str] = None
    version_id: Optional[str] = None  # the version acted on, where a store acts on listed versions

    def row(self) -> tuple[str, str, Optional[str]]:
        return self.address, self.action, self.error


def receipts_frame(receipts: list[Receipt], versioned: bool = False) -> pd.DataFrame:
    """ACTION_SCHEMA rows, or VERSIONED_ACTION_SCHEMA rows when `versioned`."""
    if versioned:
        rows = [(*r.row(), r.version_id) for r in receipts]
        return pd.DataFrame(rows, columns=VERSIONED_ACTION_SCHEMA.names)
    return pd.DataFrame([r.row() for r in receipts], columns=ACTION_SCHEMA.names)


def floor_to_second(value: Any) -> Optional[dt.datetime]:
    """S3 reports modification times to the second in HEAD and to the millisecond in listings."""
    if value is None or pd.isna(value):
        return None
    stamp = pd.Timestamp(value)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return stamp.floor("s").to_pydatetime()


def after_copy(copied: Receipt, removed: Optional[Receipt]) -> Receipt:
    """A copied object is moved once its source is gone; a source that stays is a failure to name."""
    if copied.action != "moved" or removed is None or removed.action in ("deleted", "already_absent"):
        return copied
    return Receipt(copied.address, "failed", f"copied_but_source_kept:{removed.error}")


def executor_log(logger: logging.Logger) -> logging.Logger:
    """`logger`, writing INFO to stderr (the executor's log) when nothing else is configured."""
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    return logger


# A check before a delete: (client, address, size, last_modified[, version_id]) -> (the receipt
# refusing it, or None with what the delete needs).
Check = Callable[..., tuple[Optional[Receipt], Any]]
# A copy: (client, source, destination, last_modified[, version_id]) -> (its receipt, what deletes
# the source once copied, or None).
Copy = Callable[..., tuple[Receipt, Any]]
# One batch delete, on one client, of what the checks or copies passed on.
Delete = Callable[[Any, list[Any]], list[Receipt]]


def deleting(
    spark: SparkSession,
    candidates: DataFrame,
    make_client: Callable[[], Any],
    chunk_size: Callable[[Any], int],
    check: Check,
    delete: Delete,
    versioned: bool = False,
) -> DataFrame:
    """Delete `candidates` (address, last_modified[, size]): each chunk's keys checked
    concurrently, those that passed deleted in one batch; ACTION_SCHEMA rows. When `versioned`,
    each check also gets the candidate's `version_id` and the rows are VERSIONED_ACTION_SCHEMA."""

    def act(client: Any, pool: ThreadPoolExecutor, chunk: pd.DataFrame) -> list[Receipt]:
        sizes = chunk["size"] if "size" in chunk else [None] * len(chunk)
        rows = zip(chunk["address"], sizes, chunk["last_modified"], *_versions(chunk, versioned))
        return checked_then_deleted(client, pool, rows, check, delete)

    columns = ["address", "last_modified"] + (["size"] if "size" in candidates.columns else [])
    columns += ["version_id"] if versioned else []
    return over_rows(spark, candidates, columns, _acting(make_client, chunk_size, act, versioned), versioned)


def moving(
    spark: SparkSession,
    moves: DataFrame,
    make_client: Callable[[], Any],
    chunk_size: Callable[[Any], int],
    copy: Copy,
    delete: Delete,
    versioned: bool = False,
) -> DataFrame:
    """Move (address, destination[, last_modified]) pairs: each chunk copied concurrently, the
    copied sources deleted in one batch; ACTION_SCHEMA rows. When `versioned`, each copy also
    gets the pair's `version_id` and the rows are VERSIONED_ACTION_SCHEMA."""

    def act(client: Any, pool: ThreadPoolExecutor, chunk: pd.DataFrame) -> list[Receipt]:
        modified = chunk["last_modified"] if "last_modified" in chunk else [None] * len(chunk)
        rows = zip(chunk["address"], chunk["destination"], modified, *_versions(chunk, versioned))
        return copied_then_deleted(client, pool, rows, copy, delete)

    columns = ["address", "destination"] + (["last_modified"] if "last_modified" in moves.columns else [])
    columns += ["version_id"] if versioned else []
    return over_rows(spark, moves, columns, _acting(make_client, chunk_size, act, versioned), versioned)


def checked_then_deleted(
    client: Any, pool: ThreadPoolExecutor, rows: Iterable[tuple[Any, ...]], check: Check, delete: Delete
) -> list[Receipt]:
    """Each row `check`ed on `pool`, those that passed deleted in one batch: a receipt for every row."""
    checks = list(pool.map(lambda row: check(client, *row), rows))
    settled = [refused for refused, _ in checks if refused is not None]
    passed = [token for refused, token in checks if refused is None]
    return settled + (delete(client, passed) if passed else [])


def copied_then_deleted(
    client: Any, pool: ThreadPoolExecutor, rows: Iterable[tuple[Any, ...]], copy: Copy, delete: Delete
) -> list[Receipt]:
    """Each row's source `copy`ed on `pool`, the copied sources deleted in one batch: a receipt for every row."""
    copied = list(pool.map(lambda row: copy(client, *row), rows))
    sources = [token for _, token in copied if token is not None]
    removed = {r.address: r for r in delete(client, sources)} if sources else {}
    return [after_copy(r, removed.get(r.address)) for r, _ in copied]


class Acts(Protocol):
    """A store's own per-key check and copy and its batch delete, as `deleting` and `moving` take them."""

    def check(self, client: Any, address: str, size: Any, modified: Any) -> tuple[Optional[Receipt], Any]: ...

    def copy(self, client: Any, source: str, destination: str, modified: Any) -> tuple[Receipt, Any]: ...

    def delete(self, client: Any, tokens: list[Any]) -> list[Receipt]: ...


Row = tuple[str, str, Optional[str]]  # (address, action, error)
VersionedRow = tuple[str, str, Optional[str], Optional[str]]  # (address, action, error, version_id)


def deleted_rows(client: Any, acts: Acts, keys: list[str], mtimes_us: list[int], sizes: list[int]) -> list[Row]:
    """NamespaceReader.deleted by a store's `acts`: each key checked against its listed time and
    size, those that passed deleted in batches."""
    return [r.row() for r in _deleted(client, acts, zip(keys, sizes, map(_listed_time, mtimes_us)))]


def deleted_versions(
    client: Any, acts: Acts, keys: list[str], mtimes_us: list[int], sizes: list[int], versions: list[Optional[str]]
) -> list[VersionedRow]:
    """NamespaceReader.deleted_versions by a store's `acts` (versioned): deleted_rows, each check
    and delete naming the key's listed version, each row the version acted on."""
    rows = zip(keys, sizes, map(_listed_time, mtimes_us), versions)
    return [(*r.row(), r.version_id) for r in _deleted(client, acts, rows)]


def _deleted(client: Any, acts: Acts, rows: Iterable[tuple[Any, ...]]) -> list[Receipt]:
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        return checked_then_deleted(client, pool, rows, acts.check, acts.delete)


def moved_rows(client: Any, acts: Acts, keys: list[str], destinations: list[str], mtimes_us: list[int]) -> list[Row]:
    """NamespaceReader.moved by a store's `acts`: each key copied to its destination, the copied
    sources then deleted in batches."""
    return [r.row() for r in _moved(client, acts, zip(keys, destinations, map(_listed_time, mtimes_us)))]


def moved_versions(
    client: Any,
    acts: Acts,
    keys: list[str],
    destinations: list[str],
    mtimes_us: list[int],
    versions: list[Optional[str]],
) -> list[VersionedRow]:
    """NamespaceReader.moved_versions by a store's `acts` (versioned): moved_rows, each copy and
    delete naming the key's listed version, each row the version acted on."""
    rows = zip(keys, destinations, map(_listed_time, mtimes_us), versions)
    return [(*r.row(), r.version_id) for r in _moved(client, acts, rows)]


def _moved(client: Any, acts: Acts, rows: Iterable[tuple[Any, ...]]) -> list[Receipt]:
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        return copied_then_deleted(client, pool, rows, acts.copy, acts.delete)


def _listed_time(mtime_us: int) -> pd.Timestamp:
    """A listed modification time, in microseconds since the epoch, as the checks compare it."""
    return pd.Timestamp(int(mtime_us), unit="us", tz="UTC")


def _versions(chunk: pd.DataFrame, versioned: bool) -> list[list[Optional[str]]]:
    """The chunk's listed versions as one more argument per row (None where none was listed), or none."""
    if not versioned:
        return []
    return [[None if pd.isna(v) else str(v) for v in chunk["version_id"]]]


def _acting(
    make_client: Callable[[], Any],
    chunk_size: Callable[[Any], int],
    act: Callable[[Any, ThreadPoolExecutor, pd.DataFrame], list[Receipt]],
    versioned: bool = False,
) -> Body:
    """A mapInPandas body: one client and pool per partition, `act` on chunks of `chunk_size(client)` rows."""

    def body(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        client = make_client()
        with ThreadPoolExecutor(CLIENT_THREADS) as pool:
            for frame in frames:
                size = chunk_size(client)
                for start in range(0, len(frame), size):
                    yield receipts_frame(act(client, pool, frame.iloc[start : start + size]), versioned)

    return body


Probe = Callable[[Any, str], tuple[Optional[Any], Optional[str]]]


def existence(make_client: Callable[[], Any], probe: Probe) -> Body:
    """A mapInPandas body in EXISTS_SCHEMA; `probe` gives (found or None, error code or None) per
    address, and any error fails the task: an unknown answer is never `exists = False`."""

    def check(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        client = make_client()
        with ThreadPoolExecutor(CLIENT_THREADS) as pool:
            for frame in frames:
                present = probed(pool, client, probe, frame["address"])
                yield pd.DataFrame({"address": frame["address"], "exists": present})

    return check


def probed(pool: ThreadPoolExecutor, client: Any, probe: Probe, addresses: Iterable[str]) -> list[bool]:
    """Whether each address exists, `probe` run on `pool`; StoreError when any answer is unknown."""
    addresses = list(addresses)
    found = list(pool.map(lambda a: probe(client, a), addresses))
    errors = [(a, code) for a, (_, code) in zip(addresses, found) if code is not None]
    if errors:
        raise StoreError(f"cannot tell whether objects exist: {errors[:5]}")
    return [response is not None for response, _ in found]


def listing(
    make_client: Callable[[], Any],
    list_slice: Callable[[Any, dict[str, Any]], Iterable[Any]],
    to_frame: Callable[[list[Any]], pd.DataFrame],
    label: str,
    logger: logging.Logger,
) -> Body:
    """A mapInPandas body from slice rows to INVENTORY_SCHEMA rows, a progress line every
    PROGRESS_EVERY objects."""

    def list_slices(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        client, progress, listed = make_client(), executor_log(logger), 0
        for frame in frames:
            for record in frame.to_dict("records"):
                batch: list[Any] = []
                for item in list_slice(client, record):
                    batch.append(item)
                    if len(batch) >= PROGRESS_EVERY:
                        listed += len(batch)
                        progress.info("%s: %d objects listed so far by this task", label, listed)
                        yield to_frame(batch)
                        batch = []
                listed += len(batch)
                if batch:
                    yield to_frame(batch)

    return list_slices


def slice_rows(
    namespace: str, key_prefix: str, prefix: str, slices: Callable[[str], list[Any]], logger: logging.Logger
) -> Optional[list[tuple]]:
    """The slice rows that list the namespace, or its directory key `prefix` (discovered by
    `slices` from the full key prefix); None when `prefix` is not a plain key."""
    start = prefix.strip("/")
    if start and not is_plain_key(start):
        return None
    found = slices(key_prefix + start + "/" if start else key_prefix)
    logger.info("listing %s/%s over %d slices", namespace, start, len(found))
    return [piece.row() for piece in found]


def over_slices(
    spark: SparkSession, rows: list[tuple], schema: Any, body: Body, listed: Any = INVENTORY_SCHEMA
) -> DataFrame:
    """The listing (rows in `listed`): one row a slice, as many tasks as slices up to the session's task count."""
    return local_frame(spark, rows, schema).repartition(task_count(spark, len(rows))).mapInPandas(body, listed)


def over_addresses(addresses: DataFrame, body: Body) -> DataFrame:
    """Whether each address exists (EXISTS_SCHEMA), checked where the addresses are."""
    return addresses.select("address").mapInPandas(body, EXISTS_SCHEMA)


def over_rows(
    spark: SparkSession, rows: DataFrame, columns: list[Any], body: Body, versioned: bool = False
) -> DataFrame:
    """Actions on `rows` (their `columns`), spread over the session's task count; ACTION_SCHEMA rows
    (VERSIONED_ACTION_SCHEMA when `versioned`)."""
    schema = VERSIONED_ACTION_SCHEMA if versioned else ACTION_SCHEMA
    return rows.select(*columns).repartition(shuffle_partitions(spark)).mapInPandas(body, schema)
