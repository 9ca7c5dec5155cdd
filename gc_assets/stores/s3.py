"""S3 store (`s3://bucket/prefix` namespaces), for AWS S3 and S3-compatible endpoints such as MinIO.

The driver talks to S3 through a dagster-aws `S3Resource`; executors build one plain
boto3 client per partition from `S3Settings` (endpoint and region only; credentials
come from the standard AWS environment or profile on each executor and never travel
in a closure, a log line or metadata).

Listing: the driver discovers slices with delimiter listings a bounded depth down; a
prefix with too many children to enumerate is cut into contiguous key ranges instead,
so a flat prefix with millions of keys is still listed in parallel. Executors paginate
ListObjectsV2 per slice and log how many objects they have listed so far.

Deletion: batches of at most 1000 keys per DeleteObjects. Each key is checked with
HEAD first: gone means `already_absent` (so a rerun after a partial failure finishes
the job), a different size or modification time than the inventory saw means
`failed` (`modified_since_inventory`). Throttling and transient errors are retried
with exponential backoff and full jitter; a key that still fails is a `failed`
receipt with the S3 error code, never dropped.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from gc_assets.config import InventoryReport
from gc_assets.stores.base import ACTION_SCHEMA, DELETE_BATCH_SIZE, EXISTS_SCHEMA, INVENTORY_SCHEMA, StoreError
from gc_assets.uris import is_plain_key

log = logging.getLogger(__name__)

SLICE_DEPTH = 2
MAX_FANOUT = 32  # at most this many slices per discovered prefix
DISCOVERY_PAGE_SIZE = 1000  # a prefix with more children than one page is cut by key ranges
PROGRESS_EVERY = 10_000  # objects between two progress lines of an executor
CLIENT_THREADS = 16  # concurrent HEAD / copy requests per partition
# Where a too-large prefix is cut: before each of these characters after the prefix.
RANGE_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# The largest code point: a key between `s[:-1] + pred(s[-1]) + MAX_CHAR` and `s` is not realistic.
MAX_CHAR = "\U0010ffff"

RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "500",
        "502",
        "503",
        "504",
    }
)
ABSENT_CODES = frozenset({"404", "NoSuchKey", "NotFound"})

R = TypeVar("R")


@dataclass(frozen=True)
class S3Settings:
    """Where S3 is: endpoint and region, nothing secret. Plain data, so it can travel to executors."""

    endpoint_url: Optional[str] = None
    region: Optional[str] = None

    @classmethod
    def from_environment(cls, endpoint_url: Optional[str] = None, region: Optional[str] = None) -> "S3Settings":
        """Explicit values (the gc.yaml `s3` override) win over AWS_ENDPOINT_URL(_S3) and AWS_REGION."""
        return cls(
            endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None,
            region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None,
        )

    def resource(self) -> Any:
        """The driver's dagster-aws S3Resource; retries are ours (call_with_retries), not botocore's."""
        from dagster_aws.s3 import S3Resource

        return S3Resource(endpoint_url=self.endpoint_url, region_name=self.region, max_attempts=1)

    def client(self) -> Any:
        """An executor's boto3 client (dagster is not imported on executors: it costs seconds per worker)."""
        import boto3
        from botocore.config import Config

        config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, max_pool_connections=CLIENT_THREADS + 4)
        return boto3.session.Session().client("s3", endpoint_url=self.endpoint_url, region_name=self.region, config=config)


def executor_client(settings: S3Settings) -> Any:
    return settings.client()


def executor_log() -> logging.Logger:
    """This module's logger, writing INFO to stderr (the executor's log) when nothing else is configured."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    return log


def split_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key prefix) of `s3://bucket/prefix`; the prefix is '' or ends with '/'."""
    rest = uri.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    return bucket, (prefix + "/" if prefix else "")


# --- retries -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: attempt n waits uniform(0, min(max_delay, base * 2**n))."""

    attempts: int = 8
    base_delay: float = 0.05
    max_delay: float = 10.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.max_delay, self.base_delay * (2**attempt)))


def error_code(exc: BaseException) -> str:
    """The S3 error code of a ClientError (`SlowDown`, `AccessDenied`, `404`), else the exception's type."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        if code:
            return str(code)
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status:
            return str(status)
    return type(exc).__name__


def is_retryable(exc: BaseException) -> bool:
    """Throttling, 5xx and connection-level failures; never a 4xx such as AccessDenied or NoSuchKey."""
    from botocore.exceptions import ClientError, ConnectionError as BotoConnectionError, HTTPClientError

    if isinstance(exc, ClientError):
        return error_code(exc) in RETRYABLE_CODES
    return isinstance(exc, (BotoConnectionError, HTTPClientError))


def call_with_retries(
    what: str,
    operation: Callable[[], R],
    policy: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
    rng: Optional[random.Random] = None,
) -> R:
    """Run `operation`, retrying retryable failures; the last failure is raised."""
    rng = rng or random.Random()
    for attempt in range(policy.attempts):
        try:
            return operation()
        except Exception as exc:
            if not is_retryable(exc) or attempt + 1 == policy.attempts:
                raise
            pause = policy.delay(attempt, rng)
            log.warning("%s: %s, retry %d of %d in %.3fs", what, error_code(exc), attempt + 1, policy.attempts - 1, pause)
            sleep(pause)
    raise AssertionError("unreachable: the last attempt returns or raises")


# --- listing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slice:
    """Keys under `prefix` (only those directly under it unless `recursive`), with start <= key < end."""

    prefix: str
    recursive: bool = True
    start: Optional[str] = None
    end: Optional[str] = None

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
        page = call_with_retries(f"ListObjectsV2 s3://{bucket}/{piece.prefix}", lambda: client.list_objects_v2(**request), policy)
        for item in page.get("Contents", []):
            key = item["Key"]
            if piece.end is not None and key >= piece.end:
                return
            if piece.holds(key):
                yield item
        if not page.get("IsTruncated"):
            return
        request["ContinuationToken"] = page["NextContinuationToken"]


def inventory_rows(items: Iterable[dict[str, Any]], key_prefix: str) -> pd.DataFrame:
    """ListObjectsV2 items as INVENTORY_SCHEMA rows, keys relative to the namespace.

    Folder markers (keys ending in '/') are not data and are left out.
    """
    rows = [
        (item["Key"][len(key_prefix) :], int(item["Size"]), item["LastModified"], str(item.get("ETag", "")).strip('"') or None)
        for item in items
        if not item["Key"].endswith("/")
    ]
    frame = pd.DataFrame(rows, columns=["address", "size", "last_modified", "etag"])
    frame["last_modified"] = pd.to_datetime(frame["last_modified"], utc=True)
    return frame


_SLICE_SCHEMA = T.StructType(
    [
        T.StructField("prefix", T.StringType(), False),
        T.StructField("recursive", T.BooleanType(), False),
        T.StructField("start", T.StringType(), True),
        T.StructField("end", T.StringType(), True),
    ]
)


# --- acting on keys ------------------------------------------------------------------------------


@dataclass
class Receipt:
    address: str
    action: str
    error: Optional[str] = None

    def row(self) -> tuple[str, str, Optional[str]]:
        return self.address, self.action, self.error


def floor_to_second(value: Any) -> Optional[dt.datetime]:
    """S3 reports modification times to the second in HEAD and to the millisecond in listings."""
    if value is None or pd.isna(value):
        return None
    stamp = pd.Timestamp(value)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return stamp.floor("s").to_pydatetime()


def head(client: Any, bucket: str, key: str, policy: RetryPolicy) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """(HEAD response, None), (None, None) when the key is absent, or (None, error code)."""
    try:
        return call_with_retries(f"HeadObject {key}", lambda: client.head_object(Bucket=bucket, Key=key), policy), None
    except Exception as exc:  # noqa: BLE001 - every failure becomes a receipt
        code = error_code(exc)
        return (None, None) if code in ABSENT_CODES else (None, code)


def check_before_delete(
    client: Any, bucket: str, key_prefix: str, address: str, size: Optional[int], modified: Any, policy: RetryPolicy
) -> Optional[Receipt]:
    """None when the object may be deleted, else the receipt that says why not."""
    if not is_plain_key(address):
        return Receipt(address, "failed", "unsafe_key")
    found, code = head(client, bucket, key_prefix + address, policy)
    if code is not None:
        return Receipt(address, "failed", code)
    if found is None:
        return Receipt(address, "already_absent")
    expected = floor_to_second(modified)
    if (expected is not None and floor_to_second(found["LastModified"]) != expected) or (
        size is not None and not pd.isna(size) and int(found["ContentLength"]) != int(size)
    ):
        return Receipt(address, "failed", "modified_since_inventory")
    return None


def delete_batch(client: Any, bucket: str, key_prefix: str, addresses: list[str], policy: RetryPolicy) -> list[Receipt]:
    """One DeleteObjects call for at most 1000 keys (retried whole on throttling), per-key
    retryable errors retried, per-key final errors and missing results turned into `failed`."""
    if len(addresses) > DELETE_BATCH_SIZE:
        raise ValueError(f"DeleteObjects takes at most {DELETE_BATCH_SIZE} keys, got {len(addresses)}")
    receipts: dict[str, Receipt] = {}
    pending = list(addresses)
    rng = random.Random()
    for attempt in range(policy.attempts):
        if not pending:
            break
        request = {"Objects": [{"Key": key_prefix + a} for a in pending], "Quiet": False}
        try:
            response = call_with_retries(
                f"DeleteObjects ({len(pending)} keys)",
                lambda: client.delete_objects(Bucket=bucket, Delete=request),
                policy,
                rng=rng,
            )
        except Exception as exc:  # noqa: BLE001 - the whole batch failed for good
            code = error_code(exc)
            receipts.update({a: Receipt(a, "failed", code) for a in pending})
            pending = []
            break
        for item in response.get("Deleted", []):
            address = item["Key"][len(key_prefix) :]
            receipts[address] = Receipt(address, "deleted")
        retry = []
        for item in response.get("Errors", []):
            address, code = item["Key"][len(key_prefix) :], str(item.get("Code", "UnknownError"))
            if code in ABSENT_CODES:
                receipts[address] = Receipt(address, "already_absent")
            elif code in RETRYABLE_CODES and attempt + 1 < policy.attempts:
                retry.append(address)
            else:
                receipts[address] = Receipt(address, "failed", code)
        if retry:
            pause = policy.delay(attempt, rng)
            log.warning("DeleteObjects: %d keys failed with retryable errors, retrying in %.3fs", len(retry), pause)
            time.sleep(pause)
        pending = retry
    return [receipts.get(a, Receipt(a, "failed", "no_result")) for a in addresses]


def delete_chunk(client: Any, bucket: str, key_prefix: str, chunk: pd.DataFrame, policy: RetryPolicy, pool: ThreadPoolExecutor) -> list[Receipt]:
    """Check every key of a chunk (<= 1000) concurrently, then delete those that passed in one batch."""
    sizes = chunk["size"] if "size" in chunk else [None] * len(chunk)
    checks = list(
        pool.map(
            lambda args: check_before_delete(client, bucket, key_prefix, *args, policy),
            zip(chunk["address"], sizes, chunk["last_modified"]),
        )
    )
    settled = [c for c in checks if c is not None]
    to_delete = [a for a, c in zip(chunk["address"], checks) if c is None]
    deleted = delete_batch(client, bucket, key_prefix, to_delete, policy) if to_delete else []
    return settled + deleted


UNSUPPORTED_CONDITION_CODES = ("NotImplemented", "InvalidArgument", "InvalidRequest", "501")


def move_one(
    client: Any, bucket: str, key_prefix: str, source: str, destination: str, modified: Any, policy: RetryPolicy
) -> Receipt:
    """Copy `source` to `destination` (both relative); the caller deletes sources that were copied.

    The source must be unchanged since `modified` (when given); an existing destination is
    never overwritten: the copy carries `If-None-Match: *` (AWS S3 honours it; an endpoint
    that ignores it, such as moto 5.2, is still covered by the HEAD before the copy), and
    the destination is read back after it, so an object written there in between is a
    `failed` receipt and its source stays.
    """
    if not is_plain_key(destination):
        return Receipt(source, "failed", "unsafe_key")
    refused = check_before_delete(client, bucket, key_prefix, source, None, modified, policy)
    if refused is not None:
        return refused
    found, code = head(client, bucket, key_prefix + destination, policy)
    if found is not None or code is not None:
        return Receipt(source, "failed", code or "destination_exists")
    request = {"Bucket": bucket, "Key": key_prefix + destination, "CopySource": {"Bucket": bucket, "Key": key_prefix + source}}
    try:
        try:
            result = call_with_retries(f"CopyObject {source}", lambda: client.copy_object(**request, IfNoneMatch="*"), policy)
        except Exception as exc:  # noqa: BLE001 - an endpoint without conditional copies
            if error_code(exc) not in UNSUPPORTED_CONDITION_CODES:
                raise
            result = call_with_retries(f"CopyObject {source}", lambda: client.copy_object(**request), policy)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a receipt
        code = error_code(exc)
        if code in ("PreconditionFailed", "412"):
            return Receipt(source, "failed", "destination_exists")
        return Receipt(source, "already_absent") if code in ABSENT_CODES else Receipt(source, "failed", code)
    copied_etag = result.get("CopyObjectResult", {}).get("ETag")
    landed, code = head(client, bucket, key_prefix + destination, policy)
    if landed is None or (copied_etag and landed.get("ETag") != copied_etag):
        return Receipt(source, "failed", code or "destination_changed")
    return Receipt(source, "moved")


@dataclass
class S3Store:
    """The store of one `s3://bucket/prefix` namespace (see the module docstring)."""

    namespace: str
    settings: S3Settings = field(default_factory=S3Settings.from_environment)
    policy: RetryPolicy = RetryPolicy()
    # Builds an executor's client; replaceable (picklable) so tests can inject faults client-side.
    client_factory: Callable[[S3Settings], Any] = executor_client
    slice_depth: int = SLICE_DEPTH
    fanout: int = MAX_FANOUT
    discovery_page_size: int = DISCOVERY_PAGE_SIZE
    # Read this S3 Inventory report (gc.yaml `inventory`) instead of listing.
    inventory: Optional[InventoryReport] = None

    def __post_init__(self) -> None:
        self.bucket, self.key_prefix = split_s3_uri(self.namespace)
        self._client: Any = None  # the driver's client, made on first use

    def _partitions(self, spark: SparkSession, rows: int) -> int:
        return max(1, min(rows, int(spark.conf.get("spark.sql.shuffle.partitions"))))

    def slices(self, root: str) -> list[Slice]:
        client = self._driver_client()

        def list_page(prefix: str) -> DelimiterPage:
            page = call_with_retries(
                f"ListObjectsV2 s3://{self.bucket}/{prefix}",
                lambda: client.list_objects_v2(
                    Bucket=self.bucket, Prefix=prefix, Delimiter="/", MaxKeys=self.discovery_page_size
                ),
                self.policy,
            )
            children = sorted(p["Prefix"] for p in page.get("CommonPrefixes", []))
            return DelimiterPage(children, bool(page.get("Contents")), bool(page.get("IsTruncated")))

        try:
            return discover_slices(list_page, root, self.slice_depth, self.fanout)
        except Exception as exc:
            raise StoreError(f"namespace {self.namespace} cannot be listed: {error_code(exc)}") from None

    def list(self, spark: SparkSession, prefix: str = "") -> DataFrame:
        """Every object of the namespace, or only those under `prefix` (a directory key inside it).

        The whole namespace comes from the inventory report when one is configured.
        """
        if self.inventory is not None and not prefix:
            return self.list_from_report(spark, self.inventory)
        start = prefix.strip("/")
        if start and not is_plain_key(start):
            return spark.createDataFrame([], INVENTORY_SCHEMA)
        slices = self.slices(self.key_prefix + start + "/" if start else self.key_prefix)
        log.info("listing %s/%s over %d slices", self.namespace, start, len(slices))
        bucket, key_prefix, settings, policy, factory = self.bucket, self.key_prefix, self.settings, self.policy, self.client_factory

        def list_slices(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            client = factory(settings)
            progress = executor_log()
            listed = 0
            for frame in frames:
                for record in frame.to_dict("records"):
                    piece = Slice(record["prefix"], bool(record["recursive"]), record["start"], record["end"])
                    batch: list[dict[str, Any]] = []
                    for item in list_slice(client, bucket, piece, policy):
                        batch.append(item)
                        if len(batch) >= PROGRESS_EVERY:
                            listed += len(batch)
                            progress.info("s3://%s/%s: %d objects listed so far by this task", bucket, key_prefix, listed)
                            yield inventory_rows(batch, key_prefix)
                            batch = []
                    listed += len(batch)
                    if batch:
                        yield inventory_rows(batch, key_prefix)

        rows = [(s.prefix, s.recursive, s.start, s.end) for s in slices]
        return (
            spark.createDataFrame(rows, _SLICE_SCHEMA)
            .repartition(self._partitions(spark, len(rows)))
            .mapInPandas(list_slices, INVENTORY_SCHEMA)
        )

    def list_from_report(self, spark: SparkSession, report: InventoryReport) -> DataFrame:
        """The inventory according to an S3 Inventory report, refused when stale or for another bucket."""
        from gc_assets.stores import s3_inventory

        manifest = s3_inventory.read_manifest(self._driver_client(), report.manifest, self.policy)
        now = dt.datetime.now(dt.timezone.utc)
        s3_inventory.check_report(manifest, self.bucket, now, dt.timedelta(days=report.max_age_days))
        log.info("inventory of %s from the report of %s (%d data files)", self.namespace, manifest.created_at.isoformat(), len(manifest.files))
        record_report_metadata(manifest.uri, manifest.created_at)
        return s3_inventory.inventory_from_report(spark, manifest, self.namespace, self.settings, self.policy, self.client_factory)

    def delete(self, spark: SparkSession, candidates: DataFrame) -> DataFrame:
        bucket, key_prefix, settings, policy, factory = self.bucket, self.key_prefix, self.settings, self.policy, self.client_factory
        columns = ["address", "last_modified"] + (["size"] if "size" in candidates.columns else [])

        def delete_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            client = factory(settings)
            with ThreadPoolExecutor(CLIENT_THREADS) as pool:
                for frame in frames:
                    for start in range(0, len(frame), DELETE_BATCH_SIZE):
                        chunk = frame.iloc[start : start + DELETE_BATCH_SIZE]
                        receipts = delete_chunk(client, bucket, key_prefix, chunk, policy, pool)
                        yield pd.DataFrame([r.row() for r in receipts], columns=["address", "action", "error"])

        return (
            candidates.select(*columns)
            .repartition(int(spark.conf.get("spark.sql.shuffle.partitions")))
            .mapInPandas(delete_batches, ACTION_SCHEMA)
        )

    def move(self, spark: SparkSession, moves: DataFrame) -> DataFrame:
        bucket, key_prefix, settings, policy, factory = self.bucket, self.key_prefix, self.settings, self.policy, self.client_factory

        def move_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            client = factory(settings)
            with ThreadPoolExecutor(CLIENT_THREADS) as pool:
                for frame in frames:
                    for start in range(0, len(frame), DELETE_BATCH_SIZE):
                        chunk = frame.iloc[start : start + DELETE_BATCH_SIZE]
                        modified = chunk["last_modified"] if "last_modified" in chunk else [None] * len(chunk)
                        copied = list(
                            pool.map(
                                lambda args: move_one(client, bucket, key_prefix, *args, policy),
                                zip(chunk["address"], chunk["destination"], modified),
                            )
                        )
                        sources = [r.address for r in copied if r.action == "moved"]
                        removed = {r.address: r for r in delete_batch(client, bucket, key_prefix, sources, policy)} if sources else {}
                        receipts = [_after_copy(r, removed.get(r.address)) for r in copied]
                        yield pd.DataFrame([r.row() for r in receipts], columns=["address", "action", "error"])

        columns = ["address", "destination"] + (["last_modified"] if "last_modified" in moves.columns else [])
        return (
            moves.select(*columns)
            .repartition(int(spark.conf.get("spark.sql.shuffle.partitions")))
            .mapInPandas(move_batches, ACTION_SCHEMA)
        )

    def read_text(self, key: str) -> Optional[str]:
        """A small object of the namespace (such as a lease), or None when there is none."""
        client = self._driver_client()
        try:
            body = call_with_retries(
                f"GetObject {key}", lambda: client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read(), self.policy
            )
        except Exception as exc:
            if error_code(exc) in ABSENT_CODES:
                return None
            raise StoreError(f"cannot read {key} in {self.namespace}: {error_code(exc)}") from None
        return body.decode("utf-8")

    def write_text(self, key: str, text: str, exclusive: bool = False) -> bool:
        """Write a small object; with `exclusive`, only if none exists (S3 conditional write, If-None-Match)."""
        client = self._driver_client()
        request: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key), "Body": text.encode("utf-8")}
        if exclusive:
            request["IfNoneMatch"] = "*"
        try:
            call_with_retries(f"PutObject {key}", lambda: client.put_object(**request), self.policy)
        except Exception as exc:
            if exclusive and error_code(exc) in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
                return False
            raise StoreError(f"cannot write {key} in {self.namespace}: {error_code(exc)}") from None
        return True

    def keys(self, prefix: str) -> list[str]:
        """Keys of the small objects under `prefix` (a lease's records, a hold's records), on the driver."""
        client, found = self._driver_client(), []
        start = self._key(prefix.rstrip("/")) + ("/" if prefix.endswith("/") else "")
        try:
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start):
                found.extend(item["Key"][len(self.key_prefix):] for item in page.get("Contents", []))
        except Exception as exc:
            raise StoreError(f"cannot list {prefix} in {self.namespace}: {error_code(exc)}") from None
        return sorted(found)

    def modified_time(self, key: str) -> Optional[dt.datetime]:
        """The object's LastModified as the storage service stamped it (None when absent)."""
        client = self._driver_client()
        try:
            response = call_with_retries(
                f"HeadObject {key}", lambda: client.head_object(Bucket=self.bucket, Key=self._key(key)), self.policy
            )
        except Exception as exc:
            if error_code(exc) in ABSENT_CODES or error_code(exc) == "404":
                return None
            raise StoreError(f"cannot read the time of {key} in {self.namespace}: {error_code(exc)}") from None
        return response["LastModified"].astimezone(dt.timezone.utc)

    def remove(self, key: str) -> None:
        client = self._driver_client()
        try:
            call_with_retries(f"DeleteObject {key}", lambda: client.delete_object(Bucket=self.bucket, Key=self._key(key)), self.policy)
        except Exception as exc:
            raise StoreError(f"cannot remove {key} in {self.namespace}: {error_code(exc)}") from None

    def _key(self, key: str) -> str:
        if not is_plain_key(key):
            raise StoreError(f"{key!r} is not a plain key inside {self.namespace}")
        return self.key_prefix + key

    def _driver_client(self) -> Any:
        if self._client is None:
            self._client = self.settings.resource().get_client()
        return self._client

    def exists(self, spark: SparkSession, addresses: DataFrame) -> DataFrame:
        bucket, key_prefix, settings, policy, factory = self.bucket, self.key_prefix, self.settings, self.policy, self.client_factory

        def check(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            client = factory(settings)
            with ThreadPoolExecutor(CLIENT_THREADS) as pool:
                for frame in frames:
                    found = list(pool.map(lambda a: head(client, bucket, key_prefix + a, policy), frame["address"]))
                    errors = [(a, code) for a, (_, code) in zip(frame["address"], found) if code is not None]
                    if errors:
                        raise StoreError(f"cannot tell whether objects exist: {errors[:5]}")
                    yield pd.DataFrame({"address": frame["address"], "exists": [r is not None for r, _ in found]})

        return addresses.select("address").mapInPandas(check, EXISTS_SCHEMA)


def record_report_metadata(manifest_uri: str, created_at: dt.datetime) -> None:
    """Inside a Dagster asset, the report's manifest and date become the asset's metadata."""
    from dagster import AssetExecutionContext, DagsterInvariantViolationError, MetadataValue

    try:
        context = AssetExecutionContext.get()
    except DagsterInvariantViolationError:
        return  # called outside an asset (a test, a script): the inventory_date column still holds it
    context.add_output_metadata(
        {"inventory_date": MetadataValue.timestamp(created_at), "inventory_manifest": MetadataValue.text(manifest_uri)}
    )


def _after_copy(copied: Receipt, removed: Optional[Receipt]) -> Receipt:
    """A copied object is moved once its source is gone; a source that stays is a failure to name."""
    if copied.action != "moved" or removed is None or removed.action in ("deleted", "already_absent"):
        return copied
    return Receipt(copied.address, "failed", f"copied_but_source_kept:{removed.error}")
