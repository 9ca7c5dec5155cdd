"""`format: lakefs`: a repository read as lakeFS stores it (SSTable metaranges and ranges under
`_lakefs/`, a refs dump, the binary rules file), collected through the whole graph exactly
as the brute-force oracle says; what storage alone cannot know is kept or refused."""

from __future__ import annotations

import datetime as dt

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance

from gc_assets.lakegen import DOCS_RULES
from gc_assets.runner import run_partition
from gc_assets_tests.lakes import AS_OF, GC_DATE, native_lake_on_disk
from gc_assets_tests.oracles import expected_candidates

MIN_AGE = dt.timedelta(hours=24)


def _read(path: str) -> list[dict]:
    return pq.read_table(path).to_pylist()


def _run(lake, mode="dry_run", instance=None):
    return run_partition(str(lake.config_path), lake.lake.name, GC_DATE, mode=mode, instance=instance or DagsterInstance.ephemeral())


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
