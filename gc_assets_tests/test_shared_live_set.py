"""One live set across repositories (docs/design.md §10): a file another configured
repository's retained versions reference is live in the namespace that holds it.

Delta shallow clones name their source table's files by absolute URI. delta-rs's vacuum of
the source table collects those files once the source itself no longer needs them, and the
clone breaks; gc_assets keeps them, and explain names the clone.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance
from deltalake import DeltaTable
from pyspark.sql import functions as F

from gc_assets import cli
from gc_assets.core.config import GcConfig, RepositoryConfig
from gc_assets.mark.partition import GcPartition
from gc_assets.mark.shared import needed_by_others, record_outside_references, referrers_of
from gc_assets.runner import run_partition
from gc_assets.sources import SourceError
from gc_assets_tests import delta_tables, iceberg_tables
from gc_assets_tests.lakes import write_config

WINDOW_DAYS = 5
SETTINGS = {"rules": {"default_retention_days": WINDOW_DAYS}, "allow_unsafe_retention": True}


def delta_repo(name: str, table: delta_tables.BuiltTable, **options) -> dict:
    return {"name": name, "format": "delta", "storage_namespace": table.uri, **SETTINGS, **options}


def _key(table: delta_tables.BuiltTable, uri: str) -> str | None:
    """`uri` (as delta-rs's add actions spell it) as a key of `table`, or None outside it."""
    path = Path(uri.removeprefix("file://"))
    return path.relative_to(table.path).as_posix() if path.is_relative_to(table.path) else None


def clone_needs(clone: delta_tables.BuiltTable, source: delta_tables.BuiltTable) -> set[str]:
    """The source table's keys the clone's head needs, read by delta-rs from the clone's log."""
    actions = DeltaTable(str(clone.path)).get_add_actions(flatten=True)
    return {key for uri in actions.column("path").to_pylist() if (key := _key(source, uri)) is not None}


def _clone_rows(clone: delta_tables.BuiltTable) -> list[dict]:
    """Every row of the clone's head, read file by file from the paths its log names (delta-rs
    itself reads absolute add paths as relative ones)."""
    paths = DeltaTable(str(clone.path)).get_add_actions(flatten=True).column("path").to_pylist()
    return sorted((row for uri in paths for row in pq.read_table(uri.removeprefix("file://")).to_pylist()), key=repr)


def _candidates(summary: dict) -> set[str]:
    return {row["address"] for row in pq.read_table(summary["outputs"]["orphan_candidates"]).to_pylist()}


def test_referrers_are_the_repositories_whose_external_prefixes_reach_into_a_namespace(tmp_path):
    lake = tmp_path / "lake"

    def repo(name: str, *external: str) -> RepositoryConfig:
        return RepositoryConfig(
            name=name,
            format="delta",
            storage_namespace=(lake / name).as_uri(),
            external_prefixes=tuple((lake / e).as_uri() for e in external),
        )

    config = GcConfig(
        repositories=(
            repo("a"),
            repo("b", "a/data"),  # a prefix inside a's namespace
            repo("c", "a", "c"),  # a's whole namespace, and its own (never its own referrer)
            repo("d"),
            repo("e", ""),  # the whole lake: every namespace below it
            repo("f", "d-other"),  # a sibling whose name only starts like d's
        )
    )
    assert [r.name for r in config.referrers("a")] == ["b", "c", "e"]
    assert [r.name for r in config.referrers("d")] == ["e"]
    assert [r.name for r in config.referrers("c")] == ["e"]
    assert [r.name for r in config.referrers("e")] == []
    assert [r.name for r in config.referrers("f")] == ["e"]


@dataclass
class ClonedWarehouse:
    """Three Delta histories, two of them shallow-cloned at two random versions each."""

    tables: dict[str, delta_tables.BuiltTable]  # the sources first, then the clones
    repos: list[dict]  # one gc.yaml entry each; a clone's external_prefixes reach its source
    needs: dict[str, set[str]]  # source -> its keys the clones' heads need (delta-rs)
    own: dict[str, set[str]]  # table -> its own candidates (delta-rs full vacuum)


SOURCES = ("overwrites", "updates", "merges")


def cloned_warehouse(root: Path, now: dt.datetime, seed: int, **source_options) -> ClonedWarehouse:
    """The clones' sources lose files they need to delta-rs's vacuum (asserted: never an empty case)."""
    shuffle = random.Random(seed)
    tables = {
        "overwrites": delta_tables.appends_and_overwrites(root / "wh", now),
        "updates": delta_tables.deletes_and_updates(root / "wh", now),
        "merges": delta_tables.merges(root / "wh", now),
    }
    repos = [delta_repo(name, table, **source_options) for name, table in tables.items()]
    needs: dict[str, set[str]] = {name: set() for name in tables}
    for name in ("overwrites", "updates"):
        source = tables[name]
        head = max(delta_tables.log_lines(source.path))
        for number, version in enumerate(sorted(shuffle.sample(range(head - 2), 2))):
            clone = delta_tables.shallow_clone(source, version, root / "clones", f"{name}-{number}", now)
            repos.append(delta_repo(clone.name, clone, external_prefixes=[source.uri]))
            tables[clone.name] = clone
            needs[name] |= clone_needs(clone, source)
    window = dt.timedelta(days=WINDOW_DAYS)
    own = {name: delta_tables.vacuum_candidates(table, window) for name, table in tables.items()}
    for name in ("overwrites", "updates"):
        assert own[name] & needs[name], f"{name}: its clones need none of its own candidates: the case is empty"
    return ClonedWarehouse(tables, repos, needs, own)


def test_a_shallow_clones_files_stay_live_in_the_table_it_cloned(tmp_path, spark, capsys):
    """The fleet's candidates are each table's own candidates (delta-rs) minus what any other
    repository's retained versions need, over clones of random versions of several histories."""
    now = delta_tables.now_utc()
    lake = cloned_warehouse(tmp_path, now, 20261125, max_delete_fraction=1.0)
    sources, own, needs = SOURCES, lake.own, lake.needs
    config = write_config(tmp_path / "gc.yaml", lake.repos, tmp_path / "state")

    status = cli.main(["run", "--config", str(config), "--all", "--date", now.date().isoformat(), "--json"])

    out, err = capsys.readouterr()
    summaries = {s["repo"]: s for s in (json.loads(line) for line in out.splitlines() if line.startswith("{"))}
    assert status == 0, err
    assert len(summaries) == 7
    for name in sources:
        assert _candidates(summaries[name]) == own[name] - needs[name], name
        assert summaries[name]["checks"]["independent_witness"] == "passed"
    for name, summary in summaries.items():
        if name not in sources:
            assert summary["orphan_candidates"] == 0, name

    shared = sorted(own["overwrites"] & needs["overwrites"])[0]
    status = cli.main(["explain", shared, "--config", str(config), "--repo", "overwrites", "--json"])
    explanation = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status == 0 and explanation["status"] == "live", explanation
    assert explanation["reasons"][0].startswith("repository overwrites-"), explanation


def test_deleting_a_cloned_table_keeps_every_file_its_clone_reads(tmp_path, spark):
    now = delta_tables.now_utc()
    source = delta_tables.appends_and_overwrites(tmp_path / "wh", now)
    clone = delta_tables.shallow_clone(source, 1, tmp_path / "clones", "snapshot", now)
    rows = _clone_rows(clone)
    own = delta_tables.vacuum_candidates(source, dt.timedelta(days=WINDOW_DAYS))
    needs = clone_needs(clone, source)
    assert own & needs
    config = write_config(
        tmp_path / "gc.yaml",
        [
            delta_repo("orders", source, max_delete_fraction=1.0),
            delta_repo("snapshot", clone, external_prefixes=[source.uri]),
        ],
        tmp_path / "state",
    )

    status = cli.main(["run", "--config", str(config), "--repo", "orders", "--mode", "delete", "--json"])

    assert status == 0
    assert not (own - needs) & source.files(), "what no repository needs is deleted"
    assert needs <= source.files()
    assert _clone_rows(clone) == rows


def test_an_undeclared_clone_is_refused_and_its_source_keeps_what_it_reads(tmp_path, spark, capsys):
    """A discovered shallow clone whose source's prefix is not under its external_prefixes is
    refused, and its source (discovered first) keeps every file the clone reads: in the dry
    run that judges the tables together, and in `--mode delete`, where each table is a run of
    its own and the source is swept before the clone's own run."""
    now = delta_tables.now_utc()
    source = delta_tables.appends_and_overwrites(tmp_path / "wh", now)
    clone = delta_tables.shallow_clone(source, 1, tmp_path / "wh", "z-clone", now)
    rows = _clone_rows(clone)
    own = delta_tables.vacuum_candidates(source, dt.timedelta(days=WINDOW_DAYS))
    needs = clone_needs(clone, source)
    assert own & needs and own - needs
    discovered = {"discover": {"format": "delta", "under": (tmp_path / "wh").as_uri()}, **SETTINGS}

    def run(mode: str) -> tuple[int, dict[str, dict], str]:
        config = write_config(tmp_path / f"{mode}.yaml", [{**discovered, "max_delete_fraction": 1.0}], tmp_path / mode)
        status = cli.main(["run", "--config", str(config), "--all", "--mode", mode.replace("_", "-"), "--json"])
        out, err = capsys.readouterr()
        return status, {s["repo"]: s for s in (json.loads(line) for line in out.splitlines() if line[:1] == "{")}, err

    status, summaries, err = run("dry_run")
    assert status == 1 and "repository z-clone failed: " in err and "under no external_prefixes" in err
    assert _candidates(summaries[source.name]) == own - needs

    status, summaries, err = run("delete")
    assert status == 1 and "repository z-clone failed: " in err and "under no external_prefixes" in err
    assert summaries[source.name]["receipts"] == {"deleted": len(own - needs)}
    assert not (own - needs) & source.files(), "what no repository needs is deleted"
    assert needs <= source.files()
    assert _clone_rows(clone) == rows


def test_a_found_referrer_committing_between_two_chunks_revives_what_it_now_reads(tmp_path, spark, monkeypatch):
    """The sweep re-validates before a chunk once a referrer a mark found (undeclared) moved,
    as it does for declared ones: the clone's new version names the source's candidates not yet
    acted on, and they are skipped, not deleted."""
    from gc_assets.sweep import lease, sweeper

    now = delta_tables.now_utc()
    source = delta_tables.appends_and_overwrites(tmp_path / "wh", now)
    clone = delta_tables.shallow_clone(source, 1, tmp_path / "wh", "z-clone", now)
    free = sorted(delta_tables.vacuum_candidates(source, dt.timedelta(days=WINDOW_DAYS)) - clone_needs(clone, source))
    assert len(free) >= 2
    discovered = {"discover": {"format": "delta", "under": (tmp_path / "wh").as_uri()}, **SETTINGS}
    config = write_config(tmp_path / "gc.yaml", [{**discovered, "max_delete_fraction": 1.0}], tmp_path / "state")
    instance = DagsterInstance.ephemeral()
    refused = run_partition(str(config), "z-clone", now.date(), now, "dry_run", instance)
    assert not refused.success and "under no external_prefixes" in (refused.error or "")
    adds = {
        a["add"]["path"]: a["add"]
        for actions in delta_tables.log_lines(source.path).values()
        for a in actions
        if "add" in a
    }
    monkeypatch.setenv(sweeper.CHUNK_OBJECTS_ENV, "1")
    # chunks are hash buckets of the address (a temporary path here): one object per chunk,
    # whatever the path, so the clone's commit always lands between two deletions
    monkeypatch.setattr(
        sweeper,
        "chunked",
        lambda todo, chunks: [todo.filter(F.col("address") == row.address) for row in todo.select("address").collect()],
    )
    read_later: list[str] = []
    real_check = lease.Heartbeat.check

    def clone_commits_after_the_first_deletion(self):
        real_check(self)
        left = [key for key in free if (source.path / key).exists()]
        if len(left) < len(free) and not read_later:
            read_later.extend(left)
            millis = int((now - dt.timedelta(hours=1)).timestamp() * 1000)
            actions = [{"commitInfo": {"timestamp": millis, "operation": "WRITE"}}] + [
                {"add": {**adds[key], "path": (source.path / key).as_uri(), "modificationTime": millis}} for key in left
            ]
            (clone.path / "_delta_log" / f"{1:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))

    monkeypatch.setattr(lease.Heartbeat, "check", clone_commits_after_the_first_deletion)
    outcome = run_partition(str(config), source.name, now.date(), now, "delete", instance)

    assert outcome.success, outcome.error
    receipts = {
        r["address"]: r["action"] for r in pq.read_table(outcome.summary["outputs"]["deletion_receipts"]).to_pylist()
    }
    assert read_later and {receipts[key] for key in read_later} == {"skipped_revived"}
    assert all((source.path / key).is_file() for key in read_later)
    assert sorted(key for key, action in receipts.items() if action == "deleted") == sorted(set(free) - set(read_later))


def test_a_found_referrer_is_forgotten_only_by_a_mark_at_a_later_as_of(tmp_path):
    """A backfill of an older date, when the clone did not exist yet, must not lift the
    protection a newer mark of it recorded; a newer mark that no longer reads there does."""
    config = GcConfig(
        state_dir=str(tmp_path / "state"),
        repositories=tuple(
            RepositoryConfig(name=name, format="delta", storage_namespace=(tmp_path / name).as_uri())
            for name in ("orders", "sales/clone")
        ),
    )
    day = dt.datetime(2026, 11, 20, tzinfo=dt.timezone.utc)
    inside = (tmp_path / "orders").resolve().as_uri() + "/part"
    assert config.owner_of(inside + "/x.parquet").name == "orders"
    assert config.owner_of((tmp_path / "elsewhere").resolve().as_uri() + "/x.parquet") is None

    record_outside_references(config, "sales/clone", day, {inside: inside + "/x.parquet"})
    assert [r.name for r in referrers_of(config, "orders")] == ["sales/clone"]
    record_outside_references(config, "sales/clone", day - dt.timedelta(days=3), {})
    assert [r.name for r in referrers_of(config, "orders")] == ["sales/clone"]
    record_outside_references(config, "sales/clone", day + dt.timedelta(days=1), {})
    assert referrers_of(config, "orders") == []


def test_a_referrer_that_cannot_be_read_fails_the_mark_naming_it(tmp_path, spark):
    now = delta_tables.now_utc()
    source = delta_tables.merges(tmp_path / "wh", now)
    clone = delta_tables.shallow_clone(source, 1, tmp_path / "clones", "broken-clone", now)
    (clone.path / "_delta_log" / f"{0:020d}.json").write_text("{not json\n")
    config = GcConfig(
        repositories=(
            RepositoryConfig(name="merges", format="delta", storage_namespace=source.uri),
            RepositoryConfig(
                name="broken-clone",
                format="delta",
                storage_namespace=clone.uri,
                external_prefixes=(source.uri,),
            ),
        )
    )
    partition = GcPartition(config, config.repository("merges"), now.date(), now)
    with pytest.raises(SourceError, match="repository 'broken-clone' references objects in its namespace"):
        needed_by_others(spark, partition)


def test_an_iceberg_tables_add_files_of_another_tables_file_keeps_it_live_there(tmp_path, spark, capsys):
    """The lender's candidates alone hold the file it overwrote; with the borrower configured
    (its external_prefixes naming the lender) the file stays, and explain names the borrower."""
    lender, borrower = iceberg_tables.lending_tables(tmp_path)
    shared = lender.notes["shared"]
    rules = {"rules": {"default_retention_days": 2}, "max_delete_fraction": 1.0}
    alone = write_config(tmp_path / "alone.yaml", [lender.repo_config(**rules)], tmp_path / "state-alone")
    both = write_config(
        tmp_path / "both.yaml",
        [
            lender.repo_config(**rules),
            borrower.repo_config(**rules, external_prefixes=[lender.namespace_uri]),
        ],
        tmp_path / "state",
    )
    date = iceberg_tables.GC_DATE

    own = run_partition(str(alone), "lender", date, instance=DagsterInstance.ephemeral())
    fleet = run_partition(str(both), "lender", date, instance=DagsterInstance.ephemeral())

    assert own.success and fleet.success, (own.error, fleet.error)
    assert shared in _candidates(own.summary)
    assert _candidates(fleet.summary) == _candidates(own.summary) - {shared}
    assert fleet.summary["checks"]["independent_witness"] == "passed"
    capsys.readouterr()
    status = cli.main(["explain", shared, "--config", str(both), "--repo", "lender", "--date", str(date), "--json"])
    explanation = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status == 0 and explanation["status"] == "live", explanation
    assert explanation["reasons"][0].startswith("repository borrower needs it"), explanation

    # Undeclared: the borrower is refused, and the lender (deleted first, each a run of its own)
    # keeps the file, for the borrower was marked before either was swept.
    undeclared = write_config(
        tmp_path / "undeclared.yaml", [lender.repo_config(**rules), borrower.repo_config(**rules)], tmp_path / "u"
    )
    arguments = ["run", "--config", str(undeclared), "--date", str(date), "--mode", "delete", "--json"]
    status = cli.main([*arguments, "--repo", "lender", "--repo", "borrower"])
    out, err = capsys.readouterr()
    deleted = json.loads(out.strip().splitlines()[-2])
    assert status == 1 and "repository borrower failed: " in err and "external_prefixes" in err
    assert deleted["repo"] == "lender" and deleted["receipts"] == {"deleted": len(_candidates(own.summary)) - 1}
    assert (lender.namespace / shared).is_file()


def test_a_table_inside_another_tables_directory_is_collected_only_by_its_own_repository(tmp_path, spark, capsys):
    """delta-rs's vacuum of the outer table deletes the inner table's files, its log among
    them; gc_assets protects the inner namespace in the outer repository and collects it only
    under the inner table's own rules, and explain names the inner repository."""
    now = delta_tables.now_utc()
    window = dt.timedelta(days=WINDOW_DAYS)
    outer = delta_tables.appends_and_overwrites(tmp_path / "wh", now)
    inner = delta_tables.deletes_and_updates(outer.path, now)
    prefix = f"{inner.name}/"
    outer_alone = delta_tables.vacuum_candidates(outer, window)
    inner_own = delta_tables.vacuum_candidates(inner, window)
    inner_in_outer = {key for key in outer_alone if key.startswith(prefix)}
    assert any("/_delta_log/" in key for key in inner_in_outer), "delta-rs keeps the inner log: the case is empty"
    inner_files = inner.files()
    rows = sorted(DeltaTable(str(inner.path)).to_pyarrow_table().to_pylist(), key=repr)
    repos = [delta_repo("outer", outer, max_delete_fraction=1.0), delta_repo("inner", inner, max_delete_fraction=1.0)]
    config = write_config(tmp_path / "gc.yaml", repos, tmp_path / "state")
    date = now.date().isoformat()

    status = cli.main(["run", "--config", str(config), "--all", "--date", date, "--mode", "delete", "--json"])

    out, err = capsys.readouterr()
    summaries = {s["repo"]: s for s in (json.loads(line) for line in out.splitlines() if line.startswith("{"))}
    assert status == 0, err
    assert _candidates(summaries["outer"]) == outer_alone - inner_in_outer
    assert _candidates(summaries["inner"]) == inner_own
    assert inner.files() == {key for key in inner_files if key not in inner_own}
    assert sorted(DeltaTable(str(inner.path)).to_pyarrow_table().to_pylist(), key=repr) == rows

    kept = sorted(inner.files())[0]
    status = cli.main(["explain", prefix + kept, "--config", str(config), "--repo", "outer", "--date", date, "--json"])
    explanation = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status == 0 and explanation["status"] == "protected", explanation
    assert explanation["reasons"] == [
        f"inside repository inner's namespace ({prefix}): repository inner collects its own objects"
    ]


def _table_inside(outer: delta_tables.BuiltTable, name: str, modified: float) -> None:
    """A one-commit Delta table named `name` inside `outer`'s directory, its files dated `modified`."""
    table = outer.path / name
    (table / "_delta_log").mkdir(parents=True)
    (table / "part-0.parquet").write_bytes(b"data")
    commit = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"add": {"path": "part-0.parquet", "size": 4, "modificationTime": int(modified * 1000), "dataChange": True}},
    ]
    (table / "_delta_log" / "00000000000000000000.json").write_text("".join(json.dumps(a) + "\n" for a in commit))
    for path in (table / "part-0.parquet", table / "_delta_log" / "00000000000000000000.json"):
        os.utime(path, (modified, modified))


def test_a_thousand_tables_discovered_inside_a_repository_are_all_protected_there(tmp_path, capsys):
    """Each table discovered inside the outer table's directory is a nested namespace the outer
    repository must keep its hands off; with a thousand of them its mark still runs (one
    condition per protected prefix overflowed Spark's planner) and spares every one."""
    now = delta_tables.now_utc()
    outer = delta_tables.appends_and_overwrites(tmp_path / "wh", now)
    old = (now - dt.timedelta(days=30)).timestamp()
    names = [f"inner-{i:04d}" for i in range(1000)]
    for name in names:
        _table_inside(outer, name, old)
    outer_alone = delta_tables.vacuum_candidates(outer, dt.timedelta(days=WINDOW_DAYS))
    inside = {key for key in outer_alone if key.split("/")[0] in set(names)}
    assert len(inside) == 2 * len(names), "delta-rs collects the inner tables: the case is empty"
    discover = {"discover": {"format": "delta", "under": outer.uri}, **SETTINGS}
    config = write_config(
        tmp_path / "gc.yaml", [delta_repo("outer", outer, max_delete_fraction=1.0), discover], tmp_path / "s"
    )

    status = cli.main(["run", "--config", str(config), "--repo", "outer", "--date", now.date().isoformat(), "--json"])

    out, err = capsys.readouterr()
    summaries = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert status == 0, err
    assert _candidates(summaries[0]) == outer_alone - inside
