"""S3 Inventory reports as the inventory of an S3 namespace (buckets too large to list).

S3 writes a report as `manifest.json` (source bucket, creation time, file format,
schema and data files) plus data files in the destination bucket: gzipped CSV
without a header (keys URL-encoded, form style), or Parquet / ORC (keys as is). The
data files are read on executors, each checked against the manifest's MD5.

A report is a snapshot taken at its creation time: objects written after it are
missing from it. Its date is therefore kept with the inventory (column
`inventory_date`, and asset metadata when read inside Dagster), and a report older
than `max_age_days` is refused, because every day of age is a day of new objects the
live-objects check cannot confirm.

On a versioned bucket the report must carry VersionId (an optional field of the report's
configuration): each current object's version is what a delete or move names later.
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import hashlib
import io
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional
from urllib.parse import unquote_plus

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.spark import local_frame, task_count
from gc_assets.stores.base import INVENTORY_SCHEMA, VERSIONED_INVENTORY_SCHEMA, StoreError
from gc_assets.stores.retries import RetryPolicy, call_with_retries
from gc_assets.stores.s3.client import (
    S3_FAILURES,
    S3Settings,
    error_code,
    split_s3_uri,
)

FORMATS = ("CSV", "Parquet", "ORC")
# CSV fileSchema names -> the Parquet/ORC column names S3 uses for the same field.
COLUMN_NAMES = {
    "Bucket": "bucket",
    "Key": "key",
    "VersionId": "version_id",
    "IsLatest": "is_latest",
    "IsDeleteMarker": "is_delete_marker",
    "Size": "size",
    "LastModifiedDate": "last_modified_date",
    "ETag": "e_tag",
}


class InventoryReportError(StoreError):
    """The report is unusable (malformed, stale, for another bucket, corrupt); nothing was deleted."""


@dataclass(frozen=True)
class DataFile:
    bucket: str
    key: str
    md5: Optional[str]


@dataclass(frozen=True)
class InventoryManifest:
    uri: str
    source_bucket: str
    created_at: dt.datetime
    file_format: str
    csv_columns: tuple[str, ...]  # column names of CSV data files, in S3's Parquet spelling
    files: tuple[DataFile, ...]
    version_ids: bool = False  # the data files carry each object's VersionId


def parse_manifest(text: str, uri: str) -> InventoryManifest:
    """A manifest.json as S3 writes it; anything missing or unknown is refused with the field named."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InventoryReportError(f"{uri}: not JSON ({exc})") from None

    def field(name: str) -> Any:
        if name not in raw:
            raise InventoryReportError(f"{uri}: field {name!r} is missing")
        return raw[name]

    file_format = str(field("fileFormat"))
    if file_format not in FORMATS:
        raise InventoryReportError(f"{uri}: fileFormat {file_format!r} is not one of {', '.join(FORMATS)}")
    try:
        created_at = dt.datetime.fromtimestamp(int(field("creationTimestamp")) / 1000, tz=dt.timezone.utc)
    except (TypeError, ValueError):
        raise InventoryReportError(
            f"{uri}: creationTimestamp {raw['creationTimestamp']!r} is not epoch milliseconds"
        ) from None
    destination = str(field("destinationBucket")).removeprefix("arn:aws:s3:::")
    csv_columns: tuple[str, ...] = ()
    if file_format == "CSV":
        names = [name.strip() for name in str(field("fileSchema")).split(",")]
        csv_columns = tuple(COLUMN_NAMES.get(name, name) for name in names)
        if "key" not in csv_columns or "bucket" not in csv_columns:
            raise InventoryReportError(f"{uri}: fileSchema lacks Bucket or Key")
    files = tuple(DataFile(destination, str(f["key"]), f.get("MD5checksum")) for f in field("files"))
    version_ids = "version_id" in csv_columns if file_format == "CSV" else "version_id" in str(raw.get("fileSchema"))
    return InventoryManifest(uri, str(field("sourceBucket")), created_at, file_format, csv_columns, files, version_ids)


def check_report(
    manifest: InventoryManifest, bucket: str, now: dt.datetime, max_age: dt.timedelta, versioned: bool = False
) -> None:
    """Refuse a report for another bucket, from the future, older than `max_age`, or without the
    versions of a `versioned` bucket."""
    if manifest.source_bucket != bucket:
        raise InventoryReportError(
            f"{manifest.uri}: the report is for bucket {manifest.source_bucket!r}, not {bucket!r}"
        )
    if versioned and not manifest.version_ids:
        raise InventoryReportError(
            f"{manifest.uri}: bucket {bucket!r} is versioned and the report has no VersionId field "
            "(add it to the inventory configuration's optional fields)"
        )
    age = now - manifest.created_at
    if age < dt.timedelta(0):
        raise InventoryReportError(f"{manifest.uri}: created {manifest.created_at.isoformat()}, later than now")
    if age > max_age:
        raise InventoryReportError(
            f"{manifest.uri}: the report of {manifest.created_at.isoformat()} is {age.days} days old; "
            f"max_age_days is {max_age / dt.timedelta(days=1):g} (objects written since are not in it)"
        )


def parse_data_file(payload: bytes, manifest_format: str, csv_columns: tuple[str, ...]) -> pd.DataFrame:
    """One data file as columns bucket, key, size, last_modified, etag, is_latest, is_delete_marker,
    version_id (None when the report has none; "null" for a version written while versioning was off)."""
    if manifest_format == "CSV":
        text = gzip.decompress(payload).decode("utf-8")
        rows = list(csv.reader(io.StringIO(text)))
        frame = pd.DataFrame(rows, columns=list(csv_columns)) if rows else pd.DataFrame(columns=list(csv_columns))
        frame["key"] = frame["key"].map(unquote_plus)
        for flag in ("is_latest", "is_delete_marker"):
            if flag in frame:
                frame[flag] = frame[flag].str.lower() == "true"
    elif manifest_format == "Parquet":
        import pyarrow.parquet as pq

        frame = pq.read_table(io.BytesIO(payload)).to_pandas()
    else:
        import pyarrow.orc as orc

        frame = orc.ORCFile(io.BytesIO(payload)).read().to_pandas()
    for column in ("size", "last_modified_date", "e_tag"):
        if column not in frame:
            raise InventoryReportError(
                f"inventory data file has no {column!r} column: configure Size, LastModifiedDate and ETag"
            )
    return pd.DataFrame(
        {
            "bucket": frame["bucket"].astype(str),
            "key": frame["key"].astype(str),
            "size": pd.to_numeric(frame["size"]).astype("Int64"),
            "last_modified": pd.to_datetime(frame["last_modified_date"], utc=True),
            "etag": frame["e_tag"].astype(str).str.strip('"'),
            "is_latest": frame["is_latest"].astype(bool) if "is_latest" in frame else True,
            "is_delete_marker": frame["is_delete_marker"].astype(bool) if "is_delete_marker" in frame else False,
            "version_id": frame["version_id"].map(lambda v: "null" if pd.isna(v) or v == "" else str(v))
            if "version_id" in frame
            else None,
        }
    )


def namespace_rows(objects: pd.DataFrame, bucket: str, key_prefix: str, versioned: bool = False) -> pd.DataFrame:
    """Current, non-deleted objects of the namespace, keys relative to it; folder markers are left out.
    With `versioned`, each row also names its version (VERSIONED_INVENTORY_SCHEMA)."""
    keep = (
        (objects["bucket"] == bucket)
        & objects["key"].str.startswith(key_prefix)
        & ~objects["key"].str.endswith("/")
        & objects["is_latest"]
        & ~objects["is_delete_marker"]
    )
    chosen = objects[keep]
    rows = pd.DataFrame(
        {
            "address": chosen["key"].str.slice(len(key_prefix)),
            "size": chosen["size"].astype("int64"),
            "last_modified": chosen["last_modified"],
            "etag": chosen["etag"].replace("", None),
        }
    )
    if versioned:
        if chosen["version_id"].isna().any():
            raise InventoryReportError(f"bucket {bucket!r} is versioned and an inventory data file has no VersionId")
        rows["version_id"] = chosen["version_id"]
    return rows


def read_manifest(client: Any, uri: str, policy: RetryPolicy) -> InventoryManifest:
    bucket, key = uri.split("://", 1)[1].split("/", 1)
    try:
        body = call_with_retries(
            f"GetObject {uri}", lambda: client.get_object(Bucket=bucket, Key=key)["Body"].read(), policy, S3_FAILURES
        )
    except Exception as exc:
        raise InventoryReportError(f"{uri}: cannot read the manifest: {error_code(exc)}") from None
    return parse_manifest(body.decode("utf-8"), uri)


def inventory_from_report(
    spark: SparkSession,
    manifest: InventoryManifest,
    namespace: str,
    settings: S3Settings,
    policy: RetryPolicy,
    client_factory: Callable[[S3Settings], Any],
    versioned: bool = False,
) -> DataFrame:
    """The namespace's objects according to the report, read on executors, with the report's date
    (and each object's current version when `versioned`)."""
    bucket, key_prefix = split_s3_uri(namespace)
    file_format, csv_columns = manifest.file_format, manifest.csv_columns

    def read_files(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        client = client_factory(settings)
        for frame in frames:
            for data_bucket, key, md5 in zip(frame["bucket"], frame["key"], frame["md5"]):
                payload = call_with_retries(
                    f"GetObject {key}",
                    lambda: client.get_object(Bucket=data_bucket, Key=key)["Body"].read(),
                    policy,
                    S3_FAILURES,
                )
                if md5 and hashlib.md5(payload).hexdigest() != md5:
                    raise InventoryReportError(
                        f"inventory data file s3://{data_bucket}/{key} does not match its MD5 checksum"
                    )
                yield namespace_rows(parse_data_file(payload, file_format, csv_columns), bucket, key_prefix, versioned)

    files = [(f.bucket, f.key, f.md5) for f in manifest.files]
    files_schema = "bucket string, key string, md5 string"
    partitions = task_count(spark, len(files))
    return (
        local_frame(spark, files, files_schema)
        .repartition(partitions)
        .mapInPandas(read_files, VERSIONED_INVENTORY_SCHEMA if versioned else INVENTORY_SCHEMA)
        .withColumn("inventory_date", F.lit(manifest.created_at))
    )
