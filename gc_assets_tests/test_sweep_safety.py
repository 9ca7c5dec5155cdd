"""The sweep: trash and restore, purge, re-validation, deferred deletion, the lease and
crash recovery after SIGKILL. Every test compares storage with what the rules allow.

One lake is marked (and trashed) once for the module; a test that sweeps that mark puts the
lake back as saved and re-executes deletion_receipts alone (gc_assets_tests.marked_lakes)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import AssetKey, DagsterInstance
from hypothesis import given, settings
from hypothesis import strategies as st

from gc_assets import cli
from gc_assets.core.split_parquet import SPARK_SCHEMA_KEY
from gc_assets.demo.lakegen import export_tables, write_export, write_objects
from gc_assets.stores.base import DELETE_BATCH_SIZE
from gc_assets.stores.local import LocalStore
from gc_assets.sweep import lease
from gc_assets_tests.cli_runs import summary_of
from gc_assets_tests.lakes import AS_OF, GC_DATE, lake_on_disk
from gc_assets_tests.lease_race import race_rounds
from gc_assets_tests.marked_lakes import (  # noqa: F401 - the fixtures
    MARKED,
    TRASHED,
    expected_of,
    mark,
    namespace_snapshot,
    saved,
    trashed,
    whole_run,
)
from gc_assets_tests.sweep_runs import (
    SWEEP_CHUNK_OBJECTS,
    a_chunk_journaled,
    instance_after_kill,
    receipts_of,
    receipts_only,
    run_killed_after_first_chunk,
)

# The deletion paths' steps split their rows, as a cluster's do (conftest.rows_split_in_two).
pytestmark = pytest.mark.usefixtures("rows_split_in_two")


def _receipts(outcome) -> list[dict]:
    return pq.read_table(outcome.summary["outputs"]["deletion_receipts"]).to_pylist()


def test_trash_moves_candidates_and_restore_puts_them_back_byte_for_byte(saved, trashed, capsys):
    lake = saved.restore(TRASHED)
    before, outcome = trashed.before, trashed.outcome
    expected = expected_of(lake)
    run_id = outcome.summary["run_id"]
    assert outcome.summary["receipts"] == {"trashed": len(expected)}
    after = namespace_snapshot(lake.namespace)
    trash = f"_gc_trash/{run_id}/"
    assert {k for k in after if not k.startswith(trash)} == set(before) - expected
    assert {k[len(trash) :]: v for k, v in after.items() if k.startswith(trash)} == {k: before[k] for k in expected}

    assert cli.main(["restore", "--config", str(lake.config_path), "--repo", lake.lake.name, "--run-id", run_id]) == 0
    summary = summary_of(capsys.readouterr().out)
    assert summary["receipts"] == {"restored": len(expected)}
    assert namespace_snapshot(lake.namespace) == before
    assert not (lake.namespace / "_gc" / "trash" / f"{run_id}.json").exists()


def test_restore_never_overwrites_an_object_written_since(saved, trashed, capsys):
    lake = saved.restore(TRASHED)
    run_id = trashed.outcome.summary["run_id"]
    victim = sorted(expected_of(lake))[0]
    (lake.namespace / victim).write_text("new data at the old address")
    assert cli.main(["restore", "--config", str(lake.config_path), "--repo", lake.lake.name, "--run-id", run_id]) == 1
    summary = summary_of(capsys.readouterr().out)
    assert summary["failed"] == [victim]
    assert (lake.namespace / victim).read_text() == "new data at the old address"
    assert (lake.namespace / f"_gc_trash/{run_id}/{victim}").exists()


def test_later_run_purges_expired_trash(saved, trashed):
    lake = saved.restore(TRASHED, trash_retention_days=0)
    trash_run = trashed.outcome.summary["run_id"]
    second = whole_run(lake, "delete")
    assert second.success, second.error
    purged = {r["address"] for r in _receipts(second) if r["action"] == "purged"}
    assert purged == {f"_gc_trash/{trash_run}/{k}" for k in expected_of(lake)}
    assert not any(k.startswith("_gc_trash/") for k in namespace_snapshot(lake.namespace))
    assert second.summary["checks"]["receipts_cover_candidates"] == "passed"


def test_commit_between_mark_and_sweep_revives_objects(saved):
    """A commit made after the mark references an expired object again (a revert): it is skipped."""
    lake = saved.restore(MARKED)
    expected = expected_of(lake)
    expired = sorted(
        k for k in expected if any(k == a for c in lake.lake.commits.values() for a, _ in c.entries.values())
    )
    revived, branch_revived = expired[0], expired[1]
    at = dt.datetime(2022, 3, 31, 18, tzinfo=dt.timezone.utc)
    lake.lake.commit("main", at, {"reverted/file": (revived, 1)})
    old_commit = next(c for c in lake.lake.commits.values() if any(a == branch_revived for a, _ in c.entries.values()))
    lake.lake.branches["restored-branch"] = old_commit.commit_id  # a branch created from an old commit
    _rewrite_export(lake)
    before = namespace_snapshot(lake.namespace)

    outcome = saved.sweep("delete")
    assert outcome.success, outcome.error
    receipts = {r["address"]: r["action"] for r in _receipts(outcome)}
    assert receipts[revived] == "skipped_revived" and receipts[branch_revived] == "skipped_revived"
    assert set(namespace_snapshot(lake.namespace)) == set(before) - (expected - {revived, branch_revived})


def test_deferred_deletion_waits_for_a_second_sighting(saved):
    lake = saved.restore(MARKED, confirm_days=3)
    earlier = mark(lake, DagsterInstance.ephemeral(), GC_DATE - dt.timedelta(days=3))
    assert earlier.success, earlier.error
    earlier_candidates = {
        r["address"] for r in pq.read_table(earlier.summary["outputs"]["orphan_candidates"]).to_pylist()
    }
    outcome = saved.sweep("delete")
    assert outcome.success, outcome.error
    receipts = {r["address"]: (r["action"], r["error"]) for r in _receipts(outcome)}
    now_candidates = expected_of(lake)
    confirmed = now_candidates & earlier_candidates
    assert confirmed and now_candidates - earlier_candidates
    assert {a for a, (action, _) in receipts.items() if action == "deleted"} == confirmed
    assert all(
        receipts[a][0] == "would_delete" and "unconfirmed" in receipts[a][1]
        for a in now_candidates - earlier_candidates
    )
    assert all((lake.namespace / a).exists() for a in now_candidates - earlier_candidates)


def test_a_held_lease_refuses_the_sweep_and_an_expired_one_is_taken_over(saved):
    lake = saved.restore(MARKED)
    store = LocalStore(lake.namespace_uri)
    now = dt.datetime.now(dt.timezone.utc)
    held = lease.acquire(store, "other-instance-run", "elsewhere", now)
    before = namespace_snapshot(lake.namespace)
    outcome = saved.sweep("delete")
    assert not outcome.success and "another sweep holds the lease" in outcome.error
    assert namespace_snapshot(lake.namespace) == before
    lease.release(store, held)
    # a sweep that crashed on another machine: its pid means nothing here, its expiry does
    stale = lease.Lease(
        held.token + 1,
        "crashed-run",
        "x",
        "some-other-host",
        "other-boot",
        1,
        (now - dt.timedelta(minutes=1)).isoformat(),
    )
    assert store.write_text(stale.key, json.dumps(stale.__dict__), exclusive=True)
    outcome = saved.sweep("delete")
    assert outcome.success, outcome.error
    assert lease.newest(store) is None and store.keys(lease.LEASE_PREFIX) == []  # taken over, then released


def _everything(root: Path) -> dict[str, tuple[str, int]]:
    """key -> (sha256, mtime_ns) of every regular file, the product's own records included."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def test_sigkill_mid_sweep_then_rerun_tells_the_truth_and_a_finished_sweep_is_not_redone(tmp_path, spark):
    """A kill -9 between two chunks of a delete, then a rerun: one receipt per candidate, the
    killed run's own told as its own, and a rerun of the finished sweep writes nothing. (Trash
    under a kill, where a move is a copy and a delete, is test_s3_gc's.)"""
    lake = _lake_with_untracked(tmp_path, 4 * SWEEP_CHUNK_OBJECTS)  # at least four chunks: killed between two
    expected = expected_of(lake)
    before = set(namespace_snapshot(lake.namespace))
    arguments = [
        "--config",
        str(lake.config_path),
        "--repo",
        lake.lake.name,
        "--date",
        GC_DATE.isoformat(),
        "--mode",
        "delete",
    ]
    # `run --repo` sweeps a set of one: its chunks are journaled in the set's journal, which the
    # re-execution of the partition's own sweep below reads as its own (sweep.journal).
    journal = lake.config_path.parent / "state" / "_sweeps"
    home = run_killed_after_first_chunk(tmp_path, arguments, lambda: a_chunk_journaled(journal, "set"))
    remaining = set(namespace_snapshot(lake.namespace))
    assert before - expected <= remaining  # nothing live lost
    assert remaining & expected  # killed mid-way: some candidates still there

    with instance_after_kill(home, lake.config_path) as instance:
        result = receipts_only(lake.config_path, lake.lake.name, AS_OF, instance, "delete")  # re-execute from failure
        assert result.success
        receipts = receipts_of(result)
        after_rerun = _everything(lake.namespace)
        again = receipts_only(lake.config_path, lake.lake.name, AS_OF, instance, "delete")  # the finished sweep again
    assert [r["address"] for r in receipts] == sorted(expected)  # exactly one receipt per candidate
    runs = {r["run_id"] for r in receipts}
    assert len(runs) == 2  # the killed run's work is told as its own, the rerun did the rest
    assert {r["action"] for r in receipts} == {"deleted"}
    assert set(namespace_snapshot(lake.namespace)) == before - expected
    assert again.success and receipts_of(again) == receipts
    assert _everything(lake.namespace) == after_rerun  # not one write: no lease, no move, no record


def _lake_with_untracked(tmp_path, count: int):
    """The docs example without churn plus `count` untracked uploads: that many more candidates."""
    lake = lake_on_disk(tmp_path, churn=0, max_delete_fraction=1.0)
    for _ in range(count):
        lake.lake.upload_untracked(dt.datetime(2022, 3, 1, tzinfo=dt.timezone.utc))
    write_objects(lake.lake, lake.namespace)
    return lake


def _as_written_before_rows_named_their_repository(journal: Path, repo: str) -> None:
    """One repository's sweep journal as the version before every row named its repository kept
    it: frames without `repo`, the finished sweep's metadata not keyed by the repository."""
    for part in journal.rglob("*.parquet"):
        table = pq.read_table(part)
        footer = dict(table.schema.metadata or {})
        if SPARK_SCHEMA_KEY in footer:
            spark_schema = json.loads(footer[SPARK_SCHEMA_KEY])
            spark_schema["fields"] = [f for f in spark_schema["fields"] if f["name"] != "repo"]
            footer[SPARK_SCHEMA_KEY] = json.dumps(spark_schema).encode()
        table = table.drop_columns([c for c in table.column_names if c == "repo"])
        pq.write_table(table.replace_schema_metadata(footer), part, use_deprecated_int96_timestamps=True)
        part.with_name(f".{part.name}.crc").unlink(missing_ok=True)  # Spark's checksum of the file it wrote
    metadata = journal / "metadata.json"
    if metadata.exists():
        metadata.write_text(json.dumps(json.loads(metadata.read_text())[repo]))


def test_a_repositorys_journal_kept_by_the_version_before_is_read_as_its_own(saved, trashed):
    """After an upgrade, the sweep of a mark swept by the version before reads that sweep's journal:
    the finished sweep's receipts come back as they were, and a sweep killed after its chunks
    takes them as done. Neither acts again, nor tells the objects it moved as absent."""
    trash_run = trashed.outcome.summary["run_id"]
    for finished in (True, False):
        lake = saved.restore(TRASHED)
        (journal,) = (lake.config_path.parent / "state" / "_sweeps").glob(f"repo={lake.lake.name}/date=*/mark=*")
        _as_written_before_rows_named_their_repository(journal, lake.lake.name)
        if not finished:  # killed once every chunk was journaled, before the receipts
            shutil.rmtree(journal / "receipts")
            (journal / "metadata.json").unlink()
        before = namespace_snapshot(lake.namespace)
        again = saved.sweep("trash")
        assert again.success, again.error
        receipts = _receipts(again)
        assert sorted(r["address"] for r in receipts) == sorted(expected_of(lake)), finished
        assert {(r["action"], r["run_id"]) for r in receipts} == {("trashed", trash_run)}, finished
        assert namespace_snapshot(lake.namespace) == before, finished
        (latest,) = saved.instance.fetch_materializations(AssetKey("deletion_receipts"), limit=1).records
        told = latest.asset_materialization.metadata.get("rerun_of_finished_sweep")
        assert (told is not None and told.value) is finished  # the finished sweep is known as such


def _journaled(lake) -> set[str]:
    """Addresses of every chunk the sweeps of this lake journaled."""
    return {
        r["address"]
        for p in (lake.config_path.parent / "state" / "_sweeps").rglob("chunk-*/*.parquet")
        for r in pq.read_table(p).to_pylist()
    }


def _rewrite_export(lake) -> None:
    export = lake.namespace / "_lakefs" / "export"
    for dataset in export.iterdir():
        if dataset.is_dir():
            for part in dataset.iterdir():
                part.unlink()
    write_export(export_tables(lake.lake), export, exported_at=dt.datetime.now(dt.timezone.utc))


def test_a_commit_between_two_chunks_revives_a_candidate_not_yet_acted_on(saved, monkeypatch):
    """Re-validation runs before every chunk once the repository's fingerprint moves."""
    from gc_assets.sweep import sweeper

    lake = saved.restore(MARKED)
    expected = expected_of(lake)
    monkeypatch.setenv(sweeper.CHUNK_OBJECTS_ENV, str(len(expected) // 4))  # several chunks
    revived: list[str] = []
    real_check = lease.Heartbeats.lost_lease

    def commit_before_the_second_chunk(self, name):
        lost = real_check(self, name)
        done = _journaled(lake)
        if done and not revived:  # one chunk acted: a writer commits an object not yet deleted
            revived.append(sorted(expected - done)[0])
            lake.lake.commit(
                "main", dt.datetime(2022, 3, 31, 18, tzinfo=dt.timezone.utc), {"revived/file": (revived[0], 1)}
            )
            _rewrite_export(lake)
        return lost

    monkeypatch.setattr(lease.Heartbeats, "lost_lease", commit_before_the_second_chunk)
    outcome = saved.sweep("delete")
    assert outcome.success, outcome.error
    receipts = {r["address"]: r["action"] for r in _receipts(outcome)}
    assert revived and receipts[revived[0]] == "skipped_revived"
    assert (lake.namespace / revived[0]).is_file()
    assert {a for a, action in receipts.items() if action == "deleted"} == expected - set(revived)
    assert outcome.summary["checks"]["receipts_cover_candidates"] == "passed"


def test_purge_never_purges_a_trashed_object_that_is_needed_again(saved, trashed):
    """A held address (as after an operator marked it needed) stays in the trash, with its run's record."""
    from gc_assets.core.state import TRASH_RUNS_PREFIX
    from gc_assets.sweep.holds import record_hold

    lake = saved.restore(TRASHED, trash_retention_days=0)
    run_id = trashed.outcome.summary["run_id"]
    trashed_keys = sorted(expected_of(lake))
    needed = trashed_keys[0]
    store = LocalStore(lake.namespace_uri)
    record_hold(store, "operator", [needed], dt.datetime.now(dt.timezone.utc))
    second = whole_run(lake, "delete")
    assert second.success, (second.error, {k: v for k, v in second.summary["checks"].items() if v != "passed"})
    receipts = {r["address"]: r for r in _receipts(second)}
    kept = receipts[f"_gc_trash/{run_id}/{needed}"]
    assert kept["action"] == "skipped_revived" and f"--run-id {run_id}" in kept["error"]
    assert (lake.namespace / "_gc_trash" / run_id / needed).is_file()
    purged = {a for a, r in receipts.items() if r["action"] == "purged"}
    assert purged == {f"_gc_trash/{run_id}/{k}" for k in trashed_keys[1:]}
    assert store.read_text(f"{TRASH_RUNS_PREFIX}{run_id}.json") is not None  # still restorable


def test_a_sweep_whose_lease_was_taken_over_stops_before_its_next_chunk(saved, monkeypatch):
    from gc_assets.sweep import sweeper

    lake = saved.restore(MARKED)
    expected = expected_of(lake)
    monkeypatch.setenv(sweeper.CHUNK_OBJECTS_ENV, str(len(expected) // 4))
    store = LocalStore(lake.namespace_uri)
    real_check = lease.Heartbeats.lost_lease

    def taken_over_after_one_chunk(self, name):
        held = self.leases[name]
        if _journaled(lake) and lease.newest(store).token == held.token:
            now = dt.datetime.now(dt.timezone.utc)
            usurper = dataclasses.replace(
                held, token=held.token + 1, run_id="usurper", expires_at=(now + lease.LEASE_DURATION).isoformat()
            )
            assert store.write_text(usurper.key, json.dumps(dataclasses.asdict(usurper)), exclusive=True)
        return real_check(self, name)

    monkeypatch.setattr(lease.Heartbeats, "lost_lease", taken_over_after_one_chunk)
    outcome = saved.sweep("delete")
    assert not outcome.success and "was taken over" in outcome.error
    done = _journaled(lake)
    assert done and done < expected  # one chunk acted, then nothing more
    assert {k for k in expected if not (lake.namespace / k).exists()} == done
    assert lease.newest(store).run_id == "usurper"  # left to its holder


def test_sweeps_started_at_once_from_several_processes_exactly_one_gets_the_lease(tmp_path):
    race_rounds(tmp_path.as_uri(), rounds=5)


def test_the_chunk_size_is_four_store_batches_per_task_unless_set_and_a_bad_setting_is_refused(monkeypatch):
    from gc_assets.sweep.sweeper import CHUNK_OBJECTS_ENV, chunk_objects

    monkeypatch.delenv(CHUNK_OBJECTS_ENV, raising=False)
    assert chunk_objects(3) == 3 * 4 * DELETE_BATCH_SIZE
    monkeypatch.setenv(CHUNK_OBJECTS_ENV, "")
    assert chunk_objects(3) == 3 * 4 * DELETE_BATCH_SIZE
    monkeypatch.setenv(CHUNK_OBJECTS_ENV, "250")
    assert chunk_objects(4) == 250
    for bad in ("0", "-3", "1.5", "ten"):
        monkeypatch.setenv(CHUNK_OBJECTS_ENV, bad)
        with pytest.raises(ValueError, match=f"{CHUNK_OBJECTS_ENV}='{re.escape(bad)}'"):
            chunk_objects(4)


@settings(max_examples=300, deadline=None)
@given(
    counts=st.dictionaries(st.text("abcdef", min_size=1, max_size=3), st.integers(1, 50), max_size=12),
    size=st.integers(1, 20),
)
def test_a_sets_chunks_cover_every_repository_once_and_hold_about_a_chunk_each(counts, size):
    """sweep.set_sweep.packed: every repository's objects fall in exactly one chunk each (a large
    one cut into equal pieces, every piece once), and no chunk holds more than `size` objects
    unless one piece alone does (a piece is at most `size`)."""
    from gc_assets.sweep.set_sweep import packed

    chunks = packed(counts, size)
    pieces = [share for chunk in chunks for share in chunk]
    assert sorted(pieces) == sorted((repo, n, piece) for repo, n, piece in pieces)
    for repo, count in counts.items():
        mine = sorted(piece for name, n, piece in pieces if name == repo)
        (n,) = {n for name, n, _ in pieces if name == repo}
        assert mine == list(range(n)) and -(-count // n) <= size
    for chunk in chunks:
        held = sum(-(-counts[repo] // n) for repo, n, _ in chunk)
        assert held <= size or len(chunk) == 1


def test_a_bad_chunk_setting_refuses_the_sweep_before_it_takes_the_lease_or_writes(saved, monkeypatch):
    from gc_assets.sweep.sweeper import CHUNK_OBJECTS_ENV

    lake = saved.restore(MARKED)
    before = _everything(lake.namespace)
    monkeypatch.setenv(CHUNK_OBJECTS_ENV, "0")
    outcome = saved.sweep("trash")
    assert not outcome.success and f"{CHUNK_OBJECTS_ENV}='0'" in str(outcome.error)
    assert _everything(lake.namespace) == before  # no lease, no trash record, nothing moved
