"""Fail closed (docs/design.md §10): missing or ambiguous knowledge is a refusal, never a deletion.

Each scenario runs the whole graph in delete mode on real files and asserts both the
refusal (or the correct handling) and that every object a retained commit needs is
still in storage afterwards. Scenarios that differ only in the sweep share one mark
(`aliased_mark`) and sweep it in delete mode alone.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance

from gc_assets.cli import main as cli_main
from gc_assets.core import guards
from gc_assets.demo.lakegen import Lake, write_lake
from gc_assets.runner import run_partition
from gc_assets.stores.local import LocalStore
from gc_assets.sweep.lease import LEASE_PREFIX, ClockSkew, check_clock
from gc_assets_tests.lakes import AS_OF, GC_DATE, LakeOnDisk, lake_on_disk, write_config
from gc_assets_tests.oracles import lake_graph, retained_brute_force
from gc_assets_tests.sweep_runs import sweep_only

UTC = dt.timezone.utc
OLD = dt.datetime(2022, 3, 1, 12, tzinfo=UTC)


def _needed(lake_on: object) -> set[str]:
    """Every key a retained commit of the complete lake references (brute force, no product code)."""
    lake = lake_on.lake
    retained = retained_brute_force(*lake_graph(lake), lake_on.rules, AS_OF)
    return {address for cid in retained for address, _ in lake.commits[cid].entries.values()}


def _run(config: Path, repo: str, mode: str = "delete"):
    return run_partition(str(config), repo, GC_DATE, mode=mode, instance=DagsterInstance.ephemeral())


def _head_keys(lake: Lake) -> set[str]:
    return {address for address, _ in lake.commits[lake.branches["main"]].entries.values()}


@dataclass
class MarkedLake:
    """A lake marked in a dry run, ready for sweeps of that mark alone (sweep_runs.sweep_only)."""

    on_disk: LakeOnDisk
    instance: DagsterInstance
    candidates: set[str]

    def delete_sweep(self):
        return sweep_only(self.on_disk.config_path, self.on_disk.lake.name, AS_OF, self.instance, "delete")


@pytest.fixture(scope="module")
def aliased_mark(tmp_path_factory, spark) -> MarkedLake:
    """Ranges written as file:// URIs through a symlink to the namespace, marked once: the tests
    below sweep this mark in delete mode, the refused sweep first, then the one that deletes."""
    root = tmp_path_factory.mktemp("aliased")
    on_disk = lake_on_disk(root, max_delete_fraction=1.0)
    alias = root / "alias"
    os.symlink(on_disk.namespace, alias)
    export = on_disk.namespace / "_lakefs" / "export" / "ranges" / "part-00000.parquet"
    table = pq.read_table(export)
    aliased = [f"{alias.as_uri()}/{a}" for a in table.column("address").to_pylist()]
    pq.write_table(table.set_column(table.schema.get_field_index("address"), "address", [aliased]), export)
    instance = DagsterInstance.ephemeral()

    dry = run_partition(str(on_disk.config_path), on_disk.lake.name, GC_DATE, mode="dry_run", instance=instance)

    assert dry.success, dry.error
    candidates = {r["address"] for r in pq.read_table(dry.summary["outputs"]["orphan_candidates"]).to_pylist()}
    return MarkedLake(on_disk, instance, candidates)


def test_clock_skew_stops_a_delete_run_before_anything_is_removed(aliased_mark, monkeypatch):
    on_disk = aliased_mark.on_disk
    before = on_disk.files()
    assert aliased_mark.candidates and aliased_mark.candidates <= before  # there is something to remove
    real = LocalStore.modified_time
    monkeypatch.setattr(LocalStore, "modified_time", lambda self, key: real(self, key) + dt.timedelta(hours=1))

    outcome = aliased_mark.delete_sweep()

    assert not outcome.success and "max_clock_skew_minutes" in outcome.error
    assert {f for f in on_disk.files() - before if not f.startswith(LEASE_PREFIX)} == set()
    assert before - on_disk.files() == set()


def test_absolute_addresses_through_a_symlinked_namespace_protect_their_objects(aliased_mark):
    """The aliased addresses name objects inside the namespace: they survive a delete sweep."""
    on_disk = aliased_mark.on_disk

    outcome = aliased_mark.delete_sweep()

    assert outcome.success, outcome.error
    survivors = on_disk.files()
    assert _needed(on_disk) <= survivors
    assert outcome.summary["receipts"].get("deleted", 0) > 0  # it still collects what is really garbage


def test_absolute_address_outside_every_known_location_refuses_the_mark(tmp_path, spark):
    """An address that reaches the objects through a path the product cannot resolve (a second
    mount, here a copy standing in for one) is outside and under no external prefix: refused."""
    on_disk = lake_on_disk(tmp_path, max_delete_fraction=1.0)
    mount = tmp_path / "second-mount"
    shutil.copytree(on_disk.namespace, mount, symlinks=True)
    export = on_disk.namespace / "_lakefs" / "export" / "ranges" / "part-00000.parquet"
    table = pq.read_table(export)
    moved = [f"{mount.as_uri()}/{a}" for a in table.column("address").to_pylist()]
    pq.write_table(table.set_column(table.schema.get_field_index("address"), "address", [moved]), export)
    before = on_disk.files()

    outcome = _run(on_disk.config_path, on_disk.lake.name)

    assert not outcome.success
    assert "outside the storage namespace" in outcome.error and "external_prefixes" in outcome.error
    assert str(mount) in outcome.error and "held by commit(s)" in outcome.error
    assert on_disk.files() == before


def test_external_prefixes_accept_outside_addresses(tmp_path, spark):
    """The same outside addresses, declared under external_prefixes: live, never collected, no refusal."""
    outside = tmp_path / "imports"
    lake = Lake("imports")
    lake.objects["data/garbage"] = (5, OLD)
    lake.commit("main", OLD, {"p/imported": (f"{outside.as_uri()}/one", 5), "p/local": ("data/local", 5)})
    lake.objects["data/local"] = (5, OLD)
    namespace = tmp_path / "lake" / "imports"
    write_lake(lake, namespace)
    outside.mkdir()
    (outside / "one").write_text("imported")
    repo = {
        "name": "imports",
        "format": "lakefs-export",
        "storage_namespace": namespace.as_uri(),
        "source": (namespace / "_lakefs" / "export").as_uri(),
        "rules": {"default_retention_days": 7},
        "max_delete_fraction": 1.0,
        "external_prefixes": [outside.as_uri()],
    }
    config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")

    outcome = _run(config, "imports")

    assert outcome.success, outcome.error
    assert outcome.summary["receipts"] == {"deleted": 1}
    assert (outside / "one").exists() and (namespace / "data" / "local").exists()
    assert not (namespace / "data" / "garbage").exists()


def test_a_relative_key_escaping_the_namespace_refuses_the_mark(tmp_path, spark):
    lake = Lake("escape")
    lake.objects["data/kept"] = (5, OLD)
    lake.commit("main", OLD, {"p/kept": ("data/kept", 5), "p/escape": ("../elsewhere/secret", 5)})
    namespace = tmp_path / "lake" / "escape"
    write_lake(lake, namespace)
    repo = {
        "name": "escape",
        "format": "lakefs-export",
        "storage_namespace": namespace.as_uri(),
        "source": (namespace / "_lakefs" / "export").as_uri(),
        "rules": {"default_retention_days": 7},
    }
    config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")

    outcome = _run(config, "escape")

    assert not outcome.success and "'../elsewhere/secret'" in outcome.error
    assert (namespace / "data" / "kept").exists()


def test_metarange_rows_missing_for_the_head_refuse_the_mark(tmp_path, spark):
    """An export read while it was being written: main's head has no metarange rows."""
    on_disk = lake_on_disk(tmp_path, max_delete_fraction=1.0)
    export = on_disk.namespace / "_lakefs" / "export"
    commits = pq.read_table(export / "commits" / "part-00000.parquet").to_pylist()
    head = on_disk.lake.branches["main"]
    head_metarange = next(c["metarange_id"] for c in commits if c["commit_id"] == head)
    metaranges = pq.read_table(export / "metaranges" / "part-00000.parquet")
    kept = metaranges.filter([m != head_metarange for m in metaranges.column("metarange_id").to_pylist()])
    pq.write_table(kept, export / "metaranges" / "part-00000.parquet")
    (export / "_manifest.json").unlink(missing_ok=True)  # no manifest: integrity alone must catch it
    before = on_disk.files()

    outcome = _run(on_disk.config_path, on_disk.lake.name)

    assert not outcome.success
    assert head_metarange in outcome.error and "metaranges" in outcome.error
    assert on_disk.files() == before


def test_the_witness_catches_a_connector_that_misses_a_head_object(tmp_path, spark, monkeypatch):
    """A connector whose live set drops one head object: candidates_not_live recomputes through the
    same connector and passes; the independent witness reads the export's raw rows and blocks."""
    from gc_assets.sources import lakefs_export

    on_disk = lake_on_disk(tmp_path, max_delete_fraction=1.0)
    victim = sorted(_head_keys(on_disk.lake))[0]
    original = lakefs_export._live  # the live entries of one export or of many

    def forgetful(*args):
        return original(*args).filter(f"address != '{victim}'")

    monkeypatch.setattr(lakefs_export, "_live", forgetful)

    outcome = _run(on_disk.config_path, on_disk.lake.name)

    assert not outcome.success
    assert outcome.summary["checks"]["independent_witness"] == "failed"
    assert outcome.summary["checks"]["candidates_not_live"] == "passed"  # the same-path guard is blind to it
    assert (on_disk.namespace / victim).exists()
    assert "deletion_receipts" not in outcome.summary["outputs"]


def test_witness_guard_names_needed_candidates_and_unmarked_head_objects(spark):
    namespace = "s3://Bucket/lake"
    witness = spark.createDataFrame(
        [
            ("main", "s3a://bucket/lake/data/a"),
            ("main", "data/b"),
            ("v1", "s3://bucket/lake/data/c"),
            ("main", "s3://other/x"),
        ],
        "commit_id string, address string",
    )
    live = spark.createDataFrame(
        [("data/a", True, True), ("data/b", True, True), ("data/c", False, True)],
        "address string, at_head boolean, in_namespace boolean",
    )
    candidates = spark.createDataFrame([("data/a",), ("data/z",)], "address string")

    verdict = guards.independent_witness(candidates, witness, live, namespace)

    assert not verdict.passed
    assert verdict.metadata["needed_candidates"] == ["main: data/a"]
    assert verdict.metadata["unmarked_head_objects"] == ["v1: data/c"]
    clean = guards.independent_witness(
        candidates.filter("address = 'data/z'"), witness.filter("commit_id = 'main'"), live, namespace
    )
    assert clean.passed and clean.metadata["witnessed_objects"] == 2


def test_witness_guard_resolves_file_aliases_itself(tmp_path, spark):
    real = tmp_path / "real"
    (real / "data").mkdir(parents=True)
    alias = tmp_path / "alias"
    os.symlink(real, alias)
    witness = spark.createDataFrame([("main", f"{alias.as_uri()}/data/x")], "commit_id string, address string")
    live = spark.createDataFrame([("data/x", True, True)], "address string, at_head boolean, in_namespace boolean")
    candidates = spark.createDataFrame([("data/x",)], "address string")
    verdict = guards.independent_witness(candidates, witness, live, real.as_uri())
    assert not verdict.passed and verdict.metadata["needed_candidates"] == ["main: data/x"]


def test_untracked_objects_younger_than_the_window_are_kept(tmp_path, spark):
    """An untracked object two days old survives untracked_min_age_hours: 72; an expired one of the same age goes."""
    lake = Lake("window")
    written = AS_OF - dt.timedelta(days=2)
    lake.commit("main", written - dt.timedelta(days=20), ["old"])
    lake.commit("main", written - dt.timedelta(days=19), ["new"], delete=("old",))
    expired = lake.commits[next(iter(lake.commits))].entries["old"][0]
    lake.objects[expired] = (lake.objects[expired][0], written)
    untracked = lake.upload_untracked(written + dt.timedelta(minutes=1))
    namespace = tmp_path / "lake" / "window"
    write_lake(lake, namespace)
    repo = {
        "name": "window",
        "format": "lakefs-export",
        "storage_namespace": namespace.as_uri(),
        "source": (namespace / "_lakefs" / "export").as_uri(),
        "rules": {"default_retention_days": 7},
        "max_delete_fraction": 1.0,
        "untracked_min_age_hours": 72,
    }
    config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")

    outcome = _run(config, "window")

    assert outcome.success, outcome.error
    assert (namespace / untracked).exists()
    assert not (namespace / expired).exists()
    assert outcome.summary["receipts"] == {"deleted": 1}


def test_untracked_window_below_the_format_guard_needs_the_unsafe_flag(tmp_path):
    repo = {
        "name": "w",
        "format": "lakefs-export",
        "storage_namespace": (tmp_path / "ns").as_uri(),
        "source": (tmp_path / "ns" / "export").as_uri(),
        "min_object_age_hours": 24,
        "untracked_min_age_hours": 2,
    }
    config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")
    assert cli_main(["run", "--config", str(config), "--repo", "w", "--date", GC_DATE.isoformat()]) == 2


def test_local_age_counts_from_the_change_time(tmp_path, spark):
    """A file copied in with an old modification time is young by its ctime."""
    (tmp_path / "data").mkdir()
    copied = tmp_path / "data" / "copied"
    copied.write_text("x")
    old = (dt.datetime.now(UTC) - dt.timedelta(days=30)).timestamp()
    os.utime(copied, (old, old))
    listed = LocalStore(tmp_path.as_uri(), trust_mtime=False).list(spark).collect()
    assert listed[0]["last_modified"].replace(tzinfo=UTC) > dt.datetime.now(UTC) - dt.timedelta(hours=1)
    trusting = LocalStore(tmp_path.as_uri(), trust_mtime=True).list(spark).collect()
    assert trusting[0]["last_modified"].replace(tzinfo=UTC) < dt.datetime.now(UTC) - dt.timedelta(days=29)


class _SkewedStore:
    def __init__(self, skew: dt.timedelta):
        self.skew = skew

    def modified_time(self, key: str) -> dt.datetime:
        assert key.startswith(LEASE_PREFIX)
        return dt.datetime(2026, 1, 1, tzinfo=UTC) + self.skew


def test_clock_skew_beyond_the_limit_refuses():
    now = dt.datetime(2026, 1, 1, tzinfo=UTC)
    key = f"{LEASE_PREFIX}000000000001.json"
    assert check_clock(_SkewedStore(dt.timedelta(minutes=4)), key, now, dt.timedelta(minutes=5)) == dt.timedelta(
        minutes=4
    )
    with pytest.raises(ClockSkew, match="differ by 360 s"):
        check_clock(_SkewedStore(dt.timedelta(minutes=-6)), key, now, dt.timedelta(minutes=5))


def test_one_namespace_twice_and_bad_prefixes_are_configuration_errors(tmp_path):
    from gc_assets.core.config import ConfigError, load_config

    outer = {
        "name": "outer",
        "format": "lakefs-export",
        "storage_namespace": (tmp_path / "lake").as_uri(),
        "source": (tmp_path / "export-outer").as_uri(),
    }
    inner = {
        "name": "inner",
        "format": "lakefs-export",
        "storage_namespace": (tmp_path / "lake" / "inner").as_uri(),
        "source": (tmp_path / "export-inner").as_uri(),
    }
    nested = load_config(write_config(tmp_path / "gc.yaml", [outer, inner], tmp_path / "state"))
    assert nested.nested_in("outer") == {"inner/": "inner"}  # protected there, collected by its own repository
    os.makedirs(tmp_path / "lake")
    os.symlink(tmp_path / "lake", tmp_path / "same")
    same = {**inner, "storage_namespace": (tmp_path / "same").as_uri()}
    with pytest.raises(ConfigError, match="share the storage namespace"):
        load_config(write_config(tmp_path / "same.yaml", [outer, same], tmp_path / "state"))
    for bad in ["s3://bucket/x", "/abs", "a/../b", "data/*", "./x", ""]:
        with pytest.raises(ConfigError, match="protected_prefixes"):
            load_config(
                write_config(tmp_path / "bad.yaml", [{**outer, "protected_prefixes": [bad]}], tmp_path / "state")
            )


@pytest.mark.parametrize(
    "fmt, source", [("delta", "table"), ("iceberg", "table"), ("iceberg", "table/metadata/v3.metadata.json")]
)
def test_a_table_namespace_must_be_the_table_root(tmp_path, fmt, source):
    from gc_assets.core.config import ConfigError, load_config

    repo = {
        "name": "t",
        "format": fmt,
        "storage_namespace": (tmp_path / "warehouse").as_uri(),
        "source": (tmp_path / "warehouse" / source).as_uri(),
    }
    with pytest.raises(ConfigError, match="is not the table root"):
        load_config(write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state"))
    at_root = {**repo, "storage_namespace": (tmp_path / "warehouse" / "table").as_uri()}
    assert load_config(write_config(tmp_path / "gc.yaml", [at_root], tmp_path / "state")).repositories[0].name == "t"
