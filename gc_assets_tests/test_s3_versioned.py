"""Versioned S3 buckets (docs/design.md §7): a delete names the version that was listed and
judged, so it reclaims the bytes (a delete by key only adds a delete marker) and a key written
again after the listing keeps its new version; receipts name the versions; a bucket whose
versioning cannot be read is refused before anything is touched. Buckets with versioning
Enabled and Suspended (whose versions written meanwhile are "null"), against moto's server."""

from __future__ import annotations

import datetime as dt
import gzip
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import pytest
from botocore.exceptions import ClientError
from dagster import DagsterInstance
from pyspark.sql import DataFrame

from gc_assets.core.config import InventoryReport
from gc_assets.core.names import REPO
from gc_assets.core.time import partition_date_of
from gc_assets.runner import run_partition
from gc_assets.stores.base import ACTION_SCHEMA, INVENTORY_SCHEMA, VERSIONED_INVENTORY_SCHEMA, StoreError
from gc_assets.stores.executor import Receipt
from gc_assets.stores.many import FLEET_INVENTORY_SCHEMA, delete_many, list_many, move_many
from gc_assets.stores.retries import RetryPolicy
from gc_assets.stores.s3.actions import check_before_delete, delete_batch, move_one
from gc_assets.stores.s3.client import S3Settings
from gc_assets.stores.s3.inventory import InventoryReportError
from gc_assets.stores.s3.store import S3Store
from gc_assets_tests.s3_server import S3Endpoint, s3, s3_versions  # noqa: F401 - the fixtures
from gc_assets_tests.sweep_runs import receipts_of, receipts_only
from gc_assets_tests.test_s3_gc import _s3_lake
from gc_assets_tests.test_s3_inventory import _put_report

FAST = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.01)


def _versioning(client, bucket: str, status: str) -> None:
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": status})


def _put(client, bucket: str, keys: list[str], body: bytes = b"first") -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: client.put_object(Bucket=bucket, Key=key, Body=body + key.encode()), keys))


def _stored(client, bucket: str, prefix: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """({key: its stored versions}, {key: its delete markers}) under `prefix`, newest first."""
    versions: dict[str, list[str]] = {}
    markers: dict[str, list[str]] = {}
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Versions", []):
            versions.setdefault(item["Key"], []).append(item["VersionId"])
        for item in page.get("DeleteMarkers", []):
            markers.setdefault(item["Key"], []).append(item["VersionId"])
    return versions, markers


def _current(client, bucket: str, prefix: str) -> dict[str, str]:
    """{address: current VersionId} of the keys whose newest entry is a version, not a delete marker."""
    current = {}
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Versions", []):
            if item["IsLatest"]:
                current[item["Key"][len(prefix) :]] = item["VersionId"]
    return current


def _versioned_bucket(s3, bucket: str, status: str) -> dict[str, str]:
    """A bucket with versions of every kind, and its versioning left at `status`:
    `old/` written before versioning ("null"), `data/` (and `twice/`, written twice) while
    Enabled, and with Suspended, `late/` written after the suspension ("null" again)."""
    client = s3.client()
    s3.create_bucket(bucket)
    _put(client, bucket, [f"ns/old/{i}" for i in range(3)])
    _versioning(client, bucket, "Enabled")
    _put(client, bucket, [f"ns/data/{c}/{i:03d}" for c in "abcdef" for i in range(12)] + ["ns/twice/x"])
    client.put_object(Bucket=bucket, Key="ns/twice/x", Body=b"second")
    if status == "Suspended":
        _versioning(client, bucket, "Suspended")
        _put(client, bucket, [f"ns/late/{i}" for i in range(4)])
    return _current(client, bucket, "ns/")


Acts = Callable[[DataFrame], DataFrame]


def _alone(spark, store: S3Store) -> tuple[DataFrame, Acts, Acts]:
    """The store's own listing, delete and move (a table swept by its own run)."""
    return store.list(spark), lambda rows: store.delete(spark, rows), lambda rows: store.move(spark, rows)


def _in_a_set(spark, store: S3Store) -> tuple[DataFrame, Acts, Acts]:
    """stores.many's, through the store's reader, the namespace beside an empty one (a set swept together)."""
    stores = {"ns": store, "empty": S3Store(f"s3://{store.bucket}/empty", store.settings, store.policy)}
    return (
        list_many(spark, stores),
        lambda rows: delete_many(spark, stores, rows),
        lambda rows: move_many(spark, stores, rows),
    )


@pytest.mark.parametrize("acting", [_alone, _in_a_set])
@pytest.mark.parametrize("status", ["Enabled", "Suspended"])
def test_deletes_and_moves_act_on_the_listed_version_and_a_key_written_again_keeps_its_new_one(
    s3_versions, spark, status, acting
):
    """The same on a table's own run and in a set (stores.many, where each task reads the
    bucket's versioning as it lists)."""
    bucket = f"versions-{status.lower()}-{acting.__name__.strip('_')}"
    client = s3_versions.client()
    current = _versioned_bucket(s3_versions, bucket, status)
    store = S3Store(f"s3://{bucket}/ns", S3Settings.from_environment(), FAST, fanout=3, discovery_page_size=4)
    assert store.versioning() == status
    assert any(s.start is not None for s in store.slices("ns/"))  # key ranges start at a KeyMarker

    listing, delete, move = acting(spark, store)
    assert listing.schema == (VERSIONED_INVENTORY_SCHEMA if acting is _alone else FLEET_INVENTORY_SCHEMA)
    listing = spark.createDataFrame(listing.collect(), listing.schema)  # as object_inventory stores it
    listed = {r["address"]: r for r in listing.collect()}
    assert {a: r["version_id"] for a, r in listed.items()} == current  # every current object, its version
    assert {listed[f"old/{i}"]["version_id"] for i in range(3)} == {"null"}
    if status == "Suspended":
        assert {listed[f"late/{i}"]["version_id"] for i in range(4)} == {"null"}

    # After the listing: one key written again (a new version; with Suspended, at the null one
    # written while suspended: replaced in place), one deleted by someone else.
    rewritten = "late/0" if status == "Suspended" else "data/a/000"
    time.sleep(1.1)  # S3 times are whole seconds
    client.put_object(Bucket=bucket, Key=f"ns/{rewritten}", Body=b"written again, longer than before")
    client.delete_object(Bucket=bucket, Key="ns/data/a/001")
    moved = {a for a in listed if a.startswith("data/f/")}
    doomed = {a for a in listed if a not in moved}
    candidates = listing.filter(listing.address.isin(sorted(doomed)))

    receipts = {r["address"]: (r["action"], r["version_id"]) for r in delete(candidates).collect()}

    expected = {a: ("deleted", listed[a]["version_id"]) for a in doomed}
    expected[rewritten] = ("skipped_revived", listed[rewritten]["version_id"])
    expected["data/a/001"] = ("already_absent", listed["data/a/001"]["version_id"])
    assert receipts == expected
    versions, markers = _stored(client, bucket, "ns/")
    deleted = {f"ns/{a}" for a, (action, _) in receipts.items() if action == "deleted"}
    # No stored version of a deleted object remains, and no delete marker hides anything: the
    # key written twice shows its older version again (a version the listing did not judge).
    assert {k for k in deleted if k in versions and k != "ns/twice/x"} == set()
    assert len(versions["ns/twice/x"]) == 1 and listed["twice/x"]["version_id"] not in versions["ns/twice/x"]
    assert not {k for k in deleted if k in markers}
    again = client.get_object(Bucket=bucket, Key=f"ns/{rewritten}")
    assert again["Body"].read() == b"written again, longer than before"  # the new version is current, intact

    pairs = listing.filter(listing.address.isin(sorted(moved))).selectExpr(
        *[c for c in listing.columns if c == REPO],
        "address",
        "concat('_gc_trash/run-1/', address) as destination",
        "last_modified",
        "version_id",
    )
    trashed = {r["address"]: (r["action"], r["version_id"]) for r in move(pairs).collect()}
    assert trashed == {a: ("moved", listed[a]["version_id"]) for a in moved}
    versions, markers = _stored(client, bucket, "ns/")
    assert not {f"ns/{a}" for a in moved} & (set(versions) | set(markers))  # the listed version moved whole
    for address in moved:
        copy = client.get_object(Bucket=bucket, Key=f"ns/_gc_trash/run-1/{address}")["Body"].read()
        assert copy == f"firstns/{address}".encode()


class _WriteAfterHead:
    """A client that answers the first HEAD of `key`, then writes `key` again: a writer landing
    between the check and the action."""

    def __init__(self, client, bucket: str, key: str):
        self.client, self.bucket, self.key, self.written = client, bucket, key, False

    def head_object(self, **request):
        answer = self.client.head_object(**request)
        if request["Key"] == self.key and not self.written:
            self.written = True
            self.client.put_object(Bucket=self.bucket, Key=self.key, Body=b"landed after the check")
        return answer

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_a_write_landing_between_the_check_and_the_action_keeps_its_new_version(s3_versions):
    bucket = "versions-race"
    client = s3_versions.client()
    s3_versions.create_bucket(bucket)
    _versioning(client, bucket, "Enabled")
    for key in ("ns/deleted", "ns/moved"):
        client.put_object(Bucket=bucket, Key=key, Body=b"listed")
    listed = _current(client, bucket, "ns/")

    racing = _WriteAfterHead(client, bucket, "ns/deleted")
    assert check_before_delete(racing, bucket, "ns/", "deleted", 6, None, FAST, listed["deleted"], True) is None
    assert delete_batch(racing, bucket, "ns/", ["deleted"], FAST, [listed["deleted"]]) == [
        Receipt("deleted", "deleted", None, listed["deleted"])
    ]
    racing = _WriteAfterHead(client, bucket, "ns/moved")
    moved = move_one(racing, bucket, "ns/", "moved", "_gc_trash/r/moved", None, FAST, listed["moved"], True)
    assert moved == Receipt("moved", "moved", None, listed["moved"])
    assert delete_batch(client, bucket, "ns/", ["moved"], FAST, [listed["moved"]])[0].action == "deleted"

    assert client.get_object(Bucket=bucket, Key="ns/_gc_trash/r/moved")["Body"].read() == b"listed"
    versions, markers = _stored(client, bucket, "ns/")
    for key in ("deleted", "moved"):  # the listed version is gone; the one written since is current
        assert client.get_object(Bucket=bucket, Key=f"ns/{key}")["Body"].read() == b"landed after the check"
        assert len(versions[f"ns/{key}"]) == 1 and f"ns/{key}" not in markers


def test_unreadable_versioning_is_refused_and_versions_appearing_later_are_never_deleted_by_key(s3_versions, spark):
    s3 = s3_versions
    bucket = "versions-later"
    client = s3.client()
    s3.create_bucket(bucket)
    _put(client, bucket, [f"ns/x/{i}" for i in range(4)])

    class Denied:
        def get_bucket_versioning(self, Bucket):
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "GetBucketVersioning")

    denied = S3Store(f"s3://{bucket}/ns", S3Settings.from_environment(), FAST)
    denied._client = Denied()  # the driver's client, refused GetBucketVersioning
    with pytest.raises(StoreError, match=f"bucket '{bucket}'.*versioning cannot be read \\(AccessDenied\\)"):
        denied.list(spark)
    with pytest.raises(StoreError, match="versioning cannot be read"):
        denied.delete(spark, spark.createDataFrame([], INVENTORY_SCHEMA))

    never = S3Store(f"s3://{bucket}/ns", S3Settings.from_environment(), FAST)
    assert never.versioning() == ""
    listing = never.list(spark)
    assert listing.schema == INVENTORY_SCHEMA  # never versioned: listed and deleted as before
    rows = listing.collect()
    _versioning(client, bucket, "Enabled")  # after this store read its versioning
    stale = spark.createDataFrame(rows[:2], INVENTORY_SCHEMA)
    by_key = never.delete(spark, stale)
    assert by_key.schema == ACTION_SCHEMA
    assert {(r["action"], r["error"]) for r in by_key.collect()} == {("failed", "delete_marker_only")}
    fresh = S3Store(f"s3://{bucket}/ns", S3Settings.from_environment(), FAST)
    unversioned_rows = spark.createDataFrame(rows[2:], INVENTORY_SCHEMA)
    refused = {(r["action"], r["error"], r["version_id"]) for r in fresh.delete(spark, unversioned_rows).collect()}
    assert refused == {("failed", "version_not_listed", None)}
    versions, _ = _stored(client, bucket, "ns/")
    assert set(versions) == {f"ns/x/{i}" for i in range(4)}  # every byte still stored


def test_an_inventory_report_names_the_versions_of_a_versioned_bucket(s3_versions, spark):
    bucket = "versions-report"
    client = s3_versions.client()
    current = _versioned_bucket(s3_versions, bucket, "Suspended")
    try:  # where test_s3_inventory's reports go; that module may have made it in this process
        s3_versions.create_bucket("inventories")
    except ClientError as exc:
        assert exc.response["Error"]["Code"] in ("BucketAlreadyExists", "BucketAlreadyOwnedByYou")
    created = dt.datetime.now(dt.timezone.utc)
    rows = []
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket):
        for item in page.get("Versions", []):
            stamp = item["LastModified"].strftime("%Y-%m-%dT%H:%M:%S.000Z")
            version = "" if item["VersionId"] == "null" else item["VersionId"]  # S3 writes the null version empty
            latest = str(item["IsLatest"]).lower()
            rows.append(f'"{bucket}","{item["Key"]}","{version}","{latest}","false","{item["Size"]}","{stamp}","e"')
    body = gzip.compress(("\n".join(rows) + "\n").encode())
    schema = "Bucket, Key, VersionId, IsLatest, IsDeleteMarker, Size, LastModifiedDate, ETag"
    files = [(f"{bucket}/all/data/part-0.csv.gz", body)]
    with_versions = _put_report(s3_versions, bucket, created, "CSV", files, schema, "all")
    without = _put_report(
        s3_versions, bucket, created, "CSV", files, "Bucket, Key, Size, LastModifiedDate, ETag", "cur"
    )

    def store(manifest: str) -> S3Store:
        report = InventoryReport(manifest=manifest)
        return S3Store(f"s3://{bucket}/ns", S3Settings.from_environment(), FAST, inventory=report)

    listed = store(with_versions).list(spark)
    assert {r["address"]: r["version_id"] for r in listed.collect()} == current
    with pytest.raises(InventoryReportError, match=f"bucket '{bucket}' is versioned and the report has no VersionId"):
        store(without).list(spark)


@dataclass(frozen=True)
class _VersionedEndpoint(S3Endpoint):
    """The endpoint, its new buckets created with versioning Enabled."""

    def create_bucket(self, name: str) -> None:
        super().create_bucket(name)
        _versioning(self.client(), name, "Enabled")


def test_a_lake_on_a_versioned_bucket_reclaims_what_it_deletes_and_spares_a_key_written_again(
    s3_versions, spark, tmp_path
):
    """The whole graph on a bucket with versioning Enabled: a dry run marks; a candidate is
    written again; the delete sweep then removes every stored version of each other candidate,
    keeps the new version, names every version in its receipts and counts only what is gone."""
    bucket = "versions-lake"
    client = s3_versions.client()
    config, uploaded, as_of, expected = _s3_lake(_VersionedEndpoint(s3_versions.url), tmp_path, bucket, 0)
    assert client.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    instance = DagsterInstance.ephemeral()
    dry = run_partition(
        str(config), "s3-repo", partition_date_of(as_of), as_of=as_of, mode="dry_run", instance=instance
    )
    assert dry.success, dry.error
    listed = _current(client, bucket, "repo/")
    assert expected and dry.summary["receipts"] == {"would_delete": len(expected)}

    rewritten = sorted(expected)[0]
    client.put_object(Bucket=bucket, Key=f"repo/{rewritten}", Body=b"written again between mark and sweep")
    result = receipts_only(config, "s3-repo", as_of, instance, "delete")
    assert result.success

    receipts = {r["address"]: (r["action"], r["version_id"], r["size"]) for r in receipts_of(result)}
    assert {a: (action, version) for a, (action, version, _) in receipts.items()} == {
        **{a: ("deleted", listed[a]) for a in expected},
        rewritten: ("skipped_revived", listed[rewritten]),
    }
    versions, markers = _stored(client, bucket, "repo/")
    assert not {f"repo/{a}" for a in expected - {rewritten}} & (set(versions) | set(markers))
    assert client.get_object(Bucket=bucket, Key=f"repo/{rewritten}")["Body"].read().startswith(b"written again")
    assert {k for k in versions if "/_gc" not in k} == {k for k in uploaded if "/_gc" not in k} - {
        f"repo/{a}" for a in expected - {rewritten}
    }
    materialized = next(
        e.materialization.metadata
        for e in result.get_asset_materialization_events()
        if e.materialization.asset_key.path[-1] == "deletion_receipts"
    )
    gone = sum(size for action, _, size in receipts.values() if action == "deleted")
    assert gone > 0 and materialized["bytes_reclaimed"].value == gone
