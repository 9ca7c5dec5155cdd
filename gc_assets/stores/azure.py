"""Azure Blob Storage and ADLS Gen2 namespaces (`abfss://container@account.dfs.core.windows.net/prefix`
and its `wasbs://`, `az://` spellings), with azure-storage-blob behind the shared engine (stores/blobs.py).

Credentials are the repository's gc.yaml `azure` account key, SAS or connection string, each
an `{env: NAME}` reference read on the machine that uses it; else Azure's standard chain on each
executor: a connection string in AZURE_STORAGE_CONNECTION_STRING (account key or SAS) when it
names the namespace's account, else DefaultAzureCredential (environment, workload identity,
managed identity, Azure CLI). The blob endpoint is the repository's `azure.endpoint_url` (Azurite,
sovereign clouds), else the connection string's BlobEndpoint, else https://<account>.blob.<suffix>.
The SDK's own retries are off: the engine retries ServerBusy / 503, other 5xx and connection
failures itself; every request waits at most the settings' timeouts to connect and to read,
and an operation retries within the engine's deadline (RetryPolicy.deadline).
"""

from __future__ import annotations

import base64
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from gc_assets.core.config import AzureOverride, EnvSecret
from gc_assets.core.uris import azure_parts
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

BATCH_SIZE = 256  # Blob Batch: at most 256 subrequests per batch
PAGE_SIZE = 5000  # List Blobs: at most 5000 results per page
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
RETRYABLE_CODES = frozenset({"ServerBusy", "OperationTimedOut", "InternalError"})
COPY_WAIT_SECONDS = 60.0  # a pending server-side copy is polled this long before it is a failure


def connection_string_parts(value: str) -> dict[str, str]:
    """`Key=Value;...` pairs of an Azure Storage connection string (values may hold '=')."""
    pairs = (item.partition("=") for item in value.split(";") if item.strip())
    return {key.strip(): val.strip() for key, _, val in pairs}


@dataclass(frozen=True)
class AzureSettings(BlobSettings):
    """One storage account's location: account, endpoint suffix and an optional endpoint override."""

    account: str
    suffix: str = "core.windows.net"
    endpoint_url: Optional[str] = None  # gc.yaml `azure.endpoint_url`: Azurite, sovereign clouds
    timeouts: Timeouts = field(default_factory=Timeouts.from_environment)
    account_key: Optional[EnvSecret] = None  # gc.yaml credentials: variable names, read at use
    sas_token: Optional[EnvSecret] = None
    connection_string: Optional[EnvSecret] = None

    @classmethod
    def of_override(
        cls, account: str, suffix: str, override: AzureOverride, timeouts: Optional[Timeouts] = None
    ) -> "AzureSettings":
        """gc.yaml's `azure` block; timeouts from the driver's settings, else this process's environment."""
        return cls(
            account,
            suffix,
            override.endpoint_url,
            timeouts or Timeouts.from_environment(),
            account_key=override.account_key,
            sas_token=override.sas_token,
            connection_string=override.connection_string,
        )

    def resolve(self) -> tuple[str, dict[str, str]]:
        """(the blob endpoint URL, {"account_key" or "sas_token": ...}: gc.yaml's, else the connection
        string's when it names this account, else {}: DefaultAzureCredential's turn). Resolved on the
        machine that uses them, never stored in the settings."""
        default = f"https://{self.account}.blob.{self.suffix}"
        if self.account_key is not None:
            return self.endpoint_url or default, {"account_key": self.account_key.reveal()}
        if self.sas_token is not None:
            return self.endpoint_url or default, {"sas_token": self.sas_token.reveal().lstrip("?")}
        configured = self.connection_string is not None
        text = (
            self.connection_string.reveal()
            if self.connection_string is not None
            else os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
        )
        parts = connection_string_parts(text)
        ours = (
            configured
            or parts.get("AccountName", "").lower() == self.account
            or (not parts.get("AccountName") and "SharedAccessSignature" in parts)
        )
        url = self.endpoint_url or (parts.get("BlobEndpoint") if ours else None) or default
        if ours and "AccountKey" in parts:
            return url, {"account_key": parts["AccountKey"]}
        if ours and "SharedAccessSignature" in parts:
            return url, {"sas_token": parts["SharedAccessSignature"]}
        return url, {}

    def service(self) -> Any:
        """A BlobServiceClient with the SDK's retries off and our timeouts."""
        from azure.storage.blob import BlobServiceClient

        url, secret = self.resolve()
        if "account_key" in secret:
            credential: Any = {"account_name": self.account, "account_key": secret["account_key"]}
        elif "sas_token" in secret:
            credential = secret["sas_token"]
        else:
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
        return BlobServiceClient(
            account_url=url,
            credential=credential,
            retry_total=0,
            connection_timeout=self.timeouts.connect,
            read_timeout=self.timeouts.read,
        )

    def client(self, container: str) -> "AzureClient":
        return AzureClient(self.service().get_container_client(container))


class AzureClient(BlobClient):
    batch_size = BATCH_SIZE

    def __init__(self, container: Any):
        self._container = container

    def error_code(self, exc: BaseException) -> str:
        if isinstance(exc, NoAnswer):
            return str(exc)
        code = getattr(exc, "error_code", None)
        if code:
            return str(getattr(code, "value", code))
        status = getattr(exc, "status_code", None)
        return str(status) if status else type(exc).__name__

    def is_retryable(self, exc: BaseException) -> bool:
        """Also a connection failure or an answer cut short (IncompleteReadError), which the SDK's
        download wraps in a plain HttpResponseError of the 200 it had started to read."""
        from azure.core.exceptions import IncompleteReadError, ServiceRequestError, ServiceResponseError

        cause: Optional[BaseException] = exc
        while cause is not None:
            if isinstance(cause, (ServiceRequestError, ServiceResponseError, IncompleteReadError)):
                return True
            cause = cause.__cause__
        return getattr(exc, "status_code", None) in RETRYABLE_STATUS or self.error_code(exc) in RETRYABLE_CODES

    def timed_out_endpoint(self, exc: BaseException) -> Optional[str]:
        from azure.core.exceptions import ServiceRequestTimeoutError, ServiceResponseTimeoutError

        if isinstance(exc, (ServiceRequestTimeoutError, ServiceResponseTimeoutError)):
            return origin(self._container.url)
        return None

    def is_absent(self, exc: BaseException) -> bool:
        return getattr(exc, "status_code", None) == 404

    def is_condition_failed(self, exc: BaseException) -> bool:
        return getattr(exc, "status_code", None) in (409, 412)

    def _page(self, prefix: str, delimiter: bool, token: Optional[str], size: int) -> tuple[list[Any], Optional[str]]:
        """One listing page (blobs and, with the delimiter, BlobPrefix entries) and the next token."""
        items = (
            self._container.walk_blobs(name_starts_with=prefix, delimiter="/", results_per_page=size)
            if delimiter
            else self._container.list_blobs(name_starts_with=prefix, results_per_page=size)
        )
        pages = items.by_page(continuation_token=token)
        return list(next(pages)), pages.continuation_token

    def children(self, prefix: str, page_size: int) -> DelimiterPage:
        from azure.storage.blob import BlobPrefix

        items, token = self._page(prefix, True, None, page_size)
        children = sorted(i.name for i in items if isinstance(i, BlobPrefix))
        return DelimiterPage(children, any(not isinstance(i, BlobPrefix) for i in items), token is not None)

    def list(self, piece: Slice, policy: RetryPolicy) -> Iterator[BlobInfo]:
        """List Blobs has no start-after: a key range is listed from the longest prefix its keys share."""
        from azure.storage.blob import BlobPrefix

        prefix, token = range_prefix(piece), None
        while True:
            items, token = retried(
                self, f"list {prefix}", lambda: self._page(prefix, not piece.recursive, token, PAGE_SIZE), policy
            )
            for item in items:
                if isinstance(item, BlobPrefix):
                    continue
                if piece.end is not None and item.name >= piece.end:
                    return
                if piece.holds(item.name):
                    yield self._info(item)
            if token is None:
                return

    def _info(self, item: Any) -> BlobInfo:
        md5 = item.content_settings.content_md5 if item.content_settings else None
        digest = base64.b64encode(bytes(md5)).decode() if md5 else None
        return BlobInfo(item.name, int(item.size), item.last_modified, item.etag, digest)

    def head(self, key: str) -> Optional[BlobInfo]:
        try:
            return self._info(self._container.get_blob_client(key).get_blob_properties())
        except Exception as exc:
            if self.is_absent(exc):
                return None
            raise

    def delete_batch(self, items: list[tuple[str, str]]) -> dict[str, Optional[str]]:
        """One Blob Batch request; each delete carries If-Match with the version its check saw."""
        from azure.core import MatchConditions

        requests = [
            {"name": key, "etag": version, "match_condition": MatchConditions.IfNotModified} for key, version in items
        ]
        responses = list(self._container.delete_blobs(*requests, raise_on_any_failure=False))
        answers: dict[str, Optional[str]] = {}
        for (key, _), response in zip(items, responses):
            status = response.status_code
            if status in (200, 202):
                answers[key] = None
            elif status == 404:
                answers[key] = ABSENT
            else:
                answers[key] = response.headers.get("x-ms-error-code") or str(status)
        return answers

    def copy_if_absent(self, source: str, destination: str, version: str) -> str:
        """Copy Blob with If-None-Match: * on the destination and If-Match on the source."""
        from azure.core import MatchConditions

        target = self._container.get_blob_client(destination)
        result = target.start_copy_from_url(
            self._container.get_blob_client(source).url,
            match_condition=MatchConditions.IfMissing,
            source_etag=version,
            source_match_condition=MatchConditions.IfNotModified,
        )
        deadline = time.monotonic() + COPY_WAIT_SECONDS
        while result.get("copy_status") == "pending" and time.monotonic() < deadline:
            time.sleep(0.5)
            properties = target.get_blob_properties()
            result = {"copy_status": properties.copy.status, "etag": properties.etag}
        if result.get("copy_status") != "success":
            raise RuntimeError(f"copy of {source} ended {result.get('copy_status')}")
        return str(result["etag"])

    def read(self, key: str) -> bytes:
        return self._container.get_blob_client(key).download_blob().readall()

    def write(self, key: str, data: bytes, exclusive: bool) -> None:
        """Upload; with `exclusive` the SDK sends If-None-Match: * (overwrite=False)."""
        self._container.upload_blob(key, data, overwrite=not exclusive)

    def remove(self, key: str) -> None:
        self._container.delete_blob(key)

    def keys(self, prefix: str) -> list[str]:
        return [item.name for item in self._container.list_blobs(name_starts_with=prefix)]


def range_prefix(piece: Slice) -> str:
    """The longest prefix every key of the slice starts with: the common prefix of its bounds,
    or the lower bound itself when the upper one is the next string of that length (`p/a`, `p/b`)."""
    if piece.start is None or piece.end is None:
        return piece.prefix
    start, end = piece.start, piece.end
    if len(start) == len(end) and start[:-1] == end[:-1] and ord(end[-1]) == ord(start[-1]) + 1:
        return start
    shared = os.path.commonprefix([start, end])
    return shared if shared.startswith(piece.prefix) else piece.prefix


def azure_store(namespace: str, override: AzureOverride = AzureOverride()) -> BlobStore:
    """The store of a normalized `abfss://container@account.dfs.<suffix>/prefix` namespace."""
    container, account, suffix, prefix = azure_parts(namespace)
    settings = AzureSettings.of_override(account, suffix, override)
    return BlobStore(namespace, container, prefix + "/" if prefix else "", settings)
