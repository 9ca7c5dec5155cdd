"""`gc-assets plan`: what-if retention per rules file, against the brute-force oracle, with
storage and the state directory untouched."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

from gc_assets.core.config import Rules
from gc_assets.demo.lakegen import DOCS_RULES
from gc_assets_tests.cli_runs import run_cli, summary_of
from gc_assets_tests.lakes import AS_OF, lake_on_disk
from gc_assets_tests.oracles import expected_candidates, lake_graph, retained_brute_force

SHORT_RULES = {
    "default_retention_days": 2,
    "branches": [{"branch_id": "main", "retention_days": 2}, {"pattern": "feature/*", "retention_days": 1}],
}


def _tree_digest(root: Path) -> str:
    """Every file under `root` with its content and modification time, but the log files."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "logs" not in p.relative_to(root).parts):
        digest.update(f"{path.relative_to(root)} {path.stat().st_mtime_ns}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def test_two_rules_files_give_the_oracles_counts_and_touch_nothing(tmp_path, spark, capfd):
    lake = lake_on_disk(tmp_path, churn=30)
    rules_files = []
    for name, rules in (("docs.json", DOCS_RULES), ("short.json", SHORT_RULES)):
        (tmp_path / name).write_text(json.dumps(rules))
        rules_files.append(tmp_path / name)
    before = _tree_digest(tmp_path)
    command = ["plan", "--config", str(lake.config_path), "--repo", lake.lake.name, "--date", "2022-03-31"]
    for path in rules_files:
        command += ["--rules", str(path)]
    done = run_cli(capfd, *command, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    plans = summary_of(done.stdout)["plans"]
    assert [p["rules"] for p in plans] == [str(p) for p in rules_files]
    assert all(
        list(p)
        == ["rules", "retained_commits", "expired_commits", "live_objects", "orphan_candidates", "reclaimable_bytes"]
        for p in plans
    )

    commits, refs = lake_graph(lake.lake)
    cutoff = AS_OF - dt.timedelta(hours=24)  # min(as_of, export time) - min_object_age
    for plan, rules in zip(plans, (DOCS_RULES, SHORT_RULES)):
        parsed = Rules.model_validate(rules)
        retained = retained_brute_force(commits, refs, parsed, AS_OF)
        expected = expected_candidates(lake.lake, lake.namespace_uri, parsed, AS_OF, cutoff)
        assert (plan["retained_commits"], plan["expired_commits"]) == (len(retained), len(commits) - len(retained))
        assert plan["orphan_candidates"] == len(expected)
        assert plan["reclaimable_bytes"] == sum(lake.lake.objects[key][0] for key in expected)
    assert plans[1]["orphan_candidates"] > plans[0]["orphan_candidates"]  # shorter retention, more to reclaim
    assert "  oldest restorable\n" in done.stdout and "\n    main             2022-" in done.stdout
    progress = [line for line in done.stdout.splitlines() if line.startswith("  rules ")]
    assert progress == [  # one line per rules file as it is judged, before the tables
        f"  {'rules':<18} {p['rules']}: {p['orphan_candidates']} candidates, {p['reclaimable_bytes']} bytes reclaimable"
        for p in plans
    ]
    assert _tree_digest(tmp_path) == before  # no receipts, no state, storage untouched
    assert list((tmp_path / "state").iterdir()) == [tmp_path / "state" / "logs"]


def test_the_retention_whatif_asset_shows_the_same_table_in_its_metadata(tmp_path):
    from dagster import materialize
    from dagster_pyspark import LazyPySparkResource

    from gc_assets.core.spark import default_spark_config
    from gc_assets.defs.assets.whatif import build_whatif_asset
    from gc_assets.defs.resources import GcConfigResource

    lake = lake_on_disk(tmp_path, churn=10)
    (tmp_path / "short.json").write_text(json.dumps(SHORT_RULES))
    before = _tree_digest(tmp_path)
    result = materialize(
        [build_whatif_asset()],
        resources={
            "gc_config": GcConfigResource(config_path=str(lake.config_path)),
            "pyspark": LazyPySparkResource(spark_config=default_spark_config()),
        },
        run_config={
            "ops": {
                "retention_whatif": {"config": {"date": "2022-03-31", "rules_files": [str(tmp_path / "short.json")]}}
            }
        },
    )
    assert result.success
    metadata = result.asset_materializations_for_node("retention_whatif")[0].metadata
    commits, refs = lake_graph(lake.lake)
    parsed = Rules.model_validate(SHORT_RULES)
    retained = retained_brute_force(commits, refs, parsed, AS_OF)
    expected = expected_candidates(lake.lake, lake.namespace_uri, parsed, AS_OF, AS_OF - dt.timedelta(hours=24))
    row = f"| `{tmp_path / 'short.json'}` | {len(retained)} | {len(commits) - len(retained)} | "
    assert row in metadata["plans"].value
    assert metadata[f"{lake.lake.name}/0/orphan_candidates"].value == len(expected)
    assert _tree_digest(tmp_path) == before
