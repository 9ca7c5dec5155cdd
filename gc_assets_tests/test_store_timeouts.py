"""An endpoint that accepts connections and never answers is named by the first operation of
every store (S3, Azure, GCS), and by a metadata read and a discovery listing, within two
attempts, not after eight attempts of 30 s each: the message names the namespace (or file),
the operation and the endpoint. An operation's deadline is one attempt at the timeouts its
store is configured with (GC_ASSETS_CONNECT_TIMEOUT_SECONDS, GC_ASSETS_READ_TIMEOUT_SECONDS,
or a store's own settings), so the real endpoints here wait out timeouts of a second or two,
side by side; at the default timeouts (connect 10 s, read 30 s) the bound is within two
minutes, shown on a simulated clock. Throttling and resets fail fast and, at the default
timeouts, keep every attempt of the policy: the deadline counts time, not failures
(test_s3_store.py's test_listing_is_retried_when_throttled and test_blob_stores.py's
throttling tests show a 503 then success on the real clients).
"""

from __future__ import annotations

import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from gc_assets.core.config import ConfigError, GcsOverride
from gc_assets.sources.base import SourceError
from gc_assets.sources.discovery import delta_table_paths
from gc_assets.sources.files import read_small_file
from gc_assets.stores.azure import AzureSettings, azure_store
from gc_assets.stores.base import StoreError
from gc_assets.stores.blobs import BlobStore
from gc_assets.stores.gcs import gcs_store
from gc_assets.stores.retries import NoAnswer, RetryPolicy, Timeouts, call_with_retries
from gc_assets.stores.s3.client import S3_FAILURES, S3Settings
from gc_assets.stores.s3.store import S3Store
from gc_assets.stores.settings import StoreSettings
from gc_assets_tests.blob_servers import AZURITE_ACCOUNT, AZURITE_KEY, silent_endpoint

BOUND = 120.0  # seconds: the first operation against a silent endpoint must be named within this
CONFIGURED = Timeouts(connect=1.0, read=2.0)  # what the environment sets for the stores below
# A source's own settings, unlike the environment's: a deadline of 4 s gives a second attempt
# of 3 s, which the environment's 3 s deadline would not.
SOURCE_TIMEOUTS = Timeouts(connect=1.0, read=3.0)
NO_ANSWER = re.compile(r"did not answer within (\d+) s \((\d+) attempts\)")


@pytest.fixture
def configured_timeouts(monkeypatch):
    """CONFIGURED in the environment, whatever it sets, and no emulator variables."""
    monkeypatch.setenv("GC_ASSETS_CONNECT_TIMEOUT_SECONDS", str(CONFIGURED.connect))
    monkeypatch.setenv("GC_ASSETS_READ_TIMEOUT_SECONDS", str(CONFIGURED.read))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def _failure(operation: Callable[[], object], refusal: type[Exception]) -> tuple[str, float]:
    """The message `operation` fails with, and the seconds it took."""
    started = time.monotonic()
    with pytest.raises(refusal) as failure:
        operation()
    return str(failure.value), time.monotonic() - started


def test_a_silent_endpoint_is_named_within_two_attempts_at_the_configured_timeouts(
    spark, monkeypatch, configured_timeouts
):
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
        assert {s.settings.timeouts for s in stores.values()} == {CONFIGURED}
        assert {s.policy.deadline for s in stores.values()} == {CONFIGURED.connect + CONFIGURED.read}
        # Sources read with their settings' timeouts (a repository's), not the environment's.
        source_settings = S3Settings(url, "us-east-1", SOURCE_TIMEOUTS)
        operations = {
            **{namespace: (lambda s=store: s.list(spark), StoreError) for namespace, store in stores.items()},
            "gs://silent/_delta_log/0.json": (
                lambda: read_small_file(
                    "gs://silent/_delta_log/0.json",
                    StoreSettings(timeouts=SOURCE_TIMEOUTS, gcs_settings=GcsOverride(endpoint_url=url)),
                ),
                SourceError,
            ),
            "s3://silent/tables": (lambda: delta_table_paths("s3://silent/tables", source_settings), ConfigError),
        }
        with ThreadPoolExecutor(len(operations)) as pool:
            outcomes = dict(zip(operations, pool.map(lambda pair: _failure(*pair), operations.values())))
    for where, (message, took) in outcomes.items():
        timeouts = CONFIGURED if where in stores else SOURCE_TIMEOUTS
        assert where in message, message
        assert re.search(r"cannot (be )?(read|list)", message), message
        assert f"the endpoint {url} did not answer within" in message, message
        seconds, attempts = map(int, NO_ANSWER.search(message).groups())
        # The last attempt starts by the deadline (one attempt at the timeouts) and waits them out.
        assert attempts == 2 and seconds <= 2 * timeouts.attempt, message
        assert timeouts.read <= took < BOUND, f"{where}: {took:.0f} s: {message}"


def test_a_stores_deadline_follows_its_own_timeouts(monkeypatch):
    monkeypatch.setenv("GC_ASSETS_CONNECT_TIMEOUT_SECONDS", "1")
    monkeypatch.setenv("GC_ASSETS_READ_TIMEOUT_SECONDS", "2")
    assert RetryPolicy().deadline == 3.0
    given = RetryPolicy(attempts=3, base_delay=0.5)
    own = Timeouts(connect=5.0, read=7.0)
    s3 = S3Store("s3://bucket/ns", S3Settings(timeouts=own), given)
    azure = BlobStore("abfss://c@a.dfs.core.windows.net/ns", "c", "ns/", AzureSettings("a", timeouts=own), given)
    for store in (s3, azure):
        assert store.policy == RetryPolicy(attempts=3, base_delay=0.5, timeouts=own)
        assert store.policy.deadline == 12.0


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


def _silence(policy: RetryPolicy, seconds: list[float]) -> tuple[NoAnswer, int, float]:
    """How the retries end when attempt n times out after `seconds[n]`: the error, the attempts,
    the seconds in all."""
    clock = Clock()
    operation, calls = _failing(clock, [(took, _read_timeout()) for took in seconds])
    with pytest.raises(NoAnswer) as silent:
        call_with_retries("GetBucketVersioning", operation, policy, S3_FAILURES, sleep=clock.sleep, clock=clock)
    return silent.value, len(calls), clock.now


def test_the_default_timeouts_name_a_silent_endpoint_within_two_minutes():
    timeouts = Timeouts()
    policy = RetryPolicy(timeouts=timeouts)
    assert (timeouts.connect, timeouts.read, policy.deadline) == (10.0, 30.0, 40.0)
    # The worst case: a first attempt that times out just before the deadline, then one that
    # connects just before its connect timeout and waits its read timeout.
    _, attempts, took = _silence(policy, [timeouts.attempt - 0.1] + [timeouts.attempt] * policy.attempts)
    assert attempts == 2 and took <= policy.deadline + timeouts.attempt < BOUND
    # An endpoint that accepts connections: each attempt waits the read timeout.
    silent, attempts, took = _silence(policy, [timeouts.read] * policy.attempts)
    assert attempts == 2 and took <= policy.deadline + timeouts.read
    assert re.fullmatch(r"the endpoint http://10\.1\.2\.3:9000 did not answer within 6\d s \(2 attempts\)", str(silent))


def test_throttling_keeps_every_attempt_and_an_answer_is_not_silence():
    policy, timeouts = RetryPolicy(timeouts=Timeouts()), Timeouts()
    clock = Clock()
    operation, calls = _failing(clock, [(0.2, _slow_down())] * (policy.attempts - 1))
    rng = random.Random(3)
    listed = call_with_retries("ListObjectsV2", operation, policy, S3_FAILURES, sleep=clock.sleep, rng=rng, clock=clock)
    assert listed == "listed" and len(calls) == policy.attempts

    clock = Clock()
    operation, calls = _failing(clock, [(0.2, _slow_down()), (timeouts.read, _read_timeout())] * policy.attempts)
    with pytest.raises(ReadTimeoutError):  # it answered once: not NoAnswer, the last error as it was
        call_with_retries("ListObjectsV2", operation, policy, S3_FAILURES, sleep=clock.sleep, clock=clock)
    assert clock.now <= policy.deadline + timeouts.connect + timeouts.read
