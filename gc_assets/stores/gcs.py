"""Google Cloud Storage namespaces (`gs://bucket/prefix`), with google-cloud-storage behind the
shared engine (stores/blobs.py).

Credentials are the repository's gc.yaml `gcs` service account key or access token, each an
`{env: NAME}` reference read on the machine that uses it; else Application Default Credentials
on each executor (environment, workload identity, metadata server). STORAGE_EMULATOR_HOST
selects an emulator as the library itself does. The endpoint is the repository's
`gcs.endpoint_url` (an `http://` endpoint without configured credentials is an emulator and is
reached anonymously). The library's own retries are off (retry=None): the engine retries 429,
5xx and connection failures itself. Every call passes timeout=(connect, read) from the
settings: the library's default is one value for both, and a call without it would wait its
60 s per read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from gc_assets.core.config import ConfigError, EnvSecret, GcsOverride
from gc_assets.core.uris import normalize_namespace
from gc_assets.stores.blobs import (
    ABSENT,
    BlobClient,
    BlobInfo,
    BlobSettings,
    BlobStore,
    retried,
)
from gc_assets.stores.retries import NoAnswer, RetryPolicy, Timeouts, origin
from gc_assets.stores.slices import DelimiterPage, Slice

BATCH_SIZE = 100  # JSON API batch requests: at most 100 calls per batch
PAGE_SIZE = 1000
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class GcsSettings(BlobSettings):
    endpoint_url: Optional[str] = None  # gc.yaml `gcs.endpoint_url`: an emulator, a private endpoint
    project: Optional[str] = None
    timeouts: Timeouts = field(default_factory=Timeouts.from_environment)
    credentials: Optional[EnvSecret] = None  # gc.yaml credentials: variable names, read at use
    token: Optional[EnvSecret] = None

    @classmethod
    def of_override(cls, override: GcsOverride, timeouts: Optional[Timeouts] = None) -> "GcsSettings":
        """gc.yaml's `gcs` block; timeouts from the driver's settings, else this process's environment."""
        timeouts = timeouts or Timeouts.from_environment()
        return cls(
            override.endpoint_url, override.project, timeouts, credentials=override.credentials, token=override.token
        )

    def configured_credentials(self) -> Any:
        """google-auth credentials from gc.yaml's service account key or token, else None (ADC)."""
        if self.token is not None:
            from google.oauth2.credentials import Credentials

            return Credentials(token=self.token.reveal())
        if self.credentials is not None:
            from google.oauth2 import service_account

            try:
                info = json.loads(self.credentials.reveal())
                return service_account.Credentials.from_service_account_info(
                    info, scopes=["https://www.googleapis.com/auth/devstorage.full_control"]
                )
            except (ValueError, KeyError):  # the message could quote the key: name the variable only
                raise ConfigError(f"${self.credentials.env} is not a service account key (JSON)") from None
        return None

    def service(self) -> Any:
        from google.cloud import storage

        options = {"api_endpoint": self.endpoint_url} if self.endpoint_url else None
        project = self.project or os.environ.get("GOOGLE_CLOUD_PROJECT") or None
        configured = self.configured_credentials()
        if configured is not None:
            return storage.Client(
                project=project or getattr(configured, "project_id", None),
                credentials=configured,
                client_options=options,
            )
        if self.endpoint_url and self.endpoint_url.startswith("http://"):
            from google.auth.credentials import AnonymousCredentials

            return storage.Client(
                project=project or "emulator", credentials=AnonymousCredentials(), client_options=options
            )
        return storage.Client(project=project, client_options=options)

    def client(self, container: str) -> "GcsClient":
        return GcsClient(self.service(), container, (self.timeouts.connect, self.timeouts.read))


class GcsClient(BlobClient):
    batch_size = BATCH_SIZE

    def __init__(self, service: Any, bucket: str, timeout: tuple[float, float]):
        self._service = service
        self._timeout = timeout  # (connect, read) seconds, passed to every call
        self._bucket = service.bucket(bucket)
        self.batch_supported = True  # False once the endpoint answered a batch request with no multipart reply

    def error_code(self, exc: BaseException) -> str:
        if isinstance(exc, NoAnswer):
            return str(exc)
        code = getattr(exc, "code", None)
        return str(int(code)) if isinstance(code, int) else type(exc).__name__

    def is_retryable(self, exc: BaseException) -> bool:
        """Also a connection failure, a timeout and an answer cut short (ChunkedEncodingError:
        fewer bytes than its Content-Length)."""
        import requests

        if isinstance(exc, (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)):
            return True
        return getattr(exc, "code", None) in RETRYABLE_STATUS

    def timed_out_endpoint(self, exc: BaseException) -> Optional[str]:
        import requests

        if not isinstance(exc, requests.Timeout):
            return None
        return origin(exc.request.url if exc.request is not None else self._service._connection.API_BASE_URL)

    def is_absent(self, exc: BaseException) -> bool:
        return getattr(exc, "code", None) == 404

    def is_condition_failed(self, exc: BaseException) -> bool:
        return getattr(exc, "code", None) in (409, 412)

    def _page(
        self, prefix: str, delimiter: bool, start: Optional[str], end: Optional[str], token: Optional[str], size: int
    ):
        iterator = self._service.list_blobs(
            self._bucket,
            prefix=prefix,
            delimiter="/" if delimiter else None,
            start_offset=start,
            end_offset=end,
            page_token=token,
            page_size=size,
            retry=None,
            timeout=self._timeout,
        )
        page = next(iterator.pages)
        return list(page), set(page.prefixes), iterator.next_page_token

    def children(self, prefix: str, page_size: int) -> DelimiterPage:
        items, prefixes, token = self._page(prefix, True, None, None, None, page_size)
        return DelimiterPage(sorted(prefixes), bool(items), token is not None)

    def list(self, piece: Slice, policy: RetryPolicy) -> Iterator[BlobInfo]:
        """Key ranges are listed exactly (startOffset, endOffset)."""
        token = None
        while True:
            items, _, token = retried(
                self,
                f"list gs://{self._bucket.name}/{piece.prefix}",
                lambda: self._page(piece.prefix, not piece.recursive, piece.start, piece.end, token, PAGE_SIZE),
                policy,
            )
            yield from (self._info(item) for item in items if piece.holds(item.name))
            if token is None:
                return

    def _info(self, blob: Any) -> BlobInfo:
        return BlobInfo(blob.name, int(blob.size), blob.updated, str(blob.generation), blob.md5_hash or None)

    def head(self, key: str) -> Optional[BlobInfo]:
        blob = self._bucket.get_blob(key, retry=None, timeout=self._timeout)
        return None if blob is None else self._info(blob)

    def delete_batch(self, items: list[tuple[str, str]]) -> dict[str, Optional[str]]:
        """One batch request of deletes, each with ifGenerationMatch the version its check saw.

        An endpoint without batch support (fake-gcs-server answers without a multipart reply)
        gets the same conditional deletes one request each, from then on.
        """
        if self.batch_supported:
            try:
                with self._service.batch(raise_exception=False) as batch:
                    for key, version in items:
                        self._bucket.blob(key).delete(
                            if_generation_match=int(version), retry=None, timeout=self._timeout
                        )
                return {key: _answer(r.status_code) for (key, _), r in zip(items, batch._responses)}
            except ValueError:  # google-cloud-storage: "Bad response: not multi-part"
                self.batch_supported = False
        answers: dict[str, Optional[str]] = {}
        for key, version in items:
            try:
                self._bucket.blob(key).delete(if_generation_match=int(version), retry=None, timeout=self._timeout)
                answers[key] = None
            except Exception as exc:  # noqa: BLE001 - an HTTP answer is a per-key answer, like the batch's
                if not isinstance(getattr(exc, "code", None), int):
                    raise
                answers[key] = _answer(exc.code)  # type: ignore[attr-defined]
        return answers

    def copy_if_absent(self, source: str, destination: str, version: str) -> str:
        """copyTo with ifGenerationMatch=0 (the destination must not exist) and ifSourceGenerationMatch."""
        copied = self._bucket.copy_blob(
            self._bucket.blob(source),
            self._bucket,
            destination,
            if_generation_match=0,
            if_source_generation_match=int(version),
            retry=None,
            timeout=self._timeout,
        )
        return str(copied.generation)

    def read(self, key: str) -> bytes:
        return self._bucket.blob(key).download_as_bytes(retry=None, timeout=self._timeout)

    def write(self, key: str, data: bytes, exclusive: bool) -> None:
        """Upload; with `exclusive` only when no live generation exists (ifGenerationMatch=0)."""
        self._bucket.blob(key).upload_from_string(
            data, if_generation_match=0 if exclusive else None, retry=None, timeout=self._timeout
        )

    def remove(self, key: str) -> None:
        self._bucket.blob(key).delete(retry=None, timeout=self._timeout)

    def keys(self, prefix: str) -> list[str]:
        return [
            blob.name
            for blob in self._service.list_blobs(self._bucket, prefix=prefix, retry=None, timeout=self._timeout)
        ]


def _answer(status: int) -> Optional[str]:
    if status in (200, 204):
        return None
    return ABSENT if status == 404 else str(status)


def gcs_store(namespace: str, override: GcsOverride = GcsOverride()) -> BlobStore:
    """The store of a `gs://bucket/prefix` namespace."""
    bucket, _, prefix = normalize_namespace(namespace)[len("gs://") :].partition("/")
    return BlobStore(namespace, bucket.lower(), prefix + "/" if prefix else "", GcsSettings.of_override(override))
