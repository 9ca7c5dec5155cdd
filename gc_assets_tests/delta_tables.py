"""A corpus of real Delta tables written by the `deltalake` package, and an
independent pure-Python reading of their logs.

Each builder writes a table with one shape of history (appends, overwrites, deletes,
updates, merges, awkward partition values, compaction, checkpoints, CDC, junk), then
moves its history into the past: version k is dated `DAYS_PER_VERSION` days after
version k-1, the newest `NEWEST_AGE` ago, in the log (commit timestamps, add and
remove times) and in the files' modification times. Retention windows in whole days
then never fall within hours of a commit, so both GCs see the same side of every edge.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

DAYS_PER_VERSION = 3.0
NEWEST_AGE = dt.timedelta(hours=12)
DAY_MS = 86_400_000


@dataclass
class BuiltTable:
    name: str
    path: Path
    untracked: dict[str, float] = field(default_factory=dict)  # junk key -> mtime (epoch seconds)

    @property
    def uri(self) -> str:
        return self.path.as_uri()

    def files(self) -> set[str]:
        return {str(p.relative_to(self.path)) for p in self.path.rglob("*") if p.is_file()}


def _rows(start: int, count: int, parts: list[str] | None = None) -> pa.Table:
    values = list(range(start, start + count))
    columns: dict[str, list] = {"id": values, "value": [f"v{v}" for v in values]}
    if parts is not None:
        columns["part"] = [parts[i % len(parts)] for i in range(count)]
    return pa.table(columns)


def log_lines(path: Path) -> dict[int, list[dict]]:
    """Every JSON commit's actions, by version (plain json; independent of the connector)."""
    log = path / "_delta_log"
    result: dict[int, list[dict]] = {}
    for name in sorted(os.listdir(log)):
        if name.endswith(".json") and name[:20].isdigit() and len(name) == 25:
            result[int(name[:20])] = [
                json.loads(line) for line in (log / name).read_text().splitlines() if line.strip()
            ]
    return result


def shift_history(path: Path, now: dt.datetime) -> None:
    """Date version k at now - NEWEST_AGE - (head - k) * DAYS_PER_VERSION days, in the log and on disk."""
    commits = log_lines(path)
    head = max(commits)
    for version, actions in commits.items():
        stamp = now - NEWEST_AGE - dt.timedelta(days=(head - version) * DAYS_PER_VERSION)
        millis = int(stamp.timestamp() * 1000)
        touched: list[str] = []
        for action in actions:
            if "commitInfo" in action:
                action["commitInfo"]["timestamp"] = millis
            if "add" in action:
                action["add"]["modificationTime"] = millis
                touched.append(action["add"]["path"])
            if "cdc" in action:
                touched.append(action["cdc"]["path"])
            if "remove" in action:
                action["remove"]["deletionTimestamp"] = millis
        log_file = path / "_delta_log" / f"{version:020d}.json"
        log_file.write_text("".join(json.dumps(a) + "\n" for a in actions))
        for relative in touched + [str(log_file.relative_to(path))]:
            target = path / unquote(relative)
            if target.exists():
                os.utime(target, (millis / 1000, millis / 1000))


def _fresh(root: Path, name: str) -> Path:
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


# --------------------------------------------------------------------------- shapes


def appends_and_overwrites(root: Path, now: dt.datetime) -> BuiltTable:
    path = _fresh(root, "appends_and_overwrites")
    write_deltalake(path, _rows(0, 5))
    for i in range(1, 4):
        write_deltalake(path, _rows(i * 10, 3), mode="append")
    write_deltalake(path, _rows(100, 4), mode="overwrite")
    write_deltalake(path, _rows(200, 2), mode="append")
    write_deltalake(path, _rows(300, 2), mode="overwrite")
    write_deltalake(path, _rows(400, 2), mode="append")
    shift_history(path, now)
    return BuiltTable("appends_and_overwrites", path)


def deletes_and_updates(root: Path, now: dt.datetime) -> BuiltTable:
    path = _fresh(root, "deletes_and_updates")
    for i in range(4):
        write_deltalake(path, _rows(i * 10, 5), mode="append")
    table = DeltaTable(path)
    table.delete("id < 3")
    table.update(updates={"value": "'updated'"}, predicate="id >= 20 AND id < 23")
    table.delete("id = 31")
    table.update(updates={"value": "'again'"}, predicate="id = 0 OR id = 10")
    write_deltalake(path, _rows(50, 2), mode="append")
    shift_history(path, now)
    return BuiltTable("deletes_and_updates", path)


def merges(root: Path, now: dt.datetime) -> BuiltTable:
    path = _fresh(root, "merges")
    write_deltalake(path, _rows(0, 6))
    write_deltalake(path, _rows(6, 6), mode="append")
    for start in (3, 9, 0):
        source = pa.table({"id": list(range(start, start + 5)), "value": [f"m{start}"] * 5})
        (
            DeltaTable(path)
            .merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
    shift_history(path, now)
    return BuiltTable("merges", path)


AWKWARD_PARTITIONS = ["x y", "a=b%c", "é ü", "a+b", "100%", "tab\tend"]


def awkward_partitions(root: Path, now: dt.datetime) -> BuiltTable:
    path = _fresh(root, "awkward_partitions")
    write_deltalake(path, _rows(0, 12, AWKWARD_PARTITIONS), partition_by=["part"])
    write_deltalake(path, _rows(20, 6, AWKWARD_PARTITIONS), mode="append", partition_by=["part"])
    DeltaTable(path).delete("part = 'x y' OR part = 'a+b'")
    DeltaTable(path).update(updates={"value": "'u'"}, predicate="part = '100%'")
    write_deltalake(path, _rows(40, 6, AWKWARD_PARTITIONS[2:]), mode="overwrite", partition_by=["part"])
    write_deltalake(path, _rows(60, 6, AWKWARD_PARTITIONS), mode="append", partition_by=["part"])
    shift_history(path, now)
    return BuiltTable("awkward_partitions", path)


def compacted(root: Path, now: dt.datetime) -> BuiltTable:
    path = _fresh(root, "compacted")
    for i in range(6):
        write_deltalake(path, _rows(i * 10, 2), mode="append")
    DeltaTable(path).optimize.compact()
    for i in range(6, 9):
        write_deltalake(path, _rows(i * 10, 2), mode="append")
    DeltaTable(path).optimize.compact()
    shift_history(path, now)
    return BuiltTable("compacted", path)


def checkpointed(root: Path, now: dt.datetime) -> BuiltTable:
    """Checkpoints at two versions; the table keeps tombstones long enough for checkpoints to hold them."""
    path = _fresh(root, "checkpointed")
    config = {"delta.deletedFileRetentionDuration": "interval 1000 days"}
    write_deltalake(path, _rows(0, 4), configuration=config)
    for i in range(1, 4):
        write_deltalake(path, _rows(i * 10, 3), mode="append")
    DeltaTable(path).delete("id < 12")
    write_deltalake(path, _rows(50, 3), mode="overwrite")
    write_deltalake(path, _rows(60, 3), mode="append")
    DeltaTable(path).delete("id = 60")
    write_deltalake(path, _rows(70, 3), mode="append")
    shift_history(path, now)
    DeltaTable(path, version=4).create_checkpoint()
    DeltaTable(path).create_checkpoint()
    return BuiltTable("checkpointed", path)


def change_data_feed(root: Path, now: dt.datetime) -> BuiltTable:
    path = _fresh(root, "change_data_feed")
    write_deltalake(path, _rows(0, 8), configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(path, _rows(10, 4), mode="append")
    DeltaTable(path).update(updates={"value": "'c'"}, predicate="id < 3")
    DeltaTable(path).delete("id >= 10 AND id < 12")
    DeltaTable(path).update(updates={"value": "'d'"}, predicate="id = 5")
    write_deltalake(path, _rows(20, 2), mode="append")
    shift_history(path, now)
    return BuiltTable("change_data_feed", path)


def with_junk(root: Path, now: dt.datetime) -> BuiltTable:
    """A partitioned table with untracked files: old and new, visible and hidden, at any depth."""
    path = _fresh(root, "with_junk")
    write_deltalake(path, _rows(0, 6, ["a", "b"]), partition_by=["part"])
    write_deltalake(path, _rows(10, 6, ["a", "b"]), mode="append", partition_by=["part"])
    DeltaTable(path).delete("id < 2")
    write_deltalake(path, _rows(20, 2, ["c"]), mode="overwrite", partition_by=["part"])
    shift_history(path, now)
    ages_days = {
        "stray.parquet": 40.5,  # untracked, old
        "part=a/orphan-writer-crash.parquet": 8.5,
        "part=zz/left-over.parquet": 2.5,
        "fresh-upload.parquet": 0.1,  # untracked, young
        "_tmp/staging.parquet": 40.5,  # hidden directory
        ".hidden.parquet": 40.5,  # hidden file
        "part=a/_SUCCESS": 40.5,  # hidden name below a partition directory
        "part=a/.part-x.crc": 40.5,
        "_change_data/cdc-orphan.parquet": 40.5,  # _change_data is not hidden
        "_delta_index/index-orphan.bin": 40.5,  # nor is _delta_index
        "_delta_log/unknown-tool-file.txt": 40.5,  # _delta_log is protected
    }
    untracked: dict[str, float] = {}
    for key, age in ages_days.items():
        target = path / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"junk " + key.encode())
        mtime = (now - dt.timedelta(days=age)).timestamp()
        os.utime(target, (mtime, mtime))
        untracked[key] = mtime
    return BuiltTable("with_junk", path, untracked)


SHAPES: list[Callable[[Path, dt.datetime], BuiltTable]] = [
    appends_and_overwrites,
    deletes_and_updates,
    merges,
    awkward_partitions,
    compacted,
    checkpointed,
    change_data_feed,
    with_junk,
]


def declare_features(
    path: Path,
    protocol: dict,
    configuration: dict[str, str] | None = None,
    actions: list[dict] | None = None,
    fields: list[dict] | None = None,
) -> None:
    """Rewrite commit 0 as a writer of table features writes it (delta-rs writes few of them): its
    `protocol`, `configuration` and schema `fields` added to its metaData, and `actions` (such as
    domainMetadata) appended. The file keeps its modification time."""
    log_file = path / "_delta_log" / f"{0:020d}.json"
    stamp = log_file.stat().st_mtime
    written = log_lines(path)[0]
    for action in written:
        if "protocol" in action:
            action["protocol"] = protocol
        if "metaData" in action:
            metadata = action["metaData"]
            metadata["configuration"] = {**metadata.get("configuration", {}), **(configuration or {})}
            schema = json.loads(metadata["schemaString"])
            schema["fields"] += fields or []
            metadata["schemaString"] = json.dumps(schema)
    log_file.write_text("".join(json.dumps(a) + "\n" for a in written + (actions or [])))
    os.utime(log_file, (stamp, stamp))


def tag_optimized_files(path: Path, provider: str) -> None:
    """Name `provider` as the clusteringProvider of every file an OPTIMIZE commit adds, as a
    clustering implementation does."""
    for version, written in log_lines(path).items():
        if any(a.get("commitInfo", {}).get("operation") == "OPTIMIZE" for a in written):
            for action in written:
                if "add" in action:
                    action["add"]["clusteringProvider"] = provider
            log_file = path / "_delta_log" / f"{version:020d}.json"
            log_file.write_text("".join(json.dumps(a) + "\n" for a in written))


def _old_and_new_junk(path: Path, now: dt.datetime) -> dict[str, float]:
    """An untracked file older than every window and one younger than any: key -> mtime."""
    untracked: dict[str, float] = {}
    for key, age in {"stray-writer-crash.parquet": 40.5, "fresh-upload.parquet": 0.1}.items():
        (path / key).write_bytes(b"junk " + key.encode())
        mtime = (now - dt.timedelta(days=age)).timestamp()
        os.utime(path / key, (mtime, mtime))
        untracked[key] = mtime
    return untracked


def clustered(root: Path, now: dt.datetime) -> BuiltTable:
    """A liquid-clustered table as Delta on Spark writes one: writer features `clustering` and
    `domainMetadata`, the clustering columns in the `delta.clustering` domain, and OPTIMIZE's
    rewrites tagged with their clusteringProvider."""
    path = _fresh(root, "clustered")
    write_deltalake(path, _rows(0, 4))
    for i in range(1, 4):
        write_deltalake(path, _rows(i * 10, 3), mode="append")
    DeltaTable(path).optimize.z_order(["id"])
    DeltaTable(path).delete("id < 2")
    write_deltalake(path, _rows(50, 3), mode="append")
    DeltaTable(path).optimize.z_order(["id"])
    write_deltalake(path, _rows(60, 2), mode="append")
    declare_features(
        path,
        {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["clustering", "domainMetadata"]},
        actions=[
            {
                "domainMetadata": {
                    "domain": "delta.clustering",
                    "configuration": json.dumps({"clusteringColumns": [["id"]]}),
                    "removed": False,
                }
            }
        ],
    )
    tag_optimized_files(path, "liquid")
    shift_history(path, now)
    return BuiltTable("clustered", path, _old_and_new_junk(path, now))


def variant_shredded(root: Path, now: dt.datetime) -> BuiltTable:
    """A table with a variant column and variant shredding enabled (reader and writer features
    `variantType` and `variantShredding-preview`), with updates, deletes and an overwrite."""
    path = _fresh(root, "variant_shredded")
    write_deltalake(path, _rows(0, 6))
    write_deltalake(path, _rows(10, 4), mode="append")
    DeltaTable(path).update(updates={"value": "'u'"}, predicate="id < 3")
    DeltaTable(path).delete("id >= 10 AND id < 12")
    write_deltalake(path, _rows(20, 3), mode="overwrite")
    write_deltalake(path, _rows(30, 2), mode="append")
    DeltaTable(path).delete("id = 30")
    features = ["variantType", "variantShredding-preview"]
    declare_features(
        path,
        {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": features, "writerFeatures": features},
        configuration={"delta.enableVariantShredding": "true"},
        fields=[{"name": "payload", "type": "variant", "nullable": True, "metadata": {}}],
    )
    shift_history(path, now)
    return BuiltTable("variant_shredded", path, _old_and_new_junk(path, now))


# Tables whose protocol names table features delta-rs does not write itself.
FEATURE_SHAPES: list[Callable[[Path, dt.datetime], BuiltTable]] = [clustered, variant_shredded]


def shallow_clone(source: BuiltTable, version: int, root: Path, name: str, now: dt.datetime) -> BuiltTable:
    """A shallow clone of `source` at `version`: one commit whose add actions name the source's
    files by absolute URI, as Delta's SHALLOW CLONE writes them, dated NEWEST_AGE ago."""
    path = _fresh(root, name)
    files: dict[str, dict] = {}
    protocol = metadata = None
    for v, actions in sorted(log_lines(source.path).items()):
        if v > version:
            break
        for action in actions:
            protocol = action.get("protocol", protocol)
            metadata = action.get("metaData", metadata)
            if "add" in action:
                files[action["add"]["path"]] = action["add"]
            if "remove" in action:
                files.pop(action["remove"]["path"], None)
    assert protocol is not None and metadata is not None
    millis = int((now - NEWEST_AGE).timestamp() * 1000)
    actions = [
        {"commitInfo": {"timestamp": millis, "operation": "CLONE", "operationParameters": {"isShallow": True}}},
        {"protocol": protocol},
        {"metaData": {**metadata, "id": f"clone-of-{source.name}-{version}"}},
    ] + [{"add": {**add, "path": (source.path / unquote(key)).as_uri()}} for key, add in sorted(files.items())]
    log = path / "_delta_log"
    log.mkdir(parents=True)
    commit = log / f"{0:020d}.json"
    commit.write_text("".join(json.dumps(a) + "\n" for a in actions))
    os.utime(commit, (millis / 1000, millis / 1000))
    return BuiltTable(name, path)


def vacuum_candidates(table: BuiltTable, window: Optional[dt.timedelta]) -> set[str]:
    """delta-rs full vacuum, dry run, without its retention check: the oracle (window None: the
    table's own deletedFileRetentionDuration)."""
    hours = None if window is None else int(window.total_seconds() // 3600)
    listed = DeltaTable(str(table.path)).vacuum(
        retention_hours=hours, dry_run=True, full=True, enforce_retention_duration=False
    )
    return {str(item) for item in listed}


def now_utc() -> dt.datetime:
    return dt.datetime.fromtimestamp(time.time(), tz=dt.timezone.utc)
