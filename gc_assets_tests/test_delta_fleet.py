"""Many Delta tables marked at once (mark/delta_fleet), against each table marked alone.

The oracle is the per-table mark (mark.retained and DeltaSource.live_entries), itself held to
delta-rs's full vacuum by test_delta_vacuum_oracle and test_delta_history: every shape of those
tests (deletion vectors, CDC, partitions, compaction, checkpoints of every kind, logs that lost
their first versions) is marked in one fleet beside the others, under windows that keep all,
some and almost none of the history, and each table's retained commits, live entries and
refusal must be exactly its own. A table with a broken log fails alone. Tables that share
files (shallow clones) keep each other's, against delta-rs's own answer.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from gc_assets.core.config import GcConfig, load_config
from gc_assets.mark import candidates
from gc_assets.mark.delta_fleet import REPO, FleetMark, candidates_of, mark_tables
from gc_assets.mark.live import live
from gc_assets.mark.partition import GcPartition, Mark
from gc_assets.mark.retained import retained
from gc_assets.stores.local import LocalStore
from gc_assets.stores.many import list_many
from gc_assets_tests import delta_tables
from gc_assets_tests.conftest import jobs_started
from gc_assets_tests.lakes import write_config
from gc_assets_tests.test_delta_history import TRUNCATIONS, history
from gc_assets_tests.test_shared_live_set import SOURCES, cloned_warehouse

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


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fleet")
    now = delta_tables.now_utc()
    for build in BUILDERS:
        build(root, now)
    for name, truncate in TRUNCATIONS.items():
        history(root / name, {"delta.logRetentionDuration": "interval 1 days"} if name == "delta_rs_cleanup" else None)
        truncate(root / name)
    delta_tables.appends_and_overwrites(root / BROKEN, now)
    log = root / BROKEN / "appends_and_overwrites" / "_delta_log"
    newest = max(log.glob("*.json"))
    newest.write_text(newest.read_text() + "not json\n")
    return root


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
class WindowMark:
    """One window's fleet mark of the warehouse, and each table's own partition to mark it alone."""

    lake: GcConfig
    as_of: dt.datetime
    fleet: FleetMark
    partitions: dict[str, GcPartition]
    judged: dict[str, DataFrame | str] = field(default_factory=dict)  # each table's retained() alone, or its refusal


@pytest.fixture(scope="module")
def marked(spark, warehouse, tmp_path_factory) -> Callable[[Optional[float]], WindowMark]:
    """Each window marked once, as a fleet and table by table, for every test that judges that window."""
    made: dict[Optional[float], WindowMark] = {}

    def mark(window_days: Optional[float]) -> WindowMark:
        if window_days not in made:
            lake = _lake(warehouse, tmp_path_factory.mktemp("window"), window_days)
            as_of = delta_tables.now_utc()
            fleet = mark_tables(spark, lake.repositories, as_of)
            partitions = {repo.name: GcPartition(lake, repo, as_of.date(), as_of) for repo in lake.repositories}
            window = made[window_days] = WindowMark(lake, as_of, fleet, partitions)
            for name, partition in partitions.items():
                try:
                    window.judged[name] = retained(spark, partition).frame
                except Exception as exc:  # noqa: BLE001 - the refusal is the answer to compare
                    window.judged[name] = str(exc)
        return made[window_days]

    return mark


def _alone(spark, window: WindowMark, name: str) -> tuple[set[tuple], set[tuple]] | str:
    """The table marked by itself: (retained commits, live entries), or its refusal."""
    judged = window.judged[name]
    if isinstance(judged, str):
        return judged
    try:
        entries = window.partitions[name].source.live_entries(
            spark,
            judged.filter("retained").select("commit_id", "threshold"),
            judged.filter("ref_head").select("commit_id"),
        )
        return _rows(judged), _rows(entries)
    except Exception as exc:  # noqa: BLE001 - the refusal is the answer to compare
        return str(exc)


@pytest.mark.parametrize("window_days", [None, 0.25, 5.5, 11.5])
def test_every_table_of_a_fleet_is_marked_as_it_is_alone(spark, marked, window_days):
    window = marked(window_days)
    fleet = window.fleet

    retained_rows, live_rows = _rows(fleet.retained), _rows(fleet.live)
    names = [repo.name for repo in window.lake.repositories]
    assert len(names) == len(BUILDERS) + len(TRUNCATIONS) + 1
    for name in names:
        alone = _alone(spark, window, name)
        if isinstance(alone, str):
            assert fleet.refused.get(name) == alone, name
            continue
        assert name not in fleet.refused, fleet.refused[name]
        assert {row[1:] for row in retained_rows if row[0] == name} == alone[0], name
        assert {row[1:] for row in live_rows if row[0] == name} == alone[1], name
    assert BROKEN in {name.split("/")[0] for name in fleet.refused}, "the broken table failed alone"
    assert not {build.__name__ for build in BUILDERS} & set(fleet.refused), fleet.refused


def test_the_spark_jobs_of_a_fleet_mark_do_not_grow_with_its_tables(spark, tmp_path):
    """Three tables or twelve, each with two checkpoints and a retention window that needs the
    older one: the same number of Spark jobs, marking and deciding the candidates."""
    now = delta_tables.now_utc()
    counts = {}
    for size in (3, 12):
        root = tmp_path / f"wh{size}"
        for i in range(size):
            built = delta_tables.checkpointed(root / f"t{i:02d}", now)
            (built.path / "junk.parquet").write_bytes(b"untracked")  # an inventory beyond the log
        (tmp_path / f"c{size}").mkdir()
        lake = _lake(root, tmp_path / f"c{size}", 5.5)
        before = jobs_started(spark)
        fleet = mark_tables(spark, lake.repositories, now)
        stores = {name: LocalStore(table.repo.storage_namespace) for name, table in fleet.tables.items()}
        held = spark.createDataFrame([], "repo string, address string")
        decided = candidates_of(spark, lake, fleet, now, now, list_many(spark, stores), held)
        fleet.retained.collect(), decided.live.collect(), decided.frame.collect()
        counts[size] = jobs_started(spark) - before
        assert not fleet.refused and not decided.refused
        assert {row[REPO] for row in fleet.live.collect()} == {repo.name for repo in lake.repositories}
    assert counts[3] == counts[12], counts


@pytest.mark.parametrize("window_days", [0.25, 5.5, 11.5])
def test_the_candidates_of_every_table_of_a_fleet_are_its_candidates_alone(spark, marked, window_days):
    window = marked(window_days)
    lake, fleet, as_of = window.lake, window.fleet, window.as_of
    mark_time = as_of
    stores = {name: LocalStore(table.repo.storage_namespace) for name, table in fleet.tables.items()}
    no_holds = spark.createDataFrame([], "repo string, address string")

    decided = candidates_of(spark, lake, fleet, as_of, mark_time, list_many(spark, stores), no_holds)

    rows, live_rows = decided.frame.collect(), decided.live.collect()
    assert not decided.refused
    alone_candidates, alone_live = [], []
    for name, table in fleet.tables.items():
        partition, judged = window.partitions[name], window.judged[name]
        assert not isinstance(judged, str), judged
        live_set, _ = live(spark, partition, judged)
        mark = Mark("alone", mark_time, table.source.source_time(spark))  # the cutoffs of the fleet's reading
        held = spark.createDataFrame([], "address string")
        alone = candidates.candidates(spark, partition, stores[name].list(spark), live_set, lambda: mark, lambda: held)
        alone_candidates.append(alone.frame.select(F.lit(name).alias(REPO), "*"))
        alone_live.append(live_set.select(F.lit(name).alias(REPO), "*"))
    # Each table's own answer, every table's read in one Spark job rather than one job per table.
    names = list(fleet.tables)
    assert _per_table(rows, names) == _per_table(reduce(DataFrame.unionByName, alone_candidates).collect(), names)
    assert _per_table(live_rows, names) == _per_table(reduce(DataFrame.unionByName, alone_live).collect(), names)
    reasons = {row["reason"] for row in rows}
    assert reasons == {"expired", "untracked"}, (len(rows), reasons)  # both kinds judged, none vacuously


def test_a_fleet_keeps_what_another_table_of_it_needs_and_refuses_a_table_whose_referrer_it_did_not_read(
    spark, tmp_path
):
    """Shallow clones name their source's files by absolute URI: in one fleet, each source's
    candidates are delta-rs's minus what its clones' heads need (read by delta-rs from the
    clones' logs), the clones' candidates are delta-rs's own; a fleet that leaves the clones out
    refuses their sources instead of collecting blind."""
    now = delta_tables.now_utc()
    warehouse = cloned_warehouse(tmp_path, now, 20261126)
    lake = load_config(write_config(tmp_path / "gc.yaml", warehouse.repos, tmp_path / "state"))
    own, needs = warehouse.own, warehouse.needs
    no_holds = spark.createDataFrame([], "repo string, address string")

    def fleet_candidates(repositories) -> tuple[dict[str, set[str]], dict[str, str]]:
        fleet = mark_tables(spark, repositories, now)
        stores = {name: LocalStore(table.repo.storage_namespace) for name, table in fleet.tables.items()}
        decided = candidates_of(spark, lake, fleet, now, now, list_many(spark, stores), no_holds)
        refused = decided.refused
        by_repo: dict[str, set[str]] = {name: set() for name in fleet.tables if name not in refused}
        for row in decided.frame.collect():
            by_repo[row[REPO]].add(row["address"])
        return by_repo, {**fleet.refused, **refused}

    found, refused = fleet_candidates(lake.repositories)

    assert not refused, refused
    assert found == {name: own[name] - needs.get(name, set()) for name in warehouse.tables}

    found, refused = fleet_candidates([lake.repository(name) for name in SOURCES])

    assert set(refused) == {"overwrites", "updates"}, refused
    assert "overwrites-0" in refused["overwrites"] and "not a table of this run" in refused["overwrites"]
    assert found == {"merges": own["merges"]}
