"""Many Delta tables marked at once (mark/delta_fleet), beyond test_delta_fleet's warehouse: the
Spark jobs of a fleet mark do not grow with its tables, and tables that share files (shallow
clones) keep each other's, against delta-rs's own answer.
"""

from __future__ import annotations

from gc_assets.core.config import load_config
from gc_assets.core.names import REPO
from gc_assets.mark.delta_fleet import mark_tables
from gc_assets.mark.sets import candidates_of
from gc_assets.stores.local import LocalStore
from gc_assets.stores.many import list_many
from gc_assets_tests import delta_tables
from gc_assets_tests.conftest import jobs_started
from gc_assets_tests.lakes import write_config
from gc_assets_tests.test_delta_fleet import _lake
from gc_assets_tests.test_shared_live_set import SOURCES, cloned_warehouse


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
