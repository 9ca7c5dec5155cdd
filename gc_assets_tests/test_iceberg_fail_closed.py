"""Iceberg tables the product must read correctly or refuse (docs/design.md §10), on tables
written by pyiceberg and collected in delete mode."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance
from pyiceberg.table import DataScan, StaticTable

from gc_assets import cli
from gc_assets.core.config import RepositoryConfig
from gc_assets.runner import run_partition
from gc_assets.sources.base import SourceError
from gc_assets.sources.iceberg import IcebergSource, newest_metadata_file
from gc_assets_tests.cli_runs import summary_of
from gc_assets_tests.iceberg_tables import (
    clock_at,
    day,
    expected_live_uris,
    new_lake,
    position_delete,
    rows,
)
from gc_assets_tests.lakes import write_config

GC_DATE = day(10).date()


def _metadata_files(namespace: Path) -> list[Path]:
    return sorted((namespace / "metadata").glob("*.metadata.json"))


def _directory_table(tmp_path: Path, commits: int = 3):
    """A table located by directory: its metadata files renamed v<N>.metadata.json, with a hint."""
    lake = new_lake(tmp_path, "hinted")
    table = lake.table()
    for n in range(commits):
        with clock_at(day(n)):
            table.append(rows([n]))
    names = {
        path.name: f"v{version}.metadata.json" for version, path in enumerate(_metadata_files(lake.namespace), start=1)
    }
    for old, new in names.items():
        text = (lake.namespace / "metadata" / old).read_text()
        for before, after in names.items():
            text = text.replace(before, after)  # the metadata log names its predecessors
        (lake.namespace / "metadata" / new).write_text(text)
        (lake.namespace / "metadata" / old).unlink()
    return lake


def _relative(lake, uris: set[str]) -> set[str]:
    return {str(Path(uri.removeprefix("file://")).relative_to(lake.namespace)) for uri in uris}


def _head_files(lake, newest: Path) -> set[str]:
    """The current snapshot's data files, manifest list and manifests, read by pyiceberg from `newest`."""
    table = StaticTable.from_metadata(newest.as_uri())
    snapshot = table.current_snapshot()
    files = {task.file.file_path for task in table.scan().plan_files()}
    files |= {snapshot.manifest_list} | {m.manifest_path for m in snapshot.manifests(table.io)}
    return _relative(lake, files)


def test_a_version_hint_one_commit_behind_does_not_hide_the_newest_snapshot(tmp_path, spark, capsys):
    """And, located by directory, the table has no catalog to expire snapshots through: the
    snapshots the rules expire are retained (not_committed), every file of every snapshot stays,
    and explain says why."""
    lake = _directory_table(tmp_path)
    newest = _metadata_files(lake.namespace)[-1]
    (lake.namespace / "metadata" / "version-hint.text").write_text(str(int(newest.name[1:].split(".")[0]) - 1))
    lake.age_files()
    needed = _head_files(lake, newest) | {f"metadata/{newest.name}"}
    repo = {
        "name": "hinted",
        "format": "iceberg",
        "storage_namespace": lake.namespace_uri,
        "source": lake.namespace_uri,
        "rules": {"default_retention_days": 1},
        "max_delete_fraction": 1.0,
        "untracked_min_age_hours": 1,
        "allow_unsafe_min_age": True,
    }
    config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")
    assert IcebergSource(RepositoryConfig.model_validate(repo)).table.metadata_location.endswith(newest.name)

    outcome = run_partition(str(config), "hinted", GC_DATE, mode="delete", instance=DagsterInstance.ephemeral())

    assert outcome.success, outcome.error
    assert needed <= lake.files()
    verdicts = pq.read_table(outcome.summary["outputs"]["retained_commits"]).to_pylist()
    assert sorted((v["retained"], v["retained_by"]) for v in verdicts) == [
        (True, "main"),
        (True, "not_committed"),
        (True, "not_committed"),
    ]
    table = StaticTable.from_metadata(newest.as_uri())
    every_snapshot = expected_live_uris(table, {str(s.snapshot_id) for s in table.metadata.snapshots})
    assert _relative(lake, every_snapshot) <= lake.files()
    kept = next(v["commit_id"] for v in verdicts if v["retained_by"] == "not_committed")
    (listing,) = _relative(lake, {table.snapshot_by_id(int(kept)).manifest_list})
    arguments = ["explain", listing, "--config", str(config), "--repo", "hinted", "--date", str(GC_DATE), "--json"]
    assert cli.main(arguments) == 0
    explanation = summary_of(capsys.readouterr().out)
    assert explanation["status"] == "live" and "no catalog to expire snapshots through" in str(explanation["reasons"])


def test_the_newest_version_decides_and_ambiguity_is_refused():
    files = [
        "s3://b/t/metadata/v1.metadata.json",
        "s3://b/t/metadata/v12.metadata.json",
        "s3://b/t/metadata/v3.metadata.json",
        "s3://b/t/metadata/version-hint.text",
        "s3://b/t/metadata/snap-1.avro",
    ]
    assert newest_metadata_file("s3://b/t", files) == "s3://b/t/metadata/v12.metadata.json"
    uuids = ["file:///t/metadata/00001-a.metadata.json", "file:///t/metadata/00002-b.metadata.json"]
    assert newest_metadata_file("file:///t", uuids) == "file:///t/metadata/00002-b.metadata.json"
    with pytest.raises(
        SourceError, match=r"2 metadata files of version 2 \(\['00002-b.metadata.json', 'v2.metadata.json'\]\)"
    ):
        newest_metadata_file("file:///t", uuids + ["file:///t/metadata/v2.metadata.json"])
    with pytest.raises(SourceError, match="no metadata.json under file:///t/metadata"):
        newest_metadata_file("file:///t", ["file:///t/metadata/version-hint.text"])


def test_a_metadata_log_naming_a_missing_file_is_refused(tmp_path, spark):
    lake = new_lake(tmp_path, "gap")
    table = lake.table()
    for n in range(3):
        with clock_at(day(n)):
            table.append(rows([n]))
    logged = lake.table().metadata.metadata_log[0].metadata_file
    Path(logged.removeprefix("file://")).unlink()
    before = lake.files()
    repo = lake.repo_config(rules={"default_retention_days": 1}, max_delete_fraction=1.0)
    with pytest.raises(SourceError, match=f"names {logged}, which does not exist"):
        IcebergSource(RepositoryConfig.model_validate(repo)).table  # noqa: B018
    config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")
    outcome = run_partition(str(config), "gap", GC_DATE, mode="delete", instance=DagsterInstance.ephemeral())
    assert not outcome.success and "which does not exist" in outcome.error
    assert lake.files() == before


def test_the_witness_follows_every_head_through_scan_planning(tmp_path, spark):
    lake = new_lake(tmp_path, "refs")
    table = lake.table()
    with clock_at(day(0)):
        table.append(rows([1, 2, 3]))
    table = lake.table()
    data_file = next(iter(table.scan().plan_files())).file
    with clock_at(day(1)):
        position_delete(table, data_file, [0])
    table = lake.table()
    table.manage_snapshots().create_tag(table.metadata.current_snapshot_id, "v1").commit()
    with clock_at(day(2)):
        lake.table().append(rows([4]))
    source = IcebergSource(RepositoryConfig.model_validate(lake.repo_config(rules={"default_retention_days": 1})))
    final = lake.table()
    heads = {name: str(ref.snapshot_id) for name, ref in final.metadata.refs.items()}
    by_commit: dict[str, set[str]] = {}
    witnessed_rows = source.witness_heads(spark, sorted(heads.values())).collect()
    for row in witnessed_rows:
        by_commit.setdefault(row["commit_id"], set()).add(row["address"])
    shuffle_partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        in_one_task = source.witness_heads(spark, sorted(heads.values()))
        assert len(heads) > 1 and in_one_task.rdd.getNumPartitions() == 1  # the metadata is loaded once for both heads
        assert sorted(in_one_task.collect()) == sorted(witnessed_rows)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", shuffle_partitions)
    witnessed = {name: by_commit[snapshot_id] for name, snapshot_id in heads.items()}
    tag_snapshot = final.metadata.snapshot_by_id(final.metadata.refs["v1"].snapshot_id)
    tag_tasks = list(final.scan(snapshot_id=tag_snapshot.snapshot_id).plan_files())
    deletes = {d.file_path for t in tag_tasks for d in t.delete_files}
    assert deletes and deletes <= witnessed["v1"] and deletes <= witnessed["main"]
    assert {t.file.file_path for t in tag_tasks} <= witnessed["v1"]
    assert tag_snapshot.manifest_list in witnessed["v1"]
    assert {t.file.file_path for t in final.scan().plan_files()} <= witnessed["main"]
    assert source.untracked_min_age(spark, None).days == 3


def test_the_witness_plans_each_head_on_executors_not_in_the_driver(tmp_path, spark, monkeypatch):
    """A head's file list never passes through the driver (as for Delta, where a 2 M-file
    head ran a 2 GiB driver out of heap); the executors read the metadata file the mark loaded."""
    lake = new_lake(tmp_path, "planned")
    with clock_at(day(0)):
        lake.table().append(rows([1, 2]))
    with clock_at(day(1)):
        lake.table().append(rows([3]))
    table = lake.table()
    snapshot = table.current_snapshot()
    manifests = snapshot.manifests(table.io)
    expected = {
        snapshot.manifest_list,
        *(m.manifest_path for m in manifests),
        *(t.file.file_path for t in table.scan().plan_files()),
    }
    assert len(expected) == 5  # a manifest list, two manifests, two data files

    def planned_in_the_driver(*args, **kwargs):
        raise AssertionError("pyiceberg planned a scan in the driver")

    monkeypatch.setattr(DataScan, "plan_files", planned_in_the_driver)  # the driver's class only
    source = IcebergSource(RepositoryConfig.model_validate(lake.repo_config(rules={"default_retention_days": 1})))
    head = str(snapshot.snapshot_id)
    assert {(r["commit_id"], r["address"]) for r in source.witness_heads(spark, [head]).collect()} == {
        (head, f) for f in expected
    }
    with pytest.raises(SourceError, match="head snapshot 42 is not in"):
        source.witness_heads(spark, [head, "42"])


def test_a_copied_table_without_its_history_is_refused_by_the_log_check(tmp_path, spark):
    """Only the newest metadata file copied to a new location: the log names files that are not there."""
    lake = _directory_table(tmp_path)
    copy = tmp_path / "copy"
    (copy / "metadata").mkdir(parents=True)
    newest = _metadata_files(lake.namespace)[-1]
    shutil.copy(newest, copy / "metadata" / newest.name)
    repo = {
        "name": "copy",
        "format": "iceberg",
        "storage_namespace": lake.namespace_uri,
        "source": f"{lake.namespace_uri}/metadata/{newest.name}",
    }
    (lake.namespace / "metadata" / "v1.metadata.json").unlink()
    with pytest.raises(SourceError, match="v1.metadata.json, which does not exist"):
        IcebergSource(RepositoryConfig.model_validate(repo)).table  # noqa: B018
