"""`format: lakefs` fails closed on what storage alone cannot know: missing or unreadable tables
refuse naming them, a stale dump is refused, tables written after the dump are live, addresses
are read as lakeFS resolves them (real lakeFS-written tables), and the witness reads through
RocksDB, not the mark's reader."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path

import pytest
from pyspark import cloudpickle

from gc_assets.core.addresses import with_relative_keys
from gc_assets.core.config import RepositoryConfig
from gc_assets.demo.lakegen import TABLES_DIR, docs_example, write_metarange, write_native_lake, write_refs_dump
from gc_assets.sources.base import SourceError
from gc_assets.sources.lakefs import source as source_module
from gc_assets.sources.lakefs import witness as witness_module
from gc_assets.sources.lakefs.records import CommitData, LakeFSTable, RangeData, Timestamp, split_value
from gc_assets.sources.lakefs.source import LakeFSSource
from gc_assets.sources.lakefs.sstable import read_sstable
from gc_assets_tests.live_sets import refuse_unlisted_outside

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "lakefs"
RANGE_SST_ID = "a83af763ba098c15369d9d6d723731eb9ce18b8dfac4f88c6f1287e772393d0e"  # metarange.sst names it
UTC = dt.timezone.utc


def _lake(tmp_path: Path, **options):
    lake = docs_example("repo")
    namespace = tmp_path / "repo"
    manifest = write_native_lake(lake, namespace, **options)
    repo = RepositoryConfig(
        name="repo", format="lakefs", storage_namespace=namespace.as_uri(), refs_dump=manifest.as_uri()
    )
    return lake, namespace, repo


def _frame(spark, ids):
    return spark.createDataFrame([(c,) for c in ids], "commit_id string")


def _dump_metarange(namespace: Path, commit_id: str) -> str:
    """A commit's metarange id, read from the dump's tables with the codec directly."""
    manifest = json.loads((namespace / "_lakefs" / "refs_manifest.json").read_text())
    metarange = read_sstable((namespace / TABLES_DIR / manifest["commits_meta_range_id"]).read_bytes(), "commits")
    for _, value in metarange.records():
        range_id = split_value(value)[0].decode()
        for key, record in read_sstable((namespace / TABLES_DIR / range_id).read_bytes(), range_id).records():
            if key.decode() == commit_id:
                return CommitData.decode(split_value(record)[1]).meta_range_id
    raise KeyError(commit_id)


def test_a_missing_commit_metarange_is_refused_naming_it(tmp_path, spark):
    lake, namespace, repo = _lake(tmp_path)
    metarange = _dump_metarange(namespace, "2022-03-01")
    os.remove(namespace / TABLES_DIR / metarange)
    with pytest.raises(SourceError, match=f"metarange {metarange} of commit 2022-03-01 is missing"):
        LakeFSSource(repo).commit_graph(spark)


def test_a_missing_range_is_refused_naming_it(tmp_path, spark):
    lake, namespace, repo = _lake(tmp_path)
    metarange = read_sstable((namespace / TABLES_DIR / _dump_metarange(namespace, "2022-03-09")).read_bytes(), "m")
    range_id = split_value(next(iter(metarange.records()))[1])[0].decode()
    os.remove(namespace / TABLES_DIR / range_id)
    source = LakeFSSource(repo)
    source.commit_graph(spark)
    with pytest.raises(SourceError, match=f"range .*{range_id}, listed by metarange .* is missing"):
        source.live_entries(spark, _frame(spark, ["2022-03-28"]), _frame(spark, []))


def test_a_corrupt_range_is_refused_naming_it(tmp_path, spark):
    lake, namespace, repo = _lake(tmp_path)
    metarange = read_sstable((namespace / TABLES_DIR / _dump_metarange(namespace, "2022-03-28")).read_bytes(), "m")
    range_id = split_value(next(iter(metarange.records()))[1])[0].decode()
    path = namespace / TABLES_DIR / range_id
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # inside the first data block: its checksum no longer matches
    stamp = path.stat().st_mtime
    path.write_bytes(bytes(data))
    os.utime(path, (stamp, stamp))
    source = LakeFSSource(repo)
    with pytest.raises(SourceError, match=f"SSTable .*{range_id}.*refusing to mark"):
        source.live_entries(spark, _frame(spark, ["2022-03-28"]), _frame(spark, []))


@pytest.mark.parametrize("which", ["commits_meta_range_id", "branches_meta_range_id"])
def test_a_dump_whose_table_is_missing_is_refused_naming_it(tmp_path, spark, which):
    lake, namespace, repo = _lake(tmp_path)
    table = json.loads((namespace / "_lakefs" / "refs_manifest.json").read_text())[which]
    os.remove(namespace / TABLES_DIR / table)
    with pytest.raises(SourceError, match=f"{table} \\({which}\\) is missing"):
        LakeFSSource(repo).commit_graph(spark)


def test_a_stale_dump_is_refused(tmp_path, spark):
    old = dt.datetime.now(UTC) - dt.timedelta(hours=25)
    lake, namespace, repo = _lake(tmp_path, dumped_at=old)
    with pytest.raises(SourceError, match="more than refs_dump_max_age_hours \\(24\\).*lakectl refs-dump"):
        LakeFSSource(repo).commit_graph(spark)
    relaxed = repo.model_copy(update={"refs_dump_max_age_hours": 26})
    assert abs(LakeFSSource(relaxed).source_time(spark) - old) < dt.timedelta(seconds=1)


def test_the_dump_time_is_the_source_time(tmp_path, spark):
    dumped = dt.datetime.now(UTC).replace(microsecond=0) - dt.timedelta(hours=2)
    lake, namespace, repo = _lake(tmp_path, dumped_at=dumped)
    assert LakeFSSource(repo).source_time(spark) == dumped


def test_tables_written_after_the_dump_are_live_with_every_range_they_list(tmp_path, spark):
    """A commit made after the dump (a revert to 2022-02-27's tree) writes a metarange that lists
    old ranges: their objects, expired by the dump's history, are live."""
    lake, namespace, repo = _lake(tmp_path, dumped_at=dt.datetime.now(UTC) - dt.timedelta(hours=2))
    old_metarange = read_sstable((namespace / TABLES_DIR / _dump_metarange(namespace, "2022-02-27")).read_bytes(), "m")
    ranges = []
    for _, value in old_metarange.records():
        range_id = split_value(value)[0].decode()
        ranges.append(LakeFSTable(range_id, b"", RangeData.decode(split_value(value)[1])))
    write_metarange(namespace, ranges, dt.datetime.now(UTC), {"reverted": "2022-02-27"})
    source = LakeFSSource(repo)
    source.commit_graph(spark)
    live = {r["address"] for r in source.live_entries(spark, _frame(spark, []), _frame(spark, [])).collect()}
    assert live == {a for a, _ in lake.commits["2022-02-27"].entries.values()}


def _fixture_namespace(tmp_path: Path) -> tuple[Path, RepositoryConfig]:
    """A namespace of tables lakeFS itself wrote: metarange.sst and the range it names (RELATIVE
    entries), ok1.sst (BY_PREFIX_DEPRECATED) and import-13868.sst (FULL, an import from s3://oz-repo)
    under a metarange of ours, and a dump naming both metaranges."""
    namespace = tmp_path / "fixtures-repo"
    tables = namespace / TABLES_DIR
    tables.mkdir(parents=True)
    old = dt.datetime(2022, 3, 1, tzinfo=UTC)
    real = "0" * 63 + "1"  # the real metarange's name here (lakeFS never checks a name against content)
    for name, target in (
        ("metarange.sst", real),
        ("range.sst", RANGE_SST_ID),
        ("ok1.sst", "ab" * 32),
        ("import-13868.sst", "cd" * 32),
    ):
        shutil.copyfile(FIXTURES / name, tables / target)
        os.utime(tables / target, (old.timestamp(), old.timestamp()))
    listed = []
    for table_id in ("ab" * 32, "cd" * 32):
        table = read_sstable((tables / table_id).read_bytes(), table_id)
        keys = [k for k, _ in table.records()]
        listed.append(LakeFSTable(table_id, b"", RangeData(keys[0], keys[-1], 0, len(keys))))
    ours = write_metarange(namespace, sorted(listed, key=lambda t: t.range_data.max_key), old, {})
    commits = [
        CommitData(id="c1", creation_date=Timestamp.of(old), meta_range_id=real, version=1),
        CommitData(
            id="c2",
            creation_date=Timestamp.of(old + dt.timedelta(hours=1)),
            meta_range_id=ours,
            parents=("c1",),
            version=1,
        ),
    ]
    write_refs_dump(namespace, commits, {"main": "c2", "old": "c1"}, {}, dt.datetime.now(UTC))
    repo = RepositoryConfig(
        name="fixtures",
        format="lakefs",
        storage_namespace=namespace.as_uri(),
        refs_dump=(namespace / "_lakefs" / "refs_manifest.json").as_uri(),
    )
    return namespace, repo


def test_lakefs_written_tables_resolve_relative_deprecated_and_full_addresses(tmp_path, spark):
    namespace, repo = _fixture_namespace(tmp_path)
    source = LakeFSSource(repo)
    commits, refs = source.commit_graph(spark)
    entries = source.live_entries(spark, _frame(spark, ["c1", "c2"]), _frame(spark, ["c2"])).collect()
    by_address = {r["address"]: r for r in entries}
    # range.sst, RELATIVE: keys in the namespace, at c1 only (not a head).
    assert (
        by_address["b0c968736d8f42a2b1c6284835f08226"]["size"] == 11
        and not by_address["b0c968736d8f42a2b1c6284835f08226"]["at_head"]
    )
    assert by_address["fdf87fcf9ec849f98514ddb7e041ad56"]["size"] == 4
    # ok1.sst, BY_PREFIX_DEPRECATED hex addresses: relative keys.
    assert (
        by_address["4e068d1a46734113abd2218e87aace4c"]["size"] == 2
        and by_address["4e068d1a46734113abd2218e87aace4c"]["at_head"]
    )
    # import-13868.sst: FULL URIs of another bucket.
    full = "s3://oz-repo/datasets/common-crawl-hive-analysis/CC-MAIN-2014-23/part-m-01366.gz"
    assert by_address[full]["size"] == 3_234_746
    assert len(entries) == 2 + 105 + 13_868
    keyed = with_relative_keys(
        source.live_entries(spark, _frame(spark, ["c2"]), _frame(spark, ["c2"])), repo.storage_namespace
    )
    with pytest.raises(
        SourceError,
        match="outside the storage namespace .* under no external_prefixes.*held by commit\\(s\\) \\['c2'\\]",
    ):
        refuse_unlisted_outside(spark, source, repo, keyed, _frame(spark, ["c2"]))
    allowed = repo.model_copy(update={"external_prefixes": ("s3://oz-repo",)})
    keyed = with_relative_keys(
        source.live_entries(spark, _frame(spark, ["c2"]), _frame(spark, ["c2"])),
        repo.storage_namespace,
        allowed.external_prefixes,
    )
    refuse_unlisted_outside(spark, source, allowed, keyed, _frame(spark, ["c2"]))


def test_full_addresses_inside_the_namespace_are_its_keys(tmp_path, spark):
    lake = docs_example("repo")
    namespace = tmp_path / "repo"
    inside = f"{namespace.as_uri()}/data/imported/object"
    lake.commit("main", dt.datetime(2022, 3, 30, tzinfo=UTC), {"imported/object": (inside, 7)})
    manifest = write_native_lake(lake, namespace)
    repo = RepositoryConfig(
        name="repo", format="lakefs", storage_namespace=namespace.as_uri(), refs_dump=manifest.as_uri()
    )
    source = LakeFSSource(repo)
    source.commit_graph(spark)
    keyed = with_relative_keys(
        source.live_entries(spark, _frame(spark, [lake.branches["main"]]), _frame(spark, [])), repo.storage_namespace
    )
    row = keyed.filter(keyed.spelled == inside).collect()
    assert [(r["address"], r["in_namespace"]) for r in row] == [("data/imported/object", True)]


def test_pre_1_0_commits_list_their_main_parent_last(tmp_path, spark):
    lake = docs_example("repo")
    lake.branch("feature", "main")
    lake.commit("feature", dt.datetime(2022, 3, 29, tzinfo=UTC), ["f/x"], commit_id="feature-1")
    merge = lake.commit("main", dt.datetime(2022, 3, 30, tzinfo=UTC), merge_from="feature", commit_id="merge")
    namespace = tmp_path / "repo"
    manifest = write_native_lake(lake, namespace, legacy_commits=frozenset({merge}))
    repo = RepositoryConfig(
        name="repo", format="lakefs", storage_namespace=namespace.as_uri(), refs_dump=manifest.as_uri()
    )
    commits = {c.commit_id: c for c in LakeFSSource(repo).commit_graph(spark)[0]}
    assert commits["merge"].parents == ("2022-03-28", "feature-1")  # stored as (feature-1, 2022-03-28), version 0


def test_the_witness_reads_with_rocksdb_and_the_mark_with_its_own_reader(tmp_path, spark, monkeypatch):
    """Break one reader on the driver and on the executors: the other still reads every head right."""
    lake, namespace, repo = _lake(tmp_path)
    heads = sorted(set(lake.branches.values()))
    needed = sorted((h, a) for h in heads for a, _ in lake.commits[h].entries.values())
    for module in (source_module, witness_module):
        cloudpickle.register_pickle_by_value(module)
    try:

        def no_rocksdb(*args, **kwargs):
            raise RuntimeError("RocksDB is switched off")

        monkeypatch.setattr(witness_module, "read_with_rocksdb", no_rocksdb)
        monkeypatch.setattr(witness_module, "read_tables_with_rocksdb", no_rocksdb)
        source = LakeFSSource(repo)
        live = source.live_entries(spark, _frame(spark, heads), _frame(spark, heads))
        assert sorted({r["address"] for r in live.collect()}) == sorted({a for _, a in needed})
        with pytest.raises(Exception, match="RocksDB is switched off"):
            source.witness_heads(spark, heads).collect()
        monkeypatch.undo()

        def no_sstable(data, name):
            raise SourceError(f"SSTable {name}: the mark's reader is switched off")

        monkeypatch.setattr(source_module, "read_sstable", no_sstable)
        witnessed = sorted(
            (r["commit_id"], r["address"]) for r in LakeFSSource(repo).witness_heads(spark, heads).collect()
        )
        assert witnessed == needed
        with pytest.raises(SourceError, match="the mark's reader is switched off"):
            LakeFSSource(repo).commit_graph(spark)
    finally:
        for module in (source_module, witness_module):
            cloudpickle.unregister_pickle_by_value(module)
