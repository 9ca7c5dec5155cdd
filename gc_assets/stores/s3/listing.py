"""Listing a namespace in parallel: the driver discovers slices with delimiter listings a
bounded depth down; a prefix with too many children is cut into contiguous key ranges, so a
flat prefix with millions of keys is still listed in parallel; executors paginate each slice.

On a versioned bucket executors page ListObjectVersions instead and keep each key's current
version with its VersionId, the version a delete or move names later. Its pages hold every
version and delete marker, so it costs what ListObjectsV2 costs while keys have one version
each, and one more page per 1000 noncurrent versions or delete markers (which the bucket's
lifecycle rule expires)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

import pandas as pd
from pyspark.sql import types as T

from gc_assets.stores.base import VERSIONED_INVENTORY_SCHEMA, ObjectRow, rows_to_frame
from gc_assets.stores.s3.client import RetryPolicy, call_with_retries

SLICE_DEPTH = 2


MAX_FANOUT = 32  # at most this many slices per discovered prefix


DISCOVERY_PAGE_SIZE = 1000  # a prefix with more children than one page is cut by key ranges


# Where a too-large prefix is cut: before each of these characters after the prefix.
RANGE_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


# The largest code point: a key between `s[:-1] + pred(s[-1]) + MAX_CHAR` and `s` is not realistic.
MAX_CHAR = "\U0010ffff"


@dataclass(frozen=True)
class Slice:
    """Keys under `prefix` (only those directly under it unless `recursive`), with start <= key < end."""

    prefix: str
    recursive: bool = True
    start: Optional[str] = None
    end: Optional[str] = None

    @classmethod
    def of_row(cls, row: dict[str, Any]) -> "Slice":
        """The slice of a row of _SLICE_SCHEMA (as an executor receives it)."""
        return cls(row["prefix"], bool(row["recursive"]), row["start"], row["end"])

    def row(self) -> tuple[str, bool, Optional[str], Optional[str]]:
        """The slice as a row of _SLICE_SCHEMA."""
        return self.prefix, self.recursive, self.start, self.end

    def holds(self, key: str) -> bool:
        if not key.startswith(self.prefix):
            return False
        if not self.recursive and "/" in key[len(self.prefix) :]:
            return False
        return (self.start is None or key >= self.start) and (self.end is None or key < self.end)


def tile(prefix: str, boundaries: Iterable[str]) -> list[Slice]:
    """Contiguous recursive slices that together hold every key under `prefix`, cut at `boundaries`."""
    cuts = sorted(set(b for b in boundaries if b.startswith(prefix) and b != prefix))
    edges: list[Optional[str]] = [None, *cuts, None]
    return [Slice(prefix, True, lo, hi) for lo, hi in zip(edges, edges[1:])]


def alphabet_cuts(prefix: str) -> list[str]:
    return [prefix + c for c in RANGE_ALPHABET]


def grouped_cuts(children: list[str], groups: int) -> list[str]:
    """Cut points that split sorted `children` into at most `groups` runs of similar length."""
    if len(children) <= 1 or groups <= 1:
        return []
    step = -(-len(children) // groups)
    return children[step::step]


def start_after(start: str) -> str:
    """A StartAfter value just below `start` (ListObjectsV2 starts strictly after it)."""
    last = start[-1]
    return start[:-1] + chr(ord(last) - 1) + MAX_CHAR if ord(last) > 0 else start[:-1]


@dataclass(frozen=True)
class DelimiterPage:
    children: list[str]  # common prefixes, sorted
    has_objects: bool  # objects directly under the prefix
    truncated: bool


def discover_slices(
    list_page: Callable[[str], DelimiterPage],
    root: str,
    depth: int = SLICE_DEPTH,
    fanout: int = MAX_FANOUT,
) -> list[Slice]:
    """Slices that together hold every key under `root`, each once.

    A prefix whose children fit one delimiter page is descended into until `depth`;
    below that, or when it has more than `fanout` children, its children are grouped
    into at most `fanout` key ranges; a prefix with more children than a page is cut
    by the first character after it.
    """

    def visit(prefix: str, level: int) -> list[Slice]:
        page = list_page(prefix)
        if page.truncated:
            return tile(prefix, alphabet_cuts(prefix))
        if level + 1 >= depth or len(page.children) > fanout:
            return tile(prefix, grouped_cuts(page.children, fanout))
        slices = [Slice(prefix, recursive=False)] if page.has_objects else []
        for child in page.children:
            slices.extend(visit(child, level + 1))
        return slices

    return visit(root, 0)


def list_slice(client: Any, bucket: str, piece: Slice, policy: RetryPolicy) -> Iterator[dict[str, Any]]:
    """ListObjectsV2 pages of one slice; keys outside it (at a range's edges) are dropped."""
    request: dict[str, Any] = {"Bucket": bucket, "Prefix": piece.prefix}
    if not piece.recursive:
        request["Delimiter"] = "/"
    if piece.start is not None:
        request["StartAfter"] = start_after(piece.start)
    while True:
        page = call_with_retries(
            f"ListObjectsV2 s3://{bucket}/{piece.prefix}", lambda: client.list_objects_v2(**request), policy
        )
        for item in page.get("Contents", []):
            key = item["Key"]
            if piece.end is not None and key >= piece.end:
                return
            if piece.holds(key):
                yield item
        if not page.get("IsTruncated"):
            return
        request["ContinuationToken"] = page["NextContinuationToken"]


def list_current_versions(client: Any, bucket: str, piece: Slice, policy: RetryPolicy) -> Iterator[dict[str, Any]]:
    """ListObjectVersions pages of one slice: each key's current version (IsLatest, not a delete
    marker), with its VersionId; keys outside the slice (at a range's edges) are dropped.

    A range's start is a KeyMarker just below it (S3 lists the keys after a KeyMarker).
    """
    request: dict[str, Any] = {"Bucket": bucket, "Prefix": piece.prefix}
    if not piece.recursive:
        request["Delimiter"] = "/"
    if piece.start is not None:
        request["KeyMarker"] = start_after(piece.start)
    while True:
        page = call_with_retries(
            f"ListObjectVersions s3://{bucket}/{piece.prefix}", lambda: client.list_object_versions(**request), policy
        )
        for item in page.get("Versions", []):
            key = item["Key"]
            if piece.end is not None and key >= piece.end:
                return
            if item.get("IsLatest") and piece.holds(key):
                yield item
        if not page.get("IsTruncated"):
            return
        request["KeyMarker"] = page["NextKeyMarker"]
        if page.get("NextVersionIdMarker"):
            request["VersionIdMarker"] = page["NextVersionIdMarker"]
        else:
            request.pop("VersionIdMarker", None)


def object_row(item: dict[str, Any], key_prefix: str) -> Optional[ObjectRow]:
    """A ListObjectsV2 item as an ObjectRow, its key relative to the namespace; None for a folder
    marker (a key ending in '/'), which is not data."""
    key = item["Key"]
    if key.endswith("/"):
        return None
    modified_us = round(item["LastModified"].timestamp() * 1_000_000)
    return key[len(key_prefix) :], int(item["Size"]), modified_us, str(item.get("ETag", "")).strip('"') or None


def inventory_rows(items: Iterable[dict[str, Any]], key_prefix: str) -> pd.DataFrame:
    """ListObjectsV2 items as INVENTORY_SCHEMA rows, keys relative to the namespace, folder markers left out."""
    return rows_to_frame([row for row in (object_row(item, key_prefix) for item in items) if row is not None])


def versioned_inventory_rows(items: Iterable[dict[str, Any]], key_prefix: str) -> pd.DataFrame:
    """ListObjectVersions items as VERSIONED_INVENTORY_SCHEMA rows (VersionId "null" for a version
    written while versioning was off or suspended), folder markers left out."""
    rows = []
    for item in items:
        row = object_row(item, key_prefix)
        if row is not None:
            rows.append((item.get("VersionId") or "null", *row))
    frame = rows_to_frame(rows, ("version_id",))
    return frame[VERSIONED_INVENTORY_SCHEMA.names]


_SLICE_SCHEMA = T.StructType(
    [
        T.StructField("prefix", T.StringType(), False),
        T.StructField("recursive", T.BooleanType(), False),
        T.StructField("start", T.StringType(), True),
        T.StructField("end", T.StringType(), True),
    ]
)
