"""A real S3 endpoint for the tests: moto's server on 127.0.0.1, over HTTP.

The fixture points the standard AWS environment variables at it (fake credentials)
for this process and for the Spark executors. Executors are Python workers the JVM
starts with its own environment, fixed when the session began, so the variables are
also put in the SparkContext's executor environment, which PySpark sends with every
Python function.
"""

from __future__ import annotations

import datetime as dt
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import boto3
import pytest

from bench.environment import environment
from bench.s3_server import FAKE_CREDENTIALS, listed_keys, moto_server, upload_tree, versioning_as_s3
from gc_assets_tests.lakes import LakeOnDisk, export_entry, lake_on_disk

__all__ = ["FAKE_CREDENTIALS", "moto_server"]


@dataclass(frozen=True)
class S3Endpoint:
    url: str

    def client(self):
        return boto3.session.Session().client("s3", endpoint_url=self.url, region_name="us-east-1")

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str = "") -> set[str]:
        return listed_keys(self.client(), bucket, prefix)

    def upload_tree(self, directory: Path, bucket: str, prefix: str) -> set[str]:
        """Upload every file under `directory` to `prefix/<relative path>`; returns the keys."""
        return upload_tree(self.client(), directory, bucket, prefix)

    def date_export(self, lake: LakeOnDisk, bucket: str, prefix: str, moment: dt.datetime) -> None:
        """Upload the export's manifest again, dated `moment`: an export taken after the objects were
        uploaded, as in production (objects written after an export's time are never candidates)."""
        manifest = json.loads((lake.namespace / "_lakefs" / "export" / "_manifest.json").read_text())
        manifest["exported_at"] = moment.isoformat()
        self.client().put_object(
            Bucket=bucket, Key=f"{prefix}/_lakefs/export/_manifest.json", Body=json.dumps(manifest).encode()
        )

    def export_lake(self, root: Path, bucket: str, churn: int = 40) -> tuple[LakeOnDisk, set[str], dict[str, Any]]:
        """A generated lakeFS repository (JSON Lines export) uploaded under `s3://<bucket>/repo`:
        the lake, the keys uploaded and its gc.yaml entry (every object old enough at once)."""
        lake = lake_on_disk(root, fmt="jsonl", churn=churn)
        self.create_bucket(bucket)
        uploaded = self.upload_tree(lake.namespace, bucket, "repo")
        return lake, uploaded, export_entry("s3-repo", f"s3://{bucket}/repo")


@contextmanager
def environment_everywhere(spark, variables: dict[str, str]) -> Iterator[None]:
    """`variables` set in this process and in the session's executor environment, then restored."""
    with environment(variables), environment(variables, spark.sparkContext.environment):
        yield


@pytest.fixture(scope="module")
def s3(spark) -> Iterator[S3Endpoint]:
    with moto_server() as variables, environment_everywhere(spark, variables):
        yield S3Endpoint(variables["AWS_ENDPOINT_URL"])


@pytest.fixture(scope="module")
def s3_versions(s3) -> Iterator[S3Endpoint]:
    """The S3 endpoint, answering versioned listings and deletes as S3 does (versioning_as_s3)."""
    with versioning_as_s3():
        yield s3


@dataclass(frozen=True)
class FaultInjection:
    """Builds executor clients that fail on purpose, client side, as real S3 does under load.

    The first `throttle_calls` calls of `throttle_operation` on each client raise a 503
    `throttle_code`; DeleteObjects answers keys in `denied` with a per-key AccessDenied
    (the object stays) and keys in `flaky` with a per-key InternalError the first time.
    DeleteObjects with more than 1000 keys is refused as real S3 refuses it (moto does not).
    """

    throttle_operation: str = "delete_objects"
    throttle_calls: int = 0
    throttle_code: str = "SlowDown"
    denied: frozenset[str] = frozenset()
    flaky: frozenset[str] = frozenset()

    def __call__(self, settings) -> "FaultyClient":
        return FaultyClient(settings.client(), self)


class FaultyClient:
    def __init__(self, client, faults: FaultInjection):
        self._client = client
        self._faults = faults
        self._calls: dict[str, int] = {}
        self._flaked: set[str] = set()

    def __getattr__(self, name):
        return getattr(self._client, name)

    def _count(self, operation: str) -> None:
        from botocore.exceptions import ClientError

        self._calls[operation] = self._calls.get(operation, 0) + 1
        if operation == self._faults.throttle_operation and self._calls[operation] <= self._faults.throttle_calls:
            error = {"Code": self._faults.throttle_code, "Message": "injected"}
            raise ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": 503}}, operation)

    def list_objects_v2(self, **request):
        self._count("list_objects_v2")
        return self._client.list_objects_v2(**request)

    def head_object(self, **request):
        self._count("head_object")
        return self._client.head_object(**request)

    def delete_objects(self, Bucket, Delete):
        from botocore.exceptions import ClientError

        self._count("delete_objects")
        objects = Delete["Objects"]
        if len(objects) > 1000:
            raise ClientError({"Error": {"Code": "MalformedXML", "Message": "more than 1000 keys"}}, "DeleteObjects")
        errors, allowed = [], []
        for item in objects:
            key = item["Key"]
            if key in self._faults.denied:
                errors.append({"Key": key, "Code": "AccessDenied", "Message": "injected"})
            elif key in self._faults.flaky and key not in self._flaked:
                self._flaked.add(key)
                errors.append({"Key": key, "Code": "InternalError", "Message": "injected"})
            else:
                allowed.append(item)
        response = self._client.delete_objects(Bucket=Bucket, Delete={**Delete, "Objects": allowed}) if allowed else {}
        return {**response, "Errors": response.get("Errors", []) + errors}
