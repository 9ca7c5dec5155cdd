"""`gc-assets explain`: why one object is live, a candidate, or neither, checked against the
brute-force retention of gc_assets_tests/oracles.py and the lake's own history."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance

from gc_assets.core.config import Rules, load_config
from gc_assets.core.retention import expired_at
from gc_assets.demo.lakegen import DOCS_RULES, add_churn, docs_example, write_lake
from gc_assets.mark.partition import GcPartition
from gc_assets.questions.explain import explain_address
from gc_assets.runner import run_partition
from gc_assets_tests.cli_runs import run_cli, summary_of
from gc_assets_tests.lakes import AS_OF, GC_DATE, write_config
from gc_assets_tests.oracles import lake_graph, retained_brute_force

ASSETS = ("retained_commits", "live_files", "object_inventory", "orphan_candidates")


@pytest.fixture(scope="module")
def explained(tmp_path_factory):
    """The docs example plus a tag on an expired commit, an untracked upload, a fresh one and a
    held candidate, GC'd once; returns (lake, namespace, config path, a function explaining an address)."""
    from pyspark.sql import SparkSession

    root = tmp_path_factory.mktemp("explain")
    lake = docs_example("repo")
    lake.tags["v0"] = "2022-02-27"  # the only commit with the first tables/a/part-0
    untracked = lake.upload_untracked(dt.datetime(2022, 3, 5, tzinfo=dt.timezone.utc))
    fresh = lake.upload_untracked(dt.datetime.now(dt.timezone.utc))
    namespace = root / "lake" / "repo"
    export = write_lake(lake, namespace)
    held = lake.commits["d:2022-03-14"].entries["tables/d/part-0"][0]  # a candidate, but restored
    (namespace / "_gc" / "holds").mkdir(parents=True)
    hold = {"run_id": "r1", "held_at": dt.datetime.now(dt.timezone.utc).isoformat(), "addresses": [held]}
    (namespace / "_gc" / "holds" / "r1.json").write_text(json.dumps(hold))
    repo = {
        "name": "repo",
        "format": "lakefs-export",
        "storage_namespace": namespace.as_uri(),
        "source": export.as_uri(),
        "rules": DOCS_RULES,
    }
    config_path = write_config(root / "gc.yaml", [repo], root / "state")
    instance = DagsterInstance.ephemeral()
    outcome = run_partition(str(config_path), "repo", GC_DATE, instance=instance)
    assert outcome.success, outcome.error
    config = load_config(config_path)
    spark = SparkSession.getActiveSession()
    frames = {a: spark.read.parquet(str(root / "state" / a / "repo=repo" / f"date={GC_DATE}")) for a in ASSETS}
    partition = GcPartition(config, config.repository("repo"), GC_DATE, AS_OF)

    def explain(address: str):
        return explain_address(spark, partition, frames, address, dt.datetime.now(dt.timezone.utc))

    return (
        lake,
        namespace,
        config_path,
        explain,
        {"untracked": untracked, "fresh": fresh, "held": held, "instance": instance, "frames": frames},
    )


def _retained(lake):
    commits, refs = lake_graph(lake)
    return retained_brute_force(commits, refs, Rules.model_validate(DOCS_RULES), AS_OF)


def _referencing(lake, address):
    return {c.commit_id for c in lake.commits.values() if any(a == address for a, _ in c.entries.values())}


def test_a_live_object_at_a_head_names_the_branch_rule_and_threshold(explained):
    lake, _, _, explain, _ = explained
    address = lake.commits["2022-03-28"].entries["tables/a/part-1"][0]
    answer = explain(address)
    assert answer.status == "live"
    holders = _referencing(lake, address) & set(_retained(lake))
    assert holders == {"2022-03-28"}
    assert answer.reasons == [
        "commit 2022-03-28 of 2022-03-28T12:00:00Z: retained by main "
        "(branch rule branch_id=main, 21 days; threshold 2022-03-11T00:00:00Z)"
    ]


def test_a_logical_path_and_a_full_uri_name_the_same_object(explained):
    lake, namespace, _, explain, _ = explained
    address = lake.commits["2022-03-28"].entries["tables/a/part-1"][0]
    by_path = explain("tables/a/part-1")
    by_uri = explain(f"{namespace.as_uri()}/{address}")
    assert by_path.status == by_uri.status == "live"
    assert by_path.reasons == by_uri.reasons == explain(address).reasons


def test_an_object_kept_only_by_a_tag(explained):
    lake, _, _, explain, _ = explained
    address = lake.commits["2022-02-27"].entries["tables/a/part-0"][0]
    retained = _retained(lake)
    assert _referencing(lake, address) & set(retained) == {"2022-02-27"}  # only the tagged commit keeps it
    answer = explain(address)
    assert answer.status == "live"
    assert answer.reasons == [
        "commit 2022-02-27 of 2022-02-27T12:00:00Z: retained by v0 "
        "(tags.retain: a tag keeps its own commit; threshold 2022-02-27T12:00:00Z)"
    ]


def test_an_expired_object_names_its_newest_commit_and_when_that_commit_expired(explained):
    lake, _, _, explain, _ = explained
    address = lake.commits["d:2022-03-02"].entries["tables/c/part-0"][0]
    holders = _referencing(lake, address)
    assert holders == {"d:2022-03-02"} and not holders & set(_retained(lake))
    answer = explain(address)
    assert answer.status == "candidate"
    # The oracle: retained one second before the instant explain names, expired from it on.
    commits, refs = lake_graph(lake)
    rules = Rules.model_validate(DOCS_RULES)
    when = expired_at(commits, refs, rules, "d:2022-03-02")
    assert when == dt.datetime(2022, 3, 20, 12, tzinfo=dt.timezone.utc)  # dev's next commit, plus 7 days
    assert "d:2022-03-02" in retained_brute_force(commits, refs, rules, when - dt.timedelta(seconds=1))
    assert "d:2022-03-02" not in retained_brute_force(commits, refs, rules, when)
    assert answer.reasons[0] == (
        "expired: the newest commit that references it is d:2022-03-02 of 2022-03-02T12:00:00Z, "
        "expired since 2022-03-20T12:00:00Z"
    )


@pytest.mark.parametrize("churn", [0, 40])
def test_expired_at_agrees_with_the_brute_force_oracle_on_every_commit(churn):
    lake = docs_example("repo")
    lake.tags["v0"] = "2022-02-27"
    add_churn(
        lake, churn, dt.datetime(2022, 2, 1, tzinfo=dt.timezone.utc), dt.datetime(2022, 3, 29, tzinfo=dt.timezone.utc)
    )
    commits, refs = lake_graph(lake)
    rules = Rules.model_validate(
        {**DOCS_RULES, "branches": DOCS_RULES["branches"] + [{"pattern": "feature/*", "retention_days": 3}]}
    )
    for commit in commits:
        when = expired_at(commits, refs, rules, commit.commit_id)
        if when is None:
            assert commit.commit_id in retained_brute_force(commits, refs, rules, AS_OF + dt.timedelta(days=3650))
            continue
        assert commit.commit_id in retained_brute_force(commits, refs, rules, when - dt.timedelta(seconds=1))
        assert commit.commit_id not in retained_brute_force(commits, refs, rules, when)


def test_an_untracked_object(explained):
    lake, _, _, explain, special = explained
    assert not _referencing(lake, special["untracked"])
    answer = explain(special["untracked"])
    assert answer.status == "candidate" and answer.reasons[0] == "untracked: no commit references it"


def test_a_held_object_is_neither_live_nor_a_candidate(explained):
    lake, _, _, explain, special = explained
    assert not _referencing(lake, special["held"]) & set(_retained(lake))  # it would be a candidate
    answer = explain(special["held"])
    assert answer.status == "held"
    assert answer.reasons == ["held by _gc/holds/r1.json (a restore): `gc-assets release` lifts it"]


def test_a_protected_a_young_an_outside_and_an_unknown_object(explained):
    _, _, _, explain, special = explained
    protected = explain("_lakefs/export/_manifest.json")
    assert (protected.status, protected.reasons) == ("protected", ["under the protected prefix _lakefs/"])
    young = explain(special["fresh"])
    assert young.status == "too_young" and young.reasons[0].startswith("untracked, but last modified")
    outside = explain("file:///somewhere/else/part-0.parquet")
    assert outside.status == "outside"
    unknown = explain("data/no/such-object")
    assert (unknown.status, unknown.reasons) == (
        "unknown",
        ["neither the inventory nor the live set of this partition has it"],
    )


def test_the_command_line_prints_the_explanation_and_its_json(explained, spark, capfd):
    lake, _, config_path, _, _ = explained
    address = lake.commits["2022-02-27"].entries["tables/a/part-0"][0]
    command = ["explain", address, "--config", str(config_path), "--repo", "repo", "--date", "2022-03-31"]
    done = run_cli(capfd, *command, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    answer = summary_of(done.stdout)
    assert list(answer) == ["address", "status", "reasons"] and answer["status"] == "live"
    assert "retained by v0" in answer["reasons"][0]
    assert len(done.stdout.strip().splitlines()) == 1 and done.stderr == ""
    missing = run_cli(capfd, *command[:-1], "2022-03-30")
    assert missing.returncode == 1 and "not materialized" in missing.stderr
    assert Path(config_path).exists()


def _metadata(instance, asset):
    return instance.get_latest_materialization_event(AssetKey(asset)).asset_materialization.metadata


def test_candidates_and_receipts_carry_tables_a_person_reads_and_the_sweeps_throughput(explained):
    """The run explain reads: its candidates by reason and bytes by prefix as tables the UI draws."""
    instance, frames = explained[4]["instance"], explained[4]["frames"]
    candidates = frames["orphan_candidates"].toPandas()
    by_reason = _metadata(instance, "orphan_candidates")["by_reason"].value
    assert {(r.data["reason"], r.data["objects"], r.data["bytes"]) for r in by_reason.records} == {
        (reason, len(group), int(group["size"].sum())) for reason, group in candidates.groupby("reason")
    }
    assert [c.name for c in by_reason.schema.columns] == ["reason", "objects", "bytes"]
    prefixes = _metadata(instance, "orphan_candidates")["bytes_by_prefix"].value.records
    assert sum(r.data["bytes"] for r in prefixes) == int(candidates["size"].sum())
    receipts = _metadata(instance, "deletion_receipts")
    assert [(r.data["action"], r.data["objects"]) for r in receipts["by_action"].value.records] == [
        ("would_delete", len(candidates))
    ]
    assert (
        receipts["files_per_second"].value > 0 and receipts["bytes_reclaimed"].value == 0
    )  # a dry run reclaims nothing


def test_bytes_reclaimed_counts_what_left_the_namespace(spark):
    from pyspark.sql import Observation

    from gc_assets.defs.metadata import measures, output_metadata

    rows = [("a/1", 10, "deleted"), ("a/2", 5, "trashed"), ("b/3", 7, "failed"), ("b/4", 3, "already_absent")]
    frame = spark.createDataFrame(rows, "address string, size long, action string")
    observation = Observation("receipts")
    frame.observe(observation, *measures("deletion_receipts", {})).collect()  # as the write measures it
    metadata = output_metadata("deletion_receipts", observation.get, frame)
    assert metadata["bytes_reclaimed"].value == 15
    assert {r.data["prefix"]: r.data["bytes"] for r in metadata["bytes_by_prefix"].value.records} == {
        "a/": 15,
        "b/": 10,
    }


def test_top_prefixes_show_a_level_a_person_can_read(spark):
    """lakeFS writes data/<random>/<random>: the top ten of 150 generated directories would be
    ten single objects, so the level above is shown; a table's few partition directories
    are shown at the deeper level."""
    from gc_assets.defs.metadata import _top_prefixes

    generated = [(f"data/{i:04x}/{i:06x}", 10 + i) for i in range(150)] + [("_lakefs/x", 1)]
    frame = spark.createDataFrame(generated, "address string, size long")
    assert [(r["prefix"], r["objects"], r["bytes"]) for r in _top_prefixes(frame)] == [
        ("data/", 150, sum(10 + i for i in range(150))),
        ("_lakefs/", 1, 1),
    ]
    partitioned = [(f"year=2024/month={m:02d}/part-{j}.parquet", 100 * m + j) for m in range(1, 13) for j in range(3)]
    frame = spark.createDataFrame(partitioned + [("top.parquet", 5)], "address string, size long")
    top = _top_prefixes(frame)
    assert [r["prefix"] for r in top] == [f"year=2024/month={m:02d}/" for m in range(12, 2, -1)]
    assert top[0]["objects"] == 3 and top[0]["bytes"] == 3 * 1200 + 3
