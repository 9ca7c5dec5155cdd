"""Many Delta tables marked at once (mark/delta_tables), against delta-rs.

Every shape of test_delta_vacuum_oracle and test_delta_history (deletion vectors, CDC,
partitions, compaction, checkpoints of every kind, logs that lost their first versions) is
marked in one fleet beside the others, under windows that keep all (the table's own
retention), some and almost none of the history. Each table's candidates must be delta-rs's
full vacuum under the same window, and a table is refused only where the log cannot tell the
state at the cutoff; a table with a broken log fails alone. The same warehouse marked table by
table through its connector: test_delta_fleet_alone; the Spark jobs of a fleet mark and
shallow clones: test_delta_fleet_jobs.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from functools import cached_property, reduce
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from gc_assets.core.addresses import with_relative_keys
from gc_assets.core.config import GcConfig, RepositoryConfig, load_config
from gc_assets.core.names import REPO
from gc_assets.core.retention import Commit, Ref
from gc_assets.mark.delta_tables import mark_tables
from gc_assets.mark.live import deduplicated
from gc_assets.mark.retained import RETENTION_SCHEMA, verdict_rows
from gc_assets.mark.sets import candidates_of
from gc_assets.sources import RepositorySource, source_for
from gc_assets.sources.base import LIVE_ENTRY_SCHEMA
from gc_assets.stores.local import LocalStore
from gc_assets.stores.many import list_many
from gc_assets_tests import delta_tables
from gc_assets_tests.delta_tables import BuiltTable
from gc_assets_tests.lakes import write_config
from gc_assets_tests.test_delta_history import TRUNCATIONS, WEEK, history, state_at_cutoff_is_unknowable
from gc_assets_tests.test_delta_vacuum_oracle import hidden_below_top

BUILDERS = [
    delta_tables.appends_and_overwrites,
    delta_tables.deletes_and_updates,
    delta_tables.merges,
    delta_tables.awkward_partitions,
    delta_tables.compacted,
    delta_tables.checkpointed,
    delta_tables.change_data_feed,
    delta_tables.with_junk,
]
BROKEN = "broken"  # a table whose newest commit holds a line that is no JSON object
WINDOWS = [None, 0.25, 5.5, 11.5]  # days; None: no rules, each table's own deletedFileRetentionDuration
# Marked alone too: a window that keeps part of every table's history (a cut log's state at the
# cutoff bounded by its checkpoint's tombstones) and one that keeps more than every cut log can
# tell (refused). The verdicts of the other windows are the same rules on the same commit graph;
# their live sets are held to delta-rs by the candidates, in every window.
ALONE_WINDOWS = [5.5, 11.5]
DELTA_DEFAULT_RETENTION = dt.timedelta(days=7)  # delta.deletedFileRetentionDuration of a table that sets none


@dataclass
class Warehouse:
    root: Path
    untracked: dict[str, dict[str, float]]  # table -> the files planted beside its log (key -> mtime)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Warehouse:
    root = tmp_path_factory.mktemp("fleet")
    now = delta_tables.now_utc()
    untracked = {table.name: table.untracked for table in (build(root, now) for build in BUILDERS)}
    for name, truncate in TRUNCATIONS.items():
        history(root / name, {"delta.logRetentionDuration": "interval 1 days"} if name == "delta_rs_cleanup" else None)
        truncate(root / name)
    delta_tables.appends_and_overwrites(root / BROKEN, now)
    log = root / BROKEN / "appends_and_overwrites" / "_delta_log"
    newest = max(log.glob("*.json"))
    newest.write_text(newest.read_text() + "not json\n")
    return Warehouse(root, untracked)


def _lake(warehouse: Path, tmp_path: Path, window_days: float | None) -> GcConfig:
    rules = {} if window_days is None else {"rules": {"default_retention_days": window_days}}
    repos = [
        {
            "name": path.relative_to(warehouse).as_posix(),
            "format": "delta",
            "storage_namespace": path.as_uri(),
            "allow_unsafe_retention": True,
            **rules,
        }
        for path in sorted(p.parent for p in warehouse.rglob("_delta_log"))
    ]
    return load_config(write_config(tmp_path / "gc.yaml", repos, tmp_path / "state"))


def _rows(frame: Any) -> set[tuple]:
    return {tuple(row) for row in frame.collect()}


def _per_table(rows: list[Row], names: list[str]) -> dict[str, set[tuple]]:
    """Rows led by their table's name, as each table's set of the rest."""
    return {name: {tuple(row)[1:] for row in rows if row[REPO] == name} for name in names}


@dataclass
class Alone:
    """Each table marked by itself: its retained commits and live entries (RETENTION_SCHEMA and
    LIVE_ENTRY_SCHEMA, the table's name first), its live set (those entries keyed and
    deduplicated as mark.live does), and each refused table's refusal."""

    retained: list[Row] = field(default_factory=list)
    entries: list[Row] = field(default_factory=list)
    live: list[Row] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


class Connectors:
    """Each table's own connector and commit graph (or the graph's refusal), read once for every
    window: the graph does not depend on the window, only the verdicts do."""

    def __init__(self, spark):
        self.spark = spark
        self.sources: dict[str, RepositorySource] = {}
        self.graphs: dict[str, tuple[list[Commit], list[Ref]] | Exception] = {}

    def graph(self, repo: RepositoryConfig) -> tuple[RepositorySource, tuple[list[Commit], list[Ref]]]:
        if repo.name not in self.sources:
            self.sources[repo.name] = source_for(repo)
            try:
                self.graphs[repo.name] = self.sources[repo.name].commit_graph(self.spark)
            except Exception as exc:  # noqa: BLE001 - the refusal is the answer to compare
                self.graphs[repo.name] = exc
        graph = self.graphs[repo.name]
        if isinstance(graph, Exception):
            raise graph
        return self.sources[repo.name], graph


def marked_alone(spark, lake: GcConfig, as_of: dt.datetime, connectors: Connectors) -> Alone:
    """Every table of `lake` marked alone as of `as_of`, as mark.retained and mark.live mark it (the
    connector's evaluate_retention and live_entries), every table's rows collected in one Spark job."""
    alone = Alone()
    retained_frames, entry_frames = [], []
    for repo in lake.repositories:
        try:
            source, (commits, refs) = connectors.graph(repo)
            verdicts = source.evaluate_retention(spark, repo, commits, refs, as_of)
            judged = spark.createDataFrame(verdict_rows(commits, refs, verdicts), RETENTION_SCHEMA)
            entries = source.live_entries(
                spark,
                judged.filter("retained").select("commit_id", "threshold"),
                judged.filter("ref_head").select("commit_id"),
            )
        except Exception as exc:  # noqa: BLE001 - the refusal is the answer to compare
            alone.refused[repo.name] = str(exc)
            continue
        retained_frames.append(judged.select(F.lit(repo.name).alias(REPO), *RETENTION_SCHEMA.names))
        entry_frames.append(entries.select(F.lit(repo.name).alias(REPO), *LIVE_ENTRY_SCHEMA.names))
    alone.retained = reduce(DataFrame.unionByName, retained_frames).collect()
    alone.entries = reduce(DataFrame.unionByName, entry_frames).collect()
    # mark.live's keys and deduplication, each table's on its own entries with its own namespace.
    live = []
    for repo in lake.repositories:
        if repo.name in alone.refused:
            continue
        own = [row[1:] for row in alone.entries if row[REPO] == repo.name]
        entries = spark.createDataFrame(own, LIVE_ENTRY_SCHEMA)
        keyed = deduplicated(with_relative_keys(entries, repo.storage_namespace, repo.external_prefixes))
        live.append(keyed.select(F.lit(repo.name).alias(REPO), "*"))
    alone.live = reduce(DataFrame.unionByName, live).collect()
    return alone


@dataclass
class Decided:
    """The candidates of a fleet mark (candidates_of, without holds), collected."""

    rows: list[Row]  # (repo, address, size, last_modified, reason)
    live: list[Row]  # (repo, *the live set's columns)
    refused: dict[str, str]


class WindowMark:
    """One window's fleet mark of the warehouse; its candidates and each table marked alone when asked."""

    def __init__(self, spark, lake: GcConfig, connectors: Connectors):
        self.spark, self.lake, self.connectors = spark, lake, connectors
        self.as_of = delta_tables.now_utc()
        self.fleet = mark_tables(spark, lake.repositories, self.as_of)

    @cached_property
    def decided(self) -> Decided:
        stores = {name: LocalStore(table.repo.storage_namespace) for name, table in self.fleet.tables.items()}
        no_holds = self.spark.createDataFrame([], "repo string, address string")
        inventory = list_many(self.spark, stores)
        found = candidates_of(
            self.spark, self.lake, self.fleet, self.as_of, self.as_of, inventory, no_holds, list(self.fleet.repos)
        )
        return Decided(found.frame.collect(), found.live.collect(), found.refused)

    @cached_property
    def alone(self) -> Alone:
        return marked_alone(self.spark, self.lake, self.as_of, self.connectors)


@pytest.fixture(scope="module")
def marked(spark, warehouse, tmp_path_factory) -> Callable[[Optional[float]], WindowMark]:
    """Each window marked once as a fleet, for every test that judges that window."""
    made: dict[Optional[float], WindowMark] = {}
    connectors = Connectors(spark)

    def mark(window_days: Optional[float]) -> WindowMark:
        if window_days not in made:
            lake = _lake(warehouse.root, tmp_path_factory.mktemp("window"), window_days)
            made[window_days] = WindowMark(spark, lake, connectors)
        return made[window_days]

    return mark


def delta_rs_candidates(table: BuiltTable, window_days: Optional[float], repo) -> set[str]:
    """What gc_assets collects of a table, in delta-rs's words: its full vacuum under the window,
    except that files no commit names (`untracked`) are judged by their own guard (the table's
    deletedFileRetentionDuration, at least the minimum object age, docs/design.md §10) rather
    than by the window, and hidden names below the top are never collected (hidden_below_top)."""
    untracked = set(table.untracked)
    if untracked:
        assert "delta.deletedFileRetentionDuration" not in DeltaTable(str(table.path)).metadata().configuration
    window = None if window_days is None else dt.timedelta(days=window_days)
    expected = delta_tables.vacuum_candidates(table, window) - untracked
    if untracked:
        guard = max(DELTA_DEFAULT_RETENTION, repo.min_object_age)
        expected |= delta_tables.vacuum_candidates(table, guard) & untracked
    return {key for key in expected if not hidden_below_top(key)}


@pytest.mark.parametrize("window_days", WINDOWS)
def test_the_candidates_of_every_table_of_a_fleet_are_delta_rs_full_vacuums(marked, warehouse, window_days):
    """Each table's candidates are delta-rs's (delta_rs_candidates); a table is refused only where
    the state at the cutoff is gone (test_delta_history)."""
    window = marked(window_days)
    lake, fleet, decided = window.lake, window.fleet, window.decided
    rows = decided.rows
    assert not decided.refused
    names = list(fleet.tables)
    found = {name: {row["address"] for row in rows if row[REPO] == name} for name in names}
    expected = {
        name: delta_rs_candidates(
            BuiltTable(name, warehouse.root / name, warehouse.untracked.get(name, {})),
            window_days,
            lake.repository(name),
        )
        for name in names
    }
    assert found == expected
    for row in rows:  # expired: some commit named it; untracked: none did
        if row[REPO] in warehouse.untracked:
            assert row["reason"] == ("untracked" if row["address"] in warehouse.untracked[row[REPO]] else "expired")
    reasons = {row["reason"] for row in rows}
    assert reasons == {"expired", "untracked"}, (len(rows), reasons)  # both kinds judged, none vacuously
    for name in set(fleet.refused) - {f"{BROKEN}/appends_and_overwrites"}:
        cutoff_window = WEEK if window_days is None else dt.timedelta(days=window_days)
        assert state_at_cutoff_is_unknowable(BuiltTable(name, warehouse.root / name), cutoff_window), name
