"""Delta tables trashed and deleted together in one fleet_job run, as one set (sweep.set_sweep):
each table swept in its own mode under its own lease and its rows of the set's journal, exactly
delta-rs's candidates removed, restore by the fleet run's id; a table whose lease another sweep
holds or takes over, that another run is at work on, that a restore holds a candidate of, whose
storage fails mid-sweep, whose log cannot be read again before its next chunk or whose as-of
lies in the future stops alone, and the next run
finishes it; a table unchanged since the mark is not read again, one changed is and keeps what
it needs; confirm_days and the purge of expired trash hold per table in shared chunks; a fleet
killed with SIGKILL mid-sweep resumes every table exactly, on disk and on a versioned S3 bucket.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, DagsterRun, DagsterRunStatus
from deltalake import DeltaTable
from pyspark.sql import functions as F

from gc_assets.core.config import load_config
from gc_assets.core.names import Mode
from gc_assets.core.state import LEASE_PREFIX, TRASH_PREFIX, sweep_set_journal_at
from gc_assets.defs.concurrency import REPOSITORY_TAG
from gc_assets.defs.partitions import partition_key
from gc_assets.mark.partition import GcPartition
from gc_assets.runner import run_partitions, stored_table
from gc_assets.stores.local import LocalStore
from gc_assets.stores.state import LocalState
from gc_assets.sweep import lease, set_sweep, together
from gc_assets.sweep.holds import record_hold
from gc_assets.sweep.sweeper import CHUNK_OBJECTS_ENV
from gc_assets.sweep.trash import restore
from gc_assets_tests import delta_tables
from gc_assets_tests.lakes import write_config
from gc_assets_tests.s3_server import FAKE_CREDENTIALS, s3, s3_versions  # noqa: F401 - the fixtures
from gc_assets_tests.sweep_runs import a_chunk_journaled, instance_after_kill, run_killed_after_first_chunk, sweep_only
from gc_assets_tests.test_fleet_dry_run import BUILDERS, WINDOW, _expected, _lake, _stored

# The deletion paths' steps split their rows, as a cluster's do (conftest.rows_split_in_two).
pytestmark = pytest.mark.usefixtures("rows_split_in_two")


def _commit_adding_again(table: Path, address: str) -> None:
    """A commit that adds `address` back as it was first added (a restore of an old file)."""
    lines = delta_tables.log_lines(table)
    (added,) = {
        json.dumps(action)
        for actions in lines.values()
        for action in actions
        if "add" in action and unquote(action["add"]["path"]) == address
    }
    (table / "_delta_log" / f"{max(lines) + 1:020d}.json").write_text(added + "\n")


def test_a_fleet_that_trashes_and_deletes_collects_its_tables_in_one_run_each_under_its_own_lease(
    tmp_path, spark, monkeypatch
):
    """Tables whose modes touch storage go together too: one fleet_job run marks and judges them
    in one set of Spark jobs, then sweeps each in its own mode (one trashes, two delete) under
    its own lease and journal, as its own run would; no run of its own is launched for any. A
    table's own sweep of that mark afterwards (deletion_receipts alone) finds the set finished it:
    the same receipts, storage untouched.
    Each removes exactly delta-rs's candidates, every file at each head stays and the tables
    still read; the trashed table comes back whole from the fleet run's trash. A table whose
    lease a live sweep holds is refused, named, its storage untouched: the others go on. A
    table that nobody changed since the mark is not read again; one that a commit re-adding a
    candidate changed between the mark and its sweep is, and that candidate is kept."""
    now = delta_tables.now_utc()
    modes = {
        "c0/merges": ("trash", "trashed"),
        "c0/deletes_and_updates": ("delete", "deleted"),
        "c0/appends_and_overwrites": ("delete", "deleted"),
    }
    path, tables = _lake(tmp_path, now, **{name: {"mode": m} for name, (m, _) in modes.items()})
    expected = {name: _expected(table) for name, table in tables.items()}
    held = tables["c0/appends_and_overwrites"]
    lease.acquire(LocalStore(held.path.as_uri()), "another-sweep", f"{now.date()}|{held.name}", now)
    before_held = sorted(p for p in held.path.rglob("*") if p.is_file())
    changed = tables["c0/deletes_and_updates"]
    revived = sorted(expected["c0/deletes_and_updates"])[0]
    sweep_set = together.sweep_set

    def committed_first(*arguments):
        _commit_adding_again(changed.path, revived)  # after the mark: the sweep must see it
        return sweep_set(*arguments)

    monkeypatch.setattr(together, "sweep_set", committed_first)
    instance = DagsterInstance.ephemeral()

    outcomes = {
        o.summary["repo"]: o for o in run_partitions(load_config(path), list(tables), now.date(), instance=instance)
    }

    (fleet,) = instance.get_runs()
    assert fleet.job_name == "fleet_job" and not fleet.is_success
    refused = outcomes.pop("c0/appends_and_overwrites")
    assert not refused.success and "another sweep holds the lease" in refused.error and "another-sweep" in refused.error
    assert sorted(p for p in held.path.rglob("*") if p.is_file()) == before_held, "its storage untouched"
    lake = load_config(path)
    kept = {"c0/deletes_and_updates": {revived}}
    for name, outcome in outcomes.items():
        table, (mode, action) = tables[name], modes[name]
        summary, gone, skipped = outcome.summary, expected[name] - kept.get(name, set()), kept.get(name, set())
        assert outcome.success and summary["mode"] == mode and summary["run_id"] == fleet.run_id, summary
        assert summary["receipts"] == {action: len(gone), **({"skipped_revived": 1} if skipped else {})}, summary
        assert set(summary["checks"].values()) == {"passed"}, summary["checks"]
        receipts = _stored(path, "deletion_receipts", now.date(), name)
        assert {(row["address"], row["action"]) for row in receipts} == {(a, action) for a in gone} | {
            (a, "skipped_revived") for a in skipped
        }
        assert gone and all(not (table.path / address).exists() for address in gone), name
        assert all((table.path / address).exists() for address in skipped), name
        (record,) = instance.fetch_materializations(
            AssetRecordsFilter(
                asset_key=AssetKey("deletion_receipts"), asset_partitions=[partition_key(now.date(), name)]
            ),
            limit=1,
        ).records
        read_again = record.asset_materialization.metadata["revalidations"].value
        assert read_again == (1 if skipped else 0), (name, read_again)
        at_head = {Path(uri).relative_to(table.path).as_posix() for uri in DeltaTable(str(table.path)).file_uris()}
        assert at_head and all((table.path / address).exists() for address in at_head), name
        assert DeltaTable(str(table.path)).to_pyarrow_table().num_rows > 0
        journal = lake.state_path / sweep_set_journal_at(now.date(), fleet.run_id)
        assert name in json.loads((journal / "metadata.json").read_text()), "the set's journal names each table"
        assert not LocalStore(table.path.as_uri()).keys(LEASE_PREFIX), "each table's lease was released"

    trashed, finished = tables["c0/merges"], outcomes["c0/merges"]
    files = sorted(p for p in trashed.path.rglob("*") if p.is_file())
    as_of = dt.datetime.fromisoformat(finished.summary["as_of"])
    again = sweep_only(path, "c0/merges", as_of, instance, "trash")
    assert again.success and again.summary["receipts"] == finished.summary["receipts"], again.error
    assert sorted(p for p in trashed.path.rglob("*") if p.is_file()) == files, "the table's own sweep of the mark"
    assert all((trashed.path / TRASH_PREFIX / fleet.run_id / a).exists() for a in expected["c0/merges"])
    restored = restore(
        LocalStore(trashed.path.as_uri()),
        lake.repository("c0/merges"),
        fleet.run_id,
        LocalState(lake.state_path),
        lambda: spark,
    )
    assert restored.counts == {"restored": len(expected["c0/merges"])}
    assert all((trashed.path / address).exists() for address in expected["c0/merges"])


def test_a_fleet_sweep_that_dies_mid_way_stops_that_table_alone_and_the_next_run_finishes_it(
    tmp_path, spark, monkeypatch
):
    """Storage that fails after one object of a table was deleted ends that table's sweep with the
    error, named; the other table of the run is deleted whole. The next run (a new mark) acts only
    on what is left, and the table ends as delta-rs's vacuum leaves it, every head file in place."""
    now = delta_tables.now_utc()
    deleting = {name: {"mode": "delete"} for name in ("c0/merges", "c0/deletes_and_updates")}
    path, tables = _lake(tmp_path, now, builders=BUILDERS[:2], **deleting)
    expected = {name: _expected(table) for name, table in tables.items()}
    failing = tables["c0/merges"]
    delete_many = set_sweep.delete_many
    deleted_once = []

    def one_then_gone(spark, stores, candidates):
        if "c0/merges" not in stores:
            return delete_many(spark, stores, candidates)
        if not deleted_once:  # the table's first object goes, then its storage fails
            mine = candidates.filter(F.col("repo") == "c0/merges").limit(1)
            deleted_once.append(delete_many(spark, {"c0/merges": stores["c0/merges"]}, mine).collect())
        raise RuntimeError("storage went away")

    monkeypatch.setattr(set_sweep, "delete_many", one_then_gone)
    first = {o.summary["repo"]: o for o in run_partitions(load_config(path), list(tables), now.date())}
    monkeypatch.setattr(set_sweep, "delete_many", delete_many)

    assert not first["c0/merges"].success and "storage went away" in first["c0/merges"].error
    gone_first = {a for a in expected["c0/merges"] if not (failing.path / a).exists()}
    assert len(gone_first) == 1, gone_first
    healthy = tables["c0/deletes_and_updates"]
    assert first["c0/deletes_and_updates"].success
    assert not any((healthy.path / a).exists() for a in expected["c0/deletes_and_updates"])

    second = {o.summary["repo"]: o for o in run_partitions(load_config(path), list(tables), now.date())}

    assert second["c0/merges"].success, second["c0/merges"].error
    receipts = _stored(path, "deletion_receipts", now.date(), "c0/merges")
    assert {(r["address"], r["action"]) for r in receipts} == {
        (a, "deleted") for a in expected["c0/merges"] - gone_first
    }
    assert not any((failing.path / a).exists() for a in expected["c0/merges"])
    at_head = {Path(uri).relative_to(failing.path).as_posix() for uri in DeltaTable(str(failing.path)).file_uris()}
    assert at_head and all((failing.path / a).exists() for a in at_head)


def test_a_table_that_cannot_be_read_again_mid_sweep_stops_alone_and_the_others_are_swept_whole(
    tmp_path, spark, monkeypatch
):
    """A table whose log breaks after its first chunk acted: the re-validation before its next
    chunk cannot read it, so its sweep stops, named, with what it did on disk and no more; the
    other table of the set, re-validated in the same read, is deleted whole."""
    now = delta_tables.now_utc()
    deleting = {name: {"mode": "delete"} for name in ("c0/merges", "c0/deletes_and_updates")}
    path, tables = _lake(tmp_path, now, builders=BUILDERS[:2], **deleting)
    expected = {name: _expected(table) for name, table in tables.items()}
    monkeypatch.setenv(CHUNK_OBJECTS_ENV, "1")
    broken, healthy = tables["c0/deletes_and_updates"], tables["c0/merges"]
    journaled_act = set_sweep.SetSweep._journaled_act

    def its_log_broken_after_its_first_chunk(self, part, names, chunk_id):
        journaled_act(self, part, names, chunk_id)
        log = broken.path / "_delta_log"
        if "c0/deletes_and_updates" in names and not (log / "broken").exists():
            newest = max(int(p.stem) for p in log.glob("*.json"))
            (log / f"{newest + 1:020d}.json").write_text('{"add": {"path": \n')
            (log / "broken").touch()

    monkeypatch.setattr(set_sweep.SetSweep, "_journaled_act", its_log_broken_after_its_first_chunk)
    first = {o.summary["repo"]: o for o in run_partitions(load_config(path), list(tables), now.date())}

    stopped = first["c0/deletes_and_updates"]
    assert not stopped.success and "re-validation failed" in stopped.error, stopped.error
    gone = {a for a in expected["c0/deletes_and_updates"] if not (broken.path / a).exists()}
    assert len(gone) == 1 < len(expected["c0/deletes_and_updates"]), "its first chunk acted, then nothing more of it"
    assert first["c0/merges"].success, first["c0/merges"].error
    assert expected["c0/merges"] and not any((healthy.path / a).exists() for a in expected["c0/merges"])
    at_head = {Path(uri).relative_to(healthy.path).as_posix() for uri in DeltaTable(str(healthy.path)).file_uris()}
    assert at_head and all((healthy.path / a).exists() for a in at_head)


def test_a_fleet_that_would_delete_as_of_a_future_time_refuses_every_table_and_touches_nothing(tmp_path, spark):
    """As every sweep that touches storage: an as-of later than the wall clock is for dry runs only."""
    now = delta_tables.now_utc()
    deleting = {name: {"mode": "delete"} for name in ("c0/merges", "c0/deletes_and_updates")}
    path, tables = _lake(tmp_path, now, builders=BUILDERS[:2], **deleting)
    before = sorted(p for table in tables.values() for p in table.path.rglob("*") if p.is_file())
    future = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), dt.timezone.utc)  # day D's end

    outcomes = list(run_partitions(load_config(path), list(tables), now.date(), as_of=future))

    assert len(outcomes) == 2 and not any(o.success for o in outcomes)
    assert all("only allowed in dry_run" in o.error for o in outcomes), [o.error for o in outcomes]
    assert sorted(p for table in tables.values() for p in table.path.rglob("*") if p.is_file()) == before


def test_a_set_swept_in_small_chunks_keeps_each_tables_safety_its_own(tmp_path, spark, monkeypatch):
    """Six tables swept as one set in chunks of two objects, each chunk shared by several tables:
    one that another run is at work on is refused untouched, one with confirm_days defers every
    candidate (no earlier sighting), one that a restore holds
    a candidate of since the mark is refused untouched, one whose lease another sweep takes over
    after its first chunk stops before its next (what it did stays done and told), and the other
    two are trashed or deleted exactly as delta-rs would. The next run purges the expired
    trash of the trashed one, only that."""
    now = delta_tables.now_utc()
    options = {name: {"mode": "delete"} for name in ("c0/deletes_and_updates", "c0/appends_and_overwrites")}
    options["c0/merges"] = {"mode": "delete", "confirm_days": 1}
    options["c1/merges"] = {"mode": "trash", "trash_retention_days": 0}
    options |= {name: {"mode": "delete"} for name in ("c1/deletes_and_updates", "c1/appends_and_overwrites")}
    path, tables = _lake(tmp_path, now, copies=2, **options)
    expected = {name: _expected(table) for name, table in tables.items()}
    monkeypatch.setenv(CHUNK_OBJECTS_ENV, "2")
    held, usurped = tables["c0/deletes_and_updates"], tables["c0/appends_and_overwrites"]
    held_address = sorted(expected["c0/deletes_and_updates"])[0]
    sweep_set, journaled_act = together.sweep_set, set_sweep.SetSweep._journaled_act

    def restored_since_the_mark(*arguments):
        record_hold(LocalStore(held.path.as_uri()), "a-restore", [held_address], now)
        return sweep_set(*arguments)

    def taken_over_after_its_first_chunk(self, part, names, chunk_id):
        journaled_act(self, part, names, chunk_id)
        store = self.stores.get("c0/appends_and_overwrites")
        mine = lease.newest(store) if "c0/appends_and_overwrites" in names else None
        if mine is not None and mine.run_id == self.run_id:
            later = dt.datetime.now(dt.timezone.utc) + lease.LEASE_DURATION
            usurper = dataclasses.replace(mine, token=mine.token + 1, run_id="usurper", expires_at=later.isoformat())
            assert store.write_text(usurper.key, json.dumps(dataclasses.asdict(usurper)), exclusive=True)

    monkeypatch.setattr(together, "sweep_set", restored_since_the_mark)
    monkeypatch.setattr(set_sweep.SetSweep, "_journaled_act", taken_over_after_its_first_chunk)
    before = {name: sorted(p for p in table.path.rglob("*") if p.is_file()) for name, table in tables.items()}

    instance = DagsterInstance.ephemeral()
    busy = DagsterRun(job_name="gc_job", tags={REPOSITORY_TAG: "c1/appends_and_overwrites"})
    instance.add_run(busy.with_status(DagsterRunStatus.STARTED))
    first = {
        o.summary["repo"]: o for o in run_partitions(load_config(path), list(tables), now.date(), instance=instance)
    }

    assert not first["c1/appends_and_overwrites"].success and busy.run_id in first["c1/appends_and_overwrites"].error
    assert (
        sorted(p for p in tables["c1/appends_and_overwrites"].path.rglob("*") if p.is_file())
        == before["c1/appends_and_overwrites"]
    )
    refused = first["c0/deletes_and_updates"]
    assert not refused.success and "candidates_not_held" in refused.error, refused.error
    assert (
        sorted(p for p in held.path.rglob("*") if p.is_file() and "_gc" not in p.parts)
        == before["c0/deletes_and_updates"]
    )
    stopped = first["c0/appends_and_overwrites"]
    assert not stopped.success and "was taken over" in stopped.error, stopped.error
    gone = {a for a in expected["c0/appends_and_overwrites"] if not (usurped.path / a).exists()}
    assert gone and gone < expected["c0/appends_and_overwrites"], "one chunk acted, then nothing more of it"
    assert lease.newest(LocalStore(usurped.path.as_uri())).run_id == "usurper", "left to its holder"
    deferred = first["c0/merges"]
    assert deferred.success and deferred.summary["receipts"] == {"would_delete": len(expected["c0/merges"])}
    receipts = _stored(path, "deletion_receipts", now.date(), "c0/merges")
    assert all("unconfirmed" in row["error"] for row in receipts)
    assert all((tables["c0/merges"].path / a).exists() for a in expected["c0/merges"])
    run_id = first["c1/merges"].summary["run_id"]
    for name, action in (("c1/merges", "trashed"), ("c1/deletes_and_updates", "deleted")):
        assert first[name].success and first[name].summary["receipts"] == {action: len(expected[name])}
        assert not any((tables[name].path / a).exists() for a in expected[name])
        table = tables[name]
        at_head = {Path(uri).relative_to(table.path).as_posix() for uri in DeltaTable(str(table.path)).file_uris()}
        assert at_head and all((table.path / a).exists() for a in at_head), "every file the head reads stays"
    trashed = tables["c1/merges"]
    assert all((trashed.path / TRASH_PREFIX / run_id / a).exists() for a in expected["c1/merges"])
    for name in ("c0/merges", "c1/merges", "c1/deletes_and_updates"):
        assert not LocalStore(tables[name].path.as_uri()).keys(LEASE_PREFIX), "each lease released"

    monkeypatch.setattr(together, "sweep_set", sweep_set)
    monkeypatch.setattr(set_sweep.SetSweep, "_journaled_act", journaled_act)
    second = {o.summary["repo"]: o for o in run_partitions(load_config(path), list(tables), now.date())}

    assert second["c1/merges"].success and second["c1/merges"].summary["receipts"] == {
        "purged": len(expected["c1/merges"])
    }
    assert not any(p.is_file() for p in (trashed.path / TRASH_PREFIX / run_id).rglob("*")), "its trash purged"
    assert all(o.summary["receipts"].get("purged", 0) == 0 for name, o in second.items() if name != "c1/merges")


def _data_files(table: delta_tables.BuiltTable) -> set[str]:
    """The table's files, without the product's own records (its lease)."""
    files = (p.relative_to(table.path).as_posix() for p in table.path.rglob("*") if p.is_file())
    return {key for key in files if not key.startswith("_gc")}


def test_a_fleet_killed_mid_sweep_resumes_each_table_exactly(tmp_path):
    """A kill -9 of `run --all --mode delete` once the set journaled its first chunk (chunks of
    two objects, shared by the tables), then each table's sweep of that mark re-executed from
    failure (deletion_receipts alone): one receipt per delta-rs candidate, the killed run's
    deletions told as its own, every file at each head kept."""
    now = delta_tables.now_utc()
    path, tables = _lake(tmp_path, now, **{f"c0/{build.__name__}": {"mode": "delete"} for build in BUILDERS})
    expected = {name: _expected(table) for name, table in tables.items()}
    before = {name: _data_files(table) for name, table in tables.items()}
    arguments = ["--config", str(path), "--all", "--as-of", now.isoformat(), "--mode", "delete"]
    journal = tmp_path / "state" / "_sweeps"
    home = run_killed_after_first_chunk(
        tmp_path, arguments, journaled=lambda: a_chunk_journaled(journal, "set"), chunk_objects=2
    )
    remaining = {name: _data_files(table) for name, table in tables.items()}
    assert all(before[name] - expected[name] <= remaining[name] for name in tables), "nothing live lost"
    assert any(remaining[name] & expected[name] for name in tables), "killed mid-way: candidates still there"

    with instance_after_kill(home, path) as instance:
        (killed,) = instance.get_runs()
        outcomes = {name: sweep_only(path, name, now, instance, "delete") for name in tables}
    runs = set()
    for name, table in tables.items():
        assert outcomes[name].success, (name, outcomes[name].error)
        receipts = _stored(path, "deletion_receipts", now.date(), name)
        assert sorted(r["address"] for r in receipts) == sorted(expected[name]), name  # one receipt each
        assert {r["action"] for r in receipts} == {"deleted"}, name
        assert _data_files(table) == before[name] - expected[name], name
        at_head = {Path(uri).relative_to(table.path).as_posix() for uri in DeltaTable(str(table.path)).file_uris()}
        assert at_head and at_head <= _data_files(table), name
        runs |= {r["run_id"] for r in receipts}
    assert killed.run_id in runs and len(runs) > 1, (
        "the killed run's deletions told as its own, the rest as the reruns'"
    )


def test_a_fleet_on_a_versioned_bucket_killed_mid_sweep_resumes_on_the_versions_it_listed(tmp_path, s3_versions):
    """The kill -9 above on a bucket that keeps versions, the state directory on disk: the
    rerun of each table's sweep acts on the versions the killed run listed (read back from the
    set's journal): one receipt per delta-rs candidate, each naming its listed version, no
    version of a deleted file nor any delete marker left, every other object's one version kept."""
    now, client = delta_tables.now_utc(), s3_versions.client()
    s3_versions.create_bucket("killed")
    client.put_bucket_versioning(Bucket="killed", VersioningConfiguration={"Status": "Enabled"})
    names = [build.__name__ for build in BUILDERS]
    on_s3 = {
        name: _table_on_s3(s3_versions, tmp_path, now, "killed", name, build) for name, build in zip(names, BUILDERS)
    }
    listed = {name: _versions(client, "killed", name) for name in names}
    path = write_config(
        tmp_path / "gc.yaml", [{**t.entry, "mode": "delete"} for t in on_s3.values()], tmp_path / "state"
    )
    time.sleep(1.1)  # S3 times are whole seconds: every upload is strictly before the as-of
    as_of = dt.datetime.now(dt.timezone.utc)
    arguments = ["--config", str(path), "--all", "--as-of", as_of.isoformat(), "--mode", "delete"]
    journal = tmp_path / "state" / "_sweeps"
    home = run_killed_after_first_chunk(
        tmp_path, arguments, journaled=lambda: a_chunk_journaled(journal, "set"), chunk_objects=2
    )
    current = {name: set(_versions(client, "killed", name)) for name in names}
    assert all(on_s3[name].uploaded - on_s3[name].expected <= current[name] for name in names), "nothing live lost"
    assert any(current[name] & on_s3[name].expected for name in names), "killed mid-way: candidates still there"

    with instance_after_kill(home, path) as instance:
        (killed,) = instance.get_runs()
        outcomes = {name: sweep_only(path, name, as_of, instance, "delete") for name in names}
    runs = set()
    for name in names:
        table = on_s3[name]
        assert outcomes[name].success, (name, outcomes[name].error)
        receipts = _stored(path, "deletion_receipts", as_of.date(), name)
        assert {r["address"]: (r["action"], r["version_id"]) for r in receipts} == {
            address: ("deleted", listed[name][address]) for address in table.expected
        }, name
        assert not _left_of(client, "killed", name) & table.expected, "no version nor delete marker of a deleted file"
        kept = {key: version for key, version in _versions(client, "killed", name).items() if not key.startswith("_gc")}
        assert kept == {key: listed[name][key] for key in table.uploaded - table.expected}, name
        runs |= {r["run_id"] for r in receipts}
    assert killed.run_id in runs and len(runs) > 1, (
        "the killed run's deletions told as its own, the rest as the reruns'"
    )


def test_a_sets_leases_are_taken_many_at_once_and_each_refusal_stays_its_own(tmp_path, spark, monkeypatch):
    """More tables than LEASES_AT_ONCE: every lease is taken and fenced, except that of a table
    whose lease a live sweep holds (refused, its holder's record kept) and of one whose storage
    stamps times an hour away from the driver's clock (refused, the lease it took released)."""
    now = dt.datetime.now(dt.timezone.utc)
    names = [f"t{i:02d}" for i in range(set_sweep.LEASES_AT_ONCE + 4)]
    roots = {name: tmp_path / "wh" / name for name in names}
    for root in roots.values():
        root.mkdir(parents=True)
    repos = [{"name": n, "format": "delta", "storage_namespace": roots[n].as_uri()} for n in names]
    lake = load_config(write_config(tmp_path / "gc.yaml", repos, tmp_path / "state"))
    partitions = {n: GcPartition(lake, lake.repository(n), now.date(), now) for n in names}
    stores = {n: LocalStore(roots[n].as_uri()) for n in names}
    held, skewed = names[3], names[7]
    lease.acquire(stores[held], "another-sweep", f"{now.date()}|{held}", now)
    late = now + dt.timedelta(hours=1)
    monkeypatch.setattr(stores[skewed], "modified_time", lambda key: late)
    modes = dict.fromkeys(names, Mode.DELETE)
    sweep = set_sweep.SetSweep(spark, lake, partitions, stores, modes, "set-run", None, lambda: now, {})

    leases, skews = sweep._leases(names)

    assert sorted(leases) == sorted(skews) == sorted(set(names) - {held, skewed})
    assert "another sweep holds the lease" in sweep.refused[held] and "another-sweep" in sweep.refused[held]
    assert "max_clock_skew_minutes" in sweep.refused[skewed]
    for name, taken in leases.items():
        assert lease.newest(stores[name]) == taken and taken.run_id == "set-run", name
    assert lease.newest(stores[held]).run_id == "another-sweep"
    assert not stores[skewed].keys(LEASE_PREFIX), "the skewed table's lease was released"


class _TableOnS3(NamedTuple):
    uploaded: set[str]  # its keys, relative to the table
    expected: set[str]  # delta-rs's full vacuum candidates where it lies, relative to the table
    entry: dict  # its gc.yaml entry, without a mode


def _table_on_s3(s3, tmp_path: Path, now: dt.datetime, bucket: str, name: str, build) -> _TableOnS3:
    """`build`'s table written under `tmp_path/name` and uploaded to `s3://bucket/name`."""
    table = build(tmp_path / name, now)
    uploaded = {key.removeprefix(f"{name}/") for key in s3.upload_tree(table.path, bucket, name)}
    uri = f"s3://{bucket}/{name}"
    options = {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": s3.url, "AWS_ALLOW_HTTP": "true"}
    vacuumed = DeltaTable(uri, storage_options=options).vacuum(
        retention_hours=WINDOW.days * 24, dry_run=True, full=True, enforce_retention_duration=False
    )
    expected = {item.removeprefix(uri + "/") for item in vacuumed}
    assert expected, name
    entry = {
        "name": name,
        "format": "delta",
        "storage_namespace": uri,
        "rules": {"default_retention_days": WINDOW.days},
        "allow_unsafe_retention": True,
        "max_delete_fraction": 0.9,
        "min_object_age_hours": 0,  # S3 stamps every object with its upload time: now
        "allow_unsafe_min_age": True,
    }
    return _TableOnS3(uploaded, expected, entry)


def _versions(client, bucket: str, name: str) -> dict[str, str]:
    """The current version of each object of the table `name`, as a run lists it: a key whose
    newest entry is a delete marker is not there."""
    listing = client.list_object_versions(Bucket=bucket, Prefix=f"{name}/")
    return {v["Key"].removeprefix(f"{name}/"): v["VersionId"] for v in listing["Versions"] if v["IsLatest"]}


def _left_of(client, bucket: str, name: str) -> set[str]:
    """The keys of the table `name` with any version or delete marker stored, relative to it."""
    listing = client.list_object_versions(Bucket=bucket, Prefix=f"{name}/")
    stored = [*listing.get("Versions", []), *listing.get("DeleteMarkers", [])]
    return {v["Key"].removeprefix(f"{name}/") for v in stored}


def test_delta_tables_on_s3_are_swept_together_on_plain_and_versioned_buckets(tmp_path, spark, s3_versions):
    """A sweep on S3 goes together, with the state directory on S3 too, as on a cluster: one
    fleet_job run trashes and deletes tables on a bucket that keeps no versions and on one that
    does (stores.many through the S3 store's reader), each losing exactly what delta-rs's full
    vacuum names where it lies, and dry-runs one more table on the versioned bucket. Each
    partition is stored as a frame of its own on S3 (a manifest and its parts) that reads back as
    the run's receipts. On the versioned bucket the listing names each object's version and the
    sweep deletes or moves exactly that one: every receipt names the version listed (a dry run's
    too, as a table's own dry run names it), and no version of a deleted object nor any delete
    marker is left."""
    now, client = delta_tables.now_utc(), s3_versions.client()
    for bucket in ("plain", "kept", "state"):
        s3_versions.create_bucket(bucket)
    client.put_bucket_versioning(Bucket="kept", VersioningConfiguration={"Status": "Enabled"})
    tables = {  # name: (builder, bucket, mode, receipt action)
        "trashed": (delta_tables.merges, "plain", "trash", "trashed"),
        "deleted": (delta_tables.deletes_and_updates, "plain", "delete", "deleted"),
        "versioned": (delta_tables.appends_and_overwrites, "kept", "delete", "deleted"),
        "versioned_trash": (delta_tables.merges, "kept", "trash", "trashed"),
        "versioned_dry": (delta_tables.deletes_and_updates, "kept", "dry_run", "would_delete"),
    }
    on_s3 = {
        name: _table_on_s3(s3_versions, tmp_path, now, bucket, name, build)
        for name, (build, bucket, *_) in tables.items()
    }
    uploaded = {name: table.uploaded for name, table in on_s3.items()}
    expected = {name: table.expected for name, table in on_s3.items()}
    repos = [{**on_s3[name].entry, "mode": mode} for name, (_, _, mode, _) in tables.items()]
    listed = {name: _versions(client, "kept", name) for name in ("versioned", "versioned_trash", "versioned_dry")}
    path = write_config(tmp_path / "gc.yaml", repos, "s3://state/gc")
    time.sleep(1.1)  # S3 times are whole seconds: every upload is now strictly before the as-of
    instance = DagsterInstance.ephemeral()

    outcomes = {
        o.summary["repo"]: o for o in run_partitions(load_config(path), list(tables), now.date(), instance=instance)
    }

    runs = {run.run_id: run for run in instance.get_runs()}
    together = {outcome.summary["run_id"] for outcome in outcomes.values()}
    assert len(together) == 1 and runs[together.pop()].job_name == "fleet_job", "every bucket's together"
    for name, (_, bucket, _, action) in tables.items():
        outcome = outcomes[name]
        assert outcome.success and set(outcome.summary["checks"].values()) == {"passed"}, (name, outcome.error)
        assert outcome.summary["receipts"] == {action: len(expected[name])}, outcome.summary
        receipts = stored_table(str(path), "deletion_receipts", now.date(), name).to_pylist()
        assert sorted(row["address"] for row in receipts) == sorted(expected[name]), name
        assert outcome.summary["outputs"]["deletion_receipts"].startswith("s3://state/gc/"), outcome.summary
        left = {key.removeprefix(f"{name}/") for key in s3_versions.keys(bucket, f"{name}/")}
        trash = {key for key in left if key.startswith(f"{TRASH_PREFIX}/")}
        gone = set() if action == "would_delete" else expected[name]
        assert {key for key in left - trash if not key.startswith("_gc")} == uploaded[name] - gone, name
        run_id = outcome.summary["run_id"]
        assert trash == ({f"{TRASH_PREFIX}/{run_id}/{a}" for a in expected[name]} if action == "trashed" else set())
    for name in ("versioned", "versioned_trash", "versioned_dry"):
        receipts = stored_table(str(path), "deletion_receipts", now.date(), name).to_pylist()
        assert {row["address"]: row["version_id"] for row in receipts} == {
            address: listed[name][address] for address in expected[name]
        }, "each receipt names the version listed"
        kept = _left_of(client, "kept", name)
        if name == "versioned_dry":
            assert expected[name] <= kept and _versions(client, "kept", name).keys() == uploaded[name], "untouched"
        else:
            assert not kept & expected[name], "every deleted or moved version is gone, and no delete marker hides one"
    for name in ("trashed", "deleted"):
        receipts = stored_table(str(path), "deletion_receipts", now.date(), name).to_pylist()
        assert {row["version_id"] for row in receipts} == {None}, "a bucket without versions names none"
