"""S3 Inventory reports (CSV.gz and Parquet, as S3 writes them) as the inventory of an S3
namespace: the same objects and the same candidates as listing, stale or foreign reports
refused, and the live-objects check that knows a report cannot show newer objects."""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import hashlib
import io
import json
import time
from urllib.parse import quote_plus

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance
from pyspark.sql import functions as F

from gc_assets.core import guards
from gc_assets.core.config import InventoryReport, load_config
from gc_assets.defs.partitions import partition_key
from gc_assets.mark.candidates import orphans
from gc_assets.runner import run_partitions, stored_table
from gc_assets.stores.retries import RetryPolicy
from gc_assets.stores.s3.client import S3Settings
from gc_assets.stores.s3.inventory import (
    InventoryReportError,
    check_report,
    parse_manifest,
)
from gc_assets.stores.s3.store import S3Store
from gc_assets_tests.lakes import AS_OF, lake_on_disk, write_config
from gc_assets_tests.oracles import (
    expected_candidates,
    lake_graph,
    retained_brute_force,
)
from gc_assets_tests.s3_server import s3  # noqa: F401 - the fixture

FAST = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.01)
CSV_SCHEMA = "Bucket, Key, Size, LastModifiedDate, ETag, StorageClass"
UTC = dt.timezone.utc


def _objects(s3, bucket: str) -> list[dict]:
    found = []
    for page in s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket):
        found.extend(page.get("Contents", []))
    return found


def _manifest(
    source: str, created: dt.datetime, file_format: str, files: list[tuple[str, bytes]], schema: str
) -> bytes:
    return json.dumps(
        {
            "sourceBucket": source,
            "destinationBucket": "arn:aws:s3:::inventories",
            "version": "2016-11-30",
            "creationTimestamp": str(int(created.timestamp() * 1000)),
            "fileFormat": file_format,
            "fileSchema": schema,
            "files": [
                {"key": key, "size": len(body), "MD5checksum": hashlib.md5(body).hexdigest()} for key, body in files
            ],
        }
    ).encode()


def write_csv_report(s3, source: str, created: dt.datetime) -> str:
    """A CSV report of `source` as S3 writes it: gzip, no header, form-style URL-encoded keys, two data files."""
    objects = _objects(s3, source)
    halves = [objects[: len(objects) // 2], objects[len(objects) // 2 :]]
    files = []
    for index, half in enumerate(halves):
        text = io.StringIO()
        writer = csv.writer(text, quoting=csv.QUOTE_ALL)
        for item in half:
            stamp = item["LastModified"].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
            writer.writerow(
                [source, quote_plus(item["Key"], safe=""), item["Size"], stamp, item["ETag"].strip('"'), "STANDARD"]
            )
        files.append((f"{source}/daily/2026/data/part-{index}.csv.gz", gzip.compress(text.getvalue().encode())))
    return _put_report(s3, source, created, "CSV", files, CSV_SCHEMA, "csv")


def write_parquet_report(s3, source: str, created: dt.datetime) -> str:
    """A Parquet report with all versions: a noncurrent version and a delete marker must be ignored."""
    objects = _objects(s3, source)
    rows = [(item["Key"], item["Size"], item["LastModified"], item["ETag"].strip('"'), True, False) for item in objects]
    rows.append(("repo/data/old-version", 10, dt.datetime(2022, 1, 1, tzinfo=UTC), "e0", False, False))
    rows.append(("repo/data/deleted", 0, dt.datetime(2022, 1, 1, tzinfo=UTC), "", True, True))
    table = pa.table(
        {
            "bucket": [source] * len(rows),
            "key": [r[0] for r in rows],
            "version_id": ["v"] * len(rows),
            "is_latest": [r[4] for r in rows],
            "is_delete_marker": [r[5] for r in rows],
            "size": pa.array([r[1] for r in rows], pa.int64()),
            "last_modified_date": pa.array([r[2] for r in rows], pa.timestamp("ms", tz="UTC")),
            "e_tag": [r[3] for r in rows],
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    schema = "message s3.inventory { required binary bucket (STRING); required binary key (STRING); ... }"
    return _put_report(
        s3, source, created, "Parquet", [(f"{source}/all/data/part-0.parquet", sink.getvalue())], schema, "parquet"
    )


def _put_report(s3, source, created, file_format, files, schema, name) -> str:
    client = s3.client()
    for key, body in files:
        client.put_object(Bucket="inventories", Key=key, Body=body)
    key = f"{source}/{name}/{created.strftime('%Y-%m-%dT%H-%MZ')}/manifest.json"
    client.put_object(Bucket="inventories", Key=key, Body=_manifest(source, created, file_format, files, schema))
    return f"s3://inventories/{key}"


@pytest.fixture(scope="module")
def lake_bucket(s3, tmp_path_factory, spark):
    """A generated lake uploaded to s3://inventoried/repo, plus objects whose keys need URL encoding."""
    lake = lake_on_disk(tmp_path_factory.mktemp("inventory"), churn=25)
    s3.create_bucket("inventoried")
    s3.create_bucket("inventories")
    s3.upload_tree(lake.namespace, "inventoried", "repo")
    client = s3.client()
    for key in ("repo/data/odd key+plus/ü", "repo/data/100%/x", "elsewhere/not-in-namespace"):
        client.put_object(Bucket="inventoried", Key=key, Body=b"x")
    return lake


def _rows(frame) -> set[tuple]:
    return {(r["address"], r["size"], r["etag"], r["last_modified"].replace(microsecond=0)) for r in frame.collect()}


def test_reports_give_the_listing_inventory_and_the_same_candidates(s3, spark, lake_bucket):
    namespace = "s3://inventoried/repo"
    created = dt.datetime.now(UTC)
    listing = S3Store(namespace, S3Settings.from_environment(), FAST).list(spark)
    expected_rows = _rows(listing)
    assert ("data/odd key+plus/ü", 1) in {(a, s) for a, s, _, _ in expected_rows}

    commits, refs = lake_graph(lake_bucket.lake)
    retained = retained_brute_force(commits, refs, lake_bucket.rules, AS_OF)
    live_keys = {a for c in retained for a, _ in lake_bucket.lake.commits[c].entries.values()}
    live_keys |= {address for _, _, address, _ in lake_bucket.lake.staged}
    live = spark.createDataFrame([(k, True) for k in sorted(live_keys)], "address string, in_namespace boolean")
    every_commit = {a for c in lake_bucket.lake.commits.values() for a, _ in c.entries.values()}
    committed = spark.createDataFrame([(k, True) for k in sorted(every_commit)], "address string, in_namespace boolean")
    cutoff = created + dt.timedelta(seconds=1)  # the uploads are "now"; every object is old enough
    protected = ("_lakefs/", "_gc/", "_gc_trash/")
    oracle = expected_candidates(lake_bucket.lake, namespace, lake_bucket.rules, AS_OF, cutoff) | {
        "data/odd key+plus/ü",
        "data/100%/x",
    }

    def candidates(inventory) -> set[str]:
        return {r["address"] for r in orphans(inventory, live, committed, cutoff, protected).collect()}

    assert candidates(listing) == oracle
    for manifest in (write_csv_report(s3, "inventoried", created), write_parquet_report(s3, "inventoried", created)):
        store = S3Store(namespace, S3Settings.from_environment(), FAST, inventory=InventoryReport(manifest=manifest))
        from_report = store.list(spark)
        assert _rows(from_report) == expected_rows, manifest
        report_date = created.replace(microsecond=created.microsecond // 1000 * 1000, tzinfo=None)  # Spark: naive UTC
        assert {r[0] for r in from_report.select("inventory_date").distinct().collect()} == {report_date}
        assert candidates(from_report) == oracle, manifest


def test_stale_or_foreign_reports_are_refused(s3, spark, lake_bucket):
    old = dt.datetime.now(UTC) - dt.timedelta(days=8)
    manifest = write_csv_report(s3, "inventoried", old)
    stale = S3Store(
        "s3://inventoried/repo", S3Settings.from_environment(), FAST, inventory=InventoryReport(manifest=manifest)
    )
    with pytest.raises(InventoryReportError, match="8 days old; max_age_days is 7"):
        stale.list(spark)
    lenient = InventoryReport(manifest=manifest, max_age_days=9)
    assert (
        S3Store("s3://inventoried/repo", S3Settings.from_environment(), FAST, inventory=lenient).list(spark).count() > 0
    )
    parsed = parse_manifest(
        json.dumps(
            {
                "sourceBucket": "a",
                "destinationBucket": "b",
                "creationTimestamp": "0",
                "fileFormat": "CSV",
                "fileSchema": "Bucket, Key",
                "files": [],
            }
        ),
        "m",
    )
    with pytest.raises(InventoryReportError, match="for bucket 'a', not 'inventoried'"):
        check_report(parsed, "inventoried", dt.datetime.now(UTC), dt.timedelta(days=7))


@pytest.mark.parametrize(
    "manifest, message",
    [
        ("not json", "not JSON"),
        (
            {
                "sourceBucket": "a",
                "destinationBucket": "b",
                "creationTimestamp": "1",
                "fileFormat": "JSON",
                "files": [],
            },
            "fileFormat 'JSON'",
        ),
        (
            {"sourceBucket": "a", "destinationBucket": "b", "fileFormat": "CSV", "files": []},
            "'creationTimestamp' is missing",
        ),
        (
            {
                "sourceBucket": "a",
                "destinationBucket": "b",
                "creationTimestamp": "1",
                "fileFormat": "CSV",
                "fileSchema": "Bucket, Size",
                "files": [],
            },
            "lacks Bucket or Key",
        ),
    ],
)
def test_malformed_manifests_are_refused_naming_the_field(manifest, message):
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    with pytest.raises(InventoryReportError, match=message):
        parse_manifest(text, "s3://inventories/x/manifest.json")


def test_live_objects_missing_from_a_report_warn_but_missing_from_a_listing_block(spark):
    live = spark.createDataFrame(
        [("data/head", True, True, True), ("data/old", False, True, True)],
        "address string, at_head boolean, in_namespace boolean, required boolean",
    )
    listed = spark.createDataFrame([("data/old",)], "address string")
    verdict = guards.live_objects_present(live, listed)
    assert (verdict.passed, verdict.severity) == (False, "ERROR")

    report_date = dt.datetime(2026, 1, 2, tzinfo=UTC)
    reported = spark.createDataFrame([("data/old", report_date)], "address string, inventory_date timestamp")
    verdict = guards.live_objects_present(live, reported)
    assert (verdict.passed, verdict.severity) == (False, "WARN")
    assert verdict.metadata["missing_from_report"] == ["data/head"]
    assert "2026-01-02" in verdict.description
    complete = spark.createDataFrame(
        [("data/old", report_date), ("data/head", report_date)], "address string, inventory_date timestamp"
    )
    assert guards.live_objects_present(live, complete).passed

    # In a set, a table read from its report is judged by it, one listed beside it by its listing.
    both = live.withColumn("repo", F.explode(F.array(F.lit("from_report"), F.lit("listed"))))
    mixed = reported.withColumn("repo", F.lit("from_report")).unionByName(
        listed.withColumn("repo", F.lit("listed")), allowMissingColumns=True
    )
    verdicts = guards.live_objects_present_each(both, mixed, ["from_report", "listed"])
    assert (verdicts["from_report"].passed, verdicts["from_report"].severity) == (False, "WARN")
    assert (verdicts["listed"].passed, verdicts["listed"].severity) == (False, "ERROR")


def test_tables_read_from_their_inventory_reports_go_together_and_a_stale_report_refuses_its_table_alone(
    s3, spark, tmp_path, lake_bucket
):
    """Two lakeFS exports on S3, each with an S3 Inventory report configured, deleted in one
    fleet_job run: the one whose report is fresh loses exactly the oracle's candidates, listed
    from its report (its object_inventory names the report and its rows the report's date); the
    one whose report is 8 days old is refused alone, naming why, its storage untouched."""
    repos, lakes, uploaded = [], {}, {}
    created = {"fresh": dt.datetime.now(UTC), "stale": dt.datetime.now(UTC) - dt.timedelta(days=8)}
    for name, at in created.items():
        bucket = f"{name}-reported"
        lakes[name], uploaded[name], entry = s3.export_lake(tmp_path / name, bucket, churn=8)
        manifest = write_csv_report(s3, bucket, at)
        repos.append({**entry, "name": name, "mode": "delete", "inventory": {"manifest": manifest}})
    config = write_config(tmp_path / "gc.yaml", repos, tmp_path / "state")
    time.sleep(1.1)  # S3 times are whole seconds: every upload is now strictly before the as-of
    as_of = dt.datetime.now(UTC).replace(microsecond=0)
    for name, lake in lakes.items():
        s3.date_export(lake, f"{name}-reported", "repo", as_of)
    expected = expected_candidates(lakes["fresh"].lake, "s3://fresh-reported/repo", lakes["fresh"].rules, as_of, as_of)
    assert expected
    instance = DagsterInstance.ephemeral()

    outcomes = {
        o.summary["repo"]: o
        for o in run_partitions(load_config(config), ["fresh", "stale"], as_of.date(), as_of=as_of, instance=instance)
    }

    (run,) = instance.get_runs()
    assert run.job_name == "fleet_job"
    fresh, stale = outcomes["fresh"], outcomes["stale"]
    assert fresh.success and set(fresh.summary["checks"].values()) == {"passed"}, (fresh.error, fresh.summary)
    assert fresh.summary["receipts"] == {"deleted": len(expected)}
    assert s3.keys("fresh-reported") - {k for k in s3.keys("fresh-reported") if k.startswith("repo/_gc/")} == (
        uploaded["fresh"] - {f"repo/{key}" for key in expected}
    )
    (record,) = instance.fetch_materializations(
        AssetRecordsFilter(
            asset_key=AssetKey("object_inventory"), asset_partitions=[partition_key(as_of.date(), "fresh")]
        ),
        limit=1,
    ).records
    metadata = record.asset_materialization.metadata
    assert metadata["inventory_manifest"].value.startswith("s3://inventories/fresh-reported/csv/")
    assert metadata["inventory_date"].value == pytest.approx(created["fresh"].timestamp(), abs=1)
    dates = {
        r["inventory_date"] for r in stored_table(str(config), "object_inventory", as_of.date(), "fresh").to_pylist()
    }
    assert len(dates) == 1 and None not in dates
    assert not stale.success and "8 days old; max_age_days is 7" in stale.error, stale.error
    assert s3.keys("stale-reported") == uploaded["stale"], "the stale report's table is untouched"
