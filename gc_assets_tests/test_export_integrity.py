"""Partial lakeFS exports never delete what the complete export keeps (docs/design.md §6.1, §10).

Random lakes are exported, then damaged the way a half-written or half-copied export is:
rows dropped from a dataset, a dataset missing, a manifest that disagrees. The
connector either refuses with SourceError, or its live set still holds every object a
retained commit of the complete export references (brute force, no product code).

What integrity alone can see is what a reference names and the referred dataset lacks
entirely (a metarange without rows, a range without rows). Rows dropped from `commits`
or `refs`, or some rows of a range, leave nothing dangling; only the manifest's row
counts reveal them, so those damages are generated with a manifest present.
The examples are drawn first, marked a few at a time and checked together (examples_in_one_job).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import strategies as st
from pyspark.sql import DataFrame

from gc_assets.core.addresses import with_relative_keys
from gc_assets.core.config import Rules
from gc_assets.core.retention import evaluate, ref_heads
from gc_assets.demo.lakegen import export_tables, write_export
from gc_assets.mark.live import deduplicated
from gc_assets.sources.base import SourceError
from gc_assets.sources.lakefs_export import LakeFSExportSource, parse_manifest
from gc_assets_tests.examples_in_one_job import check_in_one_job
from gc_assets_tests.oracles import lake_graph, oracle_key, retained_brute_force
from gc_assets_tests.test_properties import NAMESPACE, T0, random_lake, rules_for

AS_OF = T0 + dt.timedelta(days=30)
DETECTABLE_WITHOUT_MANIFEST = ("metaranges", "ranges")


def _write(lake, directory: Path, manifest: bool) -> dict[str, pa.Table]:
    tables = export_tables(lake)
    write_export(tables, directory, exported_at=AS_OF if manifest else None)
    return tables


@st.composite
def damages(draw):
    manifest = draw(st.booleans())
    kinds = ["drop_rows", "drop_dataset"] + (["lying_manifest"] if manifest else [])
    kind = draw(st.sampled_from(kinds))
    datasets = ["commits", "refs", "metaranges", "ranges"] if manifest else list(DETECTABLE_WITHOUT_MANIFEST)
    dataset = draw(st.sampled_from(datasets))
    whole_keys = not manifest and kind == "drop_rows"  # without a manifest, drop every row of some ids
    return manifest, kind, dataset, draw(st.integers(0, 2**32 - 1)), whole_keys


def _damage(directory: Path, tables: dict[str, pa.Table], kind: str, dataset: str, seed: int, whole_keys: bool) -> bool:
    """Apply the damage; False when it changed nothing (an empty dataset)."""
    import random

    rng = random.Random(seed)
    table = tables[dataset]
    if kind == "drop_dataset":
        shutil.rmtree(directory / dataset)
        return True
    if kind == "lying_manifest":
        manifest = json.loads((directory / "_manifest.json").read_text())
        manifest["datasets"][dataset] += rng.choice([-1, 1])
        (directory / "_manifest.json").write_text(json.dumps(manifest))
        return True
    if table.num_rows == 0:
        return False
    if whole_keys:
        key = "metarange_id" if dataset == "metaranges" else "range_id"
        values = sorted(set(table.column(key).to_pylist()))
        dropped = set(rng.sample(values, rng.randint(1, len(values))))
        keep = [v not in dropped for v in table.column(key).to_pylist()]
    else:
        dropped_rows = set(rng.sample(range(table.num_rows), rng.randint(1, table.num_rows)))
        keep = [i not in dropped_rows for i in range(table.num_rows)]
    pq.write_table(table.filter(pa.array(keep)), directory / dataset / "part-00000.parquet")
    return True


@dataclass(frozen=True)
class PartialExport:
    """A random lake, its rules, and the damage done to its export."""

    seed: int
    steps: int
    rules: Optional[Rules]
    damage: tuple[bool, str, str, int, bool]  # damages()


PARTIAL_EXPORTS = st.builds(
    PartialExport,
    seed=st.integers(0, 2**32 - 1),
    steps=st.integers(1, 12),
    rules=rules_for("partial"),
    damage=damages(),
)


@dataclass(frozen=True)
class Marked:
    """What a retained commit of the complete export references, and the live set of the damaged
    one (None: refused, or a damage that changed nothing)."""

    needed: set[str]
    live: Optional[set[str]]


def commit_ids(spark, values) -> DataFrame:
    return spark.createDataFrame([(c,) for c in sorted(values)], "commit_id string")


def marked(spark, case: PartialExport) -> Marked:
    """The brute-force needed set, and the connector's live set of the damaged export or its refusal."""
    manifest, kind, dataset, damage_seed, whole_keys = case.damage
    lake = random_lake("partial", case.seed, case.steps)
    commits, refs = lake_graph(lake)
    needed = {
        oracle_key(address, NAMESPACE)
        for commit_id in retained_brute_force(commits, refs, case.rules, AS_OF)
        for address, _ in lake.commits[commit_id].entries.values()
    } - {None}
    with tempfile.TemporaryDirectory() as directory:
        export = Path(directory)
        tables = _write(lake, export, manifest)
        if not _damage(export, tables, kind, dataset, damage_seed, whole_keys):
            return Marked(needed, None)
        source = LakeFSExportSource(export.as_uri())
        try:
            graph_commits, graph_refs = source.commit_graph(spark)
            verdicts = evaluate(graph_commits, graph_refs, case.rules, AS_OF)
            retained = commit_ids(spark, [c for c, v in verdicts.items() if v.retained])
            heads = commit_ids(spark, ref_heads(graph_refs))
            live = {
                r["address"]
                for r in deduplicated(
                    with_relative_keys(source.live_entries(spark, retained, heads), NAMESPACE)
                ).collect()
            }
        except (SourceError, ValueError):
            return Marked(needed, None)  # refused: nothing is marked, nothing deleted
    return Marked(needed, live)


def marked_side_by_side(spark, cases: Sequence[PartialExport]) -> list[Marked]:
    """`marked` of every case, a few at once: each is many tiny Spark jobs, which wait on the
    scheduler more than they compute, so the jobs of several exports overlap."""
    with ThreadPoolExecutor(4) as markers:
        return list(markers.map(lambda case: marked(spark, case), cases))


def test_a_partial_export_is_refused_or_keeps_everything_the_complete_one_keeps(spark):
    def check(case: PartialExport, outcome: Marked) -> None:
        if outcome.live is not None:
            _, kind, dataset, _, _ = case.damage
            lost = sorted(outcome.needed - outcome.live)[:5]
            assert outcome.needed <= outcome.live, f"{kind} {dataset}: accepted yet lost {lost}"

    check_in_one_job(PARTIAL_EXPORTS, lambda cases: marked_side_by_side(spark, cases), check)


def test_manifest_fields_are_checked():
    uri = "file:///export/_manifest.json"
    good = parse_manifest(b'{"exported_at": "2024-01-01T00:00:00Z", "datasets": {"commits": 3, "staged": 0}}', uri)
    assert good["exported_at"] == dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) and good["datasets"]["staged"] == 0
    for content, message in [
        (b"{", "not valid JSON"),
        (b'{"exported_at": "2024-01-01T00:00:00"}', "a 'datasets' map"),
        (b'{"exported_at": "2024-01-01T00:00:00", "datasets": {}}', "has no time zone"),
        (b'{"exported_at": "yesterday", "datasets": {}}', "is not an RFC 3339 time"),
        (b'{"exported_at": "2024-01-01T00:00:00Z", "datasets": {"branches": 1}}', "unknown dataset 'branches'"),
        (b'{"exported_at": "2024-01-01T00:00:00Z", "datasets": {"refs": -1}}', "row count of dataset 'refs' is -1"),
    ]:
        with pytest.raises(SourceError, match=message):
            parse_manifest(content, uri)


def test_staged_zero_with_staged_rows_and_source_time(tmp_path, spark):
    lake = random_lake("staged", 3, 12)
    lake.stage("staged-main", "staged/x", T0)
    tables = _write(lake, tmp_path, manifest=True)
    assert LakeFSExportSource(tmp_path.as_uri()).source_time(spark) == AS_OF
    manifest = json.loads((tmp_path / "_manifest.json").read_text())
    manifest["datasets"]["staged"] = 0
    (tmp_path / "_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SourceError, match=r"dataset 'staged' has 1 rows, _manifest.json says 0"):
        LakeFSExportSource(tmp_path.as_uri()).commit_graph(spark)
    (tmp_path / "_manifest.json").unlink()
    oldest = min(p.stat().st_mtime for name in tables for p in (tmp_path / name).iterdir())
    assert LakeFSExportSource(tmp_path.as_uri()).source_time(spark).timestamp() == pytest.approx(oldest, abs=1e-3)
