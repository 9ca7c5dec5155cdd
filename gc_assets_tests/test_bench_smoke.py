"""The benchmark at its smallest size: the harness runs gc_job, times every step, and
finds exactly the candidates of the single-process scandir reference; the Delta
reference lists exactly the files the table's delete removed."""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import strategies as st

from bench import run as bench_run
from bench.cpu import COLLECTOR, COMPILER, DRIVER, JVM_OTHER, PLANNING, TASKS, WORKERS, CpuSplit, Sample, split
from bench.run import (
    SIZES,
    DeltaResult,
    SizeFailed,
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
    cpu = CpuSplit(**result.cold_cpu)  # its process tree's CPU: the driver, and the JVM's task threads by name
    assert cpu.parts[DRIVER] > 0 and cpu.parts[TASKS] > 0, cpu
    assert cpu.wall == result.cold_seconds and 0 < cpu.kernel < cpu.total < cpu.wall * os.cpu_count(), cpu
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


def test_cpu_split_puts_each_jvm_thread_in_its_part_and_unsampled_time_in_the_rest():
    jvm = Sample(
        JVM_OTHER,
        user=9.0,
        system=1.0,
        threads=(
            ("Executor task l", 3.0, 0.5),
            ("Executor task i", 1.0, 0.0),
            ("Thread-12", 2.0, 0.0),
            ("C1 CompilerThre", 1.5, 0.0),
            ("GC Thread#1", 0.5, 0.0),
            ("VM Thread", 0.25, 0.0),
            ("dag-scheduler-e", 0.25, 0.0),
        ),
    )
    found = split([Sample(DRIVER, 2.0, 0.5), jvm, Sample(WORKERS, 1.0, 1.0), Sample(WORKERS, 0.5, 0.0)], wall=6.0)
    assert {name: seconds for name, seconds in found.parts.items() if seconds} == {
        DRIVER: 2.5,
        TASKS: 4.5,
        PLANNING: 2.0,
        COMPILER: 1.5,
        COLLECTOR: 0.75,
        JVM_OTHER: 0.25 + 1.0,  # a named thread of no part, and 1.0 s no thread sample holds
        WORKERS: 2.5,
    }
    assert found.total == 15.0 and found.kernel == 2.5
    assert "total 15.0 (2.5 in the kernel) in 6.0 s, 2.50 cores busy" in found.line()


def test_the_warm_run_timed_is_the_servers_second_of_the_size(monkeypatch):
    """A deployment's Spark Connect server has run before: the first run on a new server (its code
    not yet compiled) is reported apart, and the warm figures are the second run's."""
    runs = iter([CpuSplit(40.0), CpuSplit(25.0)])
    jobs = iter([0, 130, 130, 245])
    server = SimpleNamespace(remote="sc://127.0.0.1:1", jobs=lambda: next(jobs))
    monkeypatch.setattr(bench_run, "cli_run", lambda config, repo, date, remote=None: (next(runs), {"a"}))
    found = bench_run.cold_and_warm(Path("gc.yaml"), "repo", dt.date(2024, 3, 31), {"a"}, False, server)
    assert found == {"warm_first_seconds": 40.0, "warm_seconds": 25.0, "warm_spark_jobs": 115}


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


def test_a_size_that_fails_is_reported_and_every_finished_size_is_kept(tmp_path, monkeypatch, capsys):
    """A long benchmark whose first size fails still measures and prints the next, keeps both in
    its JSON, and exits 1."""
    finished = DeltaResult("10k", 10_000, 0.5, 2_500, 20.0, 2_500, True)

    def failing_lake(*args, **kwargs):
        raise SizeFailed("the warm CLI run found other candidates than the reference")

    monkeypatch.setattr(bench_run, "bench_lake", failing_lake)
    monkeypatch.setattr(bench_run, "bench_delta", lambda *args, **kwargs: finished)
    results = tmp_path / "results.json"
    status = bench_run.main(
        [
            "--sizes",
            "2k",
            "--delta",
            "10k",
            "--catalog",
            "",
            "--no-cold",
            "--no-warm",
            "--work-dir",
            str(tmp_path),
            "--json",
            str(results),
        ]
    )
    printed = capsys.readouterr().out
    assert status == 1
    assert "| 10,000 | 0.50 | 20.0 |" in printed
    assert "FAILED lake 2k: the warm CLI run found other candidates" in printed
    saved = json.loads(results.read_text())
    assert saved["delta"] == [asdict(finished)] and saved["lakes"] == []
    assert saved["failures"] == ["lake 2k: the warm CLI run found other candidates than the reference"]
    assert bench_run.report([str(results)], None) == 0 and "FAILED lake 2k" in capsys.readouterr().out


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
