"""S3 clients and their failures: settings an executor builds its own client from (with the
stores' timeouts), and S3's error codes as the retries judge them (S3_FAILURES)."""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from gc_assets.core.config import EnvSecret, S3Override, revealed
from gc_assets.stores.executor import CLIENT_THREADS
from gc_assets.stores.retries import Failures, NoAnswer, Timeouts, origin

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


# S3's failures: which are retried, their codes, and the endpoint a botocore timeout names.
S3_FAILURES = Failures(is_retryable, error_code, timed_out_endpoint)
