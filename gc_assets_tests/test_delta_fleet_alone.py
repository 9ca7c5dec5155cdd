"""test_delta_fleet's warehouse marked as a fleet against each table marked alone: under a
window that keeps part of every table's history and one that keeps more than every cut log can
tell, each table's retained commits, live entries, live set and refusal are exactly its own,
marked alone through its connector (DeltaSource, the per-table pipeline's rules). A file of its
own, beside test_delta_fleet (the candidates against delta-rs), so that the two run side by side.
"""

from __future__ import annotations

import pytest

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
