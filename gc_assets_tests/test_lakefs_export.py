"""The reference-format connector: both file formats, bad input named by dataset and row,
range de-duplication, staged and imported entries."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gc_assets.core.config import RepositoryConfig
from gc_assets.core.names import REPO
from gc_assets.core.retention import GraphError, evaluate
from gc_assets.demo.lakegen import docs_example, export_tables, write_export
from gc_assets.mark.connectors import mark_tables
from gc_assets.sources.base import SourceError
from gc_assets.sources.files import read_parquet
from gc_assets.sources.lakefs_export import LakeFSExportSource
from gc_assets.stores.s3.client import S3Settings
from gc_assets_tests.conftest import jobs_started
from gc_assets_tests.lakes import AS_OF, export_entry


def _export(tmp_path: Path, fmt: str = "parquet", lake=None) -> Path:
    lake = lake or docs_example()
    directory = tmp_path / f"export-{fmt}"
    write_export(export_tables(lake), directory, fmt)
    return directory


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_both_formats_give_the_same_graph_and_entries(tmp_path, spark, fmt):
    lake = docs_example()
    source = LakeFSExportSource(_export(tmp_path, fmt, lake).as_uri())
    commits, refs = source.commit_graph(spark)
    assert {c.commit_id: c.created_at for c in commits} == {c.commit_id: c.created_at for c in lake.commits.values()}
    assert {c.commit_id: c.parents for c in commits} == {c.commit_id: c.parents for c in lake.commits.values()}
    assert {(r.name, r.commit_id) for r in refs} == set(lake.branches.items())
    retained = spark.createDataFrame([("2022-03-28",), ("d:2022-03-26",)], "commit_id string")
    heads = spark.createDataFrame([("2022-03-28",)], "commit_id string")
    rows = source.live_entries(spark, retained, heads).collect()
    expected = {a for c in ("2022-03-28", "d:2022-03-26") for a, _ in lake.commits[c].entries.values()}
    assert {r["address"] for r in rows if r["source"] == "committed"} == expected
    head_addresses = {a for a, _ in lake.commits["2022-03-28"].entries.values()}
    assert {r["address"] for r in rows if r["at_head"] and r["source"] == "committed"} == head_addresses


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_the_witness_reads_one_row_per_path_of_each_head_and_refuses_an_unknown_head(tmp_path, spark, fmt):
    lake = docs_example()
    export = _export(tmp_path, fmt, lake)
    for name, table in export_tables(lake).items():  # a second part file per dataset, empty
        if fmt == "parquet":
            pq.write_table(table.slice(0, 0), export / name / "part-00001.parquet")
        else:
            (export / name / "part-00001.jsonl").write_text("")
    source = LakeFSExportSource(export.as_uri())
    heads = sorted(set(lake.branches.values()) | set(lake.tags.values()))
    witnessed = [(r["commit_id"], r["address"]) for r in source.witness_heads(spark, heads + heads[:1]).collect()]
    # By the lake's own model, not the export: one row per path of each head's tree, a head named twice read once.
    assert sorted(witnessed) == sorted((c, address) for c in heads for address, _ in lake.commits[c].entries.values())
    with pytest.raises(SourceError, match="head commit unknown-commit is not in dataset 'commits'"):
        source.witness_heads(spark, [heads[0], "unknown-commit"])


def test_ranges_of_retained_commits_are_deduplicated_before_reading(tmp_path, spark):
    source = LakeFSExportSource(_export(tmp_path).as_uri())
    retained = spark.createDataFrame([("2022-03-09",), ("2022-03-12",), ("2022-03-28",)], "commit_id string")
    heads = spark.createDataFrame([], "commit_id string")
    entries = source.live_entries(spark, retained, heads)
    plan = entries._jdf.queryExecution().optimizedPlan().toString()
    assert re.search(r"Aggregate \[[^\]]*range_id", plan)  # range ids grouped before the join with ranges
    # Each distinct range of the three commits is read once, though the commits share ranges.
    tables = export_tables(docs_example())
    metaranges = dict(zip(tables["commits"]["commit_id"].to_pylist(), tables["commits"]["metarange_id"].to_pylist()))
    wanted = {metaranges[c] for c in ("2022-03-09", "2022-03-12", "2022-03-28")}
    ranges = {
        r
        for m, r in zip(tables["metaranges"]["metarange_id"].to_pylist(), tables["metaranges"]["range_id"].to_pylist())
        if m in wanted
    }
    range_ids = tables["ranges"]["range_id"].to_pylist()
    assert entries.count() == sum(range_ids.count(r) for r in ranges) < 3 * len(range_ids)


def test_staged_entries_are_live_and_optional(tmp_path, spark):
    lake = docs_example()
    lake.stage("main", "pending/file", dt.datetime(2022, 3, 30, tzinfo=dt.timezone.utc))
    directory = _export(tmp_path, lake=lake)
    source = LakeFSExportSource(directory.as_uri())
    empty = spark.createDataFrame([], "commit_id string")
    staged = source.live_entries(spark, empty, empty).collect()
    assert [(r["address"], r["source"], r["at_head"]) for r in staged] == [(lake.staged[0][2], "staged", True)]
    shutil.rmtree(directory / "staged")
    assert LakeFSExportSource(directory.as_uri()).live_entries(spark, empty, empty).count() == 0


def _rewrite_jsonl(directory: Path, dataset: str, edit) -> None:
    path = directory / dataset / "part-00000.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in edit(rows)))


@pytest.mark.parametrize(
    "dataset, edit, message",
    [
        ("commits", lambda rows: rows + [dict(rows[0])], "duplicate commit_id '2022-02-27'"),
        (
            "commits",
            lambda rows: [{**r, "parents": ["nope"]} if r["commit_id"] == "2022-03-12" else r for r in rows],
            "(2022-03-12): unknown parent 'nope'",
        ),
        (
            "refs",
            lambda rows: rows + [{"name": "ghost", "kind": "branch", "commit_id": "missing"}],
            "refs row 2 (ghost): unknown commit 'missing'",
        ),
        (
            "commits",
            lambda rows: [
                {**r, "created_at": "2022-03-12T12:00:00"} if r["commit_id"] == "2022-03-12" else r for r in rows
            ],
            "(2022-03-12): created_at '2022-03-12T12:00:00' has no time zone",
        ),
        (
            "commits",
            lambda rows: [{k: v for k, v in r.items() if k != "metarange_id"} for r in rows],
            "missing column(s) metarange_id",
        ),
    ],
)
def test_malformed_jsonl_export_names_dataset_and_row(tmp_path, spark, dataset, edit, message):
    directory = _export(tmp_path, "jsonl")
    _rewrite_jsonl(directory, dataset, edit)
    source = LakeFSExportSource(directory.as_uri())
    with pytest.raises((SourceError, GraphError)) as raised:
        commits, refs = source.commit_graph(spark)
        evaluate(commits, refs, None, dt.datetime(2022, 4, 1, tzinfo=dt.timezone.utc))
    assert message in str(raised.value)
    assert "commits" in str(raised.value) or "refs" in str(raised.value)


def test_unparseable_json_line_names_the_file_and_line(tmp_path, spark):
    directory = _export(tmp_path, "jsonl")
    with open(directory / "refs" / "part-00000.jsonl", "a") as out:
        out.write('{"name": "broken", "kind": \n')
    with pytest.raises(SourceError, match=r"export dataset 'refs', file .*part-00000.jsonl: not a JSON object in line"):
        LakeFSExportSource(directory.as_uri()).commit_graph(spark)


def test_missing_dataset_and_missing_parquet_column(tmp_path, spark):
    directory = _export(tmp_path)
    shutil.rmtree(directory / "metaranges")
    empty = spark.createDataFrame([], "commit_id string")
    with pytest.raises(SourceError, match="export dataset 'metaranges' is missing"):
        LakeFSExportSource(directory.as_uri()).live_entries(spark, empty, empty)
    directory = _export(tmp_path / "again")
    table = pq.read_table(directory / "refs" / "part-00000.parquet").drop(["kind"])
    pq.write_table(table, directory / "refs" / "part-00000.parquet")
    with pytest.raises(SourceError, match="export dataset 'refs': column 'kind' is missing"):
        LakeFSExportSource(directory.as_uri()).commit_graph(spark)


def test_parquet_timestamp_without_zone_is_refused(tmp_path, spark):
    directory = _export(tmp_path)
    path = directory / "commits" / "part-00000.parquet"
    table = pq.read_table(path)
    naive = table.set_column(2, "created_at", table.column("created_at").cast(pa.timestamp("us")))
    pq.write_table(naive, path)
    with pytest.raises(SourceError, match="created_at has type timestamp_ntz"):
        LakeFSExportSource(directory.as_uri()).commit_graph(spark)


def test_mixed_part_file_formats_are_refused(tmp_path, spark):
    directory = _export(tmp_path)
    (directory / "refs" / "part-00001.jsonl").write_text("{}\n")
    with pytest.raises(SourceError, match="all .parquet or all .jsonl"):
        LakeFSExportSource(directory.as_uri()).commit_graph(spark)


def test_null_required_value_is_refused(tmp_path, spark):
    directory = _export(tmp_path, "jsonl")
    _rewrite_jsonl(directory, "ranges", lambda rows: rows[:-1] + [{**rows[-1], "address": None}])
    retained = spark.createDataFrame([("2022-03-28",)], "commit_id string")
    with pytest.raises(SourceError, match="export dataset 'ranges': row with a null required column"):
        LakeFSExportSource(directory.as_uri()).live_entries(spark, retained, retained).count()


def test_json_lines_are_checked_once_per_state_of_the_files_and_a_rewritten_one_again(tmp_path, spark, monkeypatch):
    """A sweeping run reads the export twice (its mark, then re-validation): every line of a
    JSON Lines dataset is checked the first time only, and again once a file is written anew."""
    from gc_assets.sources import lakefs_export

    directory = _export(tmp_path, "jsonl")
    checked: list[str] = []
    real_check = lakefs_export._malformed_lines
    monkeypatch.setattr(
        lakefs_export, "_malformed_lines", lambda name, parsed: (checked.append(name), real_check(name, parsed))[1]
    )
    first = LakeFSExportSource(directory.as_uri()).commit_graph(spark)
    assert {"commits", "refs"} <= set(checked)
    checked.clear()
    assert LakeFSExportSource(directory.as_uri()).commit_graph(spark) == first
    assert checked == []

    with open(directory / "refs" / "part-00000.jsonl", "a") as out:
        out.write('{"name": "broken", "kind": \n')
    with pytest.raises(SourceError, match=r"export dataset 'refs', file .*part-00000.jsonl: not a JSON object in line"):
        LakeFSExportSource(directory.as_uri()).commit_graph(spark)
    assert checked == ["refs"]


def test_the_schema_of_local_part_files_is_their_footers_read_without_a_spark_job(tmp_path, spark):
    """Every step of a run reads the same exports, and a set reads many: the schema is the first
    part file's footer, read on the driver (no inference job), and a file written anew is read anew."""
    part = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"range_id": ["r1"], "size": [1]}), part)
    files = [part.as_uri()]
    settings = S3Settings()
    before = jobs_started(spark)
    first = read_parquet(spark, files, settings)
    assert jobs_started(spark) == before
    assert [(f.name, f.dataType.simpleString()) for f in first.schema.fields] == [
        ("range_id", "string"),
        ("size", "bigint"),
    ]
    assert [row.asDict() for row in first.collect()] == [{"range_id": "r1", "size": 1}]

    pq.write_table(pa.table({"range_id": ["r2"], "size": ["large"], "extra": [True]}), part)
    rewritten = read_parquet(spark, files, settings)
    assert [f.name for f in rewritten.schema.fields] == ["range_id", "size", "extra"]
    assert rewritten.collect()[0].asDict() == {"range_id": "r2", "size": "large", "extra": True}


def test_an_export_a_set_cannot_read_is_refused_alone_and_the_others_are_marked(tmp_path, spark):
    """The exports of a set are verified and read in the same Spark jobs: when one of them has a
    part file no reader can open, those jobs fail, and each export is read again alone, so that
    one is refused, named, and the others are marked."""
    lake = docs_example()
    repos = []
    for name in ("first", "broken", "last"):
        directory = _export(tmp_path / name, lake=lake)
        repos.append(
            RepositoryConfig.model_validate(
                {**export_entry(name, (tmp_path / name).as_uri()), "source": directory.as_uri()}
            )
        )
    (tmp_path / "broken" / "export-parquet" / "ranges" / "part-00001.parquet").write_bytes(
        b"PAR1 not a Parquet file PAR1"
    )

    marked = mark_tables(spark, repos, AS_OF)

    assert set(marked.marked) == {"first", "last"}
    assert set(marked.refused) == {"broken"} and "cannot be read" in marked.refused["broken"]
    live = {(row[REPO], row["address"]) for row in marked.live.collect()}
    assert {name for name, _ in live} == {"first", "last"}
