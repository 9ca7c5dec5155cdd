"""Listing one slice of an S3 namespace on an executor (the slices are stores/slices.py's).

On a versioned bucket executors page ListObjectVersions instead and keep each key's current
version with its VersionId, the version a delete or move names later. Its pages hold every
version and delete marker, so it costs what ListObjectsV2 costs while keys have one version
each, and one more page per 1000 noncurrent versions or delete markers (which the bucket's
lifecycle rule expires)."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional

import pandas as pd

from gc_assets.stores.base import VERSIONED_INVENTORY_SCHEMA, ObjectRow, rows_to_frame
from gc_assets.stores.retries import RetryPolicy, call_with_retries
from gc_assets.stores.s3.client import S3_FAILURES
from gc_assets.stores.slices import Slice

# The largest code point: a key between `s[:-1] + pred(s[-1]) + MAX_CHAR` and `s` is not realistic.
MAX_CHAR = "\U0010ffff"


def start_after(start: str) -> str:
    """A StartAfter (or KeyMarker) value just below `start` (S3 lists the keys strictly after it)."""
    last = start[-1]
    return start[:-1] + chr(ord(last) - 1) + MAX_CHAR if ord(last) > 0 else start[:-1]


def list_slice(client: Any, bucket: str, piece: Slice, policy: RetryPolicy) -> Iterator[dict[str, Any]]:
    """ListObjectsV2 pages of one slice; keys outside it (at a range's edges) are dropped."""

    def to_next_page(request: dict[str, Any], page: dict[str, Any]) -> None:
        request["ContinuationToken"] = page["NextContinuationToken"]

    return _slice_items(
        bucket, piece, policy, "ListObjectsV2", client.list_objects_v2, "StartAfter", "Contents", to_next_page
    )


def list_current_versions(client: Any, bucket: str, piece: Slice, policy: RetryPolicy) -> Iterator[dict[str, Any]]:
    """ListObjectVersions pages of one slice: each key's current version (IsLatest, not a delete
    marker), with its VersionId; keys outside the slice (at a range's edges) are dropped."""

    def to_next_page(request: dict[str, Any], page: dict[str, Any]) -> None:
        request["KeyMarker"] = page["NextKeyMarker"]
        if page.get("NextVersionIdMarker"):
            request["VersionIdMarker"] = page["NextVersionIdMarker"]
        else:
            request.pop("VersionIdMarker", None)

    versions = _slice_items(
        bucket, piece, policy, "ListObjectVersions", client.list_object_versions, "KeyMarker", "Versions", to_next_page
    )
    return (item for item in versions if item.get("IsLatest"))


def _slice_items(
    bucket: str,
    piece: Slice,
    policy: RetryPolicy,
    operation: str,
    call: Callable[..., dict[str, Any]],
    start_field: str,
    items_field: str,
    to_next_page: Callable[[dict[str, Any], dict[str, Any]], None],
) -> Iterator[dict[str, Any]]:
    """The items of a slice's listing pages (`call`, the client's `operation`), in key order:
    keys outside the slice are dropped and no page past its end is read. A range's start goes
    in the request's `start_field`, just below it; `to_next_page` sets a truncated page's
    markers in the request."""
    request: dict[str, Any] = {"Bucket": bucket, "Prefix": piece.prefix}
    if not piece.recursive:
        request["Delimiter"] = "/"
    if piece.start is not None:
        request[start_field] = start_after(piece.start)
    while True:
        page = call_with_retries(
            f"{operation} s3://{bucket}/{piece.prefix}", lambda: call(**request), policy, S3_FAILURES
        )
        for item in page.get(items_field, []):
            key = item["Key"]
            if piece.end is not None and key >= piece.end:
                return
            if piece.holds(key):
                yield item
        if not page.get("IsTruncated"):
            return
        to_next_page(request, page)


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
