"""An endpoint that accepts connections and never answers is named within two minutes by the
first operation of every store (S3, Azure, GCS), not after eight attempts of 30 s each: the
message names the namespace, the operation and the endpoint. The stores run with their default
timeouts and retry policy, so the time measured is the real bound; the three wait side by
side (a minute in all). Throttling and resets fail fast and keep every attempt of the policy:
the deadline counts time, not failures (test_s3_store.py's test_listing_is_retried_when_throttled
and test_blob_stores.py's throttling tests show a 503 then success on the real clients).
"""

from __future__ import annotations

import random
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from gc_assets.core.config import GcsOverride
from gc_assets.stores.azure import azure_store
from gc_assets.stores.base import StoreError
from gc_assets.stores.gcs import gcs_store
from gc_assets.stores.s3.client import NoAnswer, RetryPolicy, S3Settings, Timeouts, call_with_retries
from gc_assets.stores.s3.store import S3Store
from gc_assets_tests.blob_servers import AZURITE_ACCOUNT, AZURITE_KEY, silent_endpoint

BOUND = 120.0  # seconds: the first operation against a silent endpoint must be named within this


@pytest.fixture
def default_timeouts(monkeypatch):
    """The product's own timeouts, whatever this environment sets, and no emulator variables."""
    for name in ("GC_ASSETS_CONNECT_TIMEOUT_SECONDS", "GC_ASSETS_READ_TIMEOUT_SECONDS", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def _first_operation(store, spark) -> tuple[str, float]:
    """The message the store's listing fails with (S3 reads the bucket's versioning first), and
    the seconds it took."""
    started = time.monotonic()
    with pytest.raises(StoreError) as failure:
        store.list(spark)
    return str(failure.value), time.monotonic() - started


def test_a_silent_endpoint_is_named_within_two_minutes_on_every_store(spark, monkeypatch, default_timeouts):
    with silent_endpoint() as url:
        monkeypatch.setenv(
            "AZURE_STORAGE_CONNECTION_STRING",
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={url}/{AZURITE_ACCOUNT};",
        )
        stores = {
            "s3://silent/ns": S3Store("s3://silent/ns", S3Settings.from_environment(url, "us-east-1")),
            f"abfss://silent@{AZURITE_ACCOUNT}.dfs.core.windows.net/ns": azure_store(
                f"abfss://silent@{AZURITE_ACCOUNT}.dfs.core.windows.net/ns"
            ),
            "gs://silent/ns": gcs_store("gs://silent/ns", GcsOverride(endpoint_url=url)),
        }
        assert {s.settings.timeouts for s in stores.values()} == {Timeouts()}
        with ThreadPoolExecutor(len(stores)) as pool:
            outcomes = dict(zip(stores, pool.map(lambda store: _first_operation(store, spark), stores.values())))
    for namespace, (message, took) in outcomes.items():
        assert namespace in message, message
        assert re.search(r"cannot be (read|listed)", message), message
        assert f"the endpoint {url} did not answer within" in message, message
        assert Timeouts().read <= took < BOUND, f"{namespace}: {took:.0f} s: {message}"


def _read_timeout() -> ReadTimeoutError:
    return ReadTimeoutError(endpoint_url="http://10.1.2.3:9000/bucket?versioning")


def _slow_down() -> ClientError:
    return ClientError({"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "ListObjectsV2")


class Clock:
    """Time as the retries see it: each attempt and each pause advances it, nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _failing(clock: Clock, failures: list[tuple[float, BaseException]]):
    """An operation whose calls take the given seconds and raise the given errors, then succeed."""
    calls: list[float] = []

    def operation() -> str:
        calls.append(clock.now)
        if len(calls) <= len(failures):
            seconds, error = failures[len(calls) - 1]
            clock.sleep(seconds)
            raise error
        return "listed"

    return operation, calls


def test_timeouts_stop_at_the_deadline_and_throttling_keeps_every_attempt():
    policy, timeouts = RetryPolicy(), Timeouts()
    clock = Clock()
    operation, calls = _failing(clock, [(timeouts.read, _read_timeout())] * policy.attempts)
    with pytest.raises(NoAnswer) as silent:
        call_with_retries("GetBucketVersioning", operation, policy, sleep=clock.sleep, clock=clock)
    assert len(calls) == 2 and clock.now <= policy.deadline + timeouts.connect + timeouts.read < BOUND
    assert re.fullmatch(
        r"the endpoint http://10\.1\.2\.3:9000 did not answer within 6\d s \(2 attempts\)", str(silent.value)
    )

    clock = Clock()
    operation, calls = _failing(clock, [(0.2, _slow_down())] * (policy.attempts - 1))
    rng = random.Random(3)
    assert call_with_retries("ListObjectsV2", operation, policy, sleep=clock.sleep, rng=rng, clock=clock) == "listed"
    assert len(calls) == policy.attempts

    clock = Clock()
    operation, calls = _failing(clock, [(0.2, _slow_down()), (timeouts.read, _read_timeout())] * policy.attempts)
    with pytest.raises(ReadTimeoutError):  # it answered once: not NoAnswer, the last error as it was
        call_with_retries("ListObjectsV2", operation, policy, sleep=clock.sleep, clock=clock)
    assert clock.now <= policy.deadline + timeouts.connect + timeouts.read
