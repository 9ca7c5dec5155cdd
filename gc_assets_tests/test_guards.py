"""Every guard shown failing: on data that breaks it (unit), and each blocking check
stopping a delete run end to end with storage untouched.

A guard that always passed would fail each of these tests. The end-to-end tests share one
lake, marked once and put back in place before each: a fault in the mark runs the whole
graph, a fault in the candidates only the sweep, against the stored mark.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from dagster import DagsterInstance
from pyspark.sql import functions as F

from gc_assets.core import guards
from gc_assets.core.config import RepositoryConfig, load_config
from gc_assets.core.guards import witness_key, witness_root
from gc_assets.core.names import ASSETS, REPO
from gc_assets.defs.assets.collect import STEP
from gc_assets.defs.partitions import partition_key
from gc_assets.defs.resources import GcConfigResource, recorded_mark
from gc_assets.mark.partition import GcPartition
from gc_assets.runner import run_partition
from gc_assets.sweep import together
from gc_assets.sweep.guard_table import GUARDS
from gc_assets.sweep.together import CANDIDATES
from gc_assets_tests.lakes import AS_OF, GC_DATE
from gc_assets_tests.marked_lakes import MARKED, SWEEP_ASSETS, marked_lake, run_assets
from gc_assets_tests.sweep_runs import receipts_only

UTC = dt.timezone.utc
T0 = dt.datetime(2022, 3, 1, tzinfo=UTC)


def _frame(spark, rows, schema):
    return spark.createDataFrame(rows, schema)


# ------------------------------------------------------------------ unit: each guard on breaking data


def test_heads_and_tags_retained_fails_on_an_unretained_ref_commit(spark):
    rows = [("head", True, True), ("old", False, False), ("tagged", False, True)]
    verdict = guards.heads_and_tags_retained(
        _frame(spark, rows, "commit_id string, retained boolean, ref_head boolean")
    )
    assert not verdict.passed and verdict.metadata["unretained_ref_commits"] == ["tagged"]
    assert guards.heads_and_tags_retained(
        _frame(spark, rows[:2], "commit_id string, retained boolean, ref_head boolean")
    ).passed


LIVE = "address string, at_head boolean, required boolean, in_namespace boolean"
INVENTORY = "address string, size long, last_modified timestamp"


def test_live_objects_present_fails_on_a_missing_head_object_and_warns_on_history(spark):
    inventory = _frame(spark, [("data/a", 1, T0)], INVENTORY)
    head_missing = _frame(spark, [("data/a", True, True, True), ("data/b", True, True, True)], LIVE)
    verdict = guards.live_objects_present(head_missing, inventory)
    assert (verdict.passed, verdict.severity, verdict.metadata["missing_at_head"]) == (False, "ERROR", ["data/b"])
    history_missing = _frame(spark, [("data/a", True, True, True), ("data/old", False, True, True)], LIVE)
    gaps = _frame(spark, [("data/old", "c1")], "address string, commit_id string")
    asked: list[set[str]] = []

    def commits_referencing(missing):
        asked.append({r["address"] for r in missing.collect()})
        return gaps

    assert guards.live_objects_present(head_missing, inventory, commits_referencing).severity == "ERROR" and not asked
    warning = guards.live_objects_present(history_missing, inventory, commits_referencing)
    assert asked == [{"data/old"}]  # asked only once history is missing, for exactly what is missing
    assert (warning.passed, warning.severity, warning.metadata["affected_commits"]) == (False, "WARN", ["c1"])
    spelled = _frame(spark, [("data/a%20b", True, True, True)], LIVE)
    assert guards.live_objects_present(spelled, _frame(spark, [("data/a b", 1, T0)], INVENTORY)).passed
    both = _frame(
        spark, [("data/b", True, True, True)] + [(f"data/old{i}", False, True, True) for i in range(25)], LIVE
    )
    verdict = guards.live_objects_present(both, inventory, commits_referencing)
    assert (verdict.passed, verdict.severity, verdict.metadata["missing_at_head"]) == (False, "ERROR", ["data/b"])
    older = _frame(spark, [(f"data/old{i}", False, True, True) for i in range(25)], LIVE)
    warning = guards.live_objects_present(older, inventory, lambda missing: gaps)
    assert warning.severity == "WARN" and len(warning.metadata["missing_history"]) == guards.SAMPLE
    empty = guards.live_objects_present(head_missing, _frame(spark, [], INVENTORY))
    assert not empty.passed and "namespace is empty" in empty.description


def test_live_objects_present_names_the_trash_run_that_holds_a_missing_live_object(spark):
    inventory = _frame(
        spark, [("data/a", 1, T0), ("_gc_trash/run-7/data/b", 1, T0), ("_gc_trash/run-8/data/c", 1, T0)], INVENTORY
    )
    head_missing = _frame(spark, [("data/a", True, True, True), ("data/b", True, True, True)], LIVE)
    verdict = guards.live_objects_present(head_missing, inventory)
    assert (verdict.passed, verdict.severity) == (False, "ERROR")
    assert verdict.metadata["in_trash_of_runs"] == {"run-7": 1}
    assert "gc-assets restore --run-id run-7" in verdict.description


def test_live_objects_present_judges_each_repository_of_a_set_as_it_would_alone(spark):
    """One call for five repositories: each gets the verdict of its own rows, the commits of its
    own history (asked once for every repository whose history is missing, none other), and only
    the trash runs of its own namespace named."""
    inventory = _frame(
        spark,
        [
            ("head", "data/a", 1, T0),
            ("head", "_gc_trash/run-7/data/b", 1, T0),
            ("history", "data/a", 1, T0),
            ("history", "_gc_trash/run-8/data/b", 1, T0),  # another namespace's data/b
            ("history", "_gc_trash/run-9/data/old", 1, T0),
            ("older", "data/a", 1, T0),
            ("fine", "data/a", 1, T0),
        ],
        f"repo string, {INVENTORY}",
    )
    live = _frame(
        spark,
        [
            ("head", "data/a", True, True, True),
            ("head", "data/b", True, True, True),
            ("history", "data/a", True, True, True),
            ("history", "data/old", False, True, True),
            ("older", "data/a", True, True, True),
            ("older", "data/old", False, True, True),
            ("fine", "data/a", True, True, True),
            ("empty", "data/a", True, True, True),
        ],
        f"repo string, {LIVE}",
    )
    asked: list[set[tuple[str, str]]] = []
    gaps = [("history", "data/old", "c1"), ("older", "data/old", "c2"), ("older", "data/old", "c3")]

    def commits_referencing(missing):
        asked.append({(r["repo"], r["address"]) for r in missing.collect()})
        return _frame(spark, gaps, "repo string, address string, commit_id string")

    verdicts = guards.live_objects_present_each(
        live, inventory, ["head", "history", "older", "fine", "empty"], commits_referencing
    )

    assert asked == [{("history", "data/old"), ("older", "data/old")}]
    assert verdicts["older"].metadata["affected_commits"] == ["c2", "c3"]
    head, history = verdicts["head"], verdicts["history"]
    assert (head.passed, head.severity, head.metadata["missing_at_head"]) == (False, "ERROR", ["data/b"])
    assert head.metadata["in_trash_of_runs"] == {"run-7": 1}
    assert (history.passed, history.severity, history.metadata["affected_commits"]) == (False, "WARN", ["c1"])
    assert history.metadata["missing_history"] == ["data/old"] and history.metadata["in_trash_of_runs"] == {"run-9": 1}
    assert verdicts["fine"].passed
    assert not verdicts["empty"].passed and "namespace is empty" in verdicts["empty"].description


def test_candidates_not_live_fails_when_a_raw_entry_names_a_candidate(spark):
    candidates = _frame(spark, [("data/x y",), ("data/free",)], "address string")
    entries = _frame(spark, [("data/x%20y",), ("s3a://Bucket/ns/data/other",)], "address string")
    verdict = guards.candidates_not_live(candidates, entries, "s3://bucket/ns")
    assert not verdict.passed and verdict.metadata["live_candidates"] == ["data/x y"]
    aliased = _frame(spark, [("S3N://bucket/ns/data/free",)], "address string")
    assert guards.candidates_not_live(candidates, aliased, "s3://bucket/ns").metadata["live_candidates"] == [
        "data/free"
    ]
    assert guards.candidates_not_live(
        candidates, _frame(spark, [("data/kept",)], "address string"), "s3://bucket/ns"
    ).passed


def test_candidates_older_than_min_age_fails_on_young_and_on_untracked_inside_the_window(spark):
    cutoff, untracked_cutoff = T0, T0 - dt.timedelta(days=3)
    schema = "address string, last_modified timestamp, reason string"
    old = [
        ("data/old-expired", T0 - dt.timedelta(days=5), "expired"),
        ("data/old-untracked", T0 - dt.timedelta(days=5), "untracked"),
    ]
    assert guards.candidates_older_than_min_age(_frame(spark, old, schema), cutoff, untracked_cutoff).passed
    young = old + [("data/young", T0, "expired")]
    verdict = guards.candidates_older_than_min_age(_frame(spark, young, schema), cutoff, untracked_cutoff)
    assert not verdict.passed and verdict.metadata["young_candidates"] == ["data/young"]
    in_window = old + [
        ("data/writing", T0 - dt.timedelta(days=1), "untracked"),
        ("data/expired-1d", T0 - dt.timedelta(days=1), "expired"),
    ]
    verdict = guards.candidates_older_than_min_age(_frame(spark, in_window, schema), cutoff, untracked_cutoff)
    assert not verdict.passed and verdict.metadata["young_candidates"] == ["data/writing"]


@pytest.mark.parametrize(
    "bad",
    [
        "_lakefs/range-1",
        "_gc/lease.json",
        "data/_delta_log/x",
        "/abs/path",
        "s3://b/k",
        "data/../x",
        "data//x",
        "a/./b",
        "",
        "x\x00y",
    ],
)
def test_candidates_inside_namespace_fails_on_each_kind_of_offender(spark, bad):
    candidates = _frame(spark, [("data/fine",), (bad,)], "address string")
    verdict = guards.candidates_inside_namespace(candidates, ("_lakefs/", "_gc/"), (r"(^|/)_delta_log/",))
    assert not verdict.passed and verdict.metadata["offending_candidates"] == [bad]
    assert guards.candidates_inside_namespace(candidates.filter(F.col("address") == "data/fine"), ("_lakefs/",)).passed


def test_blast_radius_fails_above_the_fraction():
    repo = RepositoryConfig(name="r", format="delta", storage_namespace="file:///t", max_delete_fraction=0.25)
    assert guards.blast_radius(25, 100, repo).passed
    verdict = guards.blast_radius(26, 100, repo)
    assert not verdict.passed and verdict.metadata["candidate_fraction"] == 0.26


def test_candidates_not_held_fails_on_a_candidate_restored_after_the_mark(spark):
    candidates = _frame(spark, [("data/a",), ("data/b",)], "address string")
    assert guards.candidates_not_held(candidates, _frame(spark, [("data/elsewhere",)], "address string")).passed
    verdict = guards.candidates_not_held(candidates, _frame(spark, [("data/b",), ("data/c",)], "address string"))
    assert not verdict.passed and verdict.metadata["held_candidates"] == ["data/b"]


def test_receipts_cover_candidates_fails_on_duplicates_gaps_and_extras(spark):
    candidates = _frame(spark, [("a",), ("b",), ("c",)], "address string")
    schema = "address string, action string"
    good = _frame(
        spark,
        [
            ("a", "deleted"),
            ("b", "failed"),
            ("c", "would_delete"),
            ("_gc_trash/r/x", "purged"),
            ("_gc_trash/r/y", "skipped_revived"),
        ],
        schema,
    )
    assert guards.receipts_cover_candidates(good, candidates).passed
    bad = _frame(spark, [("a", "deleted"), ("a", "already_absent"), ("b", "deleted"), ("z", "purged")], schema)
    verdict = guards.receipts_cover_candidates(bad, candidates)
    assert not verdict.passed
    assert (verdict.metadata["duplicated"], verdict.metadata["uncovered"], verdict.metadata["extra"]) == (
        ["a"],
        ["c"],
        ["z"],
    )
    many = _frame(spark, [(f"x{i:02}", "deleted") for i in range(25)] * 2, schema)
    verdict = guards.receipts_cover_candidates(many, candidates)
    assert len(verdict.metadata["duplicated"]) == len(verdict.metadata["extra"]) == guards.SAMPLE
    assert verdict.metadata["uncovered"] == ["a", "b", "c"]


def test_live_objects_intact_fails_when_a_live_object_is_gone(spark):
    existence = _frame(spark, [("data/a", True), ("data/b", False)], "address string, exists boolean")
    verdict = guards.live_objects_intact(existence)
    assert not verdict.passed and verdict.metadata["lost_live_objects"] == ["data/b"]
    assert guards.live_objects_intact(existence.filter("exists")).passed


# ------------------------------------------------------------------ end to end: each blocking check stops a delete run


@pytest.fixture(scope="module")
def saved(tmp_path_factory, spark):
    return marked_lake(tmp_path_factory.mktemp("lake"), churn=20, max_delete_fraction=1.0)


@pytest.fixture
def lake(saved):
    return saved.restore(MARKED)


def _delete_run(lake):
    """The whole graph, the mark made again."""
    return run_partition(
        str(lake.config_path), lake.lake.name, GC_DATE, mode="delete", instance=DagsterInstance.ephemeral()
    )


def _delete_sweep(saved):
    """gc_job's step on the sweep group (inventory, candidates, receipts): the mark made again."""
    return run_assets(saved.lake, saved.instance, SWEEP_ASSETS, "delete")


def _assert_blocked(outcome, check, lake, before):
    assert not outcome.success
    assert outcome.summary["checks"][check] == "failed", outcome.summary["checks"]
    assert "deletion_receipts" not in outcome.summary["outputs"]
    assert lake.files() == before


def test_an_unretained_head_blocks_the_sweep(lake, monkeypatch):
    from gc_assets.core.retention import Retention
    from gc_assets.sources.lakefs_export import LakeFSExportSource

    original = LakeFSExportSource.evaluate_retention
    head = lake.lake.branches["main"]

    def forgets_main(self, *args):
        verdicts = original(self, *args)
        return {**verdicts, head: Retention(False, None, None)}

    monkeypatch.setattr(LakeFSExportSource, "evaluate_retention", forgets_main)
    before = lake.files()
    _assert_blocked(_delete_run(lake), "heads_and_tags_retained", lake, before)


def test_a_live_key_missing_from_the_mark_blocks_the_sweep(lake, monkeypatch):
    """The mark's normalization drops a key from the live set the candidates are decided on; the
    check recomputes from raw entries and catches it."""
    import gc_assets.mark.sets as mark

    victim = sorted(a for a, _ in lake.lake.commits[lake.lake.branches["dev"]].entries.values())[0]
    original = mark.orphans_each

    def dropping(inventory, live, *args, **kwargs):
        return original(inventory, live.filter(F.col("address") != victim), *args, **kwargs)

    monkeypatch.setattr(mark, "orphans_each", dropping)
    before = lake.files()
    _assert_blocked(_delete_run(lake), "candidates_not_live", lake, before)


def test_young_candidates_block_the_sweep_of_a_stored_mark(saved, lake, spark):
    """A file written just now is added to the stored candidates: the sweep of that mark on its
    own judges the minimum age again, by its own bounds, and refuses."""
    young = lake.namespace / "data" / "just-written"
    young.write_text("fresh")
    written = dt.datetime.fromtimestamp(young.stat().st_mtime, UTC)
    _tamper_candidates(
        lake,
        spark,
        lambda table: table.limit(1).select(
            F.lit("data/just-written").alias("address"),
            *[c for c in table.columns if c not in ("address", "last_modified")],
            F.lit(written).alias("last_modified"),
        ),
    )
    before = lake.files()
    result = receipts_only(lake.config_path, lake.lake.name, AS_OF, saved.instance, "delete")
    assert not result.success
    message = str(next(e for e in result.all_events if e.is_step_failure).step_failure_data.error)
    assert "sweep refused, storage untouched" in message and "candidates_older_than_min_age" in message
    assert lake.files() == before


def _tamper_candidates(lake, spark, added) -> None:
    """The stored orphan_candidates partition with the rows `added` makes of it appended."""
    config = load_config(lake.config_path)
    stored = config.state_path / "orphan_candidates" / f"repo={lake.lake.name}" / f"date={GC_DATE}"
    table = spark.read.parquet(f"file://{stored}")
    tampered = table.unionByName(added(table))
    staging = stored.with_name("tampered")
    tampered.write.parquet(f"file://{staging}")
    shutil.rmtree(stored)
    staging.rename(stored)


def test_candidates_decided_by_a_wrong_cutoff_are_caught_by_the_guards_own_bounds(lake, monkeypatch):
    """A set decides its candidates with cutoffs in the future; the minimum-age guard keeps its own
    bounds, from the mark's times by the rule, and blocks the sweep."""
    import gc_assets.mark.sets as sets

    future = dt.datetime(2100, 1, 1, tzinfo=UTC)
    real = sets.Judgement

    def in_the_future(name, cutoff, untracked_cutoff, *rest):
        return real(name, future, future, *rest)

    monkeypatch.setattr(sets, "Judgement", in_the_future)
    (lake.namespace / "data" / "just-written").write_text("fresh")
    before = lake.files()
    _assert_blocked(_delete_run(lake), "candidates_older_than_min_age", lake, before)


def test_candidates_under_protected_prefixes_block_the_sweep(saved, lake, monkeypatch):
    import gc_assets.mark.candidates as candidates

    monkeypatch.setattr(candidates, "under_owned_prefixes_column", lambda owner, column, prefixes: F.lit(False))
    old_metadata = lake.namespace / "_lakefs" / "old-range"
    old_metadata.write_text("lakeFS metadata")
    os.utime(old_metadata, (T0.timestamp(), T0.timestamp()))
    before = lake.files()
    _assert_blocked(_delete_sweep(saved), "candidates_inside_namespace", lake, before)


def test_a_tampered_candidate_list_is_refused_by_the_sweep_itself(saved, lake, spark):
    """Only deletion_receipts is materialized, after a live key was added to the stored
    candidates: no check runs in that run, and the sweep's own re-verification refuses."""
    live = sorted(a for a, _ in lake.lake.commits[lake.lake.branches["main"]].entries.values())[0]
    _tamper_candidates(lake, spark, lambda table: table.limit(1).withColumn("address", F.lit(live)))
    before = lake.files()

    result = receipts_only(lake.config_path, lake.lake.name, AS_OF, saved.instance, "delete")

    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert failure.step_key == STEP
    message = str(failure.step_failure_data.error)
    assert "sweep refused, storage untouched" in message and "candidates_not_live" in message and live in message
    assert lake.files() == before


def _witness_key_oracle(address: str, namespace: Path) -> str | None:
    """The witness's key by its definition: the real path of the file, relative to the real namespace."""
    parsed = urlsplit(address)
    if not parsed.scheme and not address.startswith("/"):
        return address
    try:
        return Path(unquote(parsed.path)).resolve().relative_to(namespace.resolve()).as_posix()
    except ValueError:
        return None


def test_witness_keys_resolve_every_symlink_as_the_definition_does(tmp_path):
    """Directories are resolved once per batch, each from its parent's real path; a file that is
    itself a link, a dot segment or a directory link into or out of the namespace, at any depth,
    must still land where its real path is."""
    outside = tmp_path / "outside"
    namespace = tmp_path / "table"
    (namespace / "part=1").mkdir(parents=True)
    outside.mkdir()
    (namespace / "part=1" / "a.parquet").write_bytes(b"a")
    (outside / "o.parquet").write_bytes(b"o")
    (namespace / "part=1" / "link-out.parquet").symlink_to(outside / "o.parquet")
    (namespace / "part=1" / "link-in.parquet").symlink_to(namespace / "part=1" / "a.parquet")
    (namespace / "alias").symlink_to(namespace / "part=1")
    (namespace / "away").symlink_to(outside)
    (tmp_path / "table-alias").symlink_to(namespace)
    (namespace / "part=1" / "sub" / "deep").mkdir(parents=True)
    (namespace / "part=1" / "sub" / "deep" / "b.parquet").write_bytes(b"b")
    (namespace / "part=1" / "sub" / "out").symlink_to(outside)
    (namespace / "part=1" / "sub" / "up").symlink_to("..")
    paths = [
        namespace / "part=1" / "a.parquet",
        namespace / "part=1" / "link-out.parquet",
        namespace / "part=1" / "link-in.parquet",
        namespace / "alias" / "a.parquet",
        namespace / "alias" / "link-out.parquet",
        namespace / "away" / "o.parquet",
        namespace / "away" / "missing.parquet",
        namespace / "part=1" / "missing.parquet",
        tmp_path / "table-alias" / "part=1" / "a.parquet",
        outside / "o.parquet",
        namespace / "part=1" / "sub" / "deep" / "b.parquet",
        namespace / "alias" / "sub" / "deep" / "b.parquet",
        namespace / "part=1" / "sub" / "out" / "o.parquet",
        namespace / "part=1" / "sub" / "up" / "sub" / "deep" / "b.parquet",
        namespace / "part=1" / "sub" / "up" / "sub" / "out" / "deep" / "missing.parquet",
        namespace / "part=1" / "a.parquet" / "under-a-file.parquet",
    ]
    addresses = [str(p) for p in paths] + [p.as_uri() for p in paths]
    addresses += [
        f"{namespace}/part=1/../part=1/a.parquet",
        f"{namespace}/part=1/./a.parquet",
        f"{namespace}/part=1/..",
        f"{namespace}/.",
    ]
    addresses += [f"{namespace.as_uri()}/part%3D1/a.parquet", "part=1/a.parquet"]
    root = witness_root(namespace.as_uri())
    directories: dict[str, str] = {}
    keys = [
        witness_key(address, root, directories) for address in addresses + addresses
    ]  # the second pass hits the memo
    assert keys == [_witness_key_oracle(address, namespace) for address in addresses + addresses]
    assert keys[:4] == ["part=1/a.parquet", None, "part=1/a.parquet", "part=1/a.parquet"]


def test_witness_keys_keep_hash_and_question_mark_in_local_file_names(tmp_path):
    """`#` and `?` belong to a local file's name (Hadoop's Path reads them so): the witness must
    not cut `data/hash#1` to `data/hash`, or it would vouch for the wrong file."""
    namespace = tmp_path / "table"
    (namespace / "data").mkdir(parents=True)
    root = witness_root(namespace.as_uri())
    addresses = {
        f"{namespace}/data/hash#1": "data/hash#1",
        f"file://{namespace}/data/what?v=1": "data/what?v=1",
        f"file://localhost{namespace}/data/a#b?c": "data/a#b?c",
        f"file:{namespace}/data/plain": "data/plain",
    }
    assert {a: witness_key(a, root, {}) for a in addresses} == addresses


def _stored_mark(lake, spark):
    """The partition, its stored mark and the four frames it stored, with `repo`, as a sweep alone reads them."""
    gc_config = GcConfigResource(config_path=str(lake.config_path))
    config = gc_config.load()
    repo = config.repository(lake.lake.name)
    key = partition_key(GC_DATE, repo.name)
    as_of, mark = recorded_mark(gc_config, key)
    frames = {asset: gc_config.stored(spark, asset, key).withColumn(REPO, F.lit(repo.name)) for asset in ASSETS[:4]}
    return GcPartition(config, repo, GC_DATE, as_of), mark, frames


def test_a_sweep_alone_judges_again_every_guard_a_sweep_must_pass_on_the_mark_as_stored(saved, lake, spark):
    """Each guard GUARDS says a sweep passes first, judged again by name on the stored mark; one
    that cannot be read again (its connector fails) is a failed verdict of its own, not a pass."""
    from gc_assets.sources.lakefs_export import LakeFSExportSource

    partition, mark, frames = _stored_mark(lake, spark)
    now = dt.datetime.now(UTC)
    verdicts = together.judged_again(spark, partition.config, partition, mark, frames, now)
    assert {v.name: v.passed for v in verdicts} == {guard.name: True for guard in GUARDS if guard.before_sweep}

    def unreadable(*args, **kwargs):
        raise OSError("the export cannot be read")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LakeFSExportSource, "_dataset", unreadable)
        (failed,) = together.judged_again(spark, partition.config, partition, mark, frames, now)
    assert not failed.passed and failed.severity == "ERROR" and "the export cannot be read" in failed.description


def test_a_sweep_alone_is_judged_on_the_stored_verdicts_not_on_a_new_mark(saved, lake, spark):
    """The stored verdicts are what the guards read the raw entries of: with every commit retained
    in them, the expired candidates are live to candidates_not_live, where a new mark of the same
    source would find them expired and pass."""
    partition, mark, frames = _stored_mark(lake, spark)
    expired = {row.address for row in frames[CANDIDATES].filter("reason = 'expired'").select("address").collect()}
    assert expired, "the lake's mark expires history"
    kept = frames["retained_commits"].withColumn("retained", F.lit(True))
    now = dt.datetime.now(UTC)
    verdicts = together.judged_again(
        spark, partition.config, partition, mark, {**frames, "retained_commits": kept}, now
    )
    (failed,) = [v for v in verdicts if not v.passed]
    assert failed.name == "candidates_not_live" and set(failed.metadata["live_candidates"]) <= expired
