"""`format: lakefs`: a repository read as lakeFS stores it (SSTable metaranges and ranges under
`_lakefs/`, a refs dump, the binary rules file), collected through the whole graph exactly
as the brute-force oracle says; what storage alone cannot know is kept or refused."""

from __future__ import annotations

import datetime as dt
import json
import os
import time

import pyarrow.parquet as pq
import pytest
import yaml
from dagster import DagsterInstance

from gc_assets.core.time import partition_date_of
from gc_assets.demo.lakegen import DOCS_RULES
from gc_assets.runner import run_partition
from gc_assets_tests.cli_runs import run_cli
from gc_assets_tests.lakes import AS_OF, GC_DATE, native_lake_on_disk, write_config
from gc_assets_tests.oracles import expected_candidates
from gc_assets_tests.s3_server import s3  # noqa: F401 - the fixture

MIN_AGE = dt.timedelta(hours=24)


def _read(path: str) -> list[dict]:
    return pq.read_table(path).to_pylist()


def _run(lake, mode="dry_run", instance=None):
    return run_partition(
        str(lake.config_path), lake.lake.name, GC_DATE, mode=mode, instance=instance or DagsterInstance.ephemeral()
    )


def _never_committed(lake) -> set[str]:
    """Objects no commit names: staged entries and abandoned uploads, which storage cannot tell apart."""
    committed = {a for c in lake.lake.commits.values() for a, _ in c.entries.values()}
    return set(lake.lake.objects) - committed


@pytest.mark.parametrize("mode", ["dry_run", "trash", "delete"])
def test_a_native_lake_is_collected_exactly_as_the_oracle_says(tmp_path, spark, mode):
    lake = native_lake_on_disk(tmp_path, churn=60, legacy_commits=2, max_delete_fraction=1.0)
    before = lake.files()
    expected = expected_candidates(lake.lake, lake.namespace_uri, lake.rules, AS_OF, AS_OF - MIN_AGE, untracked=False)
    uncommitted = _never_committed(lake)
    assert expected and uncommitted and all(lake.lake.objects[k][1] < AS_OF - MIN_AGE for k in uncommitted)
    outcome = _run(lake, mode)
    assert outcome.success, outcome.error
    summary = outcome.summary
    candidates = _read(summary["outputs"]["orphan_candidates"])
    assert {c["address"] for c in candidates} == expected
    assert {c["reason"] for c in candidates} == {"expired"}
    assert set(summary["checks"].values()) == {"passed"}
    action = {"dry_run": "would_delete", "trash": "trashed", "delete": "deleted"}[mode]
    assert summary["receipts"] == {action: len(expected)}
    after = lake.files()
    if mode == "dry_run":
        assert after == before
    else:
        gone = {f for f in before - after}
        assert gone == expected
        assert uncommitted <= after  # objects no range names survive: they may be staged
        assert not {f for f in after - before if not f.startswith(("_gc/", "_gc_trash/"))}
    if mode == "trash":
        trashed = {f.split("/", 2)[2] for f in after if f.startswith(f"_gc_trash/{summary['run_id']}/")}
        assert trashed == expected


def test_rules_come_from_the_namespaces_binary_rules_file(tmp_path, spark):
    lake = native_lake_on_disk(tmp_path, churn=0, rules_in_namespace=True)
    outcome = _run(lake)
    assert outcome.success, outcome.error
    retained = {r["commit_id"] for r in _read(outcome.summary["outputs"]["retained_commits"]) if r["retained"]}
    # The lakeFS documentation's example (main 21 days, dev 7), read from _lakefs/retention/gc/rules/config.json.
    assert retained == {"d:2022-03-23", "d:2022-03-26", "2022-03-09", "2022-03-12", "2022-03-28"}
    assert DOCS_RULES["default_retention_days"] == 14


def _upload_native_lake(s3, lake, bucket: str) -> set[str]:
    """Upload the lake as lakeFS wrote it: data and commit tables first, the refs dump (and the
    rules file) a second later, as a dump comes after the commits it describes."""
    s3.create_bucket(bucket)
    client = s3.client()
    files = [p for p in sorted(lake.namespace.rglob("*")) if p.is_file()]
    dumped = {p for p in files if p.stat().st_mtime > (AS_OF + dt.timedelta(days=1)).timestamp()}
    keys = set()
    for batch in ([p for p in files if p not in dumped], sorted(dumped)):
        for path in batch:
            key = f"repo/{path.relative_to(lake.namespace).as_posix()}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
            keys.add(key)
        time.sleep(1.1)  # S3 times are whole seconds
    return keys


@pytest.mark.parametrize("mode", ["dry_run", "trash", "delete"])
def test_a_native_lake_on_s3_is_collected_exactly_as_the_oracle_says(s3, spark, tmp_path, mode):
    lake = native_lake_on_disk(tmp_path / "local", churn=40, legacy_commits=1, deprecated_addresses=mode == "trash")
    bucket = f"native-{mode.replace('_', '-')}"
    uploaded = _upload_native_lake(s3, lake, bucket)
    namespace = f"s3://{bucket}/repo"
    repo = {
        "name": "s3-repo",
        "format": "lakefs",
        "storage_namespace": namespace,
        "refs_dump": f"{namespace}/_lakefs/refs_manifest.json",
        "rules": DOCS_RULES,
        "min_object_age_hours": 0,
        "allow_unsafe_min_age": True,
        "max_delete_fraction": 1.0,
    }
    config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")
    as_of = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    expected = expected_candidates(lake.lake, namespace, lake.rules, as_of, as_of, untracked=False)
    assert expected and all(f"repo/{key}" in uploaded for key in expected)
    outcome = run_partition(
        str(config), "s3-repo", partition_date_of(as_of), as_of=as_of, mode=mode, instance=DagsterInstance.ephemeral()
    )
    assert outcome.success, outcome.error
    assert {r["address"] for r in _read(outcome.summary["outputs"]["orphan_candidates"])} == expected
    assert set(outcome.summary["checks"].values()) == {"passed"}
    left = {k for k in s3.keys(bucket) if not k.startswith(("repo/_gc/", "repo/_gc_trash/"))}
    assert left == (uploaded if mode == "dry_run" else uploaded - {f"repo/{key}" for key in expected})
    assert {f"repo/{k}" for k in _never_committed(lake)} <= left
    if mode == "trash":
        trashed = s3.keys(bucket, f"repo/_gc_trash/{outcome.summary['run_id']}/")
        assert {k.split("/", 3)[3] for k in trashed} == expected


def test_explain_and_plan_work_for_a_native_lake(tmp_path, spark, capfd):
    from gc_assets.core.config import load_config
    from gc_assets.mark.partition import GcPartition
    from gc_assets.questions.explain import explain_address

    lake = native_lake_on_disk(tmp_path, churn=0)
    untracked = "data/abandoned/upload"
    (lake.namespace / untracked).parent.mkdir(parents=True, exist_ok=True)
    (lake.namespace / untracked).write_bytes(b"an abandoned upload, or a staged object")
    stamp = dt.datetime(2022, 3, 5, tzinfo=dt.timezone.utc).timestamp()
    os.utime(lake.namespace / untracked, (stamp, stamp))
    outcome = _run(lake)
    assert outcome.success, outcome.error
    config = load_config(lake.config_path)
    frames = {
        a: spark.read.parquet(str(tmp_path / "state" / a / "repo=repo" / f"date={GC_DATE}"))
        for a in ("retained_commits", "live_files", "object_inventory", "orphan_candidates")
    }
    partition = GcPartition(config, config.repository("repo"), GC_DATE, AS_OF)

    def explain(address):
        return explain_address(spark, partition, frames, address, dt.datetime.now(dt.timezone.utc))

    staged_or_not = explain(untracked)
    assert staged_or_not.status == "protected" and "may be staged" in staged_or_not.reasons[0]
    expired = lake.lake.commits["2022-02-27"].entries["tables/a/part-0"][0]
    answer = explain(expired)
    assert answer.status == "candidate" and answer.reasons[0].startswith(
        "expired: the newest commit that references it is 2022-02-27"
    )
    by_path = explain("tables/a/part-1")  # a logical path: the newest commit that has it names the object
    assert by_path.status == "live" and by_path.address == "tables/a/part-1"

    done = run_cli(capfd, "plan", "--config", str(lake.config_path), "--repo", "repo", "--date", "2022-03-31", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads(done.stdout.strip().splitlines()[-1])["plans"][0]
    expected = expected_candidates(lake.lake, lake.namespace_uri, lake.rules, AS_OF, AS_OF - MIN_AGE, untracked=False)
    assert (plan["retained_commits"], plan["orphan_candidates"]) == (5, len(expected))


def test_the_fingerprint_is_the_dump_and_the_rules_and_with_spark_the_tables(tmp_path, spark):
    from gc_assets.core.config import load_config
    from gc_assets.defs.automation import fingerprint_of
    from gc_assets.demo.lakegen import write_rules_file

    lake = native_lake_on_disk(tmp_path, churn=5, rules_in_namespace=True)
    repo = load_config(lake.config_path).repository("repo")
    first = fingerprint_of(repo)
    assert fingerprint_of(repo) == first
    write_rules_file(lake.namespace, {"default_retention_days": 3})
    second = fingerprint_of(repo)
    assert second != first
    manifest = lake.namespace / "_lakefs" / "refs_manifest.json"
    dump = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**dump, "tags_meta_range_id": dump["branches_meta_range_id"]}))
    assert fingerprint_of(repo) != second
    manifest.write_text(json.dumps(dump))

    from gc_assets.sources import source_for

    with_tables = source_for(repo).fingerprint(spark)
    (lake.namespace / "_lakefs" / ("ef" * 32)).write_bytes(b"a table a commit wrote after the dump")
    assert source_for(repo).fingerprint(None) == fingerprint_of(repo)  # the sensor reads no listing
    assert source_for(repo).fingerprint(spark) != with_tables  # the sweep's re-validation does


def test_a_configured_block_storage_prefix_is_read_there_and_protected(tmp_path, spark):
    """lakeFS's committed.block_storage_prefix set to another key: its metaranges, ranges and rules
    file are read there and none of its files is collected; the default prefix refuses the namespace."""
    lake = native_lake_on_disk(tmp_path, churn=20, rules_in_namespace=True, max_delete_fraction=1.0)
    (lake.namespace / "meta").mkdir()
    os.rename(lake.namespace / "_lakefs", lake.namespace / "meta" / "lakefs")  # a rename keeps every mtime
    repo = yaml.safe_load(lake.config_path.read_text())["repositories"][0]
    assert repo["refs_dump"].endswith("/_lakefs/refs_manifest.json") and "rules" not in repo
    repo["refs_dump"] = (lake.namespace / "meta" / "lakefs" / "refs_manifest.json").as_uri()
    before = lake.files()

    write_config(lake.config_path, [repo], tmp_path / "state-default")
    refused = _run(lake, "delete")
    assert not refused.success and "_lakefs" in refused.error
    assert lake.files() == before

    write_config(lake.config_path, [{**repo, "block_storage_prefix": "meta/lakefs"}], tmp_path / "state")
    outcome = _run(lake, "delete")
    assert outcome.success, outcome.error
    # The rules are the namespace's own: read from meta/lakefs/retention/gc/rules/config.json.
    expected = expected_candidates(lake.lake, lake.namespace_uri, lake.rules, AS_OF, AS_OF - MIN_AGE, untracked=False)
    assert expected
    assert {c["address"] for c in _read(outcome.summary["outputs"]["orphan_candidates"])} == expected
    assert before - lake.files() == expected
    assert {f for f in before if f.startswith("meta/lakefs/")} <= lake.files()
