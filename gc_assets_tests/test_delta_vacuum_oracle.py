"""Delta candidates equal delta-rs full vacuum on a corpus of real tables.

For every table shape and retention window, the candidates gc_assets computes (the
orphan_candidates pipeline, called directly with Spark) equal
`DeltaTable.vacuum(dry_run=True, full=True, retention_hours=W, enforce_retention_duration=False)`,
with the minimum object age set to the window (delta-rs judges untracked files by the
window). The one difference by design is stated and asserted where it occurs.
"""

from __future__ import annotations

import datetime as dt
import re
from concurrent.futures import ThreadPoolExecutor
from functools import reduce
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.addresses import with_relative_keys
from gc_assets.core.config import RepositoryConfig
from gc_assets.core.spark import local_frame
from gc_assets.mark.candidates import orphans
from gc_assets.mark.live import deduplicated
from gc_assets.mark.partition import GC_OWN_PREFIXES
from gc_assets.sources.base import retained_frame
from gc_assets.sources.delta import DeltaSource
from gc_assets.stores.local import LocalStore
from gc_assets_tests import delta_tables
from gc_assets_tests.delta_tables import SHAPES, BuiltTable

WINDOWS = [dt.timedelta(hours=1), dt.timedelta(days=4), dt.timedelta(days=10), dt.timedelta(days=20)]
AGREEMENT: dict[str, tuple[int, int]] = {}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, spark) -> dict[str, BuiltTable]:
    root = tmp_path_factory.mktemp("delta_corpus")
    now = delta_tables.now_utc()
    return {table.name: table for table in (build(root, now) for build in SHAPES)}


class TableFrames:
    """What does not depend on the window, computed once per table: the graph, the inventory, every committed key."""

    def __init__(self, spark: SparkSession, table: BuiltTable):
        self.source = DeltaSource(table.uri, table.uri)
        self.graph = self.source.commit_graph(spark)
        self.inventory = LocalStore(table.uri).list(spark).cache()
        self.committed = with_relative_keys(self.source.committed_addresses(spark), table.uri).cache()


def candidates_frame(spark: SparkSession, table: BuiltTable, frames: TableFrames, window: dt.timedelta) -> DataFrame:
    """orphan_candidates for `window`, as of now, min object age = window: address and reason."""
    repo = RepositoryConfig(
        name=table.name,
        format="delta",
        storage_namespace=table.uri,
        rules={"default_retention_days": window.total_seconds() / 86400},
        allow_unsafe_retention=True,
        min_object_age_hours=window.total_seconds() / 3600,
    )
    as_of = delta_tables.now_utc()
    source = frames.source
    commits, refs = frames.graph
    verdicts = source.evaluate_retention(spark, repo, commits, refs, as_of)
    retained = retained_frame(spark, verdicts, [c for c, v in verdicts.items() if v.retained])
    heads = local_frame(spark, [(r.commit_id,) for r in refs], "commit_id string")
    live = deduplicated(with_relative_keys(source.live_entries(spark, retained, heads), repo.storage_namespace))
    protected = source.protected_prefixes + GC_OWN_PREFIXES
    cutoff = as_of - repo.min_object_age
    candidates = orphans(frames.inventory, live, frames.committed, cutoff, protected, source.protected_patterns)
    return candidates.select("address", "reason")


def our_candidates(spark: SparkSession, table: BuiltTable, frames: TableFrames, window: dt.timedelta) -> dict[str, str]:
    """candidates_frame collected: address -> reason."""
    return {row["address"]: row["reason"] for row in candidates_frame(spark, table, frames, window).collect()}


def candidates_by_window(spark: SparkSession, table: BuiltTable, frames: TableFrames) -> list[dict[str, str]]:
    """candidates_frame for each of WINDOWS (address -> reason), collected at once rather than a collect per window."""
    every_window = reduce(
        DataFrame.unionByName,
        (candidates_frame(spark, table, frames, w).withColumn("window", F.lit(i)) for i, w in enumerate(WINDOWS)),
    )
    found: list[dict[str, str]] = [{} for _ in WINDOWS]
    for row in every_window.collect():
        found[row["window"]][row["address"]] = row["reason"]
    return found


@pytest.fixture(scope="module")
def found(spark, corpus) -> dict[str, list[dict[str, str]]]:
    """candidates_by_window of every shape, the shapes side by side: each is many tiny Spark jobs,
    which wait on the scheduler more than they compute, so several tables' jobs overlap."""
    with ThreadPoolExecutor(4) as markers:
        by_shape = markers.map(
            lambda table: candidates_by_window(spark, table, TableFrames(spark, table)), corpus.values()
        )
        return dict(zip(corpus, by_shape))


def hidden_below_top(key: str) -> bool:
    """Delta's hidden-name rule applied to a component other than the first.

    By design gc_assets applies the rule to every path component, as Delta on Spark
    does while listing; delta-rs checks only the start of the whole path, so it
    collects e.g. `part=a/_SUCCESS`. These files are never candidates here.
    """
    components = key.split("/")[1:]
    return any(re.match(r"[._]", c) and not c.startswith(("_delta_index", "_change_data")) for c in components)


@pytest.mark.parametrize("shape", [build.__name__ for build in SHAPES])
def test_candidates_equal_delta_rs_full_vacuum(corpus, found, shape):
    table = corpus[shape]
    identical = 0
    for window, ours in zip(WINDOWS, found[shape]):
        expected = delta_tables.vacuum_candidates(table, window)
        by_design = {key for key in expected if hidden_below_top(key)}
        assert set(ours) == expected - by_design, f"{shape}, window {window}"
        identical += set(ours) == expected
        # expired: some commit named it; untracked: none did.
        for key, reason in ours.items():
            assert reason == ("untracked" if key in table.untracked else "expired"), key
        if shape == "with_junk":
            assert by_design == {"part=a/_SUCCESS", "part=a/.part-x.crc"}
        else:
            assert not by_design
    AGREEMENT[shape] = (identical, len(WINDOWS))
    # Every shape has removals on both sides of some window: the comparison is not vacuous.
    assert delta_tables.vacuum_candidates(table, WINDOWS[0]) != delta_tables.vacuum_candidates(table, WINDOWS[2])


def test_agreement_figure_covers_every_shape():
    """Runs last in this module: every (table, window) pair was compared."""
    assert set(AGREEMENT) == {build.__name__ for build in SHAPES}
    identical = sum(i for i, _ in AGREEMENT.values())
    total = sum(n for _, n in AGREEMENT.values())
    print(
        f"\nagreement with delta-rs full vacuum: {identical}/{total} identical, "
        f"{total}/{total} equal up to the hidden-name rule"
    )
    assert total == len(SHAPES) * len(WINDOWS)
    assert identical == total - len(WINDOWS)  # only with_junk differs, and only by the stated rule


def test_corpus_exercises_the_formats_features(corpus):
    """The corpus holds what the comparison claims to cover: checkpoints, CDC files, encoded paths, removals."""
    log = corpus["checkpointed"].path / "_delta_log"
    assert (log / "00000000000000000004.checkpoint.parquet").exists()
    assert (log / "_last_checkpoint").exists()
    assert any(p.startswith("_change_data/") for p in corpus["change_data_feed"].files())
    awkward = {Path(p).parts[0] for p in corpus["awkward_partitions"].files() if p.startswith("part=")}
    assert {"part=x%20y", "part=a%3Db%25c", "part=100%25"} <= awkward
    lines = delta_tables.log_lines(corpus["compacted"].path)
    assert sum("remove" in a for actions in lines.values() for a in actions) >= 6
