"""format: file-catalog (docs/design.md §6.5) end to end: random IOx-style catalogs on SQLite and on
a real PostgreSQL, objects on local files and S3, collected exactly as the brute-force oracle
says in dry run, trash (then restored, objects and rows) and delete.

Object times come from the store's own clock (a file's max(mtime, ctime), S3's upload time),
so objects are written in two waves a few seconds apart and the object cutoff is seconds
(allow_unsafe_min_age); soft-delete times are written at every age around the 48 h row cutoff.

Each lake is dry-run once, its mark compared with the oracle; a trash or delete then sweeps that
mark (deletion_receipts alone). The lakes on local files are saved as marked and put back, objects,
state and catalog (PostgreSQL's saved rows inserted again), before each of their sweeps.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance

from gc_assets.cli import main as cli_main
from gc_assets.core.time import partition_date_of
from gc_assets.runner import run_partition
from gc_assets.stores.local import LocalStore
from gc_assets.sweep import lease
from gc_assets_tests import delta_tables
from gc_assets_tests.cli_runs import run_cli_in_memory
from gc_assets_tests.file_catalogs import (
    OBJECT_CUTOFF,
    ROW_CUTOFF_HOURS,
    catalog_entry,
    oracle,
    postgres_catalog,
    random_catalog,
    sqlite_catalog,
    table_rows,
    write_file,
    write_objects_of,
)
from gc_assets_tests.lakes import write_config
from gc_assets_tests.marked_lakes import replace_with_copy
from gc_assets_tests.postgres_server import postgres  # noqa: F401 - the fixture
from gc_assets_tests.s3_server import s3  # noqa: F401 - the fixture
from gc_assets_tests.sweep_runs import sweep_only

BUCKET = "iox"


def _local_listing(root: Path) -> dict[str, dt.datetime]:
    listing = {}
    for path in root.rglob("*"):
        if path.is_file():
            stat = path.stat()
            listing[path.relative_to(root).as_posix()] = dt.datetime.fromtimestamp(
                max(stat.st_mtime_ns, stat.st_ctime_ns) / 1e9, dt.timezone.utc
            )
    return listing


def _s3_listing(s3, prefix: str) -> dict[str, dt.datetime]:
    client, listing = s3.client(), {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for item in page.get("Contents", []):
            listing[item["Key"][len(prefix) + 1 :]] = item["LastModified"]
    return listing


def _table(stored: str) -> list[dict[str, Any]]:
    return pq.read_table(stored).to_pylist()


def _row_cutoff(outcome) -> dt.datetime:
    (state,) = _table(outcome.summary["outputs"]["retained_commits"])
    return state["threshold"].replace(tzinfo=dt.timezone.utc)


def _by_action(outcome) -> dict[str, set]:
    found: dict[str, set] = {}
    for receipt in _table(outcome.summary["outputs"]["deletion_receipts"]):
        value = (
            receipt["row_id"]
            if receipt["action"].startswith("row_") or receipt["action"].endswith("_row")
            else receipt["address"]
        )
        found.setdefault(receipt["action"], set()).add(value)
    return found


class Lake:
    """One random catalog with its objects, on local files or S3, and its database; `before_objects(lake)`
    runs once the catalog exists, before its objects are written (`lake.put` writes one). Without
    `objects`, none are written yet: _write_together writes several lakes' objects and sets their as-of."""

    def __init__(
        self,
        tmp_path: Path,
        database: str,
        store: str,
        request,
        seed: int = 11,
        rows: int = 300,
        before_objects: Optional[Callable[["Lake"], None]] = None,
        objects: bool = True,
    ):
        self.tmp_path, self.store = tmp_path, store
        now = dt.datetime.now(dt.timezone.utc)
        self.catalog = random_catalog(seed, rows, now)
        self.pg = request.getfixturevalue("postgres") if database == "postgres" else None
        if self.pg is not None:
            self.database = f"iox_{seed}_{store}"
            self.url = postgres_catalog(self.pg, self.database, self.catalog)
        else:
            self.url = sqlite_catalog(tmp_path / "catalog.db", self.catalog)
        if store == "s3":
            self.s3 = request.getfixturevalue("s3")
            self.s3.create_bucket(BUCKET)
            self.prefix = f"iox-{seed}"
            self.namespace = f"s3://{BUCKET}/{self.prefix}"
            client = self.s3.client()
            self.put: Callable[[str], None] = lambda key: client.put_object(
                Bucket=BUCKET, Key=f"{self.prefix}/{key}", Body=key.encode()
            )
        else:
            self.root = tmp_path / "iox"
            self.root.mkdir()
            self.namespace = f"file://{self.root}"
            self.put = lambda key: write_file(self.root, key)
        if before_objects is not None:
            before_objects(self)
        self.config = write_config(
            tmp_path / "gc.yaml", [catalog_entry("iox", self.namespace, self.url)], tmp_path / "state"
        )
        self.instance = DagsterInstance.ephemeral()
        if objects:
            (self.as_of,) = write_objects_of([(self.catalog, self.put)], OBJECT_CUTOFF)

    def save(self) -> None:
        """Keep the objects, the state and the catalog as they are now, beside them (PostgreSQL's rows in memory)."""
        for part in self._saved_parts():
            replace_with_copy(self.tmp_path / part, self._saved / part)
        if self.pg is not None:
            self._saved_rows = self.rows()

    def restore(self) -> None:
        """Everything as saved, at the paths it was saved from (stored partitions and journals name them).

        PostgreSQL's table gets its saved rows back in place: the run's catalog snapshot stays open
        in this process (file_catalog holds the latest read), so the database is not recreated."""
        for part in self._saved_parts():
            replace_with_copy(self._saved / part, self.tmp_path / part)
        if self.pg is not None:
            with self.pg.connect(self.database) as connection, connection.transaction():
                connection.execute("DELETE FROM parquet_file")
                connection.cursor().executemany(
                    "INSERT INTO parquet_file VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    [(row_id, *rest) for row_id, rest in self._saved_rows.items()],
                )

    def _saved_parts(self) -> list[str]:
        return ["state", *(["iox"] if self.store == "local" else []), *(["catalog.db"] if self.pg is None else [])]

    @property
    def _saved(self) -> Path:
        return self.tmp_path.with_name(f"{self.tmp_path.name}-saved")

    def listing(self) -> dict[str, dt.datetime]:
        return _s3_listing(self.s3, self.prefix) if self.store == "s3" else _local_listing(self.root)

    def rows(self) -> dict[int, tuple[Any, ...]]:
        return table_rows(self.url, self.pg)

    def run(self, mode: str):
        outcome = run_partition(
            str(self.config), "iox", partition_date_of(self.as_of), as_of=self.as_of, mode=mode, instance=self.instance
        )
        assert outcome.success, outcome.error
        return outcome

    def sweep(self, mode: str):
        """deletion_receipts alone in `mode`, on the stored mark."""
        outcome = sweep_only(self.config, "iox", self.as_of, self.instance, mode)
        assert outcome.success, outcome.error
        return outcome

    def expected(self, outcome, listing: dict[str, dt.datetime]) -> Any:
        cutoff = _row_cutoff(outcome)
        assert abs(cutoff - (self.as_of - dt.timedelta(hours=ROW_CUTOFF_HOURS))) < dt.timedelta(
            minutes=15
        )  # the run itself, on a loaded machine
        return oracle(self.catalog.rows, listing, cutoff, self.as_of - OBJECT_CUTOFF)


@dataclass(frozen=True)
class Marked:
    """A lake's dry run (its mark) and both places before and after it."""

    lake: Lake
    rows_before: dict[int, tuple[Any, ...]]
    listing_before: dict[str, dt.datetime]
    dry: Any
    rows_after: dict[int, tuple[Any, ...]]
    listing_after: dict[str, dt.datetime]


def _write_together(lakes: list[Lake]) -> None:
    """Several lakes' objects with one pause, each lake's as-of right after its young wave."""
    for lake, written in zip(lakes, write_objects_of([(lake.catalog, lake.put) for lake in lakes], OBJECT_CUTOFF)):
        lake.as_of = written


def _mark(lake: Lake) -> Marked:
    rows_before, listing_before = lake.rows(), lake.listing()
    dry = lake.run("dry_run")
    return Marked(lake, rows_before, listing_before, dry, lake.rows(), lake.listing())


def _marked_and_saved(lake: Lake) -> Marked:
    marked = _mark(lake)
    lake.save()
    return marked


def _collect(marked: Marked, final: str, marks_again: bool = True) -> None:
    """The dry run as the oracle says, then a sweep of its mark in `final` mode (trash: then restored, and
    with `marks_again` a new dry run holds what was restored)."""
    lake, rows_before, listing_before = marked.lake, marked.rows_before, marked.listing_before
    expected = lake.expected(marked.dry, listing_before)
    assert expected.candidates and expected.removed_rows and not expected.missing_live
    assert {r["address"] for r in _table(marked.dry.summary["outputs"]["orphan_candidates"])} == expected.candidates
    assert {r["address"] for r in _table(marked.dry.summary["outputs"]["live_files"])} == expected.live
    assert _by_action(marked.dry) == {"would_delete": expected.candidates, "would_delete_row": expected.removed_rows}
    assert marked.rows_after == rows_before and marked.listing_after == listing_before  # dry run touches neither

    done = lake.sweep(final)  # the mark's own cutoffs; storage as the dry run left it
    action, row_action = ("trashed", "row_trashed") if final == "trash" else ("deleted", "row_deleted")
    assert _by_action(done) == {action: expected.candidates, row_action: expected.removed_rows}
    assert set(lake.rows()) == set(rows_before) - expected.removed_rows
    remaining = {k for k in lake.listing() if not k.startswith(("_gc/", "_gc_trash/"))}
    assert remaining == set(listing_before) - expected.candidates
    assert expected.live <= remaining  # every object a remaining row names is still there
    if final != "trash":
        return
    run_id = done.summary["run_id"]
    assert cli_main(["restore", "--config", str(lake.config), "--repo", "iox", "--run-id", run_id]) == 0
    assert lake.rows() == rows_before  # the removed rows are back, as they were
    restored = {k for k in lake.listing() if not k.startswith(("_gc/", "_gc_trash/"))}
    assert restored == set(listing_before)
    if not marks_again:
        return
    again = lake.run("dry_run")  # a new mark: restored rows and objects are held, not taken again until released
    assert not _by_action(again).get("would_delete_row", set()) & expected.removed_rows
    assert not _by_action(again).get("would_delete", set()) & expected.candidates


SEEDS = {("sqlite", "local"): 11, ("postgres", "local"): 21, ("sqlite", "s3"): 31, ("postgres", "s3"): 32}


@pytest.fixture(scope="module")
def lakes(spark, tmp_path_factory, request) -> dict[tuple[str, str], Lake]:
    """A lake of each catalog kind on each store, by (database, store), their objects written together."""
    made = {
        (database, store): Lake(
            tmp_path_factory.mktemp(f"{database}-{store}"), database, store, request, seed=seed, objects=False
        )
        for (database, store), seed in SEEDS.items()
    }
    _write_together(list(made.values()))
    return made


@pytest.fixture(scope="module")
def sqlite_on_local_files(lakes) -> Marked:
    """Marked once for the module; each test puts it back as marked, then sweeps it."""
    return _marked_and_saved(lakes["sqlite", "local"])


@pytest.fixture(scope="module")
def postgres_on_local_files(lakes) -> Marked:
    """Marked once for the module; each test puts it back as marked, then sweeps it."""
    return _marked_and_saved(lakes["postgres", "local"])


@pytest.mark.parametrize("final", ["trash", "delete"])
def test_sqlite_catalog_on_local_files_is_collected_as_the_oracle_says(final, sqlite_on_local_files):
    """The new mark after the restore is shown on PostgreSQL here and on SQLite over S3."""
    sqlite_on_local_files.lake.restore()
    _collect(sqlite_on_local_files, final, marks_again=False)


@pytest.mark.parametrize("final", ["trash", "delete"])
def test_postgres_catalog_on_local_files_is_collected_as_the_oracle_says(final, postgres_on_local_files):
    postgres_on_local_files.lake.restore()
    _collect(postgres_on_local_files, final)


def test_a_catalog_whose_lease_another_sweep_holds_keeps_its_rows_and_objects(sqlite_on_local_files):
    """A catalog's rows are cleaned under its sweep's lease, as in a set: a sweep refused because
    another holds the lease removes no row and no object."""
    marked = sqlite_on_local_files
    lake = marked.lake
    lake.restore()
    store = LocalStore(lake.namespace)
    taken = lease.acquire(store, "another-sweep", f"{partition_date_of(lake.as_of)}|iox", delta_tables.now_utc())
    try:
        refused = sweep_only(lake.config, "iox", lake.as_of, lake.instance, "delete")
    finally:
        lease.release(store, taken)
    assert not refused.success and "another sweep holds the lease" in refused.error, refused.error
    assert lake.rows() == marked.rows_before, "no row was removed"
    assert set(lake.listing()) == set(marked.listing_before), "no object was removed"


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_catalog_on_s3_is_collected_as_the_oracle_says(database, lakes):
    _collect(_mark(lakes[database, "s3"]), "trash" if database == "sqlite" else "delete")


def test_demo_file_catalog_is_collected_in_dry_run(spark, tmp_path, monkeypatch):
    """`make demo`'s file catalog: ten rows soft-deleted three days ago go, and so do their 40-day-old
    files and one old file no row names; the young stray and yesterday's soft deletes stay."""
    from gc_assets.demo.embedded import file_catalog_demo
    from gc_assets.stores.local import TRUST_MTIME_ENV_VAR

    monkeypatch.setenv(TRUST_MTIME_ENV_VAR, "1")
    repo = file_catalog_demo(tmp_path)
    config = write_config(tmp_path / "gc.yaml", [repo.config], tmp_path / "state")
    outcome = run_partition(
        str(config), repo.config["name"], repo.gc_date, mode="dry_run", instance=DagsterInstance.ephemeral()
    )
    assert outcome.success, outcome.error
    assert outcome.summary["receipts"] == {"would_delete": 11, "would_delete_row": 10}
    state = _table(outcome.summary["outputs"]["retained_commits"])[0]
    assert (state["rows"], state["soft_deleted"], state["past_row_cutoff"]) == (40, 20, 10)


def test_bench_catalog_agrees_with_its_reference(spark, tmp_path):
    from bench.catalog import bench_catalog
    from bench.run import _catalog_config, run_graph

    result = bench_catalog(tmp_path, "2k", run_graph, _catalog_config)
    assert result.agree and result.candidates == 20 and result.removed_rows == 1_800 and result.files == 220


def test_file_catalogs_are_collected_in_one_set_with_a_delta_table_as_the_oracle_says(spark, tmp_path, request):
    """A SQLite catalog that deletes, a PostgreSQL catalog that trashes and a Delta table that
    deletes, dry-run then swept by `run --all`, each run one run for all three: each catalog's
    rows and objects as the brute-force oracle says (state counters beside its retained state),
    the Delta table's files as delta-rs's full vacuum; the trashed catalog's rows and objects
    then come back by restore."""
    table = delta_tables.merges(tmp_path / "wh", delta_tables.now_utc())
    databases = {"deleting": ("sqlite", 51), "trashing": ("postgres", 53)}
    catalogs = {
        name: Lake(_made(tmp_path / name), database, "local", request, seed=seed, objects=False)
        for name, (database, seed) in databases.items()
    }
    _write_together(list(catalogs.values()))
    as_of = max(lake.as_of for lake in catalogs.values())
    for lake in catalogs.values():
        lake.as_of = as_of  # one run, one as-of: each catalog's object cutoff is the run's
    delta = {
        "name": "merges",
        "format": "delta",
        "storage_namespace": table.uri,
        "rules": {"default_retention_days": 5},
        "allow_unsafe_retention": True,
        "max_delete_fraction": 1.0,
        "mode": "delete",
    }
    modes = {"deleting": "delete", "trashing": "trash"}
    repos = [catalog_entry(name, lake.namespace, lake.url, mode=modes[name]) for name, lake in catalogs.items()]
    config = write_config(tmp_path / "gc.yaml", [*repos, delta], tmp_path / "state")
    rows_before = {name: lake.rows() for name, lake in catalogs.items()}
    listing_before = {name: lake.listing() for name, lake in catalogs.items()}
    vacuumed = delta_tables.vacuum_candidates(table, delta_tables.now_utc() - as_of + dt.timedelta(days=5))
    files_before = table.files()

    def run(*arguments: str) -> dict[str, Any]:
        done = run_cli_in_memory("run", "--config", str(config), "--all", "--as-of", as_of.isoformat(), *arguments)
        summaries = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert done.returncode == 0, done.stderr
        assert len({summary["run_id"] for summary in summaries}) == 1, "one run for the set"
        return {summary["repo"]: _Outcome(summary) for summary in summaries}

    dry = run("--mode", "dry-run", "--json")

    expected = {name: lake.expected(dry[name], listing_before[name]) for name, lake in catalogs.items()}
    for name, lake in catalogs.items():
        wanted = expected[name]
        assert wanted.candidates and wanted.removed_rows and not wanted.missing_live
        assert _by_action(dry[name]) == {"would_delete": wanted.candidates, "would_delete_row": wanted.removed_rows}
        (state,) = _table(dry[name].summary["outputs"]["retained_commits"])
        assert state["rows"] == len(rows_before[name]) and state["past_row_cutoff"] == len(wanted.removed_rows)
        assert lake.rows() == rows_before[name] and lake.listing() == listing_before[name]
    assert _by_action(dry["merges"]) == {"would_delete": vacuumed} and vacuumed

    swept = run("--json")

    for name, lake in catalogs.items():
        wanted, action = expected[name], {"delete": "deleted", "trash": "trashed"}[modes[name]]
        assert _by_action(swept[name]) == {action: wanted.candidates, f"row_{action}": wanted.removed_rows}
        assert set(lake.rows()) == set(rows_before[name]) - wanted.removed_rows
        remaining = {key for key in lake.listing() if not key.startswith(("_gc/", "_gc_trash/"))}
        assert remaining == set(listing_before[name]) - wanted.candidates
    assert files_before - table.files() == vacuumed

    run_id = swept["trashing"].summary["run_id"]
    assert cli_main(["restore", "--config", str(config), "--repo", "trashing", "--run-id", run_id]) == 0
    assert catalogs["trashing"].rows() == rows_before["trashing"]
    back = {key for key in catalogs["trashing"].listing() if not key.startswith(("_gc/", "_gc_trash/"))}
    assert back == set(listing_before["trashing"])


@dataclass(frozen=True)
class _Outcome:
    summary: dict[str, Any]  # a repository's JSON summary of a `run --all`


def _made(path: Path) -> Path:
    path.mkdir()
    return path
