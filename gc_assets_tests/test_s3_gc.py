"""The whole graph on an S3 namespace: a generated lakeFS repository (JSON Lines export)
uploaded to a real HTTP S3 endpoint is collected in dry run, and its mark then swept in delete
mode, removing exactly the oracle's objects and leaving every live object in place.

Time rule: S3 sets every object's last_modified to the upload time ("now"), so the
test collects as of a moment just after the upload, with min_object_age_hours 0 (which
needs allow_unsafe_min_age). Retention is evaluated as of that moment too: the 2022
history of the generated lake keeps branch heads, tags and dangling heads only.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from fnmatch import fnmatch
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance
from deltalake import write_deltalake

from gc_assets.core.config import RepositoryConfig
from gc_assets.core.time import partition_date_of
from gc_assets.runner import run_partition, stored_table
from gc_assets.sources import SourceError, source_for
from gc_assets.sources.delta import DeltaSource
from gc_assets.sources.lakefs_export import LakeFSExportSource
from gc_assets.stores import store_for
from gc_assets.stores.retries import RetryPolicy
from gc_assets.stores.state import FRAME_MANIFEST
from gc_assets_tests.lakes import lake_on_disk, write_config
from gc_assets_tests.oracles import expected_candidates
from gc_assets_tests.s3_server import s3  # noqa: F401 - the fixture
from gc_assets_tests.sweep_runs import (
    instance_after_kill,
    receipts_only,
    run_killed_after_first_chunk,
    sweep_only,
)

BUCKET = "gc-lake"
NAMESPACE = f"s3://{BUCKET}/repo"


def test_lake_on_s3_is_collected_in_dry_run_then_delete_mode(s3, spark, tmp_path):
    lake, uploaded, repo = s3.export_lake(tmp_path / "local", BUCKET)
    config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")
    time.sleep(1.1)  # S3 times are whole seconds: every upload is now strictly before as_of
    as_of = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    s3.date_export(lake, BUCKET, "repo", as_of)
    expected = expected_candidates(lake.lake, NAMESPACE, lake.rules, as_of, as_of)
    assert expected and all(f"repo/{key}" in uploaded for key in expected)
    instance = DagsterInstance.ephemeral()

    dry = run_partition(
        str(config), "s3-repo", partition_date_of(as_of), as_of=as_of, mode="dry_run", instance=instance
    )
    assert dry.success, dry.error
    assert set(dry.summary["checks"].values()) == {"passed"}
    candidates = {r["address"] for r in pq.read_table(dry.summary["outputs"]["orphan_candidates"]).to_pylist()}
    assert candidates == expected
    assert dry.summary["receipts"] == {"would_delete": len(expected)}
    assert dry.summary["inventory_objects"] == len(uploaded)
    assert s3.keys(BUCKET) == uploaded  # dry run leaves storage untouched

    deleted = sweep_only(config, "s3-repo", as_of, instance, "delete")  # the dry run's mark, swept
    assert deleted.success, deleted.error
    assert deleted.summary["receipts"] == {"deleted": len(expected)}
    assert set(deleted.summary["checks"].values()) == {"passed"} and "live_objects_intact" in deleted.summary["checks"]
    assert {k for k in s3.keys(BUCKET) if not k.startswith("repo/_gc/")} == uploaded - {
        f"repo/{key}" for key in expected
    }


def test_parquet_export_on_s3_reads_as_the_same_export_on_disk(s3, spark, tmp_path):
    lake = lake_on_disk(tmp_path, churn=0)
    s3.create_bucket("export-copy")
    s3.upload_tree(lake.namespace / "_lakefs", "export-copy", "repo/_lakefs")
    on_s3 = LakeFSExportSource("s3://export-copy/repo/_lakefs/export")
    on_disk = LakeFSExportSource((lake.namespace / "_lakefs" / "export").as_uri())
    assert on_s3.commit_graph(spark) == on_disk.commit_graph(spark)
    assert sorted(on_s3.committed_addresses(spark).collect()) == sorted(on_disk.committed_addresses(spark).collect())


def test_delta_log_on_s3_reads_as_the_same_table_on_disk(s3, spark, tmp_path):
    from deltalake import DeltaTable

    table = tmp_path / "table"
    write_deltalake(str(table), pa.table({"id": [1, 2], "part": ["a", "b"]}), partition_by=["part"])
    write_deltalake(str(table), pa.table({"id": [3], "part": ["a"]}), mode="append")
    write_deltalake(str(table), pa.table({"id": [4], "part": ["c"]}), mode="overwrite", partition_by=["part"])
    DeltaTable(str(table)).create_checkpoint()
    # Optional in the protocol; Spark's text source skips '_' files, so the local reading would refuse it.
    (table / "_delta_log" / "_last_checkpoint").unlink()
    write_deltalake(str(table), pa.table({"id": [5], "part": ["c"]}), mode="append")
    s3.create_bucket("delta")
    s3.upload_tree(table, "delta", "table")
    on_s3, on_disk = DeltaSource("s3://delta/table"), DeltaSource(table.as_uri())
    s3_commits, s3_refs = on_s3.commit_graph(spark)
    disk_commits, disk_refs = on_disk.commit_graph(spark)
    assert [c.commit_id for c in s3_commits] == [c.commit_id for c in disk_commits] and s3_refs == disk_refs
    retained = spark.createDataFrame([(c.commit_id,) for c in disk_commits], "commit_id string")
    heads = spark.createDataFrame([(r.commit_id,) for r in disk_refs], "commit_id string")
    assert sorted(on_s3.live_entries(spark, retained, heads).collect()) == sorted(
        on_disk.live_entries(spark, retained, heads).collect()
    )


def test_metadata_is_read_with_the_repositorys_s3_override(s3, spark, tmp_path, monkeypatch):
    """gc.yaml's `s3.endpoint_url` reaches every read, on the driver and on the executors:
    with both environments pointing at a closed port, the export, its fingerprint, a Delta
    log replayed on executors and the inventory listed on executors still come from the
    override's endpoint, and without the override nothing is reached: the refused endpoint
    is named within the stores' retry pauses, not after the AWS SDK's standard backoff."""
    lake = lake_on_disk(tmp_path / "lakefs", churn=0, fmt="jsonl")
    table = tmp_path / "delta"
    write_deltalake(str(table), pa.table({"id": [1, 2]}))
    write_deltalake(str(table), pa.table({"id": [3]}), mode="append")
    s3.create_bucket("override")
    s3.upload_tree(lake.namespace / "_lakefs", "override", "lakefs/_lakefs")
    s3.upload_tree(table, "override", "delta")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setitem(spark.sparkContext.environment, "AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the executors' too
    override = {"endpoint_url": s3.url}

    lakefs_repo = RepositoryConfig(
        name="lakefs",
        format="lakefs-export",
        storage_namespace="s3://override/lakefs",
        source="s3://override/lakefs/_lakefs/export",
        s3=override,
    )
    on_s3 = source_for(lakefs_repo)
    on_disk = LakeFSExportSource((lake.namespace / "_lakefs" / "export").as_uri())
    assert on_s3.commit_graph(spark) == on_disk.commit_graph(spark)
    before = on_s3.fingerprint(None)
    assert on_s3.fingerprint(None) == before
    refs = lake.namespace / "_lakefs" / "export" / "refs" / "part-00000.jsonl"
    main = next(json.loads(line)["commit_id"] for line in refs.read_text().splitlines() if '"main"' in line)
    moved = refs.read_text().replace(main, next(c for c in lake.lake.commits if c != main and len(c) == len(main)), 1)
    s3.client().put_object(Bucket="override", Key="lakefs/_lakefs/export/refs/part-00000.jsonl", Body=moved.encode())
    assert on_s3.fingerprint(None) != before

    delta_repo = RepositoryConfig(name="delta", format="delta", storage_namespace="s3://override/delta", s3=override)
    delta = source_for(delta_repo)
    commits, delta_refs = delta.commit_graph(spark)
    assert [c.commit_id for c in commits] == [f"{v:020d}" for v in (0, 1)]
    assert [(r.name, r.commit_id) for r in delta_refs] == [("main", f"{1:020d}")]
    versions = spark.createDataFrame([(c.commit_id,) for c in commits], "commit_id string")
    live = {
        r["address"] for r in delta.live_entries(spark, versions, versions.filter(f"commit_id = '{1:020d}'")).collect()
    }
    assert {a.rsplit("/", 1)[-1] for a in live} == {p.name for p in table.glob("*.parquet")}
    listed = {r["address"] for r in store_for(delta_repo).list(spark).collect()}
    assert listed == {p.relative_to(table).as_posix() for p in table.rglob("*") if p.is_file()}
    assert _executor_endpoints(spark) == {"http://127.0.0.1:9"}  # the executors did run with the closed port

    started = time.monotonic()
    with pytest.raises(
        SourceError, match=r"cannot list metadata at s3://override/lakefs/_lakefs/export: .*127\.0\.0\.1:9"
    ):
        LakeFSExportSource("s3://override/lakefs/_lakefs/export").commit_graph(spark)  # the environment alone
    assert time.monotonic() - started < _most_retry_pauses() + 4  # the AWS SDK's standard strategy: ~50 s


def _most_retry_pauses() -> float:
    """The longest the stores' RetryPolicy pauses in all between an operation's attempts (6.35 s)."""
    policy = RetryPolicy()
    return sum(min(policy.max_delay, policy.base_delay * 2**n) for n in range(policy.attempts - 1))


def _executor_endpoints(spark) -> set[str]:
    """AWS_ENDPOINT_URL as the Python workers on the executors see it."""

    def endpoint(frames):
        import os

        import pandas as pd

        for _ in frames:
            yield pd.DataFrame({"endpoint": [os.environ.get("AWS_ENDPOINT_URL", "")]})

    return {r["endpoint"] for r in spark.range(4).mapInPandas(endpoint, "endpoint string").collect()}


class _WriteRequests(logging.Handler):
    """Counts the requests that change an S3 endpoint (PUT, POST, DELETE), from the server's own log."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if any(f'"{verb} ' in message for verb in ("PUT", "POST", "DELETE")):
            self.lines.append(message)


def _s3_lake(s3, tmp_path, bucket: str, untracked: int, state_dir: Optional[str] = None, **options):
    """A generated lake uploaded to `bucket` with `untracked` objects no commit names, its config,
    an as-of moment after the upload, and the oracle's candidates then."""
    from concurrent.futures import ThreadPoolExecutor

    lake, uploaded, repo = s3.export_lake(tmp_path / "local", bucket, churn=8)
    extra = {f"repo/untracked/{i:05d}" for i in range(untracked)}
    client = s3.client()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: client.put_object(Bucket=bucket, Key=key, Body=b"x"), extra))
    repo = {**repo, "max_delete_fraction": 1.0, **options}
    config = write_config(tmp_path / "gc.yaml", [repo], state_dir or tmp_path / "state")
    time.sleep(1.1)
    as_of = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    s3.date_export(lake, bucket, "repo", as_of)
    expected = expected_candidates(lake.lake, repo["storage_namespace"], lake.rules, as_of, as_of)
    return config, uploaded | extra, as_of, expected | {k.removeprefix("repo/") for k in extra}


def _receipts_without_writes(s3, monkeypatch, config, as_of, instance, mode: str):
    """deletion_receipts re-executed while the S3 server's log counts the requests that change it."""
    writes = _WriteRequests()
    server_log = logging.getLogger("werkzeug")
    server_log.addHandler(writes)
    monkeypatch.setattr(server_log, "level", logging.INFO)
    try:
        result = receipts_only(config, "s3-repo", as_of, instance, mode)
    finally:
        server_log.removeHandler(writes)
    return result, writes.lines


def test_sigkill_mid_sweep_on_s3_then_rerun_tells_where_each_object_is(s3, spark, tmp_path, monkeypatch):
    """A kill -9 between two chunks of a trash sweep, where each move is a copy then a delete,
    resumes exactly from its journal, kept on S3 as on a cluster (state_dir s3://); a rerun of the
    finished sweep then returns the same receipts and writes nothing to the lake. (Delete under a
    kill, with a local state directory, is test_sweep_safety's.)"""
    mode, bucket, state = "trash", "killed-trash", "killed-trash-state"
    s3.create_bucket(state)
    # Chunks of ten: four and more of them, each a Spark job, as many as with a hundred, at a tenth
    # of the uploads, copies and deletes the S3 server in this process answers.
    chunk = 10
    config, uploaded, as_of, expected = _s3_lake(s3, tmp_path, bucket, 4 * chunk, state_dir=f"s3://{state}/gc")

    def journaled() -> bool:
        return any(fnmatch(k, f"gc/_sweeps/*/chunk-*/{FRAME_MANIFEST}") for k in s3.keys(state, "gc/_sweeps/"))

    home = run_killed_after_first_chunk(
        tmp_path,
        ["--config", str(config), "--repo", "s3-repo", "--as-of", as_of.isoformat(), "--mode", mode],
        journaled,
        poll_seconds=0.5,  # each look is a listing the S3 server answers in this process
        chunk_objects=chunk,
    )
    assert {f"repo/{k}" for k in expected} & s3.keys(bucket)  # killed mid-way

    def stored_receipts() -> list[dict]:
        rows = stored_table(str(config), "deletion_receipts", partition_date_of(as_of), "s3-repo").to_pylist()
        return sorted(rows, key=lambda r: r["address"])

    with instance_after_kill(home, config) as instance:
        result = receipts_only(config, "s3-repo", as_of, instance, mode)
        receipts, keys = stored_receipts(), s3.keys(bucket)
        again, writes = _receipts_without_writes(s3, monkeypatch, config, as_of, instance, mode)
    assert result.success and again.success
    assert stored_receipts() == receipts
    assert [line for line in writes if f" /{bucket}/" in line] == [] and s3.keys(bucket) == keys
    assert [r["address"] for r in receipts] == sorted(expected)
    assert {r["action"] for r in receipts} == {"trashed"}
    assert len({r["run_id"] for r in receipts}) == 2  # the killed run's work is told as its own
    assert all(f"repo/_gc_trash/{r['run_id']}/{r['address']}" in keys for r in receipts)
    assert {k for k in keys if "/_gc" not in k} == {k for k in uploaded if "/_gc" not in k} - {
        f"repo/{k}" for k in expected
    }
