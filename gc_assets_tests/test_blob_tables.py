"""Delta and Iceberg tables on Azure and GCS emulators are collected like tables on disk: a
Delta table written locally and uploaded as is gives the same commit graph, live entries and
delta-rs witness from the emulator as from disk, and a delete run removes exactly what
delta-rs's vacuum of the twin names; an Iceberg table written to the emulator by pyiceberg
loses exactly what pyiceberg says no retained snapshot needs. Both stay readable after."""

from __future__ import annotations

import datetime as dt
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from gc_assets.core.config import RepositoryConfig, Rules, load_config
from gc_assets.core.state import TRASH_PREFIX
from gc_assets.core.time import partition_date_of
from gc_assets.runner import run_partition, run_partitions
from gc_assets.sources import source_for
from gc_assets.sources.delta import DeltaSource, blob_storage_options
from gc_assets.stores import store_for
from gc_assets.stores.settings import StoreSettings
from gc_assets_tests import delta_tables, iceberg_tables
from gc_assets_tests.blob_servers import azurite, fake_gcs  # noqa: F401 - the fixtures
from gc_assets_tests.lakes import write_config
from gc_assets_tests.oracles import oracle_key, retained_brute_force

DELTA_WINDOW_DAYS = 5  # shorter than the tables' default 7 days, so some removals expire


@pytest.fixture(params=["azurite", "fake_gcs"], scope="module")
def cloud(request):
    return request.getfixturevalue(request.param)


def _relative(rows) -> list:
    """Witness rows with absolute addresses made relative to the table root `.../table/`."""
    return sorted((commit, address.split("/table/", 1)[1]) for commit, address in rows)


def test_delta_table_on_the_emulator_reads_as_the_same_table_on_disk(cloud, spark, tmp_path):
    table = tmp_path / "table"
    write_deltalake(str(table), pa.table({"id": [1, 2], "part": ["a", "b"]}), partition_by=["part"])
    write_deltalake(str(table), pa.table({"id": [3], "part": ["a"]}), mode="append")
    write_deltalake(str(table), pa.table({"id": [4], "part": ["c"]}), mode="overwrite", partition_by=["part"])
    DeltaTable(str(table)).create_checkpoint()
    (table / "_delta_log" / "_last_checkpoint").unlink()  # Spark's text source skips '_' files locally
    write_deltalake(str(table), pa.table({"id": [5], "part": ["c"]}), mode="append")
    cloud.create("delta")
    cloud.upload_tree(table, "delta", "table")
    namespace = cloud.namespace("delta", "table")
    repo = RepositoryConfig(name="delta", format="delta", storage_namespace=namespace)
    remote, local = source_for(repo), DeltaSource(table.as_uri())
    assert isinstance(remote, DeltaSource)
    remote_commits, remote_refs = remote.commit_graph(spark)
    local_commits, local_refs = local.commit_graph(spark)
    assert [c.commit_id for c in remote_commits] == [c.commit_id for c in local_commits] and remote_refs == local_refs
    retained = spark.createDataFrame([(c.commit_id,) for c in local_commits], "commit_id string")
    heads = spark.createDataFrame([(r.commit_id,) for r in local_refs], "commit_id string")
    assert sorted(remote.live_entries(spark, retained, heads).collect()) == sorted(
        local.live_entries(spark, retained, heads).collect()
    )
    head_ids = [r.commit_id for r in local_refs]
    witnessed = [(r["commit_id"], r["address"]) for r in remote.witness_heads(spark, head_ids).collect()]
    twin = [(r["commit_id"], r["address"]) for r in local.witness_heads(spark, head_ids).collect()]
    assert witnessed and _relative(witnessed) == _relative(twin)
    assert all(a.startswith(namespace + "/") for _, a in witnessed)
    listed = {r["address"] for r in store_for(repo).list(spark).collect()}
    assert listed == {p.relative_to(table).as_posix() for p in table.rglob("*") if p.is_file()}


def _collect(config, name: str, as_of: dt.datetime):
    outcome = run_partition(
        str(config), name, partition_date_of(as_of), as_of=as_of, mode="delete", instance=DagsterInstance.ephemeral()
    )
    assert outcome.success, outcome.error
    assert set(outcome.summary["checks"].values()) == {"passed"}  # the delta-rs / pyiceberg witness among them
    return outcome


def _after_uploads() -> dt.datetime:
    """A moment after every upload: storage times are whole seconds, objects younger than as_of are ageless."""
    time.sleep(1.1)
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def test_delta_table_on_the_emulator_is_collected_like_its_twin_and_stays_readable(cloud, spark, tmp_path):
    """delta-rs's full vacuum of the table on disk names the candidates; a delete run against the
    uploaded copy removes exactly those, and delta-rs then reads every version inside the window
    from the emulator as before. The partition values need escaping (`a=b%c`, `100%`, `é ü`)."""
    window = dt.timedelta(days=DELTA_WINDOW_DAYS)
    table = delta_tables.awkward_partitions(tmp_path / "lake", delta_tables.now_utc())
    expected = delta_tables.vacuum_candidates(table, window)
    history = DeltaTable(table.path).history()
    threshold_ms = (delta_tables.now_utc() - window).timestamp() * 1000
    inside = [h["version"] for h in history if h["timestamp"] > threshold_ms]
    assert expected and inside

    cloud.create("delta-gc")
    uploaded = cloud.upload_tree(table.path, "delta-gc", "t")
    namespace = cloud.namespace("delta-gc", "t")
    options = blob_storage_options(namespace, StoreSettings())
    rows_before = {v: _delta_rows(namespace, v, options) for v in inside}
    repo = {
        "name": "delta-on-cloud",
        "format": "delta",
        "storage_namespace": namespace,
        "rules": {"default_retention_days": DELTA_WINDOW_DAYS},
        "allow_unsafe_retention": True,
        "min_object_age_hours": 0,
        "allow_unsafe_min_age": True,
        "max_delete_fraction": 0.9,
    }
    config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")
    outcome = _collect(config, "delta-on-cloud", _after_uploads())
    receipts = pq.read_table(outcome.summary["outputs"]["deletion_receipts"]).to_pylist()
    assert {r["address"] for r in receipts} == expected
    assert [(r["address"], r["action"], r["error"]) for r in receipts if r["action"] != "deleted"] == []
    assert outcome.summary["receipts"] == {"deleted": len(expected)}
    assert {k for k in cloud.keys("delta-gc") if not k.startswith("t/_gc")} == uploaded - {
        f"t/{key}" for key in expected
    }
    assert {v: _delta_rows(namespace, v, options) for v in inside} == rows_before


def test_delta_tables_on_the_emulator_are_collected_together_one_trashed_one_deleted(cloud, spark, tmp_path):
    """Delta tables on Azure or GCS are collected as one set (sweep.together): one fleet_job run
    marks, lists and judges both, and sweeps each in its own mode beside the other (stores.many
    through the store's BlobReader). The deleted table loses exactly delta-rs's candidates, the
    trashed one holds them in its run's trash, and delta-rs reads every version inside the
    window of both from the emulator as before."""
    window, now = dt.timedelta(days=DELTA_WINDOW_DAYS), delta_tables.now_utc()
    built = {
        "deleted": delta_tables.merges(tmp_path / "lake", now),
        "trashed": delta_tables.appends_and_overwrites(tmp_path / "lake", now),
    }
    container, threshold_ms = "delta-set", (now - window).timestamp() * 1000
    cloud.create(container)
    repos, expected, uploaded, readable = [], {}, {}, {}
    for name, table in built.items():
        expected[name] = delta_tables.vacuum_candidates(table, window)
        uploaded[name] = {key.removeprefix(f"{name}/") for key in cloud.upload_tree(table.path, container, name)}
        namespace = cloud.namespace(container, name)
        inside = [h["version"] for h in DeltaTable(table.path).history() if h["timestamp"] > threshold_ms]
        options = blob_storage_options(namespace, StoreSettings())
        readable[name] = (namespace, options, {v: _delta_rows(namespace, v, options) for v in inside})
        repos.append(
            {
                "name": name,
                "format": "delta",
                "storage_namespace": namespace,
                "mode": {"deleted": "delete", "trashed": "trash"}[name],
                "rules": {"default_retention_days": DELTA_WINDOW_DAYS},
                "allow_unsafe_retention": True,
                "min_object_age_hours": 0,
                "allow_unsafe_min_age": True,
                "max_delete_fraction": 0.9,
            }
        )
    assert all(expected.values()) and all(inside for _, _, inside in readable.values())
    config = load_config(write_config(tmp_path / "gc.yaml", repos, tmp_path / "state"))
    as_of, instance = _after_uploads(), DagsterInstance.ephemeral()

    outcomes = {
        o.summary["repo"]: o
        for o in run_partitions(config, list(built), partition_date_of(as_of), as_of, None, instance)
    }

    (run,) = instance.get_runs()
    assert run.job_name == "fleet_job", "both tables in one run"
    for name in built:
        summary = outcomes[name].summary
        assert outcomes[name].success and summary["run_id"] == run.run_id, outcomes[name].error
        assert set(summary["checks"].values()) == {"passed"}, summary["checks"]
        assert summary["receipts"] == {name: len(expected[name])}, summary
        left = {key.removeprefix(f"{name}/") for key in cloud.keys(container, f"{name}/")}
        trash = {key for key in left if key.startswith(f"{TRASH_PREFIX}/")}
        assert {key for key in left - trash if not key.startswith("_gc")} == uploaded[name] - expected[name], name
        assert trash == ({f"{TRASH_PREFIX}/{run.run_id}/{a}" for a in expected[name]} if name == "trashed" else set())
        namespace, options, before = readable[name]
        assert {v: _delta_rows(namespace, v, options) for v in before} == before, name


def _delta_rows(uri: str, version: int, options: dict[str, str]) -> list[tuple]:
    """Every row of `version` as delta-rs reads it from the store: fails if a file it needs is gone."""
    result = (
        QueryBuilder()
        .register("t", DeltaTable(uri, version=version, storage_options=options))
        .execute("select * from t")
    )
    return sorted((tuple(row.values()) for row in pa.table(result.read_all()).to_pylist()), key=repr)


def test_iceberg_table_on_the_emulator_is_collected_and_every_retained_snapshot_stays_readable(cloud, spark, tmp_path):
    """A table pyiceberg writes straight to the emulator (with the FileIO properties the source
    uses), with snapshots ten days old and new, an overwrite and an orphan. pyiceberg alone names
    what the retained snapshots need; a delete run expires the others through the catalog,
    removes everything else that is not hidden, and every retained snapshot reads as before.
    On Azure this needs the source's FileIO: pyiceberg 0.12's own names no container (see
    gc_assets.sources.iceberg_io)."""
    from pyiceberg.catalog.sql import SqlCatalog

    from gc_assets.sources.iceberg import blob_io_properties

    cloud.create("iceberg")
    namespace = cloud.namespace("iceberg", "table")
    catalog = SqlCatalog(
        "c",
        uri=f"sqlite:///{tmp_path}/catalog.db",
        warehouse=namespace,
        **blob_io_properties(namespace, StoreSettings()),
    )
    catalog.create_namespace("ns")
    now = dt.datetime.now(dt.timezone.utc)
    table = catalog.create_table("ns.t", iceberg_tables.SCHEMA, location=namespace)
    for days_ago, ids in ((10, [1, 2]), (9, [3]), (8, [4, 5])):
        with iceberg_tables.clock_at(now - dt.timedelta(days=days_ago)):
            table.append(iceberg_tables.rows(ids))
    with iceberg_tables.clock_at(now - dt.timedelta(days=7)):
        table.overwrite(iceberg_tables.rows([6]))
    with iceberg_tables.clock_at(now - dt.timedelta(hours=1)):
        table.append(iceberg_tables.rows([7]))
    cloud.put("iceberg", "table/data/orphan.parquet", b"not referenced")
    as_of = _after_uploads()

    table = catalog.load_table("ns.t")
    rules = {"default_retention_days": 3}
    commits, refs = iceberg_tables.graph_from_metadata(table)
    retained = set(retained_brute_force(commits, refs, Rules.model_validate(rules), as_of))
    assert retained < {c.commit_id for c in commits}
    live = {oracle_key(uri, namespace) for uri in iceberg_tables.expected_live_uris(table, retained)}
    before = {k.removeprefix("table/") for k in cloud.keys("iceberg", "table/")}
    expected = {key for key in before - live if not iceberg_tables.is_hidden(key)}
    assert "data/orphan.parquet" in expected and len(expected) > 1
    readable_before = {s: table.scan(snapshot_id=int(s)).to_arrow().sort_by("id") for s in retained}

    repo = {
        "name": "iceberg-on-cloud",
        "format": "iceberg",
        "storage_namespace": namespace,
        "catalog": {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "name": "c", "table": "ns.t"},
        "rules": rules,
        "min_object_age_hours": 0,
        "untracked_min_age_hours": 0,  # the orphan was written a second ago
        "allow_unsafe_min_age": True,
        "max_delete_fraction": 0.9,
    }
    config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")
    outcome = _collect(config, "iceberg-on-cloud", as_of)
    receipts = pq.read_table(outcome.summary["outputs"]["deletion_receipts"]).to_pylist()
    assert {r["address"] for r in receipts} == expected
    assert outcome.summary["receipts"] == {"deleted": len(expected)}
    after = {k.removeprefix("table/") for k in cloud.keys("iceberg", "table/") if not k.startswith("table/_gc")}
    (expiry,) = after - (before - expected)  # the metadata.json of the catalog commit expiring the snapshots
    assert after - {expiry} == before - expected and expiry.endswith(".metadata.json"), expiry
    table = catalog.load_table("ns.t")
    assert {str(s.snapshot_id) for s in table.snapshots()} == retained
    assert {s: table.scan(snapshot_id=int(s)).to_arrow().sort_by("id") for s in retained} == readable_before
