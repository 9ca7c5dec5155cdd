"""test_delta_fleet's warehouse marked as a fleet against each table marked alone: under a
window that keeps part of every table's history and one that keeps more than every cut log can
tell, each table's retained commits, live entries, live set and refusal are exactly its own,
marked alone through its connector (DeltaSource, the per-table pipeline's rules). A file of its
own, beside test_delta_fleet (the candidates against delta-rs), so that the two run side by side.
"""

from __future__ import annotations

from functools import reduce

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gc_assets.mark.delta_tables import commits_referencing
from gc_assets.mark.retained import RETENTION_SCHEMA
from gc_assets_tests.test_delta_fleet import (  # noqa: F401 - the fixtures, made again for this file
    ALONE_WINDOWS,
    BROKEN,
    BUILDERS,
    REPO,
    TRUNCATIONS,
    _per_table,
    _rows,
    marked,
    warehouse,
)


@pytest.mark.parametrize("window_days", ALONE_WINDOWS)
def test_every_table_of_a_fleet_is_marked_as_it_is_alone(spark, marked, window_days):
    """Retained commits, live entries, live set and refusals, table by table."""
    window = marked(window_days)
    fleet, alone = window.fleet, window.alone

    retained_rows, live_rows = _rows(fleet.retained), _rows(fleet.live)
    names = [repo.name for repo in window.lake.repositories]
    assert len(names) == len(BUILDERS) + len(TRUNCATIONS) + 1
    alone_retained, alone_entries = _per_table(alone.retained, names), _per_table(alone.entries, names)
    for name in names:
        if name in alone.refused:
            assert fleet.refused.get(name) == alone.refused[name], name
            continue
        assert name not in fleet.refused, fleet.refused[name]
        assert {row[1:] for row in retained_rows if row[0] == name} == alone_retained[name], name
        assert {row[1:] for row in live_rows if row[0] == name} == alone_entries[name], name
    assert BROKEN in {name.split("/")[0] for name in fleet.refused}, "the broken table failed alone"
    assert not {build.__name__ for build in BUILDERS} & set(fleet.refused), fleet.refused
    marked_names = list(fleet.tables)
    assert _per_table(window.decided.live, marked_names) == _per_table(alone.live, marked_names)


@pytest.mark.parametrize("window_days", ALONE_WINDOWS)
def test_the_fleet_names_each_table_s_commits_holding_a_file_as_its_own_log_does(spark, marked, window_days):
    """delta_tables.commits_referencing, one query over the commits the mark parsed, against each
    table's DeltaSource.commits_referencing over its own log: for every file of every table's
    retained versions (checkpoints, deletion vectors, cut logs), the same retained commits."""
    window = marked(window_days)
    fleet, alone = window.fleet, window.alone
    addresses = fleet.live.select(REPO, "address").distinct()
    together = _rows(commits_referencing(fleet, fleet.retained, addresses))
    each = []
    for name, table in fleet.tables.items():
        kept = spark.createDataFrame([row[1:] for row in alone.retained if row[REPO] == name], RETENTION_SCHEMA).filter(
            "retained"
        )
        own = addresses.filter(F.col(REPO) == name).select("address")
        found = table.source.commits_referencing(spark, kept.select("commit_id", "threshold"), own)
        each.append(found.select(F.lit(name).alias(REPO), "address", "commit_id"))
    alone_rows = _rows(reduce(DataFrame.unionByName, each))
    assert together == alone_rows
    assert {row[0] for row in together} == set(fleet.tables), "every table holds some file"
    assert len(together) > len({row[:2] for row in together}), "some file is held by more than one commit"
