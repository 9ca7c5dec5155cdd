"""One live set across repositories (docs/design.md §10): a file another configured
repository's retained versions reference is live in the namespace that holds it.

Delta shallow clones name their source table's files by absolute URI. delta-rs's vacuum of
the source table collects those files once the source itself no longer needs them, and the
clone breaks; gc_assets keeps them, and explain names the clone.

Whole runs are what these tests cost, so they share them: one dry run judges the Delta lakes
of every dry-run test together, as `run --all` does, and each delete run (module fixtures) is
read by every test whose claim it shows.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyiceberg.catalog.sql import SqlCatalog
from pyspark.sql import functions as F

from gc_assets.core.config import GcConfig, RepositoryConfig, Rules, load_config
from gc_assets.core.time import end_of_day
from gc_assets.mark import connectors, sets
from gc_assets.mark.partition import GcPartition
from gc_assets.mark.shared import needed_by_others, record_outside_references, referrers_of
from gc_assets.sources import SourceError
from gc_assets.stores.state import LocalState
from gc_assets.sweep import together
from gc_assets_tests import delta_tables, iceberg_tables, lakes
from gc_assets_tests.cli_runs import run_cli_in_memory, summary_of
from gc_assets_tests.iceberg_tables import IcebergLake
from gc_assets_tests.lakes import lake_on_disk, native_lake_on_disk, write_config
from gc_assets_tests.oracles import expected_candidates, oracle_key, retained_brute_force

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


def _receipts(summary: dict) -> dict[str, str]:
    """address -> action, from the deletion_receipts the run materialized."""
    return {r["address"]: r["action"] for r in pq.read_table(summary["outputs"]["deletion_receipts"]).to_pylist()}


FAILED = re.compile(r"^gc-assets: repository (\S+) failed: (.*)$", re.MULTILINE)


@dataclass
class CliRun:
    """What `gc-assets run ... --json` returned and wrote."""

    status: int
    summaries: dict[str, dict]  # repository -> its JSON summary
    err: str

    @property
    def failed(self) -> dict[str, str]:
        """Repository -> why, for each one stderr names as failed."""
        return dict(FAILED.findall(self.err))


def gc_run(config: Path, *arguments: str) -> CliRun:
    """`gc-assets run --config CONFIG ARGUMENTS --json` in this process."""
    done = run_cli_in_memory("run", "--config", str(config), *arguments, "--json")
    summaries = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return CliRun(done.returncode, {s["repo"]: s for s in summaries}, done.stderr)


def explain(config: Path, address: str, repo: str, date: str) -> dict:
    """`gc-assets explain ADDRESS --json`'s explanation, its exit status 0."""
    done = run_cli_in_memory("explain", address, "--config", str(config), "--repo", repo, "--date", date, "--json")
    explanation = summary_of(done.stdout)
    assert done.returncode == 0, explanation
    return explanation


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


@dataclass
class Undeclared:
    """A table and a shallow clone of it, both discovered; the clone's external_prefixes do not reach its source."""

    source: delta_tables.BuiltTable
    clone: delta_tables.BuiltTable
    own: set[str]  # the source's own candidates (delta-rs full vacuum)
    needs: set[str]  # the source's keys the clone's head needs (delta-rs)
    rows: list[dict]  # the clone's head, read before any run


def undeclared_clone(root: Path, now: dt.datetime) -> Undeclared:
    source = delta_tables.appends_and_overwrites(root, now)
    clone = delta_tables.shallow_clone(source, 1, root, "z-clone", now)
    own = delta_tables.vacuum_candidates(source, dt.timedelta(days=WINDOW_DAYS))
    needs = clone_needs(clone, source)
    assert own & needs and len(own - needs) >= 2, "the clone needs none, or all but one, of its source's candidates"
    return Undeclared(source, clone, own, needs, _clone_rows(clone))


def discovered(under: Path) -> dict:
    return {"discover": {"format": "delta", "under": under.as_uri()}, **SETTINGS, "max_delete_fraction": 1.0}


@dataclass
class Nested:
    """A table inside another table's directory, each a repository of its own."""

    outer: delta_tables.BuiltTable
    inner: delta_tables.BuiltTable
    outer_alone: set[str]  # delta-rs's vacuum of the outer table: the inner table's files among them
    inner_own: set[str]


@dataclass
class JudgedTogether:
    config: Path
    date: str
    run: CliRun
    warehouse: ClonedWarehouse
    undeclared: Undeclared
    nested: Nested


@pytest.fixture(scope="module")
def judged_together(tmp_path_factory, spark) -> JudgedTogether:
    """One dry run of `--all`, judged together in one fleet run: the cloned warehouse, a table
    with an undeclared clone (both discovered), and a table inside another table's directory."""
    root = tmp_path_factory.mktemp("together")
    now = delta_tables.now_utc()
    window = dt.timedelta(days=WINDOW_DAYS)
    warehouse = cloned_warehouse(root, now, 20261125, max_delete_fraction=1.0)
    undeclared = undeclared_clone(root / "found", now)
    outer = delta_tables.appends_and_overwrites(root / "nested", now)
    inner = delta_tables.deletes_and_updates(outer.path, now)
    nested = Nested(
        outer, inner, delta_tables.vacuum_candidates(outer, window), delta_tables.vacuum_candidates(inner, window)
    )
    repos = [
        *warehouse.repos,
        delta_repo("outer", outer, max_delete_fraction=1.0),
        delta_repo("inner", inner, max_delete_fraction=1.0),
        discovered(root / "found"),
    ]
    config = write_config(root / "gc.yaml", repos, root / "state")
    date = now.date().isoformat()
    return JudgedTogether(config, date, gc_run(config, "--all", "--date", date), warehouse, undeclared, nested)


def test_a_shallow_clones_files_stay_live_in_the_table_it_cloned(judged_together):
    """The fleet's candidates are each table's own candidates (delta-rs) minus what any other
    repository's retained versions need, over clones of random versions of several histories."""
    lake, sources = judged_together, SOURCES
    own, needs, summaries = lake.warehouse.own, lake.warehouse.needs, lake.run.summaries

    assert set(summaries) >= set(lake.warehouse.tables)
    assert not set(lake.run.failed) & set(lake.warehouse.tables), lake.run.err
    for name in sources:
        assert _candidates(summaries[name]) == own[name] - needs[name], name
        assert summaries[name]["checks"]["independent_witness"] == "passed"
    for name in lake.warehouse.tables:
        if name not in sources:
            assert summaries[name]["orphan_candidates"] == 0, name

    shared = sorted(own["overwrites"] & needs["overwrites"])[0]
    explanation = explain(lake.config, shared, "overwrites", lake.date)
    assert explanation["status"] == "live", explanation
    assert explanation["reasons"][0].startswith("repository overwrites-"), explanation


@dataclass
class ClonedOuterDeleted:
    """`run --repo outer --mode delete` of a table a declared shallow clone reads, with a thousand
    discovered tables inside its directory."""

    outer: delta_tables.BuiltTable
    clone: delta_tables.BuiltTable
    outer_alone: set[str]  # delta-rs's vacuum of the outer table: the tables inside among them
    inside: set[str]  # the keys of the tables inside
    needs: set[str]  # the outer table's keys the clone's head needs (delta-rs)
    rows: list[dict]  # the clone's head, read before the run
    run: CliRun
    state: Path  # the state directory


@pytest.fixture(scope="module")
def cloned_outer_deleted(tmp_path_factory, spark) -> ClonedOuterDeleted:
    root = tmp_path_factory.mktemp("outer")
    now = delta_tables.now_utc()
    outer = delta_tables.appends_and_overwrites(root / "wh", now)
    old = (now - dt.timedelta(days=30)).timestamp()
    names = {f"inner-{i:04d}" for i in range(1000)}
    for name in sorted(names):
        _table_inside(outer, name, old)
    clone = delta_tables.shallow_clone(outer, 1, root / "clones", "snapshot", now)
    outer_alone = delta_tables.vacuum_candidates(outer, dt.timedelta(days=WINDOW_DAYS))
    inside = {key for key in outer_alone if key.split("/")[0] in names}
    assert len(inside) == 2 * len(names), "delta-rs collects the inner tables: the case is empty"
    needs = clone_needs(clone, outer)
    assert (outer_alone - inside) & needs and (outer_alone - inside) - needs
    repos = [
        delta_repo("outer", outer, max_delete_fraction=1.0),
        delta_repo("snapshot", clone, external_prefixes=[outer.uri]),
        {"discover": {"format": "delta", "under": outer.uri}, **SETTINGS},
    ]
    config = write_config(root / "gc.yaml", repos, root / "state")
    rows = _clone_rows(clone)
    run = gc_run(config, "--repo", "outer", "--date", now.date().isoformat(), "--mode", "delete")
    return ClonedOuterDeleted(outer, clone, outer_alone, inside, needs, rows, run, root / "state")


def test_deleting_a_cloned_table_keeps_every_file_its_clone_reads(cloned_outer_deleted):
    lake = cloned_outer_deleted
    own = lake.outer_alone - lake.inside

    assert lake.run.status == 0, lake.run.err
    assert lake.run.summaries["outer"]["receipts"] == {"deleted": len(own - lake.needs)}
    assert not (own - lake.needs) & lake.outer.files(), "what no repository needs is deleted"
    assert lake.needs <= lake.outer.files()
    assert _clone_rows(lake.clone) == lake.rows
    # One pipeline: the table is swept as a set of one (the set's journal), its clone marked with
    # it only for what it reads: nothing of the clone is stored.
    assert list((lake.state / "_sweeps").iterdir()) == [lake.state / "_sweeps" / "set"]
    assert not list(lake.state.glob("*/repo=snapshot"))


@dataclass
class UndeclaredDeleted:
    """`run --all --mode delete` over a table and its undeclared clone (both discovered), the
    sweep in chunks of one object, the clone committing right after the first deletion a
    version that reads the source's candidates not yet acted on."""

    lake: Undeclared
    run: CliRun
    read_later: list[str]  # the source's candidates the clone's new version reads
    later_rows: list[dict]  # their rows


@pytest.fixture(scope="module")
def undeclared_deleted(tmp_path_factory, spark) -> UndeclaredDeleted:
    from gc_assets.sweep import lease, sweeper

    root = tmp_path_factory.mktemp("undeclared")
    now = delta_tables.now_utc()
    lake = undeclared_clone(root / "wh", now)
    source, clone = lake.source, lake.clone
    free = sorted(lake.own - lake.needs)
    adds = {
        a["add"]["path"]: a["add"]
        for actions in delta_tables.log_lines(source.path).values()
        for a in actions
        if "add" in a
    }
    read_later: list[str] = []
    later_rows: list[dict] = []
    real_check = lease.Heartbeats.lost_lease

    def clone_commits_after_the_first_deletion(self, name):
        lost = real_check(self, name)
        left = [key for key in free if (source.path / key).exists()]
        if len(left) < len(free) and not read_later:
            read_later.extend(left)
            later_rows.extend(row for key in left for row in pq.read_table(source.path / key).to_pylist())
            millis = int((now - dt.timedelta(hours=1)).timestamp() * 1000)
            actions = [{"commitInfo": {"timestamp": millis, "operation": "WRITE"}}] + [
                {"add": {**adds[key], "path": (source.path / key).as_uri(), "modificationTime": millis}} for key in left
            ]
            (clone.path / "_delta_log" / f"{1:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
        return lost

    config = write_config(root / "gc.yaml", [discovered(root / "wh")], root / "state")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(sweeper.CHUNK_OBJECTS_ENV, "1")  # one object per chunk: the commit lands between two
        patch.setattr(lease.Heartbeats, "lost_lease", clone_commits_after_the_first_deletion)
        run = gc_run(config, "--all", "--mode", "delete")
    return UndeclaredDeleted(lake, run, read_later, later_rows)


def test_an_undeclared_clone_is_refused_and_its_source_keeps_what_it_reads(judged_together, undeclared_deleted):
    """A discovered shallow clone whose source's prefix is not under its external_prefixes is
    refused, and its source (discovered first) keeps every file the clone reads: in the dry
    run that judges the tables together, and in `--mode delete`, where each table is a run of
    its own and the source is swept before the clone's own run."""
    dry = judged_together.undeclared
    assert judged_together.run.status == 1
    assert "under no external_prefixes" in judged_together.run.failed["z-clone"]
    assert _candidates(judged_together.run.summaries[dry.source.name]) == dry.own - dry.needs

    deleted = undeclared_deleted
    lake, run, read_later = deleted.lake, deleted.run, set(deleted.read_later)
    assert run.status == 1 and set(run.failed) == {"z-clone"}, run.err
    assert "under no external_prefixes" in run.failed["z-clone"]
    gone = lake.own - lake.needs - read_later
    assert run.summaries[lake.source.name]["receipts"] == {"deleted": len(gone), "skipped_revived": len(read_later)}
    assert not gone & lake.source.files(), "what no repository needs is deleted"
    assert lake.needs <= lake.source.files()
    assert _clone_rows(lake.clone) == sorted(lake.rows + deleted.later_rows, key=repr)


def test_a_found_referrer_committing_between_two_chunks_revives_what_it_now_reads(undeclared_deleted):
    """The sweep re-validates before a chunk once a referrer a mark found (undeclared) moved,
    as it does for declared ones: the clone's new version names the source's candidates not yet
    acted on, and they are skipped, not deleted."""
    lake, run, read_later = undeclared_deleted.lake, undeclared_deleted.run, undeclared_deleted.read_later
    source = lake.source
    free = lake.own - lake.needs

    assert source.name not in run.failed, run.err
    receipts = _receipts(run.summaries[source.name])
    assert read_later and {receipts[key] for key in read_later} == {"skipped_revived"}
    assert all((source.path / key).is_file() for key in read_later)
    assert sorted(key for key, action in receipts.items() if action == "deleted") == sorted(free - set(read_later))


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

    record_outside_references(config, day, {"sales/clone": {inside: inside + "/x.parquet"}})
    assert [r.name for r in referrers_of(config, "orders")] == ["sales/clone"]
    record_outside_references(config, day - dt.timedelta(days=3), {"sales/clone": {}})
    assert [r.name for r in referrers_of(config, "orders")] == ["sales/clone"]
    record_outside_references(config, day + dt.timedelta(days=1), {"sales/clone": {}})
    assert referrers_of(config, "orders") == []


def test_who_reaches_into_a_set_is_recorded_and_read_in_one_listing_whatever_its_size(tmp_path, monkeypatch):
    """Twelve tables, each read by a clone a mark found (undeclared), one also by a table that
    declares it: recording what the clones' marks found, finding the set's readers and taking
    its fingerprints list the reach records once each (on an object store a listing is a
    request), and every table's readers are still found."""
    tables = [
        RepositoryConfig(name=f"t{i:02d}", format="delta", storage_namespace=(tmp_path / f"t{i:02d}").as_uri())
        for i in range(12)
    ]
    clones = [
        RepositoryConfig(
            name=f"clone/{t.name}", format="delta", storage_namespace=(tmp_path / "clones" / t.name).as_uri()
        )
        for t in tables
    ]
    declared = RepositoryConfig(
        name="declared",
        format="delta",
        storage_namespace=(tmp_path / "declared").as_uri(),
        external_prefixes=[tables[0].storage_namespace + "/"],
    )
    config = GcConfig(state_dir=str(tmp_path / "state"), repositories=(*tables, *clones, declared))
    listed: list[str] = []
    keys = LocalState.keys
    monkeypatch.setattr(LocalState, "keys", lambda state, prefix: listed.append(prefix) or keys(state, prefix))
    found = {
        clone.name: {(folder := (tmp_path / table.name).resolve().as_uri() + "/part"): folder + "/x.parquet"}
        for table, clone in zip(tables, clones)
    }

    record_outside_references(config, dt.datetime(2026, 11, 20, tzinfo=dt.timezone.utc), found)
    assert listed == ["_reaches/"]
    readers = together.readers_of(config, tables)
    assert listed == ["_reaches/"] * 2
    assert sorted(r.name for r in readers) == sorted([*found, "declared"])
    assert together._fingerprints(None, config, tables) == {}  # every table is read by another
    assert listed == ["_reaches/"] * 3


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


def lent_twice(root: Path) -> tuple[IcebergLake, IcebergLake, IcebergLake]:
    """Three tables: the lender added `data/to-borrower.parquet` and `data/to-stranger.parquet` on
    day 1 and overwrote them on day 2; on day 3 the borrower added the first with `add_files`,
    the stranger the second."""
    lender, borrower, stranger = (iceberg_tables.new_lake(root, name) for name in ("lender", "borrower", "stranger"))
    lent = [(lake, lender.namespace / "data" / f"to-{lake.name}.parquet") for lake in (borrower, stranger)]
    for number, (_, path) in enumerate(lent):
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(iceberg_tables.rows([2 * number, 2 * number + 1]), path)  # no field ids, as add_files requires
    with iceberg_tables.clock_at(iceberg_tables.day(1)):
        lender.table().add_files([str(path) for _, path in lent])
    with iceberg_tables.clock_at(iceberg_tables.day(2)):
        lender.table().overwrite(iceberg_tables.rows([9]))
    for lake, path in lent:
        with iceberg_tables.clock_at(iceberg_tables.day(3)):
            lake.table().add_files([str(path)])
        lender.notes[lake.name] = path.relative_to(lender.namespace).as_posix()
    for lake in (lender, borrower, stranger):
        lake.age_files()
    return lender, borrower, stranger


def iceberg_candidates_alone(lake: IcebergLake, rules: dict, as_of: dt.datetime | None = None) -> set[str]:
    """The table's candidates at `as_of` (GC_DATE's end) when no other repository reads it: every
    file no snapshot the rules retain needs (pyiceberg's reading of them) and no hidden path."""
    table = lake.table()
    commits, refs = iceberg_tables.graph_from_metadata(table)
    as_of = as_of or end_of_day(iceberg_tables.GC_DATE)
    retained = set(retained_brute_force(commits, refs, Rules.model_validate(rules), as_of))
    live = {oracle_key(uri, lake.namespace_uri) for uri in iceberg_tables.expected_live_uris(table, retained)}
    return {key for key in lake.files() if key not in live and not iceberg_tables.is_hidden(key)}


def test_an_iceberg_tables_add_files_of_another_tables_file_keeps_it_live_there(tmp_path, spark):
    """The lender's candidates alone (pyiceberg's reading) hold both files it lent. With the
    borrower configured (its external_prefixes naming the lender) its file stays, and explain
    names the borrower; the stranger, undeclared, is refused, and the lender (the two swept as
    one set) keeps the stranger's file too, for the set's mark read the stranger before either
    was swept."""
    lender, borrower, stranger = lent_twice(tmp_path)
    lent = {lender.notes[name] for name in ("borrower", "stranger")}
    rules = {"rules": {"default_retention_days": 2}, "max_delete_fraction": 1.0}
    own = iceberg_candidates_alone(lender, rules["rules"])
    assert lent <= own and own - lent
    config = write_config(
        tmp_path / "gc.yaml",
        [
            lender.repo_config(**rules),
            borrower.repo_config(**rules, external_prefixes=[lender.namespace_uri]),
            stranger.repo_config(**rules),
        ],
        tmp_path / "state",
    )
    date = str(iceberg_tables.GC_DATE)

    run = gc_run(config, "--date", date, "--mode", "delete", "--repo", "lender", "--repo", "stranger")

    assert run.status == 1 and set(run.failed) == {"stranger"} and "external_prefixes" in run.failed["stranger"]
    swept = run.summaries["lender"]
    assert _candidates(swept) == own - lent
    assert swept["checks"]["independent_witness"] == "passed"
    assert swept["receipts"] == {"deleted": len(own - lent)}
    assert {key for key, action in _receipts(swept).items() if action == "deleted"} == own - lent
    assert all((lender.namespace / key).is_file() for key in lent)
    explanation = explain(config, lender.notes["borrower"], "lender", date)
    assert explanation["status"] == "live", explanation
    assert explanation["reasons"][0].startswith("repository borrower needs it"), explanation


def _mixed_lake(
    root: Path, rules: dict, with_stranger: bool
) -> tuple[tuple[IcebergLake, IcebergLake, IcebergLake], delta_tables.BuiltTable, Path]:
    """lent_twice's tables (the borrower declaring the lender's namespace; the stranger configured
    or not) and a Delta table dated to GC_DATE, under `rules`: the tables, the Delta one, gc.yaml."""
    lender, borrower, stranger = lent_twice(root)
    delta = delta_tables.merges(root / "wh", end_of_day(iceberg_tables.GC_DATE))
    repos = [
        lender.repo_config(**rules),
        borrower.repo_config(**rules, external_prefixes=[lender.namespace_uri]),
        *([stranger.repo_config(**rules)] if with_stranger else []),
        delta_repo("merges", delta, max_delete_fraction=1.0),
    ]
    return (lender, borrower, stranger), delta, write_config(root / "gc.yaml", repos, root / "state")


def test_iceberg_and_delta_tables_are_judged_as_one_set_and_what_one_reads_in_another_stays_live(tmp_path, spark):
    """A dry run of a lake of Iceberg and Delta tables is one fleet_job run: each Iceberg table's
    candidates are pyiceberg's reading of it alone, less what another table of the set reads in
    its namespace (the borrower declared, the stranger not: it is refused and its file stays
    live, found in the same run); the Delta table's are delta-rs's full vacuum."""
    rules = {"rules": {"default_retention_days": 2}, "max_delete_fraction": 1.0}
    (lender, borrower, stranger), delta, config = _mixed_lake(tmp_path, rules, with_stranger=True)
    lent = {lender.notes[name] for name in ("borrower", "stranger")}
    as_of = end_of_day(iceberg_tables.GC_DATE)

    run = gc_run(config, "--date", str(iceberg_tables.GC_DATE), "--all")
    late = delta_tables.now_utc() - as_of  # delta-rs's vacuum judges by the clock, the run by its as-of

    assert run.status == 1 and set(run.failed) == {"stranger"} and "external_prefixes" in run.failed["stranger"]
    judged = {name: run.summaries[name] for name in ("lender", "borrower", "merges")}
    assert len({summary["run_id"] for summary in judged.values()}) == 1, "one run for the set"
    assert _candidates(judged["lender"]) == iceberg_candidates_alone(lender, rules["rules"]) - lent
    assert _candidates(judged["borrower"]) == iceberg_candidates_alone(borrower, rules["rules"])
    assert _candidates(judged["merges"]) == delta_tables.vacuum_candidates(delta, late + dt.timedelta(WINDOW_DAYS))
    assert all(summary["checks"]["independent_witness"] == "passed" for summary in judged.values())
    assert judged["lender"]["orphan_candidates"] and judged["merges"]["orphan_candidates"]


def test_iceberg_and_delta_tables_are_deleted_as_one_set_each_iceberg_table_expiring_first(tmp_path, spark):
    """A delete run of Iceberg and Delta tables is one fleet_job run too: each Iceberg table first
    expires in its catalog what its mark expired, and loses exactly pyiceberg's reading of its
    candidates less what the borrower reads there, every snapshot its metadata still lists
    readable; the Delta table loses exactly delta-rs's full vacuum."""
    rules = {"rules": {"default_retention_days": 2}, "max_delete_fraction": 1.0}
    (lender, borrower, _), delta, config = _mixed_lake(tmp_path, rules, with_stranger=False)
    lent = {lender.notes["borrower"]}
    as_of = end_of_day(iceberg_tables.GC_DATE)
    own = {lake.name: iceberg_candidates_alone(lake, rules["rules"]) for lake in (lender, borrower)}
    before = {lake.name: lake.files() for lake in (lender, borrower)}
    snapshots = {s.snapshot_id for s in lender.table().metadata.snapshots}
    late = delta_tables.now_utc() - as_of
    vacuumed = delta_tables.vacuum_candidates(delta, late + dt.timedelta(WINDOW_DAYS))
    delta_before = delta.files()

    run = gc_run(config, "--date", str(iceberg_tables.GC_DATE), "--all", "--mode", "delete")

    assert run.status == 0, run.err
    assert len({summary["run_id"] for summary in run.summaries.values()}) == 1, "one run for the set"
    assert before["lender"] - lender.files() == own["lender"] - lent and own["lender"] - lent
    assert before["borrower"] - borrower.files() == own["borrower"]
    assert delta_before - delta.files() == vacuumed and vacuumed
    table = lender.table()
    left = {s.snapshot_id for s in table.metadata.snapshots}
    assert left < snapshots, "the expired snapshots were expired in the catalog first"
    assert all(table.scan(snapshot_id=snapshot).to_arrow() is not None for snapshot in left)
    assert (lender.namespace / next(iter(lent))).is_file()


def test_an_iceberg_table_of_a_set_whose_catalog_lost_its_expiry_is_refused_alone_before_anything_moves(
    tmp_path, monkeypatch, spark
):
    """The catalog answers each expiry as done and keeps none: a new read of the lender still
    lists what its mark expired, so it alone is refused, with every file in place, while the Delta
    table of the same run loses exactly delta-rs's full vacuum."""
    rules = {"rules": {"default_retention_days": 2}, "max_delete_fraction": 1.0}
    (lender, _, _), delta, config = _mixed_lake(tmp_path, rules, with_stranger=False)
    before = lender.files()
    snapshots = {s.snapshot_id for s in lender.table().metadata.snapshots}
    vacuumed = delta_tables.vacuum_candidates(
        delta, delta_tables.now_utc() - end_of_day(iceberg_tables.GC_DATE) + dt.timedelta(WINDOW_DAYS)
    )
    delta_before = delta.files()
    monkeypatch.setattr(SqlCatalog, "commit_table", iceberg_tables.acknowledged_but_lost)

    run = gc_run(config, "--date", str(iceberg_tables.GC_DATE), "--all", "--mode", "delete")

    assert run.status == 1 and set(run.failed) == {"lender"}, run.err
    assert "its metadata still lists 2 commit(s) the mark expired after the expiry" in run.failed["lender"]
    assert lender.files() == before
    assert {s.snapshot_id for s in lender.table().metadata.snapshots} == snapshots
    assert delta_before - delta.files() == vacuumed and vacuumed


def test_lakefs_repositories_native_and_exported_are_collected_in_one_set_with_a_delta_table(tmp_path, spark):
    """A dry run, then a delete run, of a lakeFS repository as lakeFS stores it, another as a
    graph export and a Delta table: each run is one fleet_job run for all three; each lakeFS
    repository's candidates, then what it loses, are the brute-force oracle's, the Delta table's
    delta-rs's full vacuum. Only the Delta table's fingerprint is taken before the mark: each
    lakeFS repository is read again before its sweep acts, as in its own run."""
    min_age = dt.timedelta(hours=24)
    native = native_lake_on_disk(tmp_path / "native", name="native", churn=30, seed=3, max_delete_fraction=1.0)
    exported = lake_on_disk(tmp_path / "exported", name="exported", churn=30, seed=5, max_delete_fraction=1.0)
    delta = delta_tables.merges(tmp_path / "wh", lakes.AS_OF)
    repos = [
        *(
            load_config(lake.config_path).repository(name).model_dump(mode="json", exclude_none=True)
            for name, lake in (("native", native), ("exported", exported))
        ),
        delta_repo("merges", delta, max_delete_fraction=1.0),
    ]
    config = write_config(tmp_path / "gc.yaml", repos, tmp_path / "state")
    expected = {
        "native": expected_candidates(
            native.lake, native.namespace_uri, native.rules, lakes.AS_OF, lakes.AS_OF - min_age, untracked=False
        ),
        "exported": expected_candidates(
            exported.lake, exported.namespace_uri, exported.rules, lakes.AS_OF, lakes.AS_OF - min_age
        ),
    }
    vacuumed = delta_tables.vacuum_candidates(delta, delta_tables.now_utc() - lakes.AS_OF + dt.timedelta(WINDOW_DAYS))
    before = {"native": native.files(), "exported": exported.files(), "merges": delta.files()}

    dry = gc_run(config, "--date", str(lakes.GC_DATE), "--all")

    assert dry.status == 0, dry.err
    assert len({summary["run_id"] for summary in dry.summaries.values()}) == 1, "one run for the set"
    assert {name: _candidates(dry.summaries[name]) for name in expected} == expected
    assert expected["native"] and expected["exported"]
    assert _candidates(dry.summaries["merges"]) == vacuumed and vacuumed
    assert all(set(summary["checks"].values()) == {"passed"} for summary in dry.summaries.values())
    lake = load_config(config)  # a lakeFS fingerprint may come back to an earlier one: re-read before acting
    assert set(together._fingerprints(spark, lake, lake.repositories)) == {"merges"}

    deleted = gc_run(config, "--date", str(lakes.GC_DATE), "--all", "--mode", "delete")

    assert deleted.status == 0, deleted.err
    assert len({summary["run_id"] for summary in deleted.summaries.values()}) == 1, "one run for the set"
    assert before["native"] - native.files() == expected["native"]
    assert before["exported"] - exported.files() == expected["exported"]
    assert before["merges"] - delta.files() == vacuumed


def test_a_lakefs_repository_whose_live_set_misses_an_object_of_its_head_is_stopped_by_its_witness_in_a_set(
    tmp_path, spark, monkeypatch
):
    """The connector's live entries of the exported repository lose one object its head needs:
    the witness (the export's raw rows, read apart from the live set) stops that repository
    alone, and the native one of the same run passes every check."""
    native = native_lake_on_disk(tmp_path / "native", name="native", churn=5, seed=3)
    exported = lake_on_disk(tmp_path / "exported", name="exported", churn=5, seed=5)
    repos = [
        load_config(lake.config_path).repository(name).model_dump(mode="json", exclude_none=True)
        for name, lake in (("native", native), ("exported", exported))
    ]
    config = write_config(tmp_path / "gc.yaml", repos, tmp_path / "state")
    read_live, lost = connectors._read_live, []

    def losing_one(spark, marked):  # each format's repositories are read apart
        live = read_live(spark, marked)
        exported = F.col("repo") == "exported"
        for row in live.filter(exported & F.col("at_head")).orderBy("address").limit(1).collect():
            lost.append(row["address"])
            live = live.filter(~(exported & (F.col("address") == row["address"])))
        return live

    monkeypatch.setattr(connectors, "_read_live", losing_one)

    run = gc_run(config, "--date", str(lakes.GC_DATE), "--all")

    assert lost and run.status == 1 and set(run.failed) == {"exported"}, run.err
    assert run.summaries["exported"]["checks"]["independent_witness"] == "failed"
    assert set(run.summaries["native"]["checks"].values()) == {"passed"}


def test_the_witness_reads_the_heads_of_a_referrer_this_very_run_found(tmp_path, spark, monkeypatch):
    """A clone no one declared and no earlier run recorded, and a mark that forgets what its
    referrers need: the source's candidates take the clone's files, and only the witness, which
    reads the heads of every referrer the run found (recorded before the witness reads), stops it."""
    lake = undeclared_clone(tmp_path / "wh", delta_tables.now_utc())
    borrowed = sets._borrowed
    monkeypatch.setattr(sets, "_borrowed", lambda *args: borrowed(*args).limit(0))
    config = write_config(tmp_path / "gc.yaml", [discovered(tmp_path / "wh")], tmp_path / "state")

    run = gc_run(config, "--all")

    checks = run.summaries[lake.source.name]["checks"]
    assert _candidates(run.summaries[lake.source.name]) == lake.own, "the mark forgot the clone's needs"
    assert checks["independent_witness"] == "failed" and checks["candidates_not_live"] == "passed", checks


def test_a_table_inside_another_tables_directory_is_collected_only_by_its_own_repository(judged_together):
    """delta-rs's vacuum of the outer table deletes the inner table's files, its log among
    them; gc_assets protects the inner namespace in the outer repository and collects it only
    under the inner table's own rules, and explain names the inner repository."""
    lake, nested = judged_together, judged_together.nested
    prefix = f"{nested.inner.name}/"
    inner_in_outer = {key for key in nested.outer_alone if key.startswith(prefix)}
    assert any("/_delta_log/" in key for key in inner_in_outer), "delta-rs keeps the inner log: the case is empty"

    assert not {"outer", "inner"} & set(lake.run.failed), lake.run.err
    assert _candidates(lake.run.summaries["outer"]) == nested.outer_alone - inner_in_outer
    assert _candidates(lake.run.summaries["inner"]) == nested.inner_own

    kept = sorted(nested.inner.files() - nested.inner_own)[0]
    explanation = explain(lake.config, prefix + kept, "outer", lake.date)
    assert explanation["status"] == "protected", explanation
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


def test_a_thousand_tables_discovered_inside_a_repository_are_all_protected_there(cloned_outer_deleted):
    """Each table discovered inside the outer table's directory is a nested namespace the outer
    repository must keep its hands off; with a thousand of them its mark still runs (one
    condition per protected prefix overflowed Spark's planner) and spares every one, in a
    delete run too."""
    lake = cloned_outer_deleted

    assert lake.run.status == 0, lake.run.err
    assert _candidates(lake.run.summaries["outer"]) == lake.outer_alone - lake.inside - lake.needs
    assert lake.inside <= lake.outer.files()
