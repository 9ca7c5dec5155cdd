"""Delta tables whose early history the log no longer holds, against delta-rs full vacuum.

Every way a log can lack its first versions: log cleanup after a classic, multi-part or
v2 checkpoint (with sidecars), the checkpoint's own commit gone too, `_last_checkpoint`
pointing past missing commits, delta-rs's own `cleanup_metadata`, and random histories.
For each retention window gc_assets's candidates equal
`DeltaTable.vacuum(dry_run=True, full=True)`, or gc_assets refuses, naming the missing
versions, exactly where the log cannot tell what the state at the cutoff held: the
cutoff is older than the checkpoint's tombstones reach (its write time minus
delta.deletedFileRetentionDuration). That condition is computed here from the files'
modification times and the table property, not through the product. The random histories
are marked together, as tables of one fleet (mark/delta_tables, which test_delta_fleet holds
to each table marked alone).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import strategies as st

from gc_assets.core.config import load_config
from gc_assets.core.names import REPO
from gc_assets.mark.delta_tables import mark_tables
from gc_assets.mark.sets import candidates_of
from gc_assets.runner import run_partition
from gc_assets.sources.delta_log import DeltaLogError, classify
from gc_assets.stores.local import LocalStore
from gc_assets.stores.many import list_many
from gc_assets_tests import delta_tables
from gc_assets_tests.delta_tables import BuiltTable, _rows
from gc_assets_tests.examples_in_one_job import check_in_one_job
from gc_assets_tests.lakes import write_config
from gc_assets_tests.test_delta_vacuum_oracle import TableFrames, our_candidates

LOG = "_delta_log"
HOURS = [4 * 24, 7 * 24, 10 * 24]  # bounded by the tombstones, the report, refused
WEEK = dt.timedelta(days=7)


def history(path: Path, configuration: Optional[dict] = None) -> None:
    """Eight versions three days apart, the newest 12 hours old: A removed 12.5 days ago,
    B and C (the two files of the report) 6.5 days ago, inside the table's 7-day window."""
    write_deltalake(path, _rows(0, 2), configuration=configuration)  # v0: A
    write_deltalake(path, _rows(10, 2), mode="append")  # v1: B
    write_deltalake(path, _rows(20, 2), mode="append")  # v2: C
    DeltaTable(path).delete("id < 2")  # v3: A removed
    write_deltalake(path, _rows(40, 2), mode="append")  # v4
    DeltaTable(path).delete("id >= 10 AND id < 22")  # v5: B and C removed
    write_deltalake(path, _rows(60, 2), mode="append")  # v6
    write_deltalake(path, _rows(70, 2), mode="append")  # v7
    delta_tables.shift_history(path, delta_tables.now_utc())


def drop_commits(path: Path, versions: range) -> None:
    for version in versions:
        os.remove(path / LOG / f"{version:020d}.json")


def classic(path: Path) -> None:
    DeltaTable(path, version=6).create_checkpoint()
    drop_commits(path, range(6))


def classic_without_its_commit(path: Path) -> None:
    DeltaTable(path, version=6).create_checkpoint()
    drop_commits(path, range(7))


def multipart(path: Path) -> None:
    DeltaTable(path, version=6).create_checkpoint()
    single = path / LOG / f"{6:020d}.checkpoint.parquet"
    rows = pq.read_table(single)
    os.remove(single)
    half = rows.num_rows // 2
    for part, piece in ((1, rows.slice(0, half)), (2, rows.slice(half))):
        pq.write_table(piece, path / LOG / f"{6:020d}.checkpoint.{part:010d}.0000000002.parquet")
    (path / LOG / "_last_checkpoint").write_text(json.dumps({"version": 6, "size": rows.num_rows, "parts": 2}))
    drop_commits(path, range(6))


def v2_with_sidecars(path: Path) -> None:
    """A v2 checkpoint (UUID-named JSON) whose file actions, tombstones included, sit in two sidecars."""
    table_actions = [a for a in delta_tables.log_lines(path)[0] if "protocol" in a or "metaData" in a]
    for action in table_actions:
        if "protocol" in action:
            action["protocol"] = {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["v2Checkpoint"],
                "writerFeatures": ["v2Checkpoint"],
            }
    DeltaTable(path, version=6).create_checkpoint()
    single = path / LOG / f"{6:020d}.checkpoint.parquet"
    rows = pq.read_table(single)
    os.remove(single)
    files = rows.filter(pc.or_(pc.is_valid(rows["add"]), pc.is_valid(rows["remove"])))
    (path / LOG / "_sidecars").mkdir()
    sidecars = []
    for piece in (files.slice(0, 2), files.slice(2)):
        name = f"{uuid.uuid4()}.parquet"
        pq.write_table(piece.select(["add", "remove"]), path / LOG / "_sidecars" / name)
        size = (path / LOG / "_sidecars" / name).stat().st_size
        sidecars.append({"sidecar": {"path": name, "sizeInBytes": size, "modificationTime": 0}})
    top = [{"checkpointMetadata": {"version": 6}}, *table_actions, *sidecars]
    (path / LOG / f"{6:020d}.checkpoint.{uuid.uuid4()}.json").write_text("".join(json.dumps(a) + "\n" for a in top))
    (path / LOG / "_last_checkpoint").write_text(json.dumps({"version": 6, "size": len(top)}))
    drop_commits(path, range(6))


def pointer_past_a_gap(path: Path) -> None:
    """Commits 0..2 remain, 3..5 are gone; `_last_checkpoint` names the checkpoint after the gap."""
    DeltaTable(path, version=6).create_checkpoint()
    drop_commits(path, range(3, 6))


def two_checkpoints(path: Path) -> None:
    """An older checkpoint survives the cleanup too: replay starts at the newer one."""
    DeltaTable(path, version=2).create_checkpoint()
    DeltaTable(path, version=6).create_checkpoint()
    drop_commits(path, range(6))


def delta_rs_cleanup(path: Path) -> None:
    """delta-rs's own log cleanup (delta.logRetentionDuration of one day) after a checkpoint."""
    DeltaTable(path, version=6).create_checkpoint()
    DeltaTable(path).cleanup_metadata()


TRUNCATIONS: dict[str, Callable[[Path], None]] = {
    f.__name__: f
    for f in (
        classic,
        classic_without_its_commit,
        multipart,
        v2_with_sidecars,
        pointer_past_a_gap,
        two_checkpoints,
        delta_rs_cleanup,
    )
}
# The versions whose state is gone (version 6 without its commit is still the checkpoint's state).
MISSING = {"pointer_past_a_gap": "3..5"}


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, BuiltTable]:
    root = tmp_path_factory.mktemp("delta_history")
    built = {}
    for name, truncate in TRUNCATIONS.items():
        path = root / name
        history(path, {"delta.logRetentionDuration": "interval 1 days"} if name == "delta_rs_cleanup" else None)
        truncate(path)
        built[name] = BuiltTable(name, path)
    return built


def checkpoint_horizon(path: Path, retention: dt.timedelta) -> dt.datetime:
    """When the newest checkpoint's tombstones begin: written then, minus the table's retention."""
    log = path / LOG
    version = json.loads((log / "_last_checkpoint").read_text())["version"]
    parts = [p for p in log.iterdir() if p.name.startswith(f"{version:020d}.checkpoint")]
    written = max(p.stat().st_mtime for p in parts)
    return dt.datetime.fromtimestamp(written, tz=dt.timezone.utc) - retention


def candidates_or_refusal(
    spark, table: BuiltTable, frames: TableFrames, window: dt.timedelta
) -> Union[dict[str, str], DeltaLogError]:
    """our_candidates, or gc_assets's refusal."""
    try:
        return our_candidates(spark, table, frames, window)
    except DeltaLogError as refusal:
        return refusal


@pytest.fixture(scope="module")
def judged_by_hours(spark, tables) -> dict[str, list[Union[dict[str, str], DeltaLogError]]]:
    """candidates_or_refusal of every table under each of HOURS, the tables side by side: each is
    many tiny Spark jobs, which wait on the scheduler more than they compute."""

    def of(table: BuiltTable) -> list[Union[dict[str, str], DeltaLogError]]:
        frames = TableFrames(spark, table)
        return [candidates_or_refusal(spark, table, frames, dt.timedelta(hours=hours)) for hours in HOURS]

    with ThreadPoolExecutor(4) as markers:
        return dict(zip(tables, markers.map(of, tables.values())))


def judge(table: BuiltTable, outcome: Union[dict[str, str], DeltaLogError]) -> Optional[dict[str, str]]:
    """Candidates, or None when gc_assets refused because versions the state needs are gone."""
    if isinstance(outcome, DeltaLogError):
        assert "are no longer in the log" in str(outcome) and "refusing to collect" in str(outcome), outcome
        missing = MISSING.get(table.name, "0..5")
        assert f"versions {missing} " in str(outcome), outcome
        return None
    return outcome


def oldest_state_time(path: Path) -> dt.datetime:
    """When the oldest version the log can rebuild was written: its commit's timestamp, else the
    checkpoint file's modification time (read here from the files, not through the product)."""
    log = path / LOG
    version = json.loads((log / "_last_checkpoint").read_text())["version"]
    commit = log / f"{version:020d}.json"
    if commit.exists():
        millis = next(
            json.loads(line)["commitInfo"]["timestamp"]
            for line in commit.read_text().splitlines()
            if "commitInfo" in line
        )
        return dt.datetime.fromtimestamp(millis / 1000, tz=dt.timezone.utc)
    parts = [p for p in log.iterdir() if p.name.startswith(f"{version:020d}.checkpoint")]
    return dt.datetime.fromtimestamp(max(p.stat().st_mtime for p in parts), tz=dt.timezone.utc)


def state_at_cutoff_is_unknowable(table: BuiltTable, window: dt.timedelta, retention: dt.timedelta = WEEK) -> bool:
    """The cutoff is older than the oldest rebuildable state and than the checkpoint's tombstones."""
    cutoff = delta_tables.now_utc() - window
    return oldest_state_time(table.path) > cutoff and checkpoint_horizon(table.path, retention) > cutoff


@pytest.mark.parametrize("shape", list(TRUNCATIONS))
def test_truncated_logs_keep_what_delta_rs_keeps(tables, judged_by_hours, shape):
    table = tables[shape]
    assert not (table.path / LOG / f"{5:020d}.json").exists()
    agreed = refused = 0
    for hours, outcome in zip(HOURS, judged_by_hours[shape], strict=True):
        window = dt.timedelta(hours=hours)
        expected = delta_tables.vacuum_candidates(table, window)
        ours = judge(table, outcome)
        if ours is None:
            assert state_at_cutoff_is_unknowable(table, window), (shape, hours)
            refused += 1
        else:
            assert set(ours) == expected, (shape, hours)
            agreed += 1
    # The report's case: a week's window keeps B and C, which only the checkpoint's tombstones name.
    kept = delta_tables.vacuum_candidates(table, WEEK)
    assert len(delta_tables.vacuum_candidates(table, dt.timedelta(hours=1)) - kept) == 2
    assert (agreed, refused) == (2, 1)


def test_a_delete_run_removes_only_what_delta_rs_full_vacuum_removes(spark, tmp_path):
    """The report: a delete run with the table's own retention (7 days) on a cleaned-up log."""
    path = tmp_path / "orders"
    history(path)
    classic(path)
    expected = delta_tables.vacuum_candidates(BuiltTable("orders", path), WEEK)
    before = BuiltTable("orders", path).files()
    config = write_config(
        tmp_path / "gc.yaml",
        [{"name": "orders", "format": "delta", "storage_namespace": path.as_uri(), "max_delete_fraction": 1.0}],
        tmp_path / "state",
    )
    from dagster import DagsterInstance

    outcome = run_partition(
        str(config),
        "orders",
        dt.datetime.now(dt.timezone.utc).date(),
        mode="delete",
        instance=DagsterInstance.ephemeral(),
    )

    assert outcome.success, outcome.error
    assert before - BuiltTable("orders", path).files() == expected and len(expected) == 1
    assert DeltaTable(str(path)).version() == 7


def test_a_window_longer_than_the_checkpoints_tombstones_is_refused_naming_the_versions(spark, tables):
    table = tables["multipart"]
    frames = TableFrames(spark, table)
    with pytest.raises(DeltaLogError, match=r"versions 0\.\.5 are no longer in the log.*older than checkpoint 6"):
        our_candidates(spark, table, frames, dt.timedelta(days=10))


OPERATIONS = st.lists(
    st.sampled_from(["append", "append", "delete_oldest", "delete_newest", "overwrite"]), min_size=3, max_size=7
)


@dataclass(frozen=True)
class RandomHistory:
    """A random history, where its log is cut (a checkpoint, and every commit before it), and the window judged."""

    operations: tuple[str, ...]
    checkpoint_at: float
    drop_checkpoint_commit: bool
    retention_days: int
    window_days: float


RANDOM_HISTORIES = st.builds(
    RandomHistory,
    operations=OPERATIONS.map(tuple),
    checkpoint_at=st.floats(0.2, 1.0),
    drop_checkpoint_commit=st.booleans(),
    retention_days=st.sampled_from([4, 7, 14]),
    window_days=st.sampled_from([0.25, 2.5, 5.5, 8.5, 11.5, 16.5]),
)


@dataclass(frozen=True)
class Judged:
    """One truncated history: delta-rs's candidates, and gc_assets's or its refusal."""

    checkpoint: int  # the version the log now starts at
    expected: set[str]
    ours: Optional[set[str]]
    refusal: Optional[str]
    unknowable: bool  # state_at_cutoff_is_unknowable


def random_history(path: Path, operations: Sequence[str], retention_days: int) -> None:
    write_deltalake(
        path, _rows(0, 2), configuration={"delta.deletedFileRetentionDuration": f"interval {retention_days} days"}
    )
    ids, next_id = [0, 1], 10  # what the table holds, kept here rather than read back
    for operation in operations:
        if operation == "append" or not ids:
            write_deltalake(path, _rows(next_id, 2), mode="append")
            ids += [next_id, next_id + 1]
        elif operation == "overwrite":
            write_deltalake(path, _rows(next_id, 2), mode="overwrite")
            ids = [next_id, next_id + 1]
        else:
            victim = ids[0] if operation == "delete_oldest" else ids[-1]
            DeltaTable(path).delete(f"id = {victim}")
            ids.remove(victim)
        next_id += 10
    delta_tables.shift_history(path, delta_tables.now_utc())


def truncated_random_history(path: Path, case: RandomHistory) -> int:
    """Write the history, checkpoint it and drop the commits before; the checkpoint's version."""
    random_history(path, case.operations, case.retention_days)
    head = DeltaTable(path).version()
    version = max(1, min(head, round(case.checkpoint_at * head)))
    DeltaTable(path, version=version).create_checkpoint()
    drop_commits(path, range(version + (1 if case.drop_checkpoint_commit and version < head else 0)))
    return version


def judged_in_one_fleet(spark, cases: Sequence[RandomHistory]) -> list[Judged]:
    """Every case a table of one fleet mark (its window the retention, the minimum age of every
    object, tracked or not), its candidates beside delta-rs's full vacuum."""
    root = Path(tempfile.mkdtemp(prefix="delta_random_"))
    try:
        tables = [BuiltTable(f"h{i:03d}", root / f"h{i:03d}") for i in range(len(cases))]
        # delta-rs writes outside the interpreter's lock: the tables are written side by side.
        with ThreadPoolExecutor(4) as writers:
            versions = list(writers.map(truncated_random_history, [t.path for t in tables], cases))
        repos = [
            {
                "name": table.name,
                "format": "delta",
                "storage_namespace": table.uri,
                "rules": {"default_retention_days": case.window_days},
                "allow_unsafe_retention": True,
                "min_object_age_hours": case.window_days * 24,
                "untracked_min_age_hours": case.window_days * 24,
                "allow_unsafe_min_age": True,
            }
            for table, case in zip(tables, cases)
        ]
        lake = load_config(write_config(root / "gc.yaml", repos, root / "state"))
        as_of = delta_tables.now_utc()
        fleet = mark_tables(spark, lake.repositories, as_of)
        stores = {name: LocalStore(table.repo.storage_namespace) for name, table in fleet.tables.items()}
        no_holds = spark.createDataFrame([], "repo string, address string")
        decided = candidates_of(spark, lake, fleet, as_of, as_of, list_many(spark, stores), no_holds, list(fleet.repos))
        found: dict[str, set[str]] = {name: set() for name in fleet.tables}
        for row in decided.frame.collect():
            found[row[REPO]].add(row["address"])
        refused = {**fleet.refused, **decided.refused}
        return [
            Judged(
                version,
                delta_tables.vacuum_candidates(table, dt.timedelta(days=case.window_days)),
                found.get(table.name),
                refused.get(table.name),
                state_at_cutoff_is_unknowable(
                    table, dt.timedelta(days=case.window_days), dt.timedelta(days=case.retention_days)
                ),
            )
            for table, case, version in zip(tables, cases, versions)
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_random_histories_truncated_anywhere_agree_with_delta_rs(spark):
    def check(case: RandomHistory, judged: Judged) -> None:
        if judged.refusal is not None:
            missing = "0" if judged.checkpoint == 1 else f"0..{judged.checkpoint - 1}"
            assert f"versions {missing} are no longer in the log" in judged.refusal, judged.refusal
            assert judged.unknowable, judged.refusal
        else:
            assert judged.ours == judged.expected, (case, judged.checkpoint)

    check_in_one_job(RANDOM_HISTORIES, lambda cases: judged_in_one_fleet(spark, cases), check)


def test_a_tombstone_without_a_deletion_time_keeps_its_file_when_the_state_is_gone(spark, tmp_path):
    """deletionTimestamp is optional in the protocol: when the state at the cutoff is gone, a
    tombstone that does not say when it was removed may be inside the window, and keeps its
    file. delta-rs reads no time as expired and collects them: the one difference by design."""
    path = tmp_path / "t"
    history(path)
    classic(path)
    checkpoint = path / LOG / f"{6:020d}.checkpoint.parquet"
    rows = pq.read_table(checkpoint).to_pylist()
    undated = {r["remove"]["path"] for r in rows if r.get("remove")}
    for row in rows:
        if row.get("remove"):
            row["remove"]["deletionTimestamp"] = None
    written = checkpoint.stat().st_mtime
    pq.write_table(pa.Table.from_pylist(rows, pq.read_schema(checkpoint)), checkpoint)
    os.utime(checkpoint, (written, written))
    table = BuiltTable("t", path)
    ours = our_candidates(spark, table, TableFrames(spark, table), WEEK)
    assert len(undated) == 2 and not undated & set(ours)
    assert undated <= delta_tables.vacuum_candidates(table, WEEK)


def test_missing_versions_are_named_as_ranges():
    from gc_assets.sources.delta import missing_versions

    names = [0, 1, 2, 5, 8, 9, 10, 11]
    uris = [f"file:///t/_delta_log/{v:020d}.json" for v in names] + [
        "file:///t/_delta_log/00000000000000000009.checkpoint.parquet"
    ]
    listing = classify("file:///t/_delta_log", uris)
    assert (listing.start, listing.head) == (9, 11)
    assert missing_versions(listing) == "3..4, 6..7"
    cleaned = classify(
        "file:///t/_delta_log", [u for u in uris if u.endswith(("09.json", "10.json", "11.json", ".parquet"))]
    )
    assert missing_versions(cleaned) == "0..8"
