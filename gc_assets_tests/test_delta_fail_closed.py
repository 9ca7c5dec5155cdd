"""Delta tables that the product must refuse, or handle as the table root, in delete mode
on tables written by delta-rs (docs/design.md §10)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import time
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest
from dagster import DagsterInstance
from deltalake import DeltaTable, write_deltalake

from gc_assets.cli import main as cli_main
from gc_assets.core.config import load_config
from gc_assets.runner import run_partition, run_partitions
from gc_assets.sources.delta import DeltaSource
from gc_assets.sources.delta_log import DeltaLogError, z85_uuid
from gc_assets_tests import delta_tables
from gc_assets_tests.lakes import write_config

TODAY = dt.datetime.now(dt.timezone.utc).date()


def _table(root: Path, name: str, versions: int = 4) -> Path:
    """A table whose versions are days apart, the newest 12 hours old, and its current files."""
    path = root / name
    write_deltalake(path, pa.table({"id": [0, 1]}))
    for version in range(1, versions):
        write_deltalake(path, pa.table({"id": [version * 10]}), mode="overwrite" if version % 2 else "append")
    delta_tables.shift_history(path, delta_tables.now_utc())
    return path


def _current(path: Path) -> set[str]:
    return {str(Path(uri).relative_to(path)) for uri in DeltaTable(str(path)).file_uris()}


def _files(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}


def _repo(name: str, namespace: Path, **options) -> dict:
    return {
        "name": name,
        "format": "delta",
        "storage_namespace": namespace.as_uri(),
        "max_delete_fraction": 1.0,
        "rules": {"default_retention_days": 1},
        "allow_unsafe_retention": True,
        **options,
    }


def _run(config: Path, name: str):
    return run_partition(str(config), name, TODAY, mode="delete", instance=DagsterInstance.ephemeral())


def test_a_namespace_above_the_table_is_refused_and_nothing_is_touched(tmp_path, spark):
    warehouse = tmp_path / "warehouse"
    table, sibling = _table(warehouse, "orders"), _table(warehouse, "customers")
    before = _files(warehouse)
    config = write_config(tmp_path / "gc.yaml", [_repo("orders", warehouse, source=table.as_uri())], tmp_path / "state")
    assert (
        cli_main(["run", "--config", str(config), "--repo", "orders", "--date", TODAY.isoformat(), "--mode", "delete"])
        == 2
    )
    assert _files(warehouse) == before and _current(sibling) <= _files(sibling)
    with pytest.raises(ValueError, match="is not the storage namespace"):
        DeltaSource(table.as_uri(), warehouse.as_uri())


def test_a_source_spelled_through_a_symlink_is_the_same_table(tmp_path, spark):
    table = _table(tmp_path, "orders")
    alias = tmp_path / "alias"
    os.symlink(table, alias)
    current = _current(table)
    config = write_config(tmp_path / "gc.yaml", [_repo("orders", table, source=alias.as_uri())], tmp_path / "state")

    outcome = _run(config, "orders")

    assert outcome.success, outcome.error
    assert current <= _files(table)
    assert outcome.summary["receipts"].get("deleted", 0) > 0  # expired versions' files did go
    assert sorted(r["id"] for r in pa.table(DeltaTable(str(table)).to_pyarrow_dataset().to_table()).to_pylist()) == [30]


def _rewrite_protocol(path: Path, protocol: dict, configuration: dict | None = None) -> None:
    log = path / "_delta_log" / f"{0:020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    for action in actions:
        if "protocol" in action:
            action["protocol"] = protocol
        if "metaData" in action and configuration:
            action["metaData"]["configuration"] = {**action["metaData"]["configuration"], **configuration}
    stamp = log.stat().st_mtime
    log.write_text("".join(json.dumps(a) + "\n" for a in actions))
    os.utime(log, (stamp, stamp))


FEATURES = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": [], "writerFeatures": ["appendOnly"]}


# A protocol gc_assets does not understand, the configuration beside it, and the refusal's words.
NOT_UNDERSTOOD = [
    (
        {**FEATURES, "readerFeatures": ["catalogManaged"], "writerFeatures": ["catalogManaged"]},
        None,
        "table feature catalogManaged keeps commits outside",
    ),
    (
        {**FEATURES, "writerFeatures": ["coordinatedCommits-preview"]},
        None,
        "coordinatedCommits-preview keeps commits outside",
    ),
    (
        FEATURES,
        {"delta.coordinatedCommits.commitCoordinator-preview": "dynamodb"},
        "commitCoordinator-preview keeps commits outside",
    ),
    (
        {**FEATURES, "writerFeatures": ["vacuumProtocolCheck", "futureFeature"]},
        None,
        "['futureFeature'] are not supported by gc_assets (the table requires vacuumProtocolCheck)",
    ),
    ({**FEATURES, "writerFeatures": ["futureFeature"]}, None, "['futureFeature'] are not supported"),
    ({**FEATURES, "minWriterVersion": 8}, None, "minWriterVersion 8 is newer"),
]


def test_protocols_gc_assets_does_not_understand_are_refused_each_with_its_own_reason(tmp_path, spark):
    """Each table whose protocol gc_assets does not understand is refused by its reader, and in a
    delete run of them all, each is refused for its own reason and none is touched."""
    tables = {f"t{i}": _table(tmp_path, f"t{i}") for i in range(len(NOT_UNDERSTOOD))}
    for table, (protocol, configuration, message) in zip(tables.values(), NOT_UNDERSTOOD):
        _rewrite_protocol(table, protocol, configuration)
        with pytest.raises(DeltaLogError, match=re.escape(message)):
            DeltaSource(table.as_uri(), table.as_uri()).metadata(spark)
    before = {name: _files(table) for name, table in tables.items()}
    config = write_config(
        tmp_path / "gc.yaml", [_repo(name, table) for name, table in tables.items()], tmp_path / "state"
    )
    outcomes = list(run_partitions(load_config(config), list(tables), TODAY, mode="delete"))
    assert [o.summary["repo"] for o in outcomes] == list(tables)
    for outcome, (_, _, message) in zip(outcomes, NOT_UNDERSTOOD):
        assert not outcome.success and "refusing to collect" in outcome.error and message in outcome.error, (
            outcome.error
        )
    assert {name: _files(table) for name, table in tables.items()} == before


def test_understood_features_pass(tmp_path, spark):
    table = _table(tmp_path, "t")
    _rewrite_protocol(
        table,
        {
            **FEATURES,
            "readerFeatures": ["deletionVectors"],
            "writerFeatures": ["deletionVectors", "vacuumProtocolCheck"],
        },
    )
    assert DeltaSource(table.as_uri(), table.as_uri()).metadata(spark)[0] == []


def test_uniform_protects_the_iceberg_metadata_directory(tmp_path, spark):
    table = _table(tmp_path, "t")
    _rewrite_protocol(table, FEATURES, {"delta.universalFormat.enabledFormats": "iceberg"})
    (table / "metadata").mkdir()
    old = time.time() - 30 * 86400
    for name in ("v3.metadata.json", "snap-1.avro"):
        (table / "metadata" / name).write_text("uniform")
        os.utime(table / "metadata" / name, (old, old))
    assert "metadata/" in DeltaSource(table.as_uri(), table.as_uri()).protected_prefixes
    config = write_config(
        tmp_path / "gc.yaml",
        [_repo("t", table, untracked_min_age_hours=24, allow_unsafe_min_age=True)],
        tmp_path / "state",
    )
    outcome = _run(config, "t")
    assert outcome.success, outcome.error
    assert {"metadata/v3.metadata.json", "metadata/snap-1.avro"} <= _files(table)
    plain = _table(tmp_path / "plain", "t")
    assert DeltaSource(plain.as_uri(), plain.as_uri()).protected_prefixes == ("_delta_log/",)


def test_an_uncommitted_file_two_days_old_survives_as_delta_rs_keeps_it(tmp_path, spark):
    """With the table's default 7-day retention, a file written two days ago that no commit names
    is an in-flight write: delta-rs full vacuum keeps it, and so does gc_assets."""
    table = _table(tmp_path, "t", versions=6)  # removals 12.5 and 6.5 days ago: one outside the window
    writing = table / "part-99999-in-flight.parquet"
    writing.write_bytes(b"a writer's file, not yet committed")
    two_days = time.time() - 2 * 86400
    os.utime(writing, (two_days, two_days))
    config = write_config(
        tmp_path / "gc.yaml",
        [{**_repo("t", table), "rules": None, "allow_unsafe_retention": False}],
        tmp_path / "state",
    )
    assert DeltaSource(table.as_uri(), table.as_uri()).untracked_min_age(spark, None) == dt.timedelta(days=7)
    vacuum = DeltaTable(str(table)).vacuum(dry_run=True, full=True, enforce_retention_duration=True)
    delta_rs = {str(Path(p).relative_to(table)) if p.startswith("/") else p for p in vacuum}
    assert "part-99999-in-flight.parquet" not in delta_rs and delta_rs
    before = _files(table)

    outcome = _run(config, "t")

    assert outcome.success, outcome.error
    assert writing.exists()
    assert before - _files(table) == delta_rs  # exactly what delta-rs full vacuum removes


def test_the_witness_reads_the_head_with_delta_rs(tmp_path, spark):
    table = _table(tmp_path, "t")
    source = DeltaSource(table.as_uri(), table.as_uri())
    head = f"{DeltaTable(str(table)).version():020d}"
    witnessed = {(r["commit_id"], r["address"]) for r in source.witness_heads(spark, [head]).collect()}
    assert witnessed == {(head, uri) for uri in DeltaTable(str(table)).file_uris()}
    first = {r["address"] for r in source.witness_heads(spark, [f"{0:020d}"]).collect()}
    assert first == set(DeltaTable(str(table), version=0).file_uris()) and first != {a for _, a in witnessed}
    assert len(witnessed) == 1  # the overwrite at the head left one file


def test_the_witness_reads_the_head_on_executors_not_in_the_driver(tmp_path, spark, monkeypatch):
    """A head's file list never passes through the driver: built there, a 2 M-file table's
    1.5 M head files ran a 2 GiB driver out of heap."""
    table = _table(tmp_path, "t")
    head = f"{DeltaTable(str(table)).version():020d}"
    expected = {(head, uri) for uri in DeltaTable(str(table)).file_uris()}

    def read_in_the_driver(*args, **kwargs):
        raise AssertionError("delta-rs was called in the driver")

    monkeypatch.setattr(deltalake, "DeltaTable", read_in_the_driver)  # the driver's module only
    source = DeltaSource(table.as_uri(), table.as_uri())
    assert {(r["commit_id"], r["address"]) for r in source.witness_heads(spark, [head]).collect()} == expected


def test_the_witness_decodes_deletion_vector_names_like_the_protocol_example():
    """The Delta protocol's example: `ab^-aqEH.-t@S}K{vb[*k^` is prefix `ab` and this UUID."""
    encoded = "^-aqEH.-t@S}K{vb[*k^"
    assert z85_uuid(encoded) == "d2c639aa-8816-431a-aaf6-d3fe2512ff61"
