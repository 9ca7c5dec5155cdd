"""A corpus of real Iceberg tables, written by pyiceberg through a SQLite catalog.

Snapshot timestamps come from a controlled clock (pyiceberg stamps snapshots with
`time.time()`), one day apart, so retention rules in days have something to bite
on. pyiceberg writes copy-on-write deletes only; position and equality delete files
are committed here with pyiceberg's own manifest and manifest-list writers (a
manifest writer whose content is DELETES), exactly as a merge-on-read engine would.
Every file's modification time is set to before the first snapshot, so age never
hides a candidate.
"""

from __future__ import annotations

import datetime as dt
import os
import struct
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestWriterV2,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.statistics import PartitionStatisticsFile, StatisticsFile
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    SetPartitionStatisticsUpdate,
    SetSnapshotRefUpdate,
)
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from gc_assets.core.retention import Commit, Ref
from gc_assets.sources.iceberg import IcebergPolicy

FIRST_DAY = dt.datetime(2024, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
GC_DATE = dt.date(2024, 3, 10)
FILE_MTIME = (FIRST_DAY - dt.timedelta(days=2)).timestamp()
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
)
ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string())])


def day(n: float) -> dt.datetime:
    return FIRST_DAY + dt.timedelta(days=n)


@contextmanager
def clock_at(moment: dt.datetime) -> Iterator[None]:
    """Snapshots committed inside are stamped `moment` (pyiceberg reads time.time())."""
    fake = mock.Mock()
    fake.time.return_value = moment.timestamp()
    with mock.patch("pyiceberg.table.snapshots.time", fake):
        yield


@dataclass
class IcebergLake:
    """One table on disk: its namespace directory, its catalog and the gc.yaml entry pointing at it."""

    name: str
    namespace: Path
    catalog: SqlCatalog
    identifier: str
    catalog_uri: str
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def namespace_uri(self) -> str:
        return self.namespace.as_uri()

    def table(self) -> Table:
        return self.catalog.load_table(self.identifier)

    def files(self) -> set[str]:
        return {str(p.relative_to(self.namespace)) for p in self.namespace.rglob("*") if p.is_file()}

    def repo_config(self, **options: Any) -> dict[str, Any]:
        return {
            "name": self.name,
            "format": "iceberg",
            "storage_namespace": self.namespace_uri,
            "catalog": {"type": "sql", "uri": self.catalog_uri, "name": "corpus", "table": self.identifier},
            **options,
        }

    def age_files(self) -> None:
        for path in self.namespace.rglob("*"):
            if path.is_file():
                os.utime(path, (FILE_MTIME, FILE_MTIME))


def new_lake(
    root: Path,
    name: str,
    partitioned: bool = False,
    properties: Optional[dict[str, str]] = None,
    catalog_uri: Optional[str] = None,
) -> IcebergLake:
    """A table at `root`/lake/`name`, in a SQLite catalog of its own unless `catalog_uri` names one."""
    catalog_dir = root / "catalogs"
    catalog_dir.mkdir(parents=True, exist_ok=True)
    catalog_uri = catalog_uri or f"sqlite:///{catalog_dir / name}.db"
    catalog = SqlCatalog("corpus", uri=catalog_uri, warehouse=(root / "warehouse").as_uri())
    catalog.create_namespace_if_not_exists("db")
    namespace = root / "lake" / name
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region")) if partitioned else PartitionSpec()
    catalog.create_table(
        f"db.{name}", schema=SCHEMA, location=namespace.as_uri(), partition_spec=spec, properties=properties or {}
    )
    return IcebergLake(name, namespace, catalog, f"db.{name}", catalog_uri)


def rows(ids: list[int], region: str = "eu") -> pa.Table:
    return pa.table({"id": ids, "region": [region] * len(ids)}, schema=ARROW_SCHEMA)


# ------------------------------------------------------------------ delete files


class _DeleteManifestWriter(ManifestWriterV2):
    """pyiceberg's v2 manifest writer, for a manifest of delete files."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def commit_delete_file(table: Table, delete_file: DataFile, branch: str = "main") -> Snapshot:
    """Commit a snapshot on `branch` that adds one delete file, as merge-on-read writers do."""
    metadata = table.metadata
    parent = metadata.snapshot_by_name(branch)
    assert parent is not None
    snapshot_id = metadata.new_snapshot_id()
    sequence_number = metadata.next_sequence_number()
    commit = uuid.uuid4()
    manifest_path = f"{metadata.location}/metadata/{commit}-m0.avro"
    with _DeleteManifestWriter(
        metadata.specs()[delete_file.spec_id],
        metadata.schema(),
        table.io.new_output(manifest_path),
        snapshot_id,
        "deflate",
    ) as writer:
        writer.add(
            ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, data_file=delete_file)
        )
    manifest_list = f"{metadata.location}/metadata/snap-{snapshot_id}-0-{commit}.avro"
    with write_manifest_list(
        2, table.io.new_output(manifest_list), snapshot_id, parent.snapshot_id, sequence_number, "deflate"
    ) as lister:
        lister.add_manifests(parent.manifests(table.io) + [writer.to_manifest_file()])
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id,
        sequence_number=sequence_number,
        manifest_list=manifest_list,
        summary=Summary(operation=Operation.DELETE),
        schema_id=metadata.current_schema_id,
    )
    with table.transaction() as transaction:
        transaction._apply(
            (
                AddSnapshotUpdate(snapshot=snapshot),
                SetSnapshotRefUpdate(
                    snapshot_id=snapshot_id,
                    parent_snapshot_id=parent.snapshot_id,
                    ref_name=branch,
                    type=SnapshotRefType.BRANCH,
                ),
            ),
            (AssertRefSnapshotId(snapshot_id=parent.snapshot_id, ref=branch),),
        )
    return snapshot


def _delete_data_file(
    table: Table, path: str, content: DataFileContent, records: int, partition: Record, **extra: Any
) -> DataFile:
    delete = DataFile.from_args(
        content=content,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=records,
        file_size_in_bytes=os.path.getsize(path.removeprefix("file://")),
        **extra,
    )
    delete.spec_id = table.metadata.default_spec_id
    return delete


def position_delete(table: Table, data_file: DataFile, positions: list[int], branch: str = "main") -> Snapshot:
    """Delete rows of `data_file` by position with a Parquet position-delete file."""
    path = f"{table.metadata.location}/data/pos-del-{uuid.uuid4()}.parquet"
    pq.write_table(
        pa.table(
            {"file_path": [data_file.file_path] * len(positions), "pos": positions},
            schema=pa.schema(
                [
                    pa.field("file_path", pa.string(), False, {b"PARQUET:field_id": b"2147483546"}),
                    pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": b"2147483545"}),
                ]
            ),
        ),
        path.removeprefix("file://"),
    )
    delete = _delete_data_file(table, path, DataFileContent.POSITION_DELETES, len(positions), data_file.partition)
    return commit_delete_file(table, delete, branch)


def equality_delete(table: Table, ids: list[int], branch: str) -> Snapshot:
    """Delete rows by `id` with a Parquet equality-delete file (pyiceberg cannot plan scans over these)."""
    path = f"{table.metadata.location}/data/eq-del-{uuid.uuid4()}.parquet"
    pq.write_table(
        pa.table({"id": ids}, schema=pa.schema([pa.field("id", pa.int64(), True, {b"PARQUET:field_id": b"1"})])),
        path.removeprefix("file://"),
    )
    delete = _delete_data_file(table, path, DataFileContent.EQUALITY_DELETES, len(ids), Record(), equality_ids=[1])
    return commit_delete_file(table, delete, branch)


# ------------------------------------------------------------------ statistics files


def _empty_puffin(path: str) -> int:
    """A valid Puffin file without blobs; returns the footer size."""
    footer = b'{"blobs":[],"properties":{}}'
    footer_block = b"PFA1" + footer + struct.pack("<i", len(footer)) + b"\x00\x00\x00\x00" + b"PFA1"
    with open(path.removeprefix("file://"), "wb") as handle:
        handle.write(b"PFA1" + footer_block)
    return len(footer_block)


def add_statistics(table: Table, snapshot_id: int) -> str:
    path = f"{table.metadata.location}/metadata/stats-{snapshot_id}-{uuid.uuid4()}.puffin"
    footer = _empty_puffin(path)
    size = os.path.getsize(path.removeprefix("file://"))
    with table.update_statistics() as update:
        update.set_statistics(
            StatisticsFile(
                snapshot_id=snapshot_id,
                statistics_path=path,
                file_size_in_bytes=size,
                file_footer_size_in_bytes=footer,
                blob_metadata=[],
            )
        )
    return path


def add_partition_statistics(table: Table, snapshot_id: int) -> str:
    path = f"{table.metadata.location}/metadata/partition-stats-{snapshot_id}-{uuid.uuid4()}.parquet"
    pq.write_table(pa.table({"partition": ["eu"], "data_record_count": [1]}), path.removeprefix("file://"))
    statistics = PartitionStatisticsFile(
        snapshot_id=snapshot_id, statistics_path=path, file_size_in_bytes=os.path.getsize(path.removeprefix("file://"))
    )
    with table.transaction() as transaction:
        transaction._apply((SetPartitionStatisticsUpdate(partition_statistics=statistics),))
    return path


# ------------------------------------------------------------------ the corpus


def evolving_table(root: Path) -> IcebergLake:
    """main only, partitioned: appends, an overwrite, a copy-on-write delete, schema evolution, position deletes."""
    lake = new_lake(root, "evolving", partitioned=True)
    table = lake.table()
    with clock_at(day(1)):
        table.append(pa.concat_tables([rows([1, 2, 3], "eu"), rows([4, 5], "us")]))
    with clock_at(day(2)):
        table.append(rows([6, 7], "ap"))
    with clock_at(day(3)):
        table.overwrite(rows([10, 11], "eu"), overwrite_filter="region == 'eu'")
    with clock_at(day(4)):
        table.delete("id = 4")
    with table.update_schema() as update:
        update.add_column("note", StringType())
    with clock_at(day(5)):
        table.append(pa.table({"id": [20], "region": ["us"], "note": ["evolved"]}))
    target = next(f for f in _current_data_files(table) if "region=ap" in f.file_path)
    with clock_at(day(6)):
        position_delete(table, target, [0])
    with clock_at(day(8)):
        table.append(pa.table({"id": [30], "region": ["ap"], "note": [None]}, schema=table.schema().as_arrow()))
    lake.age_files()
    return lake


def branching_table(root: Path) -> IcebergLake:
    """A branch written separately (with an equality delete), tags on old snapshots, a deleted branch,
    statistics and partition-statistics files."""
    lake = new_lake(root, "branching")
    table = lake.table()
    with clock_at(day(1)):
        table.append(rows([1, 2]))
    with clock_at(day(2)):
        table.append(rows([3]))
    first, second = (s.snapshot_id for s in table.metadata.snapshots)
    table.manage_snapshots().create_tag(first, "v1").create_tag(second, "v2").commit()
    table.manage_snapshots().create_branch(second, "dev").commit()
    with clock_at(day(3)):
        table.append(rows([100]), branch="dev")
    with clock_at(day(4)):
        table.delete("id = 1", branch="dev")
    with clock_at(day(5)):
        table.append(rows([4]))
    table.manage_snapshots().create_branch(table.metadata.current_snapshot_id, "feature").commit()
    with clock_at(day(6)):
        table.append(rows([500]), branch="feature")
        equality_delete(table, [2], branch="dev")
    lake.notes["feature_head"] = table.metadata.snapshot_by_name("feature").snapshot_id
    table.manage_snapshots().remove_branch("feature").commit()
    with clock_at(day(7)):
        table.overwrite(rows([5, 6]))
    table = lake.table()
    lake.notes["statistics"] = add_statistics(table, table.metadata.current_snapshot_id)
    lake.notes["partition_statistics"] = add_partition_statistics(lake.table(), first)
    lake.age_files()
    return lake


def maintained_table(root: Path) -> IcebergLake:
    """Snapshots expired with pyiceberg (metadata only), a short metadata log, and untracked junk files."""
    lake = new_lake(root, "maintained", properties={"write.metadata.previous-versions-max": "3"})
    table = lake.table()
    for n in range(1, 7):
        with clock_at(day(n)):
            table.append(rows([n]))
            if n == 4:
                table.overwrite(rows([40, 41]))
    snapshots = table.metadata.snapshots
    lake.notes["expired"] = [s.snapshot_id for s in snapshots[:2]]
    table.maintenance.expire_snapshots().by_ids(lake.notes["expired"]).commit()
    junk = [
        "data/junk-from-a-failed-write.parquet",
        "metadata/abandoned-m0.avro",
        "notes/readme.txt",
        "data/.part-0.parquet.crc",
        "_staging/tmp-0.parquet",
        "data/_region=x/kept.parquet",
    ]
    for key in junk:
        (lake.namespace / key).parent.mkdir(parents=True, exist_ok=True)
        (lake.namespace / key).write_bytes(b"junk")
    lake.notes["junk"] = junk
    lake.age_files()
    return lake


AGED_DAYS = (40, 30, 20, 10)


def aged_table(root: Path, as_of: dt.datetime, catalog_uri: Optional[str] = None) -> IcebergLake:
    """main's snapshots 40, 30, 20 and 10 days before `as_of`: appends of rows 1, 2 and 3 in a file
    each, then the delete of row 3 (so only the 20-day snapshot still reaches its file), and the
    tag `release` on the 30-day one. With 7-day rules the 40- and 20-day snapshots expire.
    notes: `snapshots` maps each age in days to its snapshot id."""
    lake = new_lake(root, "aged", catalog_uri=catalog_uri)
    for days, row in zip(AGED_DAYS, (1, 2, 3)):
        with clock_at(as_of - dt.timedelta(days=days)):
            lake.table().append(rows([row]))
    with clock_at(as_of - dt.timedelta(days=AGED_DAYS[-1])):
        lake.table().delete("id = 3")
    table = lake.table()
    snapshots = {days: s.snapshot_id for days, s in zip(AGED_DAYS, table.metadata.snapshots)}
    table.manage_snapshots().create_tag(snapshots[30], "release").commit()
    lake.notes["snapshots"] = snapshots
    lake.age_files()
    return lake


def outside_file_table(root: Path, outside_dir: Path) -> IcebergLake:
    """A table that references a data file outside its location, through add_files."""
    lake = new_lake(root, "importing")
    table = lake.table()
    outside_dir.mkdir(parents=True, exist_ok=True)
    outside = outside_dir / "imported.parquet"
    pq.write_table(rows([7, 8]), outside)
    with clock_at(day(1)):
        table.append(rows([1]))
    with clock_at(day(2)):
        table.add_files([str(outside)])
    lake.notes["outside"] = outside.as_uri()
    lake.age_files()
    return lake


def lending_tables(root: Path) -> tuple[IcebergLake, IcebergLake]:
    """Two tables, the second borrowing a file of the first with `add_files`: the lender added
    `data/shared.parquet` on day 1 and overwrote it on day 2; the borrower added it on day 3."""
    lender, borrower = new_lake(root, "lender"), new_lake(root, "borrower")
    shared = lender.namespace / "data" / "shared.parquet"
    shared.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows([1, 2]), shared)  # written without field ids, as add_files requires
    with clock_at(day(1)):
        lender.table().add_files([str(shared)])
    with clock_at(day(2)):
        lender.table().overwrite(rows([3]))
    with clock_at(day(3)):
        borrower.table().add_files([str(shared)])
    lender.notes["shared"] = "data/shared.parquet"
    lender.age_files()
    borrower.age_files()
    return lender, borrower


def _current_data_files(table: Table) -> list[DataFile]:
    return [task.file for task in table.scan().plan_files()]


# ------------------------------------------------------------------ independent oracles


def graph_from_metadata(table: Table) -> tuple[list[Commit], list[Ref]]:
    """The commit graph read straight from pyiceberg's metadata model, for the oracles."""
    snapshots = {s.snapshot_id: s for s in table.metadata.snapshots}
    commits = [
        Commit(
            str(s.snapshot_id),
            (str(s.parent_snapshot_id),) if s.parent_snapshot_id in snapshots else (),
            dt.datetime.fromtimestamp(s.timestamp_ms / 1000, dt.timezone.utc),
        )
        for s in snapshots.values()
    ]
    refs = [Ref(name, ref.snapshot_ref_type.value, str(ref.snapshot_id)) for name, ref in table.metadata.refs.items()]
    return commits, refs


def iceberg_retained_oracle(
    commits: list[Commit], refs: list[Ref], policy: IcebergPolicy, as_of: dt.datetime
) -> set[str]:
    """Iceberg's RemoveSnapshots read literally, per snapshot, plus "a ref keeps its own snapshot".

    A branch retains an ancestor when every snapshot from the head down to it is within
    min-snapshots-to-keep or not older than the branch's cutoff.
    """
    now = as_of.timestamp() * 1000
    by_id = {c.commit_id: c for c in commits}

    def ts(commit_id: str) -> float:
        return by_id[commit_id].created_at.timestamp() * 1000

    def ancestry(commit_id: str) -> list[str]:
        chain = [commit_id]
        while by_id[chain[-1]].parents:
            chain.append(by_id[chain[-1]].parents[0])
        return chain

    def setting(ref: Ref, name: str) -> Any:
        own = getattr(policy.ref(ref.name), name)
        return own if own is not None else getattr(policy, name)

    retained = {ref.commit_id for ref in refs}
    live_refs = [
        ref
        for ref in refs
        if ref.name == "main"
        or setting(ref, "max_ref_age_ms") is None
        or now - ts(ref.commit_id) <= setting(ref, "max_ref_age_ms")
    ]
    referenced: set[str] = set()
    for ref in live_refs:
        if ref.kind == "tag":
            referenced.add(ref.commit_id)
            continue
        chain = ancestry(ref.commit_id)
        referenced.update(chain)
        cutoff, keep = now - setting(ref, "max_snapshot_age_ms"), setting(ref, "min_snapshots_to_keep")
        for depth, commit_id in enumerate(chain):
            if all(j < keep or ts(chain[j]) >= cutoff for j in range(depth + 1)):
                retained.add(commit_id)
    retained.update(c for c in by_id if c not in referenced and ts(c) >= now - policy.max_snapshot_age_ms)
    return retained


def expected_live_uris(table: Table, retained: set[str]) -> set[str]:
    """Every URI the retained snapshots and the metadata need, snapshot by snapshot, from pyiceberg alone.

    Data and delete files come from scan planning where pyiceberg can plan (it refuses
    equality deletes) and from `inspect.files`, which must agree with planning.
    """
    metadata = table.metadata
    live = {table.metadata_location, *(entry.metadata_file for entry in metadata.metadata_log)}
    live |= {s.statistics_path for s in list(metadata.statistics) + list(metadata.partition_statistics)}
    for snapshot_id in retained:
        snapshot = metadata.snapshot_by_id(int(snapshot_id))
        assert snapshot is not None
        live.add(snapshot.manifest_list)
        live |= {manifest.manifest_path for manifest in snapshot.manifests(table.io)}
        files = table.inspect.files(snapshot_id=snapshot.snapshot_id).to_pylist()
        live |= {f["file_path"] for f in files}
        try:
            tasks = list(table.scan(snapshot_id=snapshot.snapshot_id).plan_files())
        except ValueError as error:  # equality deletes: pyiceberg cannot plan this snapshot
            assert "equality deletes" in str(error)
            assert any(f["content"] == DataFileContent.EQUALITY_DELETES for f in files)
            continue
        assert {t.file.file_path for t in tasks} == {
            f["file_path"] for f in files if f["content"] == DataFileContent.DATA
        }
        assert {d.file_path for t in tasks for d in t.delete_files} <= {f["file_path"] for f in files}
    return live


def is_hidden(key: str) -> bool:
    """Iceberg's orphan-file rule: a path segment starting with '.' or '_' hides it, unless it is `_name=value`."""
    return any(part.startswith(".") or (part.startswith("_") and "=" not in part) for part in key.split("/"))


def acknowledged_but_lost(catalog, table, requirements, updates) -> CommitTableResponse:
    """SqlCatalog.commit_table of a catalog that answers a commit as done and keeps nothing of it
    (a lost write): the metadata it answers with is the commit's, the catalog's stays as it was."""
    staged = catalog._update_and_stage_table(catalog.load_table(table.name()), table.name(), requirements, updates)
    return CommitTableResponse(metadata=staged.metadata, metadata_location=staged.metadata_location)
