"""S3 clients and retries: settings an executor builds its own client from, the timeouts every
store's requests wait at most, and exponential backoff with full jitter for throttling and
transient errors (a 4xx is never retried), within a deadline per operation: an endpoint that
takes requests and never answers is named (NoAnswer) within two attempts, not after eight."""

from __future__ import annotations

import functools
import logging
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar
from urllib.parse import urlsplit

from gc_assets.core.config import EnvSecret, S3Override, revealed
from gc_assets.stores.executor import CLIENT_THREADS

log = logging.getLogger("gc_assets.stores.s3")


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

CONNECT_TIMEOUT_ENV = "GC_ASSETS_CONNECT_TIMEOUT_SECONDS"
READ_TIMEOUT_ENV = "GC_ASSETS_READ_TIMEOUT_SECONDS"


@dataclass(frozen=True)
class Timeouts:
    """Seconds one request of any store waits to connect, and for each read of its answer.

    A stalled connection then ends in a timeout, which the caller's RetryPolicy retries or
    reports, never in a wait without end (a sweep would hold its lease meanwhile). Set on the
    driver (GC_ASSETS_CONNECT_TIMEOUT_SECONDS, GC_ASSETS_READ_TIMEOUT_SECONDS); executors get
    them with the settings. The read timeout bounds the wait for each response (a listing of
    any size is many responses), so one attempt lasts at most connect + read: 40 s, which
    RetryPolicy.deadline is sized on.
    """

    connect: float = 10.0
    read: float = 30.0

    @classmethod
    def from_environment(cls) -> "Timeouts":
        return cls(_seconds(CONNECT_TIMEOUT_ENV, cls.connect), _seconds(READ_TIMEOUT_ENV, cls.read))


def _seconds(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < 3600:
        raise ValueError(f"{name}={value!r}: a number of seconds above 0 and below 3600")
    return seconds


@dataclass(frozen=True)
class S3Settings:
    """Where S3 is (endpoint, region), how long a request may wait, and which gc.yaml
    `{env: NAME}` credentials to use: names of variables, never their values. Plain data, so it
    can travel to executors."""

    endpoint_url: Optional[str] = None
    region: Optional[str] = None
    timeouts: Timeouts = field(default_factory=Timeouts.from_environment)
    access_key_id: Optional[EnvSecret] = None  # None: the AWS credential chain
    secret_access_key: Optional[EnvSecret] = None
    session_token: Optional[EnvSecret] = None

    @classmethod
    def from_environment(cls, endpoint_url: Optional[str] = None, region: Optional[str] = None) -> "S3Settings":
        """Explicit values (the gc.yaml `s3` override) win over AWS_ENDPOINT_URL(_S3) and AWS_REGION."""
        return cls(
            endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None,
            region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None,
        )

    def config(self) -> Any:
        """botocore's Config: our timeouts, botocore's retries off (ours are call_with_retries)."""
        from botocore.config import Config

        return Config(
            connect_timeout=self.timeouts.connect,
            read_timeout=self.timeouts.read,
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=CLIENT_THREADS + 4,
        )

    @classmethod
    def of_override(cls, override: S3Override) -> "S3Settings":
        """A repository's gc.yaml `s3` settings over the environment."""
        located = cls.from_environment(override.endpoint_url, override.region)
        return cls(
            located.endpoint_url,
            located.region,
            access_key_id=override.access_key_id,
            secret_access_key=override.secret_access_key,
            session_token=override.session_token,
        )

    def credentials(self) -> dict[str, str]:
        """boto3's keyword arguments for the configured credentials, read now from this process's
        environment; {} leaves boto3 its own chain."""
        if self.access_key_id is None:
            return {}
        found = {
            "aws_access_key_id": revealed(self.access_key_id),
            "aws_secret_access_key": revealed(self.secret_access_key),
            "aws_session_token": revealed(self.session_token),
        }
        return {name: value for name, value in found.items() if value is not None}

    def resource(self) -> Any:
        """The driver's dagster-aws S3Resource, its client built with `config()`; retries are ours."""
        return _timed_resource()(
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            max_attempts=1,
            settings_config=self.config(),
            **self.credentials(),
        )

    def client(self) -> Any:
        """An executor's boto3 client (dagster is not imported on executors: it costs seconds per worker)."""
        import boto3

        session = boto3.session.Session(**self.credentials())
        return session.client("s3", endpoint_url=self.endpoint_url, region_name=self.region, config=self.config())


@functools.cache
def _timed_resource() -> type:
    """dagster-aws's S3Resource with a botocore Config of our own: its client sets no timeouts
    (botocore's 60 s each) and takes no Config."""
    from dagster_aws.s3 import S3Resource
    from pydantic import PrivateAttr

    class TimedS3Resource(S3Resource):
        _config: Any = PrivateAttr()

        def __init__(self, settings_config: Any, **fields: Any):
            super().__init__(**fields)
            self._config = settings_config

        def get_client(self) -> Any:
            import boto3

            session = boto3.session.Session(profile_name=self.profile_name)
            return session.client(
                "s3",
                region_name=self.region_name,
                endpoint_url=self.endpoint_url,
                use_ssl=self.use_ssl,
                verify=self.verify,
                aws_access_key_id=self.aws_access_key_id,
                aws_secret_access_key=self.aws_secret_access_key,
                aws_session_token=self.aws_session_token,
                config=self._config,
            )

    return TimedS3Resource


def executor_client(settings: S3Settings) -> Any:
    return settings.client()


def split_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key prefix) of `s3://bucket/prefix`; the prefix is '' or ends with '/'."""
    rest = uri.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    return bucket, (prefix + "/" if prefix else "")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: attempt n waits uniform(0, min(max_delay, base * 2**n)),
    and no retry starts once `deadline` seconds have passed since the operation's first attempt.

    The deadline is one attempt at the default Timeouts (connect 10 s + read 30 s): an endpoint
    that never answers gets a second chance (a lost response is retried), and its operation
    ends within two attempts, 80 s at most (60 s when it accepts connections), well inside two
    minutes. Throttling and resets fail fast: the pauses of all 8 attempts add up to 6.35 s at
    most, so they are retried as many times as ever. Eight attempts that each time out would
    take 8 x 30 s and more.
    """

    attempts: int = 8
    base_delay: float = 0.05
    max_delay: float = 10.0
    deadline: float = 40.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.max_delay, self.base_delay * (2**attempt)))


class NoAnswer(Exception):
    """Every attempt of an operation timed out: the endpoint took no request, or answered none in
    time. Its text is what the stores' messages name instead of the SDK's ReadTimeout, which
    says neither where nor how long."""

    def __init__(self, endpoint: str, attempts: int, seconds: float):
        super().__init__(f"the endpoint {endpoint} did not answer within {seconds:.0f} s ({attempts} attempts)")


def origin(url: str) -> str:
    """`scheme://host[:port]` of a request's URL: the endpoint, without bucket, key or query."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def timed_out_endpoint(exc: BaseException) -> Optional[str]:
    """The endpoint a botocore connect or read timeout names, else None (any other failure)."""
    from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

    if isinstance(exc, (ConnectTimeoutError, ReadTimeoutError)):
        return origin(str(exc.kwargs.get("endpoint_url", "")))
    return None


def error_code(exc: BaseException) -> str:
    """The S3 error code of a ClientError (`SlowDown`, `AccessDenied`, `404`), NoAnswer's text,
    else the exception's type."""
    if isinstance(exc, NoAnswer):
        return str(exc)
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
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, ClientError):
        return error_code(exc) in RETRYABLE_CODES
    return isinstance(exc, (BotoConnectionError, HTTPClientError))


def call_with_retries(
    what: str,
    operation: Callable[[], R],
    policy: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
    rng: Optional[random.Random] = None,
    retryable: Callable[[BaseException], bool] = is_retryable,
    code: Callable[[BaseException], str] = error_code,
    timed_out: Callable[[BaseException], Optional[str]] = timed_out_endpoint,
    clock: Callable[[], float] = time.monotonic,
) -> R:
    """Run `operation`, retrying failures `retryable` accepts (S3's by default; the Azure and
    GCS stores pass their own) until the policy's attempts or deadline run out; the last
    failure is raised, as NoAnswer when every attempt timed out (`timed_out` names the endpoint)."""
    rng = rng or random.Random()
    started = clock()
    answered = False
    for attempt in range(policy.attempts):
        try:
            return operation()
        except Exception as exc:
            endpoint = timed_out(exc)
            answered = answered or endpoint is None
            pause = policy.delay(attempt, rng)
            if not retryable(exc) or attempt + 1 == policy.attempts or clock() - started + pause > policy.deadline:
                if endpoint is not None and not answered:
                    raise NoAnswer(endpoint, attempt + 1, clock() - started) from exc
                raise
            log.warning("%s: %s, retry %d of %d in %.3fs", what, code(exc), attempt + 1, policy.attempts - 1, pause)
            sleep(pause)
    raise AssertionError("unreachable: the last attempt returns or raises")
