"""One run, one clock (docs/design.md §2): the as-of of a run is fixed when it is launched,
and every step and check of the run, and of a re-execution of it, judges with that as-of
however far the clock has moved since. `plan` holds the stored mark's times constant.

The steps' clock is made to jump forward between calls; what each step decided is read
from the partitions it built (a spy on GcPartition), not from the code under test.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
import uuid
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRun, build_sensor_context, instance_for_test

from gc_assets.core.config import Rules, load_config
from gc_assets.core.time import AS_OF_TAG, end_of_day, partition_date_of
from gc_assets.defs import set_records
from gc_assets.defs.assets import collect, common
from gc_assets.defs.build import build_definitions
from gc_assets.defs.partitions import REPOSITORIES, partition_key
from gc_assets.demo.lakegen import Lake, add_churn, write_lake
from gc_assets.mark import sets
from gc_assets.runner import run_partition
from gc_assets.sweep import together
from gc_assets_tests.cli_runs import run_cli, summary_of
from gc_assets_tests.lakes import lake_on_disk, write_config
from gc_assets_tests.oracles import expected_candidates, lake_graph, retained_brute_force

UTC = dt.timezone.utc
RECENT_RULES = {"default_retention_days": 1, "branches": [{"branch_id": "main", "retention_days": 2}]}


@pytest.fixture
def steps_as_of(monkeypatch):
    """The as-of of every partition a step, a check or a run of a set (mark.sets, sweep.together)
    builds, while the steps' clock jumps forward by seven minutes at each reading."""
    seen: list[dt.datetime] = []
    real = common.GcPartition

    def spy(config, repo, date, as_of):
        seen.append(as_of)
        return real(config, repo, date, as_of)

    jumps = itertools.count(1)
    for module in (common, sets, together):
        monkeypatch.setattr(module, "GcPartition", spy)
    for module in (common, collect, set_records):
        monkeypatch.setattr(module, "utc_now", lambda: dt.datetime.now(UTC) + dt.timedelta(minutes=7 * next(jumps)))
    return seen


@pytest.fixture
def lake(tmp_path):
    return lake_on_disk(tmp_path, churn=3)


def _today() -> dt.date:
    return dt.datetime.now(UTC).date()


def _defs(lake):
    return build_definitions(load_config(lake.config_path), str(lake.config_path))


def _created(instance: DagsterInstance, run_id: str) -> dt.datetime:
    created = instance.get_run_record_by_id(run_id).create_timestamp
    return created if created.tzinfo else created.replace(tzinfo=UTC)


def test_a_cli_run_judges_every_step_and_the_summary_as_of_its_launch(lake, steps_as_of, spark):
    today = _today()
    before = dt.datetime.now(UTC)
    outcome = run_partition(
        str(lake.config_path), lake.lake.name, today, mode="dry_run", instance=DagsterInstance.ephemeral()
    )
    assert outcome.success, outcome.error
    launched = dt.datetime.fromisoformat(outcome.summary["as_of"])
    assert before <= launched <= min(end_of_day(today), before + dt.timedelta(minutes=5))
    assert steps_as_of and set(steps_as_of) == {launched}


def test_a_run_launched_without_tags_and_its_re_execution_judge_as_of_the_first_launch(lake, steps_as_of, spark):
    """As the UI or a backfill launches a run: no as-of tag. Its steps take the time the
    instance recorded when it created the run; a re-execution, that of the run it re-executes."""
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(REPOSITORIES.name, [lake.lake.name])
    defs = _defs(lake)
    key = partition_key(_today(), lake.lake.name)
    before = dt.datetime.now(UTC)
    first = defs.resolve_job_def("gc_job").execute_in_process(
        instance=instance, partition_key=key, tags={"dagster/backfill": "abcdefgh"}, raise_on_error=False
    )
    assert first.success
    created = _created(instance, first.run_id)
    assert before - dt.timedelta(seconds=1) <= created <= before + dt.timedelta(minutes=1)
    assert len(steps_as_of) >= 2 and set(steps_as_of) == {min(end_of_day(_today()), created)}

    # A re-execution of the sweep, an hour later by the steps' clock: still the first launch's as-of.
    steps_as_of.clear()
    again = defs.resolve_job_def("sweep_job").execute_in_process(
        instance=instance,
        partition_key=key,
        tags={"dagster/root_run_id": first.run_id, "dagster/parent_run_id": first.run_id},
        raise_on_error=False,
    )
    assert again.success
    assert _created(instance, again.run_id) > created
    assert len(steps_as_of) >= 1 and set(steps_as_of) == {min(end_of_day(_today()), created)}


def test_a_re_execution_of_a_run_launched_hours_ago_keeps_its_as_of(lake, steps_as_of, spark):
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(REPOSITORIES.name, [lake.lake.name])
    root = str(uuid.uuid4())
    launched = dt.datetime.now(UTC) - dt.timedelta(hours=3)
    instance.run_storage.add_historical_run(DagsterRun(job_name="mark_job", run_id=root), launched)
    result = (
        _defs(lake)
        .resolve_job_def("mark_job")
        .execute_in_process(
            instance=instance,
            partition_key=partition_key(_today(), lake.lake.name),
            tags={"dagster/root_run_id": root, "dagster/parent_run_id": root},
            raise_on_error=False,
        )
    )
    assert result.success
    assert steps_as_of and set(steps_as_of) == {min(end_of_day(_today()), launched)}


def test_a_sensor_run_judges_every_step_as_of_its_request(lake, steps_as_of, spark):
    defs = _defs(lake)
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(REPOSITORIES.name, [lake.lake.name])
        context = build_sensor_context(
            instance=instance, instance_ref=instance.get_ref(), repository_def=defs.get_repository_def()
        )
        before = dt.datetime.now(UTC)
        (request,) = defs.get_sensor_def("new_commits").evaluate_tick(context).run_requests
        result = defs.resolve_job_def("fleet_job").execute_in_process(  # a mark-only fleet run
            instance=instance,
            partition_key=request.partition_key,
            tags=request.tags,
            run_config=request.run_config,
            raise_on_error=False,
        )
    assert result.success
    assert steps_as_of and len(set(steps_as_of)) == 1
    assert before <= steps_as_of[0] <= before + dt.timedelta(minutes=1)
    assert steps_as_of[0].isoformat().replace("+00:00", "Z") == request.tags[AS_OF_TAG]


def _recent_lake(root: Path, now: dt.datetime) -> tuple[Lake, Path, Path]:
    """A random lake whose history runs up to a few minutes ago, dense around one day back
    (the cutoff) and two days back (main's retention)."""
    lake = Lake("recent", rng=random.Random(36))
    lake.commit("main", now - dt.timedelta(days=6), ["tables/a/part-0", "tables/b/part-0"])
    add_churn(lake, 60, now - dt.timedelta(days=5), now - dt.timedelta(hours=50))
    add_churn(lake, 60, now - dt.timedelta(hours=50), now - dt.timedelta(hours=46))
    add_churn(lake, 80, now - dt.timedelta(hours=27), now - dt.timedelta(hours=22))
    add_churn(lake, 20, now - dt.timedelta(hours=20), now - dt.timedelta(minutes=5))
    namespace = root / "lake" / "recent"
    export = write_lake(lake, namespace)
    repo = {
        "name": "recent",
        "format": "lakefs-export",
        "storage_namespace": namespace.as_uri(),
        "source": export.as_uri(),
        "rules": RECENT_RULES,
    }
    return lake, namespace, write_config(root / "gc.yaml", [repo], root / "state")


def _cli_json(capfd, *args: str) -> dict:
    """The command's last line, the JSON it prints with --json."""
    done = run_cli(capfd, *args, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    return summary_of(done.stdout)


def test_plan_with_the_configured_rules_reproduces_the_run_of_its_partition(tmp_path, spark, capfd, monkeypatch):
    """A run as of an hour ago, then `plan` of that day: the same candidates as the run and
    the brute-force oracle, although objects have aged an hour since."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)  # an ephemeral instance: plan knows only what the state holds
    now = dt.datetime.now(UTC).replace(microsecond=0)
    lake, namespace, config = _recent_lake(tmp_path, now)
    as_of = now - dt.timedelta(hours=1)
    date = partition_date_of(as_of)
    run_args = ("run", "--config", str(config), "--repo", "recent", "--as-of", as_of.isoformat(), "--mode", "dry-run")
    run = _cli_json(capfd, *run_args)
    (plan,) = _cli_json(capfd, "plan", "--config", str(config), "--repo", "recent", "--date", date.isoformat())["plans"]

    rules = Rules.model_validate(RECENT_RULES)
    commits, refs = lake_graph(lake)
    retained = retained_brute_force(commits, refs, rules, as_of)
    expected = expected_candidates(lake, namespace.as_uri(), rules, as_of, as_of - dt.timedelta(hours=24))
    # The hour matters on this lake: judged as of now, both the commits and the candidates differ.
    later = expected_candidates(lake, namespace.as_uri(), rules, now, now - dt.timedelta(hours=24))
    assert len(later) > len(expected) and len(retained_brute_force(commits, refs, rules, now)) != len(retained)
    assert run["orphan_candidates"] == len(expected)
    assert (run["retained_commits"], run["expired_commits"]) == (len(retained), len(commits) - len(retained))
    counts = ("retained_commits", "expired_commits", "live_objects", "orphan_candidates", "reclaimable_bytes")
    assert {k: plan[k] for k in counts} == {k: run[k] for k in counts}

    # The UI's what-if over the same stored partition: the same candidates and bytes.
    from dagster import materialize
    from dagster_pyspark import LazyPySparkResource

    from gc_assets.core.spark import default_spark_config
    from gc_assets.defs.assets.whatif import build_whatif_asset
    from gc_assets.defs.resources import GcConfigResource

    result = materialize(
        [build_whatif_asset()],
        resources={
            "gc_config": GcConfigResource(config_path=str(config)),
            "pyspark": LazyPySparkResource(spark_config=default_spark_config()),
        },
        run_config={"ops": {"retention_whatif": {"config": {"date": date.isoformat()}}}},
    )
    metadata = result.asset_materializations_for_node("retention_whatif")[0].metadata
    assert metadata["recent/0/orphan_candidates"].value == run["orphan_candidates"]
    assert metadata["recent/0/reclaimable_bytes"].value == run["reclaimable_bytes"]
