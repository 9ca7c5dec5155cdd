"""format: file-catalog fails closed (docs/design.md §6.5, §10): an unreachable catalog, a missing
column, executors reading off the snapshot, soft deletes in the future, objects ahead of the database's
clock, paths outside the namespace; the witness reads through its own path; gc.yaml errors
name file, repository and field; and a soft delete reverted (or a row added) during the sweep
is never lost."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.parquet as pq
import pytest
from dagster import DagsterEventType, DagsterInstance
from pyspark.sql import functions as F

from gc_assets.core.addresses import with_relative_keys
from gc_assets.core.config import ConfigError, parse_config
from gc_assets.core.names import Mode
from gc_assets.core.time import partition_date_of
from gc_assets.mark import connectors
from gc_assets.runner import run_partition
from gc_assets.sources import SourceError, source_for
from gc_assets.sources.catalog_db import CatalogDatabase, CatalogError, CatalogSnapshot
from gc_assets.sources.file_catalog import rows_of_many
from gc_assets.stores import store_for
from gc_assets.stores.state import LocalState
from gc_assets.sweep import catalog_rows
from gc_assets.sweep.journal import SweepJournal
from gc_assets_tests.cli_runs import run_cli_in_memory
from gc_assets_tests.file_catalogs import (
    OBJECT_CUTOFF,
    PATH,
    catalog_entry,
    oracle,
    postgres_catalog,
    random_catalog,
    sqlite_catalog,
    table_rows,
    write_objects,
)
from gc_assets_tests.lakes import write_config
from gc_assets_tests.live_sets import refuse_unlisted_outside
from gc_assets_tests.postgres_server import postgres  # noqa: F401 - the fixture
from gc_assets_tests.test_file_catalog import _local_listing


def _config(repo: dict[str, Any]):
    return parse_config({"repositories": [repo]}, "gc.yaml").repositories[0]


def _sqlite(tmp_path: Path, rows: int = 40, seed: int = 5) -> tuple[Any, str]:
    catalog = random_catalog(seed, rows, dt.datetime.now(dt.timezone.utc))
    return catalog, sqlite_catalog(tmp_path / "catalog.db", catalog)


def _execute(url: str, sql: str, params: tuple = ()) -> None:
    connection = sqlite3.connect(url.split(":///", 1)[1])
    connection.execute(sql, params)
    connection.commit()
    connection.close()


def test_config_errors_name_file_repository_and_field():
    good = catalog_entry("iox", "file:///data/iox", "sqlite:////data/catalog.db")
    assert (
        _config(good).row_cutoff_hours == 48
        and _config({**good, "object_cutoff_hours": None}).object_cutoff_hours == 720
    )
    cases = [
        ({**good, "catalog": {**good["catalog"], "to_delete": None}}, "field catalog.to_delete"),
        ({**good, "catalog": {**good["catalog"], "path": "{a:>3}"}}, "field catalog.path"),
        ({**good, "catalog": {**good["catalog"], "url": "mysql://h/db"}}, "field catalog.url"),
        (
            {**good, "catalog": {**good["catalog"], "url": "postgresql+psycopg://u:secret@h/db"}},
            "must not hold a password",
        ),
        ({k: v for k, v in good.items() if k != "catalog"}, "field catalog: format file-catalog needs a catalog block"),
        (
            {**good, "row_cutoff_hours": 0.5, "allow_unsafe_min_age": False, "min_object_age_hours": 24},
            "field row_cutoff_hours",
        ),
        (
            {"name": "d", "format": "delta", "storage_namespace": "file:///data/d", "row_cutoff_hours": 3},
            "field row_cutoff_hours: is only for format file-catalog",
        ),
    ]
    for repo, message in cases:
        with pytest.raises(ConfigError, match="gc.yaml: invalid configuration: repository '(iox|d)': .*" + message):
            parse_config({"repositories": [repo]}, "gc.yaml")
        assert "secret" not in str(pytest.raises(ConfigError, parse_config, {"repositories": [repo]}, "gc.yaml").value)


def test_unreachable_catalog_and_missing_column_are_refused(spark, tmp_path, postgres):
    missing_file = _config(catalog_entry("iox", f"file://{tmp_path}", f"sqlite:///{tmp_path}/absent.db"))
    with pytest.raises(SourceError, match="unreachable"):
        source_for(missing_file).commit_graph(spark)
    nowhere = _config(
        catalog_entry("iox", f"file://{tmp_path}", f"postgresql+psycopg://gc@127.0.0.1:{postgres.port + 1}/iox")
    )
    with pytest.raises(SourceError, match="unreachable"):
        source_for(nowhere).commit_graph(spark)
    _, url = _sqlite(tmp_path)
    repo = catalog_entry("iox", f"file://{tmp_path}", url)
    repo["catalog"] = {**repo["catalog"], "path": "{namespace_id}/{shard}/{object_store_id}.parquet"}
    with pytest.raises(SourceError, match=r"column\(s\) \['shard'\] missing"):
        source_for(_config(repo)).commit_graph(spark)


def test_rows_are_read_at_the_snapshot_and_readers_off_it_are_refused(spark, tmp_path, monkeypatch):
    """A row deleted just after the snapshot's counters is still read (the executors read the
    snapshot); executors that read the table itself instead find another count: refused."""
    catalog, url = _sqlite(tmp_path)
    repo = _config(catalog_entry("iox", f"file://{tmp_path}", url))
    original_state = CatalogDatabase.state

    def counted_then_a_row_deleted(self, kinds, at, cutoff):
        counted = original_state(self, kinds, at, cutoff)
        _execute(url, "DELETE FROM parquet_file WHERE id = (SELECT min(id) FROM parquet_file)")
        return counted

    monkeypatch.setattr(CatalogDatabase, "state", counted_then_a_row_deleted)
    assert source_for(repo).rows(spark).count() == len(catalog.rows)
    monkeypatch.setattr(CatalogDatabase, "at_snapshot", lambda self, snapshot: self)
    with pytest.raises(SourceError, match="did not read one consistent state"):
        source_for(repo).rows(spark)


def test_a_catalogs_rows_are_never_asked_for_under_another_name(spark, tmp_path):
    """Catalogs read together share one frame, each one's rows those of its `repo`: asked for
    under another name, its rows would be none and every object of it untracked. Refused."""
    catalog, url = _sqlite(tmp_path)
    source = source_for(_config(catalog_entry("iox", f"file://{tmp_path}", url)))
    read = source.read(spark)
    with pytest.raises(ValueError, match="the rows of repository 'iox' asked for as 'other'"):
        rows_of_many(spark, {"other": (source, read)})
    assert rows_of_many(spark, {"iox": (source, read)})["iox"].count() == len(catalog.rows)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_every_connection_at_a_snapshot_reads_it_until_it_closes(database, tmp_path, request):
    """The DB-API readers (the executors' ranges, the witness) at a snapshot see neither a row
    deleted nor a row soft-deleted after it; once closed, the snapshot is refused, not read anew."""
    catalog = random_catalog(5, 40, dt.datetime.now(dt.timezone.utc))
    pg = request.getfixturevalue("postgres") if database == "postgres" else None
    url = postgres_catalog(pg, "snapshot", catalog) if pg else sqlite_catalog(tmp_path / "catalog.db", catalog)
    db = CatalogDatabase(_config(catalog_entry("iox", f"file://{tmp_path}", url)).file_catalog, "iox")
    kinds, ids = db.checked_kinds(), sorted(r["id"] for r in catalog.rows)
    in_use = {r["id"] for r in catalog.rows if r["to_delete"] is None}
    snapshot = CatalogSnapshot(db)
    gone, backdated = ids[0], min(in_use)
    with closing(pg.connect("snapshot") if pg else sqlite3.connect(url.split(":///", 1)[1])) as writer:
        writer.execute(f"DELETE FROM parquet_file WHERE id = {gone}")
        writer.execute(f"UPDATE parquet_file SET to_delete = '2001-01-01T00:00:00+00:00' WHERE id = {backdated}")
        writer.commit()
    cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=48)
    read = [row[0] for rows in snapshot.db.rows_in_range(ids[0], ids[-1] + 1) for row in rows]
    assert sorted(read) == ids and len(db.rows_in_use(kinds, cutoff, ids[-1])) < len(
        snapshot.db.rows_in_use(kinds, cutoff, ids[-1])
    )
    assert snapshot.db.state(kinds, snapshot.at, cutoff)[0].rows == len(ids)
    held = snapshot.holder
    if pg:  # psycopg's close does not wait for the server: its backend may not have ended the transaction yet
        snapshot.holder = SimpleNamespace(rollback=held.rollback, close=lambda: None)
    snapshot.close()
    with pytest.raises(CatalogError):
        list(snapshot.db.rows_in_range(ids[0], ids[-1] + 1))
    if pg:
        held.close()


def test_soft_deletes_in_the_future_and_objects_ahead_of_the_database_are_refused(spark, tmp_path):
    _, url = _sqlite(tmp_path)
    repo = _config(catalog_entry("iox", f"file://{tmp_path}", url))
    future = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)).isoformat()
    _execute(url, "UPDATE parquet_file SET to_delete = ? WHERE id = (SELECT min(id) FROM parquet_file)", (future,))
    with pytest.raises(SourceError, match="soft-deleted in the future of the database's clock"):
        source_for(repo).rows(spark)
    inventory = spark.createDataFrame(
        [("a.parquet", 1, dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2), None)],
        "address string, size long, last_modified timestamp, etag string",
    )
    with pytest.raises(SourceError, match="modified after the database's clock"):
        source_for(repo).check_inventory(spark, inventory)
    source_for(repo).check_inventory(spark, inventory.limit(0))


def test_a_catalog_of_a_set_whose_objects_are_ahead_of_its_database_is_refused_alone(spark, tmp_path):
    """In a set's mark each catalog's listing is checked against its own database's clock, and
    each catalog's state counters are columns of its own retained rows."""
    (tmp_path / "other").mkdir()
    catalogs = {"iox": _sqlite(tmp_path, rows=40), "other": _sqlite(tmp_path / "other", rows=30, seed=6)}
    repos = [_config(catalog_entry(name, f"file://{tmp_path / name}", url)) for name, (_, url) in catalogs.items()]
    now = dt.datetime.now(dt.timezone.utc)
    marked = connectors.mark_tables(spark, repos, now)
    listed = [("iox", "a.parquet", 1, now + dt.timedelta(hours=2), None), ("other", "b.parquet", 1, now, None)]
    inventory = spark.createDataFrame(
        listed, "repo string, address string, size long, last_modified timestamp, etag string"
    )

    refused = marked.inventory_refusals(spark, inventory)

    assert set(refused) == {"iox"} and "modified after the database's clock" in refused["iox"]
    for repo in repos:
        counters = source_for(repo).state_columns()
        (row,) = marked.retained.filter(F.col("repo") == repo.name).collect()
        assert marked.counters(repo.name) == counters == {name: row[name] for name in counters}
        assert counters["rows"] == len(catalogs[repo.name][0].rows)


def test_integer_soft_delete_times_must_be_nanoseconds(spark, tmp_path):
    url = f"sqlite:///{tmp_path}/ns.db"
    _execute(
        url,
        "CREATE TABLE parquet_file (id INTEGER PRIMARY KEY, namespace_id INT, table_id INT, partition_id INT, "
        "object_store_id TEXT, to_delete INTEGER, created_at INTEGER)",
    )
    now_ns = int(dt.datetime.now(dt.timezone.utc).timestamp()) * 10**9
    _execute(url, "INSERT INTO parquet_file VALUES (1, 1, 1, 1, 'a', ?, ?)", (now_ns - 3 * 86_400 * 10**9, now_ns))
    repo = _config(catalog_entry("iox", f"file://{tmp_path}", url))
    source = source_for(repo)
    commits, _ = source.commit_graph(spark)
    assert source.state_columns() == {"rows": 1, "soft_deleted": 1, "past_row_cutoff": 1}
    assert (
        source.live_entries(
            spark,
            spark.createDataFrame([(commits[0].commit_id,)], "commit_id string"),
            spark.createDataFrame([], "commit_id string"),
        ).count()
        == 0
    )
    _execute(url, "UPDATE parquet_file SET to_delete = ?", (1_700_000_000,))  # seconds, not nanoseconds
    with pytest.raises(Exception, match="before 2000 as nanoseconds"):
        source_for(repo).rows(spark).count()


def test_paths_outside_the_namespace_are_refused_unless_external(spark, tmp_path):
    _, url = _sqlite(tmp_path, rows=10)
    _execute(url, "UPDATE parquet_file SET object_store_id = 'x' WHERE id = 3")
    for template, external, refused in [
        ("s3://elsewhere/{namespace_id}/{object_store_id}.parquet", (), True),
        ("s3://elsewhere/{namespace_id}/{object_store_id}.parquet", ("s3://elsewhere/",), False),
        ("../{namespace_id}/{object_store_id}.parquet", (), True),
    ]:
        repo_dict = catalog_entry("iox", f"file://{tmp_path}/ns", url, external_prefixes=list(external))
        repo_dict["catalog"] = {**repo_dict["catalog"], "path": template}
        repo = _config(repo_dict)
        source = source_for(repo)
        commits, _ = source.commit_graph(spark)
        retained = spark.createDataFrame([(commits[0].commit_id,)], "commit_id string")
        keyed = with_relative_keys(
            source.live_entries(spark, retained, retained), repo.storage_namespace, repo.external_prefixes
        )
        if refused:
            with pytest.raises(SourceError, match="outside the storage namespace"):
                refuse_unlisted_outside(spark, source, repo, keyed, retained)
        else:
            refuse_unlisted_outside(spark, source, repo, keyed, retained)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_witness_reads_the_rows_in_use_through_its_own_path(database, spark, tmp_path, request):
    now = dt.datetime.now(dt.timezone.utc)
    catalog = random_catalog(9, 120, now)
    if database == "postgres":
        url = postgres_catalog(request.getfixturevalue("postgres"), "witness", catalog)
    else:
        url = sqlite_catalog(tmp_path / "catalog.db", catalog)
    source = source_for(_config(catalog_entry("iox", f"file://{tmp_path}", url)))
    commits, _ = source.commit_graph(spark)
    head = commits[0].commit_id
    cutoff = source.row_cutoff_of(head)
    witnessed = {r["address"] for r in source.witness_heads(spark, [head]).collect()}
    expected = oracle(catalog.rows, {}, cutoff, now).live
    assert witnessed == expected
    retained = spark.createDataFrame([(head,)], "commit_id string")
    live = {r["address"] for r in source.live_entries(spark, retained, retained).collect()}
    assert live == expected and source.state_columns()["past_row_cutoff"] == len(catalog.rows) - len(
        [r for r in catalog.rows if r["id"] not in oracle(catalog.rows, {}, cutoff, now).removed_rows]
    )


@pytest.mark.parametrize("in_a_set", [False, True], ids=["alone", "in_a_set"])
def test_a_soft_delete_reverted_or_a_row_added_during_the_sweep_is_never_lost(spark, tmp_path, monkeypatch, in_a_set):
    """A row past the cutoff is revived just before its chunk's DELETE, and a new row names another
    candidate just after the rows were swept: both rows stay, both objects stay; alone, and swept
    in one set with another catalog by `run --all`."""
    catalog = random_catalog(41, 200, dt.datetime.now(dt.timezone.utc))
    url = sqlite_catalog(tmp_path / "catalog.db", catalog)
    root = tmp_path / "iox"
    root.mkdir()
    repos = [catalog_entry("iox", f"file://{root}", url)]
    if in_a_set:
        other = random_catalog(43, 40, dt.datetime.now(dt.timezone.utc))
        (tmp_path / "other").mkdir()
        repos.append(
            catalog_entry(
                "other",
                f"file://{tmp_path / 'other' / 'iox'}",
                sqlite_catalog(tmp_path / "other" / "catalog.db", other),
            )
        )
        write_objects(tmp_path / "other" / "iox", other, dt.timedelta(0))  # its objects: old, whatever the cutoff
    write_objects(root, catalog, OBJECT_CUTOFF)
    as_of = dt.datetime.now(dt.timezone.utc)
    config = write_config(tmp_path / "gc.yaml", repos, tmp_path / "state")
    rows_before, listing = table_rows(url), _local_listing(root)
    expected = oracle(catalog.rows, listing, as_of - dt.timedelta(hours=48), as_of - OBJECT_CUTOFF)
    by_key = {PATH.format_map(r): r["id"] for r in catalog.rows}
    revived_row = next(
        by_key[k] for k in sorted(expected.candidates) if k in by_key and by_key[k] in expected.removed_rows
    )
    revived_key = next(k for k, i in by_key.items() if i == revived_row)
    named_later = next(k for k in sorted(expected.candidates) if k not in by_key)
    original_delete, original_named = CatalogDatabase.delete_rows, catalog_rows.still_named

    def delete_after_a_revert(self, ids, kinds, cutoff, keep=None):
        if revived_row in ids:
            _execute(url, "UPDATE parquet_file SET to_delete = NULL WHERE id = ?", (revived_row,))
        return original_delete(self, ids, kinds, cutoff, keep)

    def named_then_a_new_row(spark_, repos, candidates):
        found, stopped = original_named(spark_, repos, candidates)
        if "iox" not in repos:
            return found, stopped
        found.cache().count()
        namespace_id, table_id, partition_id, name = named_later.removesuffix(".parquet").split("/")
        _execute(
            url,
            "INSERT INTO parquet_file VALUES (999999, ?, ?, ?, ?, NULL, NULL)",
            (int(namespace_id), int(table_id), int(partition_id), name),
        )
        return found, stopped

    monkeypatch.setattr(CatalogDatabase, "delete_rows", delete_after_a_revert)
    monkeypatch.setattr(catalog_rows, "still_named", named_then_a_new_row)
    if in_a_set:
        done = run_cli_in_memory(
            "run", "--config", str(config), "--all", "--as-of", as_of.isoformat(), "--mode", "delete", "--json"
        )
        summaries = {
            s["repo"]: s for s in (json.loads(line) for line in done.stdout.splitlines() if line.startswith("{"))
        }
        assert done.returncode == 0 and len({s["run_id"] for s in summaries.values()}) == 1, done.stderr
        outputs = summaries["iox"]["outputs"]
    else:
        outcome = run_partition(
            str(config),
            "iox",
            partition_date_of(as_of),
            as_of=as_of,
            mode="delete",
            instance=DagsterInstance.ephemeral(),
        )
        assert outcome.success, outcome.error
        outputs = outcome.summary["outputs"]
    receipts = pq.read_table(outputs["deletion_receipts"]).to_pylist()
    actions = {(r["row_id"] if r["row_id"] is not None else r["address"]): r["action"] for r in receipts}
    assert actions[revived_row] == "row_skipped_revived"
    assert actions[revived_key] == "skipped_revived" and actions[named_later] == "skipped_revived"
    after = table_rows(url)
    assert revived_row in after and 999999 in after
    assert set(after) == (set(rows_before) - expected.removed_rows) | {revived_row, 999999}
    assert (root / revived_key).exists() and (root / named_later).exists()
    assert {k for k in _local_listing(root) if not k.startswith("_gc")} == set(listing) - (
        expected.candidates - {revived_key, named_later}
    )


def test_a_live_row_naming_a_missing_object_fails_live_objects_present(spark, tmp_path):
    catalog = random_catalog(43, 60, dt.datetime.now(dt.timezone.utc))
    url = sqlite_catalog(tmp_path / "catalog.db", catalog)
    root = tmp_path / "iox"
    root.mkdir()
    write_objects(root, catalog, OBJECT_CUTOFF)
    live = sorted(
        oracle(
            catalog.rows,
            {},
            dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=48),
            dt.datetime.now(dt.timezone.utc),
        ).live
    )
    (root / live[0]).unlink()
    as_of = dt.datetime.now(dt.timezone.utc)
    config = write_config(tmp_path / "gc.yaml", [catalog_entry("iox", f"file://{root}", url)], tmp_path / "state")
    instance = DagsterInstance.ephemeral()
    outcome = run_partition(str(config), "iox", partition_date_of(as_of), as_of=as_of, mode="delete", instance=instance)
    assert not outcome.success and outcome.summary["checks"]["live_objects_present"] == "failed"
    evaluations = instance.all_logs(outcome.summary["run_id"], of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    (failed,) = [
        e.get_dagster_event().event_specific_data
        for e in evaluations
        if not e.get_dagster_event().event_specific_data.passed
    ]
    assert failed.check_name == "live_objects_present" and live[0] in failed.description
    assert len(table_rows(url)) == len(catalog.rows)  # the blocked sweep deleted no row


def test_row_cleanup_interrupted_then_retried_keeps_every_receipt_and_every_trashed_row(spark, tmp_path, monkeypatch):
    """A step retry keeps its run id: the retry must neither overwrite the first try's trash
    journal of deleted rows (restore would lose them) nor forget their receipts."""
    catalog, url = _sqlite(tmp_path, rows=200, seed=7)
    root = tmp_path / "iox"
    root.mkdir()
    repo = _config(catalog_entry("iox", f"file://{root}", url))
    now = dt.datetime.now(dt.timezone.utc)
    cutoff = now - dt.timedelta(hours=48)
    removed = oracle(catalog.rows, {}, cutoff, now - OBJECT_CUTOFF).removed_rows
    rows_before = table_rows(url)
    assert len(removed) > 10
    monkeypatch.setattr(catalog_rows, "CHUNK_ROWS", 4)
    original, calls = CatalogDatabase.delete_rows, []

    def lost_at_the_third_chunk(self, ids, kinds, cutoff, keep=None):
        calls.append(ids)
        if len(calls) == 3:
            raise CatalogError("server closed the connection unexpectedly")
        return original(self, ids, kinds, cutoff, keep)

    monkeypatch.setattr(CatalogDatabase, "delete_rows", lost_at_the_third_chunk)
    journal = SweepJournal(spark, LocalState(tmp_path), "journal")
    cleanup = {"iox": catalog_rows.RowCleanup(repo, store_for(repo), Mode.TRASH, cutoff, journal)}
    _, stopped = catalog_rows.sweep_rows_together(spark, cleanup, "run-1", now)
    assert "catalog cleanup stopped at chunk 3" in str(stopped["iox"])
    assert len(table_rows(url)) == len(rows_before) - 8  # two chunks went before the connection was lost
    monkeypatch.setattr(CatalogDatabase, "delete_rows", original)
    swept, stopped = catalog_rows.sweep_rows_together(spark, cleanup, "run-1", now)
    receipts = swept.collect()
    assert not stopped
    assert sorted(r["row_id"] for r in receipts if r["action"] == "row_trashed") == sorted(removed)
    assert set(table_rows(url)) == set(rows_before) - removed
    back = catalog_rows.restore_rows(spark, repo, store_for(repo), "run-1", now)
    assert sorted(i for _, action, _, i in back if action == "row_restored") == sorted(removed)
    assert table_rows(url) == rows_before
