"""Synthetic lakeFS repositories: the demo lake, test lakes and benchmark lakes.

A `Lake` is an in-memory model of a lakeFS repository (commits with their full
path → object tables, refs, staged entries, untracked uploads). `write_native_lake` lays
it out as lakeFS itself does (docs/design.md §6.4): physical objects under `data/` with
random names, modification times at upload time, ranges and metaranges as SSTables under
`_lakefs/` written when their commit was, a refs dump (its tables and manifest) and the
binary rules file. `write_lake` writes the graph export of §6.1 instead, under
`_lakefs/export/`. Ranges are content-addressed and shared between commits in both.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from gc_assets.sources.lakefs.records import (
    AddressType,
    BranchData,
    CommitData,
    Entry,
    GarbageCollectionRules,
    LakeFSTable,
    TagData,
    Timestamp,
    join_value,
    write_lakefs_table,
)

if TYPE_CHECKING:  # numpy is imported where bulk lakes are generated
    import numpy as np

UTC = dt.timezone.utc
RANGE_SIZE = 64  # entries per range; small so that commits share most ranges


@dataclass
class LakeCommit:
    commit_id: str
    parents: tuple[str, ...]
    created_at: dt.datetime
    entries: dict[str, tuple[str, int]]  # logical path -> (address, size)


@dataclass
class Lake:
    name: str
    commits: dict[str, LakeCommit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    staged: list[tuple[str, str, str, int]] = field(default_factory=list)  # branch, path, address, size
    objects: dict[str, tuple[int, dt.datetime]] = field(default_factory=dict)  # key -> (size, mtime)
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def new_address(self, at: dt.datetime, size: Optional[int] = None) -> tuple[str, int]:
        """Upload a new object with a random name, as lakeFS does, shortly before `at`."""
        key = f"data/{self.rng.getrandbits(32):08x}/{self.rng.getrandbits(64):016x}"
        size = size if size is not None else self.rng.randint(10, 400)
        self.objects[key] = (size, at - dt.timedelta(minutes=1))
        return key, size

    def commit(
        self,
        branch: str,
        at: dt.datetime,
        put: dict[str, Optional[tuple[str, int]]] | list[str] = (),
        delete: tuple[str, ...] = (),
        merge_from: Optional[str] = None,
        commit_id: Optional[str] = None,
    ) -> str:
        """Commit on `branch`: upload `put` paths (or use the given entries), delete paths, merge a branch."""
        head = self.branches.get(branch)
        entries = dict(self.commits[head].entries) if head else {}
        parents: tuple[str, ...] = (head,) if head else ()
        if merge_from is not None:
            source_head = self.branches[merge_from]
            entries.update(self.commits[source_head].entries)
            parents = parents + (source_head,)
        items = put.items() if isinstance(put, dict) else ((p, None) for p in put)
        for path, entry in items:
            entries[path] = entry if entry is not None else self.new_address(at)
        for path in delete:
            entries.pop(path, None)
        commit_id = commit_id or hashlib.sha1(f"{self.name}/{len(self.commits)}/{branch}/{at}".encode()).hexdigest()
        self.commits[commit_id] = LakeCommit(commit_id, parents, at, entries)
        self.branches[branch] = commit_id
        return commit_id

    def branch(self, name: str, from_branch: str) -> None:
        self.branches[name] = self.branches[from_branch]

    def stage(self, branch: str, path: str, at: dt.datetime) -> None:
        address, size = self.new_address(at)
        self.staged.append((branch, path, address, size))

    def upload_untracked(self, at: dt.datetime) -> str:
        """An object that was uploaded and never committed or staged."""
        return self.new_address(at)[0]


def docs_example(name: str = "example-repo") -> Lake:
    """The lakeFS documentation's GC example: main keeps 21 days, dev 7, GC on 2022-03-31.

    dev's head on 2022-03-24 was d:2022-03-23, so it and newer dev commits are kept;
    main's head on 2022-03-10 was 2022-03-09, so 2022-02-27 and 2022-03-01 expire.
    Objects added in d:2022-03-14 and overwritten in d:2022-03-20 are collected.
    """
    lake = Lake(name, rng=random.Random(2022))

    def day(text: str) -> dt.datetime:
        return dt.datetime.fromisoformat(f"{text}T12:00:00+00:00")

    lake.commit("main", day("2022-02-27"), ["tables/a/part-0", "tables/b/part-0"], commit_id="2022-02-27")
    lake.commit("main", day("2022-03-01"), ["tables/a/part-0"], commit_id="2022-03-01")
    lake.branch("dev", "main")
    lake.commit("dev", day("2022-03-02"), ["tables/c/part-0"], commit_id="d:2022-03-02")
    lake.commit("main", day("2022-03-09"), ["tables/a/part-0"], commit_id="2022-03-09")
    lake.commit("main", day("2022-03-12"), ["tables/b/part-1"], commit_id="2022-03-12")
    lake.commit("dev", day("2022-03-13"), ["tables/c/part-0"], commit_id="d:2022-03-13")
    lake.commit("dev", day("2022-03-14"), ["tables/c/part-1", "tables/d/part-0"], commit_id="d:2022-03-14")
    lake.commit("dev", day("2022-03-20"), ["tables/c/part-1"], delete=("tables/d/part-0",), commit_id="d:2022-03-20")
    lake.commit("dev", day("2022-03-23"), ["tables/e/part-0"], commit_id="d:2022-03-23")
    lake.commit("dev", day("2022-03-26"), ["tables/e/part-1"], commit_id="d:2022-03-26")
    lake.commit("main", day("2022-03-28"), ["tables/a/part-1"], commit_id="2022-03-28")
    return lake


DOCS_RULES = {
    "default_retention_days": 14,
    "branches": [{"branch_id": "main", "retention_days": 21}, {"branch_id": "dev", "retention_days": 7}],
}
DOCS_GC_DATE = dt.date(2022, 3, 31)


def add_churn(lake: Lake, commits: int, start: dt.datetime, end: dt.datetime, files_per_commit: int = 8) -> None:
    """Random history on top of `lake`: feature branches, merges, overwrites, deletes,
    tags, a deleted branch, staged entries and untracked uploads."""
    rng = lake.rng
    span = (end - start).total_seconds()
    times = sorted(start + dt.timedelta(seconds=rng.uniform(0, span)) for _ in range(commits))
    feature_count = 0
    for index, at in enumerate(times):
        branches = sorted(lake.branches)
        roll = rng.random()
        if roll < 0.08:
            feature_count += 1
            name = f"feature/f{feature_count}"
            lake.branch(name, "main")
            branch = name
        elif roll < 0.14 and any(b.startswith("feature/") for b in branches):
            source = rng.choice([b for b in branches if b.startswith("feature/")])
            lake.commit("main", at, merge_from=source)
            if rng.random() < 0.5:
                del lake.branches[source]  # deleted after merge: its head becomes dangling
            continue
        else:
            branch = rng.choice(branches)
        head = lake.commits[lake.branches[branch]]
        existing = sorted(head.entries)
        overwrite = rng.sample(existing, min(len(existing), rng.randint(0, files_per_commit // 2)))
        delete = tuple(rng.sample(existing, min(len(existing), rng.randint(0, 1))))
        new_paths = [f"tables/t{rng.randint(0, 20)}/part-{index}-{i}" for i in range(rng.randint(1, files_per_commit))]
        lake.commit(branch, at, overwrite + new_paths, delete=delete)
        if rng.random() < 0.05:
            lake.tags[f"v{len(lake.tags) + 1}"] = lake.branches[branch]
        if rng.random() < 0.05:
            lake.upload_untracked(at)
    for branch in sorted(lake.branches)[:2]:
        lake.stage(branch, f"staging/{branch}/pending", end)


def _ranges_of(entries: dict[str, tuple[str, int]]) -> list[tuple[str, list[tuple[str, str, int]]]]:
    rows = sorted((path, address, size) for path, (address, size) in entries.items())
    ranges = []
    for start in range(0, len(rows), RANGE_SIZE):
        chunk = rows[start : start + RANGE_SIZE]
        range_id = hashlib.sha256(json.dumps(chunk).encode()).hexdigest()[:32]
        ranges.append((range_id, chunk))
    return ranges


def export_tables(lake: Lake) -> dict[str, pa.Table]:
    """The graph export datasets of docs/design.md §6.1 as Arrow tables."""
    commits, metaranges, ranges = [], [], {}
    for commit in lake.commits.values():
        commit_ranges = _ranges_of(commit.entries)
        # An empty tree has no ranges; lakeFS spells its metarange id "" (nothing to look up).
        metarange_id = (
            hashlib.sha256("".join(r for r, _ in commit_ranges).encode()).hexdigest()[:32] if commit_ranges else ""
        )
        commits.append((commit.commit_id, list(commit.parents), commit.created_at, metarange_id))
        metaranges.extend((metarange_id, range_id) for range_id, _ in commit_ranges)
        ranges.update(dict(commit_ranges))
    metaranges = sorted(set(metaranges))
    range_rows = [(rid, p, a, s) for rid, chunk in sorted(ranges.items()) for p, a, s in chunk]
    refs = [(n, "branch", c) for n, c in sorted(lake.branches.items())] + [
        (n, "tag", c) for n, c in sorted(lake.tags.items())
    ]
    ts = pa.timestamp("us", tz="UTC")
    return {
        "commits": pa.table(
            {
                "commit_id": [c[0] for c in commits],
                "parents": pa.array([c[1] for c in commits], pa.list_(pa.string())),
                "created_at": pa.array([c[2] for c in commits], ts),
                "metarange_id": [c[3] for c in commits],
            }
        ),
        "refs": pa.table(
            {"name": [r[0] for r in refs], "kind": [r[1] for r in refs], "commit_id": [r[2] for r in refs]}
        ),
        "metaranges": pa.table({"metarange_id": [m[0] for m in metaranges], "range_id": [m[1] for m in metaranges]}),
        "ranges": pa.table(
            {
                "range_id": [r[0] for r in range_rows],
                "path": [r[1] for r in range_rows],
                "address": [r[2] for r in range_rows],
                "size": pa.array([r[3] for r in range_rows], pa.int64()),
            }
        ),
        "staged": pa.table(
            {
                "branch": pa.array([s[0] for s in lake.staged], pa.string()),
                "path": pa.array([s[1] for s in lake.staged], pa.string()),
                "address": pa.array([s[2] for s in lake.staged], pa.string()),
                "size": pa.array([s[3] for s in lake.staged], pa.int64()),
            }
        ),
    }


def write_export(
    tables: dict[str, pa.Table], export_dir: Path, fmt: str = "parquet", exported_at: Optional[dt.datetime] = None
) -> None:
    """Write the datasets, then `_manifest.json` last (as an exporter must) unless `exported_at` is None."""
    for name, table in tables.items():
        directory = export_dir / name
        directory.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            pq.write_table(table, directory / "part-00000.parquet")
        else:
            with open(directory / "part-00000.jsonl", "w", encoding="utf-8") as out:
                for row in table.to_pylist():
                    out.write(json.dumps({k: _json_value(v) for k, v in row.items()}) + "\n")
    if exported_at is not None:
        manifest = {
            "exported_at": _json_value(exported_at),
            "datasets": {name: t.num_rows for name, t in tables.items()},
        }
        (export_dir / "_manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def _json_value(value: object) -> object:
    if isinstance(value, dt.datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return value


def write_objects(lake: Lake, namespace: Path) -> None:
    for key, (size, mtime) in lake.objects.items():
        path = namespace / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        stamp = mtime.timestamp()
        os.utime(path, (stamp, stamp))


def write_lake(lake: Lake, namespace: Path, fmt: str = "parquet") -> Path:
    """Lay the lake out under `namespace`; returns the export directory."""
    write_objects(lake, namespace)
    export_dir = namespace / "_lakefs" / "export"
    write_export(export_tables(lake), export_dir, fmt, exported_at=dt.datetime.now(UTC))
    return export_dir


# ---------------------------------------------------------------- lakeFS's own layout (§6.4)

TABLES_DIR = "_lakefs"
REFS_MANIFEST = "_lakefs/refs_manifest.json"  # where lakeFS's older dump API wrote it; lakectl prints it
RULES_FILE = "_lakefs/retention/gc/rules/config.json"
DUMP_RANGE_RECORDS = 1000  # records per range of a refs dump


def _put_table(namespace: Path, table: LakeFSTable, written_at: dt.datetime, again: bool = False) -> LakeFSTable:
    """Write `_lakefs/<id>` stamped `written_at`; a table already there keeps its first stamp
    (ranges are content-addressed: a later commit sharing one writes nothing new here) unless
    written `again` (a new refs dump puts its tables again, as lakeFS does)."""
    path = namespace / TABLES_DIR / table.id
    if again or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(table.data)
        os.utime(path, (written_at.timestamp(), written_at.timestamp()))
    return table


def entry_value(address: str, size: int, modified: dt.datetime, deprecated: bool = False) -> bytes:
    """A range record's value: identity + catalog.Entry (RELATIVE keys, FULL absolute URIs)."""
    absolute = "://" in address or address.startswith("/")
    kind = AddressType.BY_PREFIX_DEPRECATED if deprecated else AddressType.FULL if absolute else AddressType.RELATIVE
    entry = Entry(
        address=address,
        last_modified=Timestamp.of(modified),
        size=size,
        e_tag=hashlib.md5(address.encode()).hexdigest(),
        address_type=kind,
    )
    return join_value(entry.identity(), entry.encode())


def write_metarange(
    namespace: Path, ranges: list[LakeFSTable], written_at: dt.datetime, metadata: dict[str, str], again: bool = False
) -> str:
    """Write the metarange listing `ranges` (already written); returns its id."""
    records = [(r.range_data.max_key, join_value(r.id.encode(), r.range_data.encode())) for r in ranges]
    return _put_table(namespace, write_lakefs_table(records, "metaranges", metadata), written_at, again).id


def _native_ranges(lake: Lake, commit: LakeCommit, namespace: Path, deprecated: bool) -> list[LakeFSTable]:
    ranges = []
    rows = sorted((path.encode(), address, size) for path, (address, size) in commit.entries.items())
    for start in range(0, len(rows), RANGE_SIZE):
        records = [
            (path, entry_value(address, size, lake.objects.get(address, (0, commit.created_at))[1], deprecated))
            for path, address, size in rows[start : start + RANGE_SIZE]
        ]
        ranges.append(_put_table(namespace, write_lakefs_table(records, "ranges"), commit.created_at))
    return ranges


def write_refs_dump(
    namespace: Path, commits: list[CommitData], branches: dict[str, str], tags: dict[str, str], dumped_at: dt.datetime
) -> dict[str, str]:
    """The tables `lakectl refs-dump` writes (entity commit, branch, tag) and its manifest at REFS_MANIFEST."""
    entities = {
        "commit": [(c.id.encode(), join_value(c.id.encode(), c.encode())) for c in commits],
        "branch": [
            (n.encode(), join_value(c.encode(), BranchData(id=n, commit_id=c).encode())) for n, c in branches.items()
        ],
        "tag": [(n.encode(), join_value(c.encode(), TagData(id=n, commit_id=c).encode())) for n, c in tags.items()],
    }
    manifest = {}
    for entity, records in entities.items():
        records.sort()
        metadata = {"entity": entity, "schema_name": f"io.treeverse.lakefs.graveler.{entity.capitalize()}Data"}
        ranges = [
            _put_table(
                namespace,
                write_lakefs_table(records[start : start + DUMP_RANGE_RECORDS], "ranges", metadata),
                dumped_at,
                True,
            )
            for start in range(0, len(records), DUMP_RANGE_RECORDS)
        ]
        manifest[f"{entity}s_meta_range_id" if entity != "branch" else "branches_meta_range_id"] = write_metarange(
            namespace, ranges, dumped_at, metadata, again=True
        )
    path = namespace / REFS_MANIFEST
    path.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    os.utime(path, (dumped_at.timestamp(), dumped_at.timestamp()))
    return manifest


def write_rules_file(namespace: Path, rules: dict) -> None:
    """lakeFS's rules (JSON as `lakectl gc set-config` takes them) as the binary file lakeFS keeps."""
    binary = GarbageCollectionRules(
        int(rules.get("default_retention_days") or 0),
        {b["branch_id"]: int(b["retention_days"]) for b in rules.get("branches", ()) if "branch_id" in b},
    )
    path = namespace / RULES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(binary.encode())


def write_native_lake(
    lake: Lake,
    namespace: Path,
    rules: Optional[dict] = None,
    dumped_at: Optional[dt.datetime] = None,
    legacy_commits: frozenset[str] = frozenset(),
    deprecated_addresses: bool = False,
) -> Path:
    """Lay the lake out as lakeFS does; returns the refs dump's manifest.

    Each commit's ranges and metarange are stamped with its creation time, the dump with
    `dumped_at` (now). `legacy_commits` are written as lakeFS before 1.0 wrote commits
    (version 0, the main parent last); `deprecated_addresses` writes relative addresses as
    BY_PREFIX_DEPRECATED, as lakeFS before 0.60 did. Staged entries have their objects
    under `data/` but no range names them: only lakeFS's key-value store knows them.
    """
    write_objects(lake, namespace)
    commits = []
    for commit in sorted(lake.commits.values(), key=lambda c: c.created_at):
        ranges = _native_ranges(lake, commit, namespace, deprecated_addresses)
        metarange_id = write_metarange(namespace, ranges, commit.created_at, {}) if ranges else ""
        legacy = commit.commit_id in legacy_commits
        parents = commit.parents[1:] + commit.parents[:1] if legacy else commit.parents
        commits.append(
            CommitData(
                id=commit.commit_id,
                committer="lakegen",
                message=f"commit {commit.commit_id}",
                creation_date=Timestamp.of(commit.created_at),
                meta_range_id=metarange_id,
                parents=tuple(parents),
                version=0 if legacy else 1,
                generation=1,
            )
        )
    write_refs_dump(namespace, commits, lake.branches, lake.tags, dumped_at or dt.datetime.now(UTC))
    if rules is not None:
        write_rules_file(namespace, rules)
    return namespace / REFS_MANIFEST


@dataclass(frozen=True)
class BulkShape:
    """A benchmark lake: how many objects, commits, branches, and how ranges change.

    Each branch owns its own ranges of `range_size` entries; every commit after the
    branch roots rewrites one range of its branch, giving `changes_per_commit` paths
    new objects. So a commit's metarange lists only its branch's ranges, ranges are
    shared by every commit that did not touch them (as lakeFS shares them), and old
    objects become collectable once the commits that replaced them are retained alone.
    """

    objects: int
    commits: int
    branches: int
    range_size: int = 100
    changes_per_commit: int = 50
    untracked_fraction: float = 0.01
    tags: int = 5
    days: float = 40.0
    seed: int = 0

    @property
    def untracked(self) -> int:
        return int(self.objects * self.untracked_fraction)

    @property
    def change_commits(self) -> int:
        return self.commits - self.branches

    @property
    def initial_objects(self) -> int:
        return self.objects - self.untracked - self.change_commits * self.changes_per_commit

    def validate(self) -> None:
        if self.commits <= self.branches:
            raise ValueError("a bulk lake needs more commits than branches (each branch has a root commit)")
        if self.changes_per_commit > self.range_size:
            raise ValueError("changes_per_commit cannot exceed range_size")
        if self.initial_objects < self.branches * self.range_size:
            raise ValueError(
                f"{self.objects} objects are too few for {self.commits} commits of {self.changes_per_commit} "
                f"changes and {self.branches} branches of at least one range"
            )


@dataclass
class BulkLake:
    """The generated lake: its export tables and every object written to storage."""

    export: dict[str, pa.Table]
    object_keys: list[str]
    object_sizes: "np.ndarray"
    object_mtimes_ns: "np.ndarray"


def bulk_object_key(object_id: int) -> str:
    """A random-looking, unique lakeFS-style key: a bijective scramble of the id."""
    scrambled = (object_id * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
    return f"data/{scrambled >> 56:02x}/{scrambled:016x}"


@dataclass
class _BulkHistory:
    """The commits of a bulk lake and the range versions they list, before ids are given."""

    times: "np.ndarray"  # commit times, seconds since the epoch
    parents: list[list[int]]
    head_of_branch: dict[int, int]  # branch -> its last commit
    version_objects: list["np.ndarray"]  # object ids of each range version, in path order
    version_range: list[int]  # range of each version
    metarange_versions: list["np.ndarray"]  # versions each commit's metarange lists
    object_time: "np.ndarray"  # upload time of each tracked object
    tracked: int  # objects referenced by some version


def _bulk_history(shape: BulkShape, rng: "np.random.Generator", start_s: float, end_s: float) -> _BulkHistory:
    """Root commit of each branch, one second apart; then the change commits, sorted in time,
    each rewriting `changes_per_commit` paths of one range of its branch."""
    import numpy as np

    ranges_total = shape.initial_objects // shape.range_size
    initial = ranges_total * shape.range_size
    range_branch = np.arange(ranges_total) % shape.branches
    change_times = np.sort(rng.uniform(start_s + shape.branches, end_s - 3600, shape.change_commits))
    times = np.concatenate([start_s + np.arange(shape.branches, dtype=float), change_times])
    commit_branch = np.concatenate([np.arange(shape.branches), rng.integers(0, shape.branches, shape.change_commits)])

    ranges_of_branch = [list(np.flatnonzero(range_branch == b)) for b in range(shape.branches)]
    current_version = np.zeros(ranges_total, dtype=np.int64)  # version index of each range
    history = _BulkHistory(
        times, [], {}, [], [], [], np.empty(initial + shape.change_commits * shape.changes_per_commit), initial
    )
    version_id_of: dict[tuple[int, int], int] = {}
    for r in range(ranges_total):
        version_id_of[(r, 0)] = len(history.version_objects)
        history.version_objects.append(np.arange(r * shape.range_size, (r + 1) * shape.range_size))
        history.version_range.append(r)
        history.object_time[r * shape.range_size : (r + 1) * shape.range_size] = times[range_branch[r]]

    for i in range(shape.commits):
        branch = int(commit_branch[i])
        if i < shape.branches:
            history.parents.append([0] if i > 0 else [])
        else:
            history.parents.append([history.head_of_branch[branch]])
            r = int(rng.choice(ranges_of_branch[branch]))
            objects = history.version_objects[version_id_of[(r, int(current_version[r]))]].copy()
            positions = rng.choice(shape.range_size, shape.changes_per_commit, replace=False)
            new_ids = np.arange(history.tracked, history.tracked + shape.changes_per_commit)
            objects[positions] = new_ids
            history.object_time[new_ids] = times[i]
            history.tracked += shape.changes_per_commit
            current_version[r] += 1
            version_id_of[(r, int(current_version[r]))] = len(history.version_objects)
            history.version_objects.append(objects)
            history.version_range.append(r)
        history.head_of_branch[branch] = i
        branch_ranges = np.asarray(ranges_of_branch[branch])
        history.metarange_versions.append(
            np.fromiter(
                (version_id_of[(int(r), int(current_version[r]))] for r in branch_ranges), np.int64, len(branch_ranges)
            )
        )
    return history


def _bulk_export(
    shape: BulkShape,
    history: _BulkHistory,
    commit_ids: list[str],
    refs: list[tuple[str, str, str]],
    keys: list[str],
    sizes: "np.ndarray",
) -> dict[str, pa.Table]:
    """The graph export (docs/design.md §6.1) of a bulk lake's history."""
    import numpy as np

    def range_id(version: int) -> str:
        return hashlib.sha256(f"bulk/{shape.seed}/range/{version}".encode()).hexdigest()[:32]

    def metarange_id(commit: int) -> str:
        return hashlib.sha256(f"bulk/{shape.seed}/metarange/{commit}".encode()).hexdigest()[:32]

    range_ids = [range_id(v) for v in range(len(history.version_objects))]
    metarange_ids = [metarange_id(i) for i in range(shape.commits)]
    all_versions = np.concatenate(history.version_objects)
    rows_per_version = shape.range_size
    version_of_row = np.repeat(np.arange(len(history.version_objects)), rows_per_version)
    path_of_row = np.tile(np.arange(rows_per_version), len(history.version_objects))
    range_of_row = np.asarray(history.version_range)[version_of_row]
    ts = pa.timestamp("us", tz="UTC")
    metarange_counts = [len(m) for m in history.metarange_versions]
    parents = [[commit_ids[p] for p in commit_parents] for commit_parents in history.parents]
    return {
        "commits": pa.table(
            {
                "commit_id": commit_ids,
                "parents": pa.array(parents, pa.list_(pa.string())),
                "created_at": pa.array((history.times * 1e6).astype(np.int64), ts),
                "metarange_id": metarange_ids,
            }
        ),
        "refs": pa.table(
            {"name": [r[0] for r in refs], "kind": [r[1] for r in refs], "commit_id": [r[2] for r in refs]}
        ),
        "metaranges": pa.table(
            {
                "metarange_id": pa.array(metarange_ids).take(
                    pa.array(np.repeat(np.arange(shape.commits), metarange_counts))
                ),
                "range_id": pa.array(range_ids).take(pa.array(np.concatenate(history.metarange_versions))),
            }
        ),
        "ranges": pa.table(
            {
                "range_id": pa.array(range_ids).take(pa.array(version_of_row)),
                "path": pa.array(
                    [f"tables/t{r}/part-{p:05d}" for r, p in zip(range_of_row.tolist(), path_of_row.tolist())]
                ),
                "address": pa.array(keys).take(pa.array(all_versions)),
                "size": pa.array(sizes[all_versions]),
            }
        ),
    }


def bulk_lake(shape: BulkShape, end: dt.datetime) -> BulkLake:
    """Generate a lake of `shape` whose last commit is shortly before `end`, vectorized
    so that millions of objects and 100 k commits take seconds, not hours."""
    import numpy as np

    shape.validate()
    rng = np.random.default_rng(shape.seed)
    start_s = end.timestamp() - shape.days * 86400
    history = _bulk_history(shape, rng, start_s, end.timestamp())
    commit_ids = [hashlib.sha1(f"bulk/{shape.seed}/{i}".encode()).hexdigest() for i in range(shape.commits)]
    untracked = shape.objects - history.tracked
    total_objects = history.tracked + untracked
    sizes = rng.integers(1 << 10, 1 << 22, total_objects, dtype=np.int64)
    untracked_times = rng.uniform(start_s, end.timestamp(), untracked)
    mtimes_ns = (np.concatenate([history.object_time[: history.tracked], untracked_times]) - 60) * 1e9
    keys = [bulk_object_key(k) for k in range(total_objects)]
    refs = [
        (("main" if b == 0 else f"branch-{b:04d}"), "branch", commit_ids[i])
        for b, i in sorted(history.head_of_branch.items())
    ]
    for t, commit in enumerate(sorted(rng.choice(shape.commits, min(shape.tags, shape.commits), replace=False))):
        refs.append((f"v{t + 1}", "tag", commit_ids[int(commit)]))
    export = _bulk_export(shape, history, commit_ids, refs, keys, sizes)
    return BulkLake(export, keys, sizes, mtimes_ns.astype(np.int64))


def write_bulk_objects(lake: BulkLake, namespace: Path, workers: int = 2) -> None:
    """Create every object as a sparse file of its size (no data blocks) with its mtime."""
    from concurrent.futures import ProcessPoolExecutor

    directories = sorted({key.rsplit("/", 1)[0] for key in lake.object_keys})
    for directory in directories:
        (namespace / directory).mkdir(parents=True, exist_ok=True)
    chunks = [
        (
            str(namespace),
            lake.object_keys[i::workers],
            lake.object_sizes[i::workers].tolist(),
            lake.object_mtimes_ns[i::workers].tolist(),
        )
        for i in range(workers)
    ]
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(_write_sparse_files, *zip(*chunks)))


def _write_sparse_files(root: str, keys: list[str], sizes: list[int], mtimes_ns: list[int]) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for key, size, mtime in zip(keys, sizes, mtimes_ns):
        fd = os.open(os.path.join(root, key), flags, 0o644)
        try:
            os.ftruncate(fd, size)
            os.utime(fd, ns=(mtime, mtime))
        finally:
            os.close(fd)


def write_bulk_lake(shape: BulkShape, namespace: Path, end: dt.datetime) -> Path:
    """Generate and lay out a bulk lake under `namespace`; returns the export directory."""
    lake = bulk_lake(shape, end)
    write_bulk_objects(lake, namespace)
    export_dir = namespace / "_lakefs" / "export"
    write_export(lake.export, export_dir)
    return export_dir


def write_native_from_export(
    tables: dict[str, pa.Table], namespace: Path, dumped_at: Optional[dt.datetime] = None
) -> Path:
    """A bulk lake's graph export (its objects already in `namespace`) written again in
    lakeFS's own layout beside it: every range and metarange stamped with the first commit
    that names it, then a refs dump. Returns the dump's manifest."""
    import pyarrow.compute as pc

    commits = tables["commits"].to_pydict()
    created = dict(zip(commits["commit_id"], commits["created_at"]))
    metaranges: dict[str, list[str]] = {}
    for metarange_id, range_id in zip(
        *(tables["metaranges"].column(n).to_pylist() for n in ("metarange_id", "range_id"))
    ):
        metaranges.setdefault(metarange_id, []).append(range_id)
    first_use: dict[str, dt.datetime] = {}
    for commit_id, metarange_id in zip(commits["commit_id"], commits["metarange_id"]):
        for range_id in metaranges.get(metarange_id, ()):
            first_use[range_id] = min(first_use.get(range_id, created[commit_id]), created[commit_id])
    ranges = tables["ranges"].sort_by([("range_id", "ascending"), ("path", "ascending")])
    ids = ranges.column("range_id")
    starts = pc.indices_nonzero(pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1))).to_pylist()
    bounds = [0] + [i + 1 for i in starts] + [len(ids)]
    written: dict[str, LakeFSTable] = {}
    for start, end in zip(bounds, bounds[1:]):
        chunk = ranges.slice(start, end - start).to_pydict()
        range_id = chunk["range_id"][0]
        at = first_use.get(range_id, dumped_at or dt.datetime.now(UTC))
        records = [
            (p.encode(), entry_value(a, n, at)) for p, a, n in zip(chunk["path"], chunk["address"], chunk["size"])
        ]
        written[range_id] = _put_table(namespace, write_lakefs_table(records, "ranges"), at)
    native: dict[str, str] = {"": ""}
    data = []
    for commit_id, parents, metarange_id in zip(commits["commit_id"], commits["parents"], commits["metarange_id"]):
        if metarange_id not in native:
            listed = sorted((written[r] for r in metaranges[metarange_id]), key=lambda t: t.range_data.max_key)
            native[metarange_id] = write_metarange(namespace, listed, created[commit_id], {})
        data.append(
            CommitData(
                id=commit_id,
                creation_date=Timestamp.of(created[commit_id]),
                meta_range_id=native[metarange_id],
                parents=tuple(parents),
                version=1,
                generation=1,
            )
        )
    refs = tables["refs"].to_pylist()
    write_refs_dump(
        namespace,
        data,
        {r["name"]: r["commit_id"] for r in refs if r["kind"] == "branch"},
        {r["name"]: r["commit_id"] for r in refs if r["kind"] == "tag"},
        dumped_at or dt.datetime.now(UTC),
    )
    return namespace / REFS_MANIFEST
