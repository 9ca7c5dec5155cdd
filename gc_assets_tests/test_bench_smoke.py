"""The benchmark at its smallest size: the harness runs gc_job, times every step, and
finds exactly the candidates of the single-process scandir reference; the Delta
reference lists exactly the files the table's delete removed."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import strategies as st

from bench.run import (
    SIZES,
    bench_lake,
    delta_rs_vacuum,
    format_tables,
    make_delta_table,
    prepare_lake,
    retained_commits,
)
from gc_assets.core.names import ASSETS
from gc_assets_tests.conftest import RETAINED_JOBS, jobs_started
from gc_assets_tests.oracles import retained_brute_force
from gc_assets_tests.test_retention import T0, commit_graphs, rule_sets


def test_smallest_benchmark_lake_matches_the_scandir_reference(tmp_path, spark):
    shape = SIZES["2k"]
    jobs_before = jobs_started(spark)  # the scheduler's counter, apart from the status store the bench reads
    result = bench_lake(tmp_path, "2k", shape, cold=True)
    jobs_run = jobs_started(spark) - jobs_before
    assert result.candidates_agree
    assert result.cold_seconds is not None and result.cold_seconds > 0  # a CLI run that found the same candidates
    assert 0 < result.candidates < shape.objects
    namespace, _, generate_seconds = prepare_lake(tmp_path, "2k", shape)
    assert generate_seconds == 0.0  # a complete lake is reused as it is
    metadata_files = [p for p in (namespace / "_lakefs").rglob("*") if p.is_file()]
    assert result.graph["summary"]["inventory_objects"] == shape.objects + len(metadata_files)
    assert set(result.graph["summary"]["checks"].values()) == {"passed"}
    assert set(ASSETS) <= set(result.graph["steps"]) and all(s > 0 for s in result.graph["steps"].values())
    assert result.graph["peaks"]["python_rss"] > 0 and result.graph["peaks"]["jvm_heap_used"] > 0
    # Every job of this process's run is counted, although the session (as a long-lived one
    # does) keeps fewer jobs than it ran: the run was all that ran Spark jobs here.
    assert jobs_run > RETAINED_JOBS and result.graph["spark_jobs"] == jobs_run
    table = format_tables([result], [])
    assert "| **total (s)** |" in table and "| candidates equal scandir's | yes |" in table


def test_delta_reference_lists_the_removed_files(tmp_path):
    table_dir, _ = make_delta_table(tmp_path, "tiny", 400)
    removed = {
        action["path"]
        for log in sorted((table_dir / "_delta_log").glob("*.json"))
        for action in (json.loads(line).get("remove") for line in log.read_text().splitlines())
        if action
    }
    seconds, listed = delta_rs_vacuum(table_dir)
    assert seconds > 0 and len(removed) == 100
    assert listed == removed
    assert all(pq.read_metadata(table_dir / p).num_rows == 1 for p in listed)


@given(graph=commit_graphs(), rules=rule_sets().filter(lambda r: r is not None), as_of_hours=st.integers(0, 24 * 90))
def test_the_bench_reference_retains_what_the_brute_force_oracle_retains(graph, rules, as_of_hours):
    """The scandir reference evaluates retention with its own code; it must be right for the
    bench's candidate comparison to mean anything."""
    commits, refs = graph
    as_of = T0 + dt.timedelta(hours=as_of_hours)
    plain_commits = {c.commit_id: (c.parents, c.created_at.timestamp()) for c in commits}
    plain_refs = [(r.name, r.kind, r.commit_id) for r in refs]
    expected = set(retained_brute_force(commits, refs, rules, as_of))
    assert retained_commits(plain_commits, plain_refs, rules.model_dump(), as_of.timestamp()) == expected
