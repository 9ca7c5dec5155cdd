"""An S3 endpoint on 127.0.0.1 for the bench and the tests: moto's server over HTTP, with fake
credentials, and the few calls both make of it (uploading a directory, listing keys)."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from moto.server import ThreadedMotoServer

FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


@contextmanager
def conditional_writes_atomic() -> Iterator[None]:
    """S3 decides a conditional PutObject (If-None-Match, If-Match) atomically; moto 5.2 checks
    the key and then writes it, so two writers racing on one key can both be told they won.
    While open, moto's conditional writes are taken one at a time, as S3 answers them."""
    import threading

    from moto.s3.responses import S3Response

    original = S3Response._key_response_put
    conditional = threading.Lock()

    def key_response_put(self, query, key_name):
        if "If-None-Match" not in self.headers and "If-Match" not in self.headers:
            return original(self, query, key_name)
        with conditional:
            return original(self, query, key_name)

    S3Response._key_response_put = key_response_put
    try:
        yield
    finally:
        S3Response._key_response_put = original


@contextmanager
def moto_server() -> Iterator[dict[str, str]]:
    """moto's S3 server on 127.0.0.1, its conditional writes atomic as S3's; yields the AWS
    variables that point a client at it."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    with conditional_writes_atomic():
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
        finally:
            server.stop()


def upload_tree(client: Any, directory: Path, bucket: str, prefix: str) -> set[str]:
    """Upload every file under `directory` to `prefix/<relative path>`; returns the keys."""
    files = [p for p in sorted(directory.rglob("*")) if p.is_file()]
    keys = [f"{prefix}/{p.relative_to(directory).as_posix()}" for p in files]
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda pair: client.put_object(Bucket=bucket, Key=pair[1], Body=pair[0].read_bytes()),
                zip(files, keys),
            )
        )
    return set(keys)


def listed_keys(client: Any, bucket: str, prefix: str = "") -> set[str]:
    """Every key under `prefix`."""
    keys: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.update(item["Key"] for item in page.get("Contents", []))
    return keys
