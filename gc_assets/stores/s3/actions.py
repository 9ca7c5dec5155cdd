"""Acting on objects, on executors: batches of at most 1000 keys per DeleteObjects, each key
checked with HEAD first (gone: `already_absent`; changed since the inventory: `failed`), and
moves that never overwrite (conditional copy, read back, then delete the source).

On a versioned bucket (docs/design.md §7) every action names the version that was listed and
judged: a delete by key would only add a delete marker and keep every byte, and would hide a
version written since. A key whose current version is no longer the listed one was written
again: it is `skipped_revived` and nothing of it is deleted."""

from __future__ import annotations

import dataclasses
import random
import re
import time
from typing import Any, Optional

import pandas as pd

from gc_assets.core.uris import is_plain_key
from gc_assets.stores.base import DELETE_BATCH_SIZE
from gc_assets.stores.executor import Receipt, floor_to_second
from gc_assets.stores.retries import RetryPolicy, call_with_retries
from gc_assets.stores.s3.client import (
    ABSENT_CODES,
    RETRYABLE_CODES,
    S3_FAILURES,
    error_code,
    log,
)


def head(client: Any, bucket: str, key: str, policy: RetryPolicy) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """(HEAD response, None), (None, None) when the key is absent, or (None, error code)."""
    try:
        return call_with_retries(
            f"HeadObject {key}", lambda: client.head_object(Bucket=bucket, Key=key), policy, S3_FAILURES
        ), None
    except Exception as exc:  # noqa: BLE001 - every failure becomes a receipt
        code = error_code(exc)
        return (None, None) if code in ABSENT_CODES else (None, code)


# A version already gone, where a DeleteObjects names versions.
VERSION_ABSENT_CODES = ABSENT_CODES | {"NoSuchVersion"}


def current_version(found: dict[str, Any]) -> str:
    """The VersionId of a HEAD response; S3 leaves it out for the "null" version."""
    return str(found.get("VersionId") or "null")


def check_before_delete(
    client: Any,
    bucket: str,
    key_prefix: str,
    address: str,
    size: Optional[int],
    modified: Any,
    policy: RetryPolicy,
    version_id: Optional[str] = None,
    versioned: bool = False,
) -> Optional[Receipt]:
    """None when the object may be deleted, else the receipt that says why not. On a `versioned`
    bucket the key's current version must be the listed `version_id`; the receipt names it."""
    refused = _refusal(client, bucket, key_prefix, address, size, modified, policy, version_id, versioned)
    return dataclasses.replace(refused, version_id=version_id) if refused is not None and versioned else refused


def _refusal(
    client: Any,
    bucket: str,
    key_prefix: str,
    address: str,
    size: Optional[int],
    modified: Any,
    policy: RetryPolicy,
    version_id: Optional[str],
    versioned: bool,
) -> Optional[Receipt]:
    if not is_plain_key(address):
        return Receipt(address, "failed", "unsafe_key")
    if versioned and version_id is None:
        return Receipt(address, "failed", "version_not_listed")  # listed before versioning was on
    found, code = head(client, bucket, key_prefix + address, policy)
    if code is not None:
        return Receipt(address, "failed", code)
    if found is None:
        return Receipt(address, "already_absent")
    expected = floor_to_second(modified)
    changed = (expected is not None and floor_to_second(found["LastModified"]) != expected) or (
        size is not None and not pd.isna(size) and int(found["ContentLength"]) != int(size)
    )
    if versioned and (changed or current_version(found) != version_id):
        # A new version, or the "null" version replaced (a write while versioning is suspended).
        note = f"written again since the listing (current version {current_version(found)}): not deleted"
        return Receipt(address, "skipped_revived", note)
    if changed:
        return Receipt(address, "failed", "modified_since_inventory")
    return None


def delete_batch(
    client: Any,
    bucket: str,
    key_prefix: str,
    addresses: list[str],
    policy: RetryPolicy,
    versions: Optional[list[str]] = None,
) -> list[Receipt]:
    """One DeleteObjects call for at most 1000 keys (retried whole on throttling), per-key
    retryable errors retried, per-key final errors and missing results turned into `failed`.

    With `versions` (one per address), each key's listed version is deleted and named in its
    receipt. Without, a key that only got a delete marker (the bucket is versioned after all)
    is `failed`: its bytes are all still stored.
    """
    if len(addresses) > DELETE_BATCH_SIZE:
        raise ValueError(f"DeleteObjects takes at most {DELETE_BATCH_SIZE} keys, got {len(addresses)}")
    version_of = dict(zip(addresses, versions)) if versions is not None else {}

    def entry(address: str) -> dict[str, str]:
        if versions is None:
            return {"Key": key_prefix + address}
        return {"Key": key_prefix + address, "VersionId": version_of[address]}

    def receipt(address: str, action: str, error: Optional[str] = None) -> Receipt:
        return Receipt(address, action, error, version_of.get(address))

    absent = VERSION_ABSENT_CODES if versions is not None else ABSENT_CODES
    receipts: dict[str, Receipt] = {}
    pending = list(addresses)
    rng = random.Random()
    for attempt in range(policy.attempts):
        if not pending:
            break
        request = {"Objects": [entry(a) for a in pending], "Quiet": False}
        try:
            response = call_with_retries(
                f"DeleteObjects ({len(pending)} keys)",
                lambda: client.delete_objects(Bucket=bucket, Delete=request),
                policy,
                S3_FAILURES,
                rng=rng,
            )
        except Exception as exc:  # noqa: BLE001 - the whole batch failed for good
            code = error_code(exc)
            receipts.update({a: receipt(a, "failed", code) for a in pending})
            pending = []
            break
        for item in response.get("Deleted", []):
            address = item["Key"][len(key_prefix) :]
            only_marked = versions is None and item.get("DeleteMarker")
            receipts[address] = (
                receipt(address, "failed", "delete_marker_only") if only_marked else receipt(address, "deleted")
            )
        retry = []
        for item in response.get("Errors", []):
            address, code = item["Key"][len(key_prefix) :], str(item.get("Code", "UnknownError"))
            if code in absent:
                receipts[address] = receipt(address, "already_absent")
            elif code in RETRYABLE_CODES and attempt + 1 < policy.attempts:
                retry.append(address)
            else:
                receipts[address] = receipt(address, "failed", code)
        if retry:
            pause = policy.delay(attempt, rng)
            log.warning("DeleteObjects: %d keys failed with retryable errors, retrying in %.3fs", len(retry), pause)
            time.sleep(pause)
        pending = retry
    return [receipts.get(a, receipt(a, "failed", "no_result")) for a in addresses]


UNSUPPORTED_CONDITION_CODES = ("NotImplemented", "InvalidArgument", "InvalidRequest", "501")


def holds_same_bytes(
    client: Any, bucket: str, key_prefix: str, source: str, destination: str, policy: RetryPolicy
) -> bool:
    """Whether `destination` holds `source`'s bytes, as far as S3 can tell: equal sizes and equal
    single-part ETags (the content's MD5 without SSE-KMS). A multipart ETag, a KMS ETag that
    differs, or any failed HEAD is never equal, so nothing else is ever taken for the copy."""
    found, _ = head(client, bucket, key_prefix + source, policy)
    landed, _ = head(client, bucket, key_prefix + destination, policy)
    if found is None or landed is None:
        return False
    etag = str(found.get("ETag", "")).strip('"')
    return (
        re.fullmatch(r"[0-9a-f]{32}", etag) is not None
        and str(landed.get("ETag", "")).strip('"') == etag
        and int(landed.get("ContentLength", -1)) == int(found.get("ContentLength", -2))
    )


def move_one(
    client: Any,
    bucket: str,
    key_prefix: str,
    source: str,
    destination: str,
    modified: Any,
    policy: RetryPolicy,
    version_id: Optional[str] = None,
    versioned: bool = False,
) -> Receipt:
    """Copy `source` to `destination` (both relative); the caller deletes sources that were copied.

    The source must be unchanged since `modified` (when given); an existing destination is
    never overwritten: the copy carries `If-None-Match: *` (AWS S3 honours it; an endpoint
    that ignores it, such as moto 5.2, is still covered by the HEAD before the copy), and
    the destination is read back after it, so an object written there in between is a
    `failed` receipt and its source stays. A refused copy whose destination holds the source's
    bytes (holds_same_bytes: a retry meeting its own first copy) completes the move.
    On a `versioned` bucket the listed `version_id` is copied (and named in the receipt); the
    caller then deletes that version.
    """
    moved = _move(client, bucket, key_prefix, source, destination, modified, policy, version_id, versioned)
    return dataclasses.replace(moved, version_id=version_id) if versioned else moved


def _move(
    client: Any,
    bucket: str,
    key_prefix: str,
    source: str,
    destination: str,
    modified: Any,
    policy: RetryPolicy,
    version_id: Optional[str],
    versioned: bool,
) -> Receipt:
    if not is_plain_key(destination):
        return Receipt(source, "failed", "unsafe_key")
    refused = check_before_delete(client, bucket, key_prefix, source, None, modified, policy, version_id, versioned)
    if refused is not None:
        return refused
    found, code = head(client, bucket, key_prefix + destination, policy)
    if found is not None or code is not None:
        return Receipt(source, "failed", code or "destination_exists")
    copied_from = {"Bucket": bucket, "Key": key_prefix + source}
    if versioned:
        copied_from["VersionId"] = str(version_id)
    request = {"Bucket": bucket, "Key": key_prefix + destination, "CopySource": copied_from}
    try:
        try:
            result = call_with_retries(
                f"CopyObject {source}", lambda: client.copy_object(**request, IfNoneMatch="*"), policy, S3_FAILURES
            )
        except Exception as exc:  # noqa: BLE001 - an endpoint without conditional copies
            if error_code(exc) not in UNSUPPORTED_CONDITION_CODES:
                raise
            result = call_with_retries(
                f"CopyObject {source}", lambda: client.copy_object(**request), policy, S3_FAILURES
            )
    except Exception as exc:  # noqa: BLE001 - every failure becomes a receipt
        code = error_code(exc)
        if code in ("PreconditionFailed", "412"):
            # A retried copy whose first answer was lost meets its own copy: the move is done.
            done = holds_same_bytes(client, bucket, key_prefix, source, destination, policy)
            return Receipt(source, "moved") if done else Receipt(source, "failed", "destination_exists")
        return Receipt(source, "already_absent") if code in VERSION_ABSENT_CODES else Receipt(source, "failed", code)
    copied_etag = result.get("CopyObjectResult", {}).get("ETag")
    landed, code = head(client, bucket, key_prefix + destination, policy)
    if landed is None or (copied_etag and landed.get("ETag") != copied_etag):
        return Receipt(source, "failed", code or "destination_changed")
    return Receipt(source, "moved")
