"""Synthetic lakeFS repositories: the demo lake, test lakes and benchmark lakes.

A `Lake` is an in-memory model of a lakeFS repository (commits with their full
path → object tables, refs, staged entries, untracked uploads). `write_lake` lays it
out as lakeFS does: physical objects under `data/` with random names, modification
times at upload time, and a graph export under `_lakefs/export/` whose ranges are
content-addressed and shared between commits.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

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


DOCS_RULES = {"default_retention_days": 14, "branches": [{"branch_id": "main", "retention_days": 21}, {"branch_id": "dev", "retention_days": 7}]}
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
    """The graph export datasets of DESIGN §6.1 as Arrow tables."""
    commits, metaranges, ranges = [], [], {}
    for commit in lake.commits.values():
        commit_ranges = _ranges_of(commit.entries)
        metarange_id = hashlib.sha256("".join(r for r, _ in commit_ranges).encode()).hexdigest()[:32]
        commits.append((commit.commit_id, list(commit.parents), commit.created_at, metarange_id))
        metaranges.extend((metarange_id, range_id) for range_id, _ in commit_ranges)
        ranges.update(dict(commit_ranges))
    metaranges = sorted(set(metaranges))
    range_rows = [(rid, p, a, s) for rid, chunk in sorted(ranges.items()) for p, a, s in chunk]
    refs = [(n, "branch", c) for n, c in sorted(lake.branches.items())] + [(n, "tag", c) for n, c in sorted(lake.tags.items())]
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
        "refs": pa.table({"name": [r[0] for r in refs], "kind": [r[1] for r in refs], "commit_id": [r[2] for r in refs]}),
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
                "branch": [s[0] for s in lake.staged],
                "path": [s[1] for s in lake.staged],
                "address": [s[2] for s in lake.staged],
                "size": pa.array([s[3] for s in lake.staged], pa.int64()),
            }
        ),
    }


def write_export(tables: dict[str, pa.Table], export_dir: Path, fmt: str = "parquet") -> None:
    for name, table in tables.items():
        directory = export_dir / name
        directory.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            pq.write_table(table, directory / "part-00000.parquet")
        else:
            with open(directory / "part-00000.jsonl", "w", encoding="utf-8") as out:
                for row in table.to_pylist():
                    out.write(json.dumps({k: _json_value(v) for k, v in row.items()}) + "\n")


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
    write_export(export_tables(lake), export_dir, fmt)
    return export_dir
