"""A fault-injecting HTTP proxy on 127.0.0.1, put between the product and an emulator (moto,
Azurite, fake-gcs-server), as a loaded cloud or a bad network behaves.

On a seeded random share of requests it injects one fault:

- `throttle`: a 503 in the cloud's own words (S3 `SlowDown` XML, Azure `ServerBusy`, GCS JSON),
  the request never reaching the emulator;
- `reset`: the connection reset (RST) before the request is forwarded;
- `truncate`: the request forwarded, then the response cut short (a Content-Length larger than
  the body sent, then close): the emulator acted, the client cannot know;
- `stall`: the request forwarded, the response held back `stall_seconds` (or until the client
  gives up), then sent.

Each phase gets every kind once before any kind twice. Faults are bounded in count
(`max_faults`, and `per_phase` for a kind in each phase: a stall costs the client a whole
timeout, a throttle or reset almost nothing) and in time (no stall is longer than
`stall_seconds`); each is counted by phase: the one the test set (`phase`), else the one the
request shows (listing, mark_reads for object reads, sweep for checks, deletes, copies and
writes); `phases`, when set, are the only phases given random faults. `rules` make targeted
faults: (predicate on the request, fault) pairs tried first, and not bounded by `max_faults`,
so a targeted fault is never crowded out by random ones.
"""

from __future__ import annotations

import http.client
import json
import random
import select
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional
from urllib.parse import parse_qs, urlsplit

KINDS = ("throttle", "reset", "truncate", "stall")


@dataclass(frozen=True)
class Request:
    method: str
    target: str  # path and query, as sent
    headers: dict[str, str]  # names lower-cased
    body: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query, keep_blank_values=True)

    def is_listing(self) -> bool:
        """S3 ListObjects(V2), Azure List Blobs, GCS objects.list."""
        query = self.query
        if self.method != "GET":
            return False
        if "list-type" in query or query.get("comp") == ["list"]:
            return True
        if self.path.rstrip("/").endswith("/o") and "/storage/v1/b/" in self.path:
            return True
        # S3 ListObjects (v1): GET on the bucket itself, path style.
        return (
            self.path.count("/") == 1 and "/storage/" not in self.path and ("prefix" in query or "delimiter" in query)
        )

    def phase(self) -> str:
        if self.is_listing():
            return "listing"
        if self.method == "GET":
            return "mark_reads"
        return "sweep"


def _s3_throttle() -> tuple[int, dict[str, str], bytes]:
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
        b"<Message>Please reduce your request rate.</Message><RequestId>fault-proxy</RequestId></Error>"
    )
    return 503, {"Content-Type": "application/xml"}, body


def _azure_throttle() -> tuple[int, dict[str, str], bytes]:
    body = (
        b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
        b"<Message>The server is busy.</Message></Error>"
    )
    return 503, {"Content-Type": "application/xml", "x-ms-error-code": "ServerBusy"}, body


def _gcs_throttle() -> tuple[int, dict[str, str], bytes]:
    error = {
        "code": 503,
        "message": "Backend Error",
        "errors": [{"reason": "backendError", "message": "Backend Error"}],
    }
    return 503, {"Content-Type": "application/json; charset=UTF-8"}, json.dumps({"error": error}).encode()


THROTTLES: dict[str, Callable[[], tuple[int, dict[str, str], bytes]]] = {
    "s3": _s3_throttle,
    "azure": _azure_throttle,
    "gcs": _gcs_throttle,
}


@dataclass
class FaultProxy:
    """Forwards 127.0.0.1:<port> to `upstream` (host, port), injecting faults (module docstring)."""

    upstream: tuple[str, int]
    cloud: str  # "s3", "azure" or "gcs": how a throttle is spelled
    seed: int = 0
    rate: float = 0.10
    kinds: tuple[str, ...] = KINDS
    max_faults: int = 200
    per_phase: dict[str, int] = field(default_factory=dict)  # kind -> random faults of it per phase at most
    phases: Optional[tuple[str, ...]] = None  # the phases random faults may hit; None: every phase
    stall_seconds: float = 4.0
    rules: list[tuple[Callable[[Request], bool], str]] = field(default_factory=list)
    enabled: bool = True
    phase: Optional[str] = None  # set by the test between steps; else inferred per request

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        self.injected: Counter[tuple[str, str]] = Counter()  # (phase, kind) -> count
        self.requests: Counter[str] = Counter()  # phase -> requests seen
        self._server: Optional[socketserver.ThreadingTCPServer] = None
        self._closing = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> "FaultProxy":
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128  # a client's parallel requests all connect at once (the default, 5,
            # drops connections the client then waits a whole connect timeout for: a fault nobody chose)

        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @contextmanager
    def in_phase(self, phase: Optional[str]) -> Iterator[None]:
        saved, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = saved

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """No faults inside (a rerun without faults through the same endpoint)."""
        saved, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = saved

    def counts(self) -> dict[str, dict[str, int]]:
        """{phase: {kind: faults injected}} (phases without a fault left out)."""
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for (phase, kind), count in sorted(self.injected.items()):
                out.setdefault(phase, {})[kind] = count
        return out

    def total(self) -> int:
        with self._lock:
            return sum(self.injected.values())

    def reset_counts(self) -> None:
        with self._lock:
            self.injected.clear()
            self.requests.clear()

    # -- one connection --------------------------------------------------------------------

    def _choose(self, request: Request) -> tuple[str, Optional[str]]:
        phase = self.phase or request.phase()
        with self._lock:
            self.requests[phase] += 1
            if not self.enabled:
                return phase, None
            kind = next((k for match, k in self.rules if match(request)), None)
            below_bound = sum(self.injected.values()) < self.max_faults
            random_here = self.kinds and (self.phases is None or phase in self.phases)
            if kind is None and below_bound and random_here and self._rng.random() < self.rate:
                kind = self._next_kind(phase)
            if kind is not None:
                self.injected[(phase, kind)] += 1
            return phase, kind

    def _next_kind(self, phase: str) -> Optional[str]:
        """A kind the phase has had least of (every kind once before any twice, in seeded order),
        among those below their `per_phase` bound; None when every kind is at its bound."""
        counts = {k: self.injected[(phase, k)] for k in self.kinds}
        open_kinds = [k for k in self.kinds if counts[k] < self.per_phase.get(k, self.max_faults)]
        if not open_kinds:
            return None
        fewest = min(counts[k] for k in open_kinds)
        return self._rng.choice([k for k in open_kinds if counts[k] == fewest])

    def _serve(self, client: socket.socket) -> None:
        reader = client.makefile("rb")
        try:
            while not self._closing.is_set():
                request = _read_request(reader, client)
                if request is None:
                    return
                _, kind = self._choose(request)
                if kind == "reset":
                    _reset(client)
                    return
                if kind == "throttle":
                    status, headers, body = THROTTLES[self.cloud]()
                    _send(client, status, "Service Unavailable", headers, body, request.method)
                    continue
                response = self._forward(request)
                if response is None:  # the emulator itself failed: a reset, as the client would see
                    _reset(client)
                    return
                status, reason, headers, body = response
                if kind == "truncate":
                    _send_truncated(client, status, reason, headers, body, request.method)
                    return
                if kind == "stall":
                    self._stall(client)
                _send(client, status, reason, headers, body, request.method)
        except (OSError, ValueError):
            return
        finally:
            try:
                reader.close()
                client.close()
            except OSError:
                pass

    def _stall(self, client: socket.socket) -> None:
        """Hold the response `stall_seconds`, or until the client closes its end."""
        deadline = time.monotonic() + self.stall_seconds
        while (left := deadline - time.monotonic()) > 0 and not self._closing.is_set():
            readable, _, _ = select.select([client], [], [], min(left, 0.2))
            if readable and not client.recv(1, socket.MSG_PEEK):
                raise OSError("the client gave up during the stall")

    def _forward(self, request: Request) -> Optional[tuple[int, str, list[tuple[str, str]], bytes]]:
        connection = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            connection.putrequest(request.method, request.target, skip_host=True, skip_accept_encoding=True)
            for name, value in request.headers.items():
                if name not in ("expect", "connection", "transfer-encoding", "content-length", "keep-alive"):
                    connection.putheader(name, value)
            if request.body or request.method in ("PUT", "POST", "PATCH"):
                connection.putheader("content-length", str(len(request.body)))
            connection.putheader("connection", "close")
            connection.endheaders(request.body or None)
            response = connection.getresponse()
            body = response.read()
            headers = [
                (k, v)
                for k, v in response.getheaders()
                if k.lower() not in ("transfer-encoding", "connection", "keep-alive")
            ]
            return response.status, response.reason, headers, body
        except (OSError, http.client.HTTPException):
            return None
        finally:
            connection.close()


def _read_request(reader, client: socket.socket) -> Optional[Request]:
    line = reader.readline(65537)
    while line in (b"\r\n", b"\n"):
        line = reader.readline(65537)
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        header = reader.readline(65537)
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("expect", "").lower() == "100-continue":
        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = b""
        while True:
            size = int(reader.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while reader.readline() not in (b"\r\n", b"\n", b""):
                    pass
                break
            body += reader.read(size)
            reader.readline()
    else:
        body = reader.read(int(headers.get("content-length", "0") or 0))
    return Request(method, target, headers, body)


def _head(status: int, reason: str, headers: list[tuple[str, str]] | dict[str, str], length: int) -> bytes:
    items = headers.items() if isinstance(headers, dict) else headers
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{k}: {v}" for k, v in items if k.lower() != "content-length"]
    lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _send(client: socket.socket, status: int, reason: str, headers, body: bytes, method: str) -> None:
    if method == "HEAD":
        items = headers.items() if isinstance(headers, dict) else headers
        length = next((v for k, v in items if k.lower() == "content-length"), "0")
        client.sendall(_head(status, reason, headers, int(length)))
        return
    client.sendall(_head(status, reason, headers, len(body)) + body)


def _send_truncated(client: socket.socket, status: int, reason: str, headers, body: bytes, method: str) -> None:
    """Headers promising the whole body (at least one byte), then half of it, then close."""
    if method == "HEAD" or status in (204, 304):  # no body to cut: the status line is
        client.sendall(b"HTTP/1.1 ")
    else:
        client.sendall(_head(status, reason, headers, max(len(body), 1)) + body[: len(body) // 2])
    client.shutdown(socket.SHUT_RDWR)


def _reset(client: socket.socket) -> None:
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()
