"""`format: lakefs`: a repository read as lakeFS stores it (SSTable metaranges and ranges under
`_lakefs/`, a refs dump, the binary rules file), collected through the whole graph exactly
as the brute-force oracle says; what storage alone cannot know is kept or refused."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from dagster import DagsterInstance

from gc_assets.core.time import partition_date_of
from gc_assets.defs.set_runs import RunOutcome
from gc_assets.demo.lakegen import DOCS_RULES
from gc_assets.runner import run_partition
from gc_assets_tests.cli_runs import run_cli, summary_of
from gc_assets_tests.lakes import AS_OF, GC_DATE, LakeOnDisk, native_lake_on_disk, write_config
from gc_assets_tests.marked_lakes import MARKED, SavedLake
from gc_assets_tests.oracles import expected_candidates
from gc_assets_tests.s3_server import s3  # noqa: F401 - the fixture
from gc_assets_tests.sweep_runs import sweep_only

MIN_AGE = dt.timedelta(hours=24)
UNTRACKED = "data/abandoned/upload"


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


@dataclasses.dataclass(frozen=True)
class DryRun:
    """A native lake marked by a whole dry run, saved as MARKED for sweeps of that mark."""

    saved: SavedLake
    before: set[str]  # the namespace's files before the run
    after: set[str]  # and after it
    expected: set[str]  # the oracle's candidates
    candidates: list[dict]  # the mark's
    outcome: RunOutcome


@pytest.fixture(scope="module")
def native_dry_run(tmp_path_factory, spark) -> DryRun:
    """The random lake in lakeFS's layout (two merges written as before 1.0), dry-run once: its
    mark is judged here, and the trash and delete tests sweep it, each on a restored copy."""
    lake = native_lake_on_disk(tmp_path_factory.mktemp("native"), churn=60, legacy_commits=2, max_delete_fraction=1.0)
    saved = SavedLake(lake, DagsterInstance.ephemeral())
    before = lake.files()
    expected = expected_candidates(lake.lake, lake.namespace_uri, lake.rules, AS_OF, AS_OF - MIN_AGE, untracked=False)
    outcome = _run(lake, instance=saved.instance)
    assert outcome.success, outcome.error
    saved.save(MARKED)
    candidates = _read(outcome.summary["outputs"]["orphan_candidates"])
    return DryRun(saved, before, lake.files(), expected, candidates, outcome)


@pytest.mark.parametrize("mode", ["dry_run", "trash", "delete"])
def test_a_native_lake_is_collected_exactly_as_the_oracle_says(native_dry_run, mode):
    """The dry run's mark is the oracle's; trash and delete sweep that mark on the lake as it was."""
    marked, expected, before = native_dry_run, native_dry_run.expected, native_dry_run.before
    lake = marked.saved.restore(MARKED)
    uncommitted = _never_committed(lake)
    assert expected and uncommitted and all(lake.lake.objects[k][1] < AS_OF - MIN_AGE for k in uncommitted)
    assert {c["address"] for c in marked.candidates} == expected
    assert {c["reason"] for c in marked.candidates} == {"expired"}
    assert set(marked.outcome.summary["checks"].values()) == {"passed"}  # the mark's checks
    outcome = marked.outcome if mode == "dry_run" else marked.saved.sweep(mode)
    assert outcome.success, outcome.error
    summary = outcome.summary
    assert set(summary["checks"].values()) == {"passed"}  # the sweep's checks
    action = {"dry_run": "would_delete", "trash": "trashed", "delete": "deleted"}[mode]
    assert summary["receipts"] == {action: len(expected)}
    after = marked.after if mode == "dry_run" else lake.files()
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


def _s3_repository(tmp_path, bucket: str) -> tuple[str, Path]:
    """gc.yaml for the namespace s3://BUCKET/repo, every object old enough at once: (namespace, config)."""
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
    return namespace, write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")


def _outside_gc(s3, bucket: str) -> set[str]:
    return {k for k in s3.keys(bucket) if not k.startswith(("repo/_gc/", "repo/_gc_trash/"))}


@dataclasses.dataclass(frozen=True)
class S3Lake:
    """A native lake uploaded to a bucket, with what the oracle expects as of a moment after the upload."""

    lake: LakeOnDisk
    bucket: str
    uploaded: set[str]
    config: Path
    as_of: dt.datetime
    expected: set[str]


def _s3_lake(s3, root: Path, bucket: str, **options) -> S3Lake:
    lake = native_lake_on_disk(root / "local", churn=40, **options)
    uploaded = _upload_native_lake(s3, lake, bucket)
    namespace, config = _s3_repository(root, bucket)
    as_of = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    expected = expected_candidates(lake.lake, namespace, lake.rules, as_of, as_of, untracked=False)
    assert expected and all(f"repo/{key}" in uploaded for key in expected)
    return S3Lake(lake, bucket, uploaded, config, as_of, expected)


def _run_on_s3(on_s3: S3Lake, mode: str, instance: DagsterInstance) -> RunOutcome:
    return run_partition(
        str(on_s3.config), "s3-repo", partition_date_of(on_s3.as_of), as_of=on_s3.as_of, mode=mode, instance=instance
    )


@dataclasses.dataclass(frozen=True)
class S3DryRun:
    on_s3: S3Lake
    instance: DagsterInstance
    outcome: RunOutcome
    left: set[str]  # the bucket's keys after the dry run, the product's own aside


@pytest.fixture(scope="module")
def s3_dry_run(s3, spark, tmp_path_factory) -> S3DryRun:
    """A native lake (one merge written as before 1.0) on S3, dry-run once: the delete test sweeps its mark."""
    on_s3 = _s3_lake(s3, tmp_path_factory.mktemp("s3-native"), "native", legacy_commits=1)
    instance = DagsterInstance.ephemeral()
    outcome = _run_on_s3(on_s3, "dry_run", instance)
    return S3DryRun(on_s3, instance, outcome, _outside_gc(s3, on_s3.bucket))


@pytest.mark.parametrize("mode", ["dry_run", "trash", "delete"])
def test_a_native_lake_on_s3_is_collected_exactly_as_the_oracle_says(s3, spark, tmp_path, request, mode):
    """Dry run and delete: one lake, the delete sweeping the dry run's mark. Trash: a lake whose
    relative addresses are written as before lakeFS 0.60, in a whole run of its own."""
    if mode == "trash":
        on_s3 = _s3_lake(s3, tmp_path, "native-trash", legacy_commits=1, deprecated_addresses=True)
        marked = outcome = _run_on_s3(on_s3, "trash", DagsterInstance.ephemeral())
    else:
        s3_dry_run = request.getfixturevalue("s3_dry_run")
        on_s3, marked = s3_dry_run.on_s3, s3_dry_run.outcome
        outcome = (
            marked if mode == "dry_run" else sweep_only(on_s3.config, "s3-repo", on_s3.as_of, s3_dry_run.instance, mode)
        )
    expected, uploaded = on_s3.expected, on_s3.uploaded
    assert marked.success, marked.error
    assert {r["address"] for r in _read(marked.summary["outputs"]["orphan_candidates"])} == expected
    assert set(marked.summary["checks"].values()) == {"passed"}
    assert outcome.success, outcome.error
    assert set(outcome.summary["checks"].values()) == {"passed"}
    action = {"dry_run": "would_delete", "trash": "trashed", "delete": "deleted"}[mode]
    assert outcome.summary["receipts"] == {action: len(expected)}
    left = s3_dry_run.left if mode == "dry_run" else _outside_gc(s3, on_s3.bucket)
    assert left == (uploaded if mode == "dry_run" else uploaded - {f"repo/{key}" for key in expected})
    assert {f"repo/{k}" for k in _never_committed(on_s3.lake)} <= left
    if mode == "trash":
        trashed = s3.keys(on_s3.bucket, f"repo/_gc_trash/{outcome.summary['run_id']}/")
        assert {k.split("/", 3)[3] for k in trashed} == expected


@pytest.fixture(scope="module")
def docs_dry_run(tmp_path_factory, spark) -> tuple[LakeOnDisk, RunOutcome]:
    """The docs example in lakeFS's layout, its rules only in the namespace's binary rules file,
    with an abandoned upload no commit names, dry-run once."""
    lake = native_lake_on_disk(tmp_path_factory.mktemp("docs"), churn=0, rules_in_namespace=True)
    untracked = lake.namespace / UNTRACKED
    untracked.parent.mkdir(parents=True, exist_ok=True)
    untracked.write_bytes(b"an abandoned upload, or a staged object")
    stamp = dt.datetime(2022, 3, 5, tzinfo=dt.timezone.utc).timestamp()
    os.utime(untracked, (stamp, stamp))
    outcome = _run(lake)
    assert outcome.success, outcome.error
    return lake, outcome


def test_rules_come_from_the_namespaces_binary_rules_file(docs_dry_run):
    lake, outcome = docs_dry_run
    assert "rules" not in yaml.safe_load(lake.config_path.read_text())["repositories"][0]
    retained = {r["commit_id"] for r in _read(outcome.summary["outputs"]["retained_commits"]) if r["retained"]}
    # The lakeFS documentation's example (main 21 days, dev 7), read from _lakefs/retention/gc/rules/config.json.
    assert retained == {"d:2022-03-23", "d:2022-03-26", "2022-03-09", "2022-03-12", "2022-03-28"}
    assert DOCS_RULES["default_retention_days"] == 14


def test_explain_and_plan_work_for_a_native_lake(docs_dry_run, spark, capfd):
    from gc_assets.core.config import load_config
    from gc_assets.mark.partition import GcPartition
    from gc_assets.questions.explain import explain_address

    lake, _ = docs_dry_run
    config = load_config(lake.config_path)
    state = lake.config_path.parent / "state"
    frames = {
        a: spark.read.parquet(str(state / a / "repo=repo" / f"date={GC_DATE}"))
        for a in ("retained_commits", "live_files", "object_inventory", "orphan_candidates")
    }
    partition = GcPartition(config, config.repository("repo"), GC_DATE, AS_OF)

    def explain(address):
        return explain_address(spark, partition, frames, address, dt.datetime.now(dt.timezone.utc))

    staged_or_not = explain(UNTRACKED)
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
    plan = summary_of(done.stdout)["plans"][0]
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
