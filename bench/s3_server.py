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
def versioning_as_s3() -> Iterator[None]:
    """While open, moto answers two versioning requests as S3 does where moto 5.2 does not.

    ListObjectVersions with a KeyMarker alone lists the versions of the keys after it (moto also
    skips the first version at or past the marker, taking it for its own page token, so a
    listing that starts a key range there would lose an object S3 lists). A delete on a bucket
    whose versioning is Suspended removes only the version it names, or without one the "null"
    version, leaving a delete marker (moto removes every version of the key).
    """
    import threading

    from moto.core.utils import unix_time_millis
    from moto.s3.models import FakeKey, S3Backend

    original = S3Backend.list_object_versions
    original_delete = S3Backend.delete_object
    suspended_deletes = threading.Lock()

    def delete_object(self, bucket_name, key_name, version_id=None, bypass=False):
        bucket = self.get_bucket(bucket_name)
        if getattr(bucket, "versioning_status", None) != "Suspended":
            return original_delete(self, bucket_name, key_name, version_id, bypass)
        with suspended_deletes:  # moto's own versioned deletes, the bucket read as Enabled meanwhile
            bucket.versioning_status = "Enabled"
            try:
                if version_id is None:
                    original_delete(self, bucket_name, key_name, "null", bypass)
                return original_delete(self, bucket_name, key_name, version_id, bypass)
            finally:
                bucket.versioning_status = "Suspended"

    def list_object_versions(
        self, bucket_name, delimiter=None, key_marker=None, max_keys=1000, prefix="", version_id_marker=None
    ):
        if key_marker is None or version_id_marker or delimiter:
            return original(self, bucket_name, delimiter, key_marker, max_keys, prefix, version_id_marker)
        versions, _, markers, _, _ = original(self, bucket_name, None, None, None, prefix, None)
        after = sorted(
            (v for v in [*versions, *markers] if v.name > key_marker),
            key=lambda v: (v.name, -unix_time_millis(v.last_modified)),
        )
        page = after[:max_keys] if max_keys is not None else after
        last = page[-1] if page and len(after) > len(page) else None
        return (
            [v for v in page if isinstance(v, FakeKey)],
            [],
            [v for v in page if not isinstance(v, FakeKey)],
            last.name if last else None,
            last.version_id if last else None,
        )

    S3Backend.list_object_versions, S3Backend.delete_object = list_object_versions, delete_object
    try:
        yield
    finally:
        S3Backend.list_object_versions, S3Backend.delete_object = original, original_delete


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
