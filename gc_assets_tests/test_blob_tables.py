"""Delta and Iceberg tables on Azure and GCS emulators read like their local twins: a table
written locally, uploaded as is, gives the same commit graph, the same live entries and the
same independent witness (delta-rs, pyiceberg) from the emulator as from disk, and the store
lists exactly its files."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from gc_assets.core.config import RepositoryConfig
from gc_assets.core.uris import classify_address
from gc_assets.sources import SourceError, source_for
from gc_assets.sources.delta import DeltaSource
from gc_assets.stores import store_for
from gc_assets_tests.blob_servers import azurite, fake_gcs  # noqa: F401 - the fixtures


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
    assert sorted(remote.live_entries(spark, retained, heads).collect()) == sorted(local.live_entries(spark, retained, heads).collect())
    head_ids = [r.commit_id for r in local_refs]
    witnessed = [(r["commit_id"], r["address"]) for r in remote.witness_heads(spark, head_ids).collect()]
    twin = [(r["commit_id"], r["address"]) for r in local.witness_heads(spark, head_ids).collect()]
    assert witnessed and _relative(witnessed) == _relative(twin)
    assert all(a.startswith(namespace + "/") for _, a in witnessed)
    listed = {r["address"] for r in store_for(repo).list(spark).collect()}
    assert listed == {p.relative_to(table).as_posix() for p in table.rglob("*") if p.is_file()}


def test_iceberg_table_on_the_emulator_is_read_through_pyiceberg_and_the_store(cloud, spark, tmp_path):
    """A table pyiceberg writes straight to the emulator (with the FileIO properties the source
    uses): every file it wrote is live, an orphan is not, and the witness agrees. On Azure this
    needs the source's FileIO: pyiceberg 0.12's own names no container (see iceberg_io)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    from gc_assets.sources.iceberg import IcebergSource, blob_io_properties
    from gc_assets.stores.endpoints import StoreSettings

    cloud.create("iceberg")
    namespace = cloud.namespace("iceberg", "table")
    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=namespace, **blob_io_properties(namespace, StoreSettings()))
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", Schema(NestedField(1, "id", LongType(), required=False)), location=namespace)
    for ids in ([1, 2], [3], [4, 5]):
        table.append(pa.table({"id": pa.array(ids, pa.int64())}))
    table.overwrite(pa.table({"id": pa.array([6], pa.int64())}))
    cloud.put("iceberg", "table/data/orphan.parquet", b"not referenced")
    repo = RepositoryConfig(name="ice", format="iceberg", storage_namespace=namespace, source=namespace)
    source = source_for(repo)
    assert isinstance(source, IcebergSource)
    commits, refs = source.commit_graph(spark)
    assert len(commits) == len(table.metadata.snapshots) and [r.name for r in refs] == ["main"]
    retained = spark.createDataFrame([(c.commit_id,) for c in commits], "commit_id string")
    heads = spark.createDataFrame([(r.commit_id,) for r in refs], "commit_id string")
    live = {classify_address(r["address"], namespace) for r in source.live_entries(spark, retained, heads).collect()}
    listed = {r["address"] for r in store_for(repo).list(spark).collect()}
    assert listed - live == {"data/orphan.parquet"}  # everything pyiceberg wrote is live
    witnessed = {r["address"] for r in source.witness_heads(spark, [r.commit_id for r in refs]).collect()}
    assert witnessed and {classify_address(a, namespace) for a in witnessed} <= live
