"""Property test of the whole decision on Spark: random lakes (merges, branches, tags,
deleted branches, staged and imported entries, absolute URIs, random rules and clocks).
The candidates equal the brute-force oracle, and no object reachable from a retained
commit or a staged entry is ever a candidate."""

from __future__ import annotations

import datetime as dt
import random
import tempfile
from pathlib import Path

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from gc_assets.assets.mark import live_set
from gc_assets.assets.sweep import orphans
from gc_assets.config import BranchRule, RepositoryConfig, Rules, TagRule
from gc_assets.lakegen import Lake, export_tables, write_export
from gc_assets.retention import evaluate
from gc_assets.sources.lakefs_export import LakeFSExportSource
from gc_assets_tests.oracles import expected_candidates, lake_graph, oracle_key, oracle_spellings, retained_brute_force

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)
NAMESPACE_DIR = "/lakes/ns"
NAMESPACE = f"file://{NAMESPACE_DIR}"
PROTECTED = ("_lakefs/", "_gc/", "_gc_trash/")


def _spelling(lake: Lake, key: str) -> str:
    """Refer to an object the way a commit might: relative, absolute, odd scheme case."""
    return lake.rng.choice([key, key, f"{NAMESPACE}/{key}", f"FILE://{NAMESPACE_DIR}/{key}", f"{NAMESPACE_DIR}/{key}"])


def random_lake(name: str, seed: int, steps: int) -> Lake:
    lake = Lake(name, rng=random.Random(f"{name}-{seed}"))
    rng = lake.rng
    lake.commit("main", T0, ["p0"])
    for step in range(steps):
        at = T0 + dt.timedelta(hours=rng.randint(0, 24 * 40))  # clocks are not monotonic
        roll = rng.random()
        branches = sorted(lake.branches)
        if roll < 0.15:
            lake.branch(f"b{step}", rng.choice(branches))
        elif roll < 0.25 and len(branches) > 1:
            target, source = rng.sample(branches, 2)
            lake.commit(target, at, merge_from=source)
        elif roll < 0.32 and len(branches) > 1:
            del lake.branches[rng.choice([b for b in branches if b != "main"])]
        elif roll < 0.40:
            commit_id = rng.choice(sorted(lake.commits))
            lake.tags[f"t{step}"] = commit_id
        elif roll < 0.45:
            lake.stage(rng.choice(branches), f"staged/{step}", at)
        elif roll < 0.50:
            lake.upload_untracked(at)
        else:
            branch = rng.choice(branches)
            existing = sorted(lake.commits[lake.branches[branch]].entries)
            put: dict = {f"p{rng.randint(0, 12)}": None for _ in range(rng.randint(0, 3))}
            if rng.random() < 0.3 and lake.objects:
                key = rng.choice(sorted(lake.objects))
                put[f"p{rng.randint(0, 12)}"] = (_spelling(lake, key), 1)
            if rng.random() < 0.1:
                put["imported"] = ("s3://elsewhere/imported/object", 1)
            deletes = tuple(rng.sample(existing, min(len(existing), rng.randint(0, 2))))
            lake.commit(branch, at, put, delete=deletes)
    return lake


rules_strategy = st.one_of(
    st.none(),
    st.builds(
        Rules,
        default_retention_days=st.one_of(st.none(), st.integers(0, 30)),
        branches=st.lists(
            st.builds(BranchRule, branch_id=st.sampled_from(["main", "b3", "b7"]), retention_days=st.integers(0, 30)),
            max_size=2,
            unique_by=lambda r: r.branch_id,
        ).map(tuple),
        tags=st.builds(TagRule, retain=st.booleans(), retention_days=st.one_of(st.none(), st.integers(0, 30))),
    ),
)


LAKES_PER_EXAMPLE = 8
lake_cases = st.tuples(
    st.integers(0, 2**32 - 1),  # seed
    st.integers(0, 30),  # steps
    rules_strategy,
)


def merged_export(lakes: list[Lake]) -> dict[str, pa.Table]:
    """One export holding several lakes: their commit ids and object keys never collide."""
    tables = [export_tables(lake) for lake in lakes]
    return {name: pa.concat_tables([t[name] for t in tables]) for name in tables[0]}


@settings(max_examples=25)
@given(
    cases=st.lists(lake_cases, min_size=LAKES_PER_EXAMPLE, max_size=LAKES_PER_EXAMPLE),
    as_of_hours=st.integers(24, 24 * 45),
    min_age_hours=st.sampled_from([1, 24, 72]),
)
def test_no_reachable_object_is_ever_a_candidate(spark, cases, as_of_hours, min_age_hours):
    """25 examples of 8 lakes each: 200 random lakes through the Spark decision.

    The lakes of one example share one export, one namespace (their commit ids and
    keys are distinct), one as-of time and the real cutoff, so one Spark pipeline
    judges all eight; objects are written up to 40 days after T0, so many are younger
    than the cutoff. Each candidate's reason is checked against the lake.
    """
    lakes = [random_lake(f"lake{i}", seed, steps) for i, (seed, steps, _) in enumerate(cases)]
    keys = [set(lake.objects) for lake in lakes]
    assert sum(map(len, keys)) == len(set().union(*keys))
    as_of = T0 + dt.timedelta(hours=as_of_hours)
    cutoff = as_of - dt.timedelta(hours=min_age_hours)
    retained_ids: set[str] = set()
    for lake, (_, _, rules) in zip(lakes, cases):
        commits, refs = lake_graph(lake)
        oracle = retained_brute_force(commits, refs, rules, as_of)
        assert {c for c, v in evaluate(commits, refs, rules, as_of).items() if v.retained} == set(oracle)
        retained_ids |= set(oracle)
    all_commits = {c for lake in lakes for c in lake.commits}
    head_ids = {c for lake in lakes for c in [*lake.branches.values(), *lake.tags.values()]}

    with tempfile.TemporaryDirectory() as directory:
        write_export(merged_export(lakes), Path(directory), "parquet")
        source = LakeFSExportSource(Path(directory).as_uri())
        ids = lambda values: spark.createDataFrame([(c,) for c in sorted(values)], "commit_id string")  # noqa: E731
        live = live_set(source.live_entries(spark, ids(retained_ids), ids(head_ids)), NAMESPACE)
        committed = live_set(source.live_entries(spark, ids(all_commits), ids(head_ids)), NAMESPACE)
        inventory = spark.createDataFrame(
            [(key, size, mtime) for lake in lakes for key, (size, mtime) in lake.objects.items()],
            "address string, size long, last_modified timestamp",
        )
        candidates = {r["address"]: r["reason"] for r in orphans(inventory, live, committed, cutoff, PROTECTED).collect()}

    for lake, (_, _, rules) in zip(lakes, cases):
        commits, refs = lake_graph(lake)
        retained = retained_brute_force(commits, refs, rules, as_of)
        found = {k for k in lake.objects if k in candidates}
        reachable = {oracle_key(a, NAMESPACE) for c in retained for a, _ in lake.commits[c].entries.values()}
        reachable |= {oracle_key(s[2], NAMESPACE) for s in lake.staged}
        assert not found & reachable
        assert found == expected_candidates(lake, NAMESPACE, rules, as_of, cutoff, PROTECTED)
        ever = {oracle_key(a, NAMESPACE) for c in lake.commits.values() for a, _ in c.entries.values()}
        ever_spelled = set().union(*(oracle_spellings(k) for k in ever if k is not None)) if ever else set()
        assert {k: candidates[k] for k in found} == {k: "expired" if k in ever_spelled else "untracked" for k in found}


def mutate(lake: Lake, seed: int, steps: int) -> None:
    """What may happen between mark and sweep: commits re-referencing old objects (reverts),
    branches created from old commits, tags moved, branches deleted, new staged entries."""
    rng = random.Random(seed)
    for step in range(steps):
        at = T0 + dt.timedelta(hours=rng.randint(0, 24 * 50))
        roll = rng.random()
        branches = sorted(lake.branches)
        if roll < 0.4:
            key = rng.choice(sorted(lake.objects))
            lake.commit(rng.choice(branches), at, {f"revert/{step}": (_spelling(lake, key), 1)})
        elif roll < 0.6:
            lake.branches[f"from-old-{step}"] = rng.choice(sorted(lake.commits))
        elif roll < 0.75:
            lake.tags[f"moved-{step}"] = rng.choice(sorted(lake.commits))
        elif roll < 0.85 and len(branches) > 1:
            del lake.branches[rng.choice([b for b in branches if b != "main"])]
        else:
            key = rng.choice(sorted(lake.objects))
            lake.staged.append((rng.choice(branches), f"staged/again-{step}", key, 1))


@settings(max_examples=15)
@given(
    case=lake_cases,
    as_of_hours=st.integers(24, 24 * 45),
    min_age_hours=st.sampled_from([1, 24, 72]),
    mutation_seed=st.integers(0, 2**32 - 1),
    mutations=st.integers(1, 6),
)
def test_revalidation_revives_exactly_what_the_current_state_keeps(spark, case, as_of_hours, min_age_hours, mutation_seed, mutations):
    """Random interleavings of a mark, repository changes, and a sweep: no object reachable
    from a commit retained at sweep time (or staged then) is among the objects the sweep acts
    on, and no object it does not reach is revived."""
    import copy

    from gc_assets.sweeper import revalidate

    seed, steps, rules = case
    as_of = T0 + dt.timedelta(hours=as_of_hours)
    cutoff = as_of - dt.timedelta(hours=min_age_hours)
    marked_lake = random_lake("marked", seed, steps)
    commits, refs = lake_graph(marked_lake)
    marked_verdicts = evaluate(commits, refs, rules, as_of)
    heads = {r.commit_id for r in refs}
    candidates = expected_candidates(marked_lake, NAMESPACE, rules, as_of, cutoff, PROTECTED)

    current = copy.deepcopy(marked_lake)
    mutate(current, mutation_seed, mutations)
    with tempfile.TemporaryDirectory() as directory:
        write_export(export_tables(current), Path(directory), "parquet")
        source = LakeFSExportSource(Path(directory).as_uri())
        marked = spark.createDataFrame(
            [(c, v.retained, c in heads) for c, v in marked_verdicts.items()], "commit_id string, retained boolean, ref_head boolean"
        )
        frame = spark.createDataFrame([(k,) for k in sorted(candidates)] or [("none/never",)], "address string")
        repo = RepositoryConfig(name="marked", format="lakefs-export", storage_namespace=NAMESPACE, source=directory, rules=rules)
        check = revalidate(spark, source, repo, as_of, marked, frame)
        revived = {r["address"] for r in check.revived.collect()}

    acted_on = candidates - revived
    current_commits, current_refs = lake_graph(current)
    retained_now = retained_brute_force(current_commits, current_refs, rules, as_of)
    reachable = {oracle_key(a, NAMESPACE) for c in retained_now for a, _ in current.commits[c].entries.values()}
    reachable |= {oracle_key(s[2], NAMESPACE) for s in current.staged}
    assert not acted_on & reachable  # nothing the current state keeps is acted on
    spelled = set().union(*(oracle_spellings(k) for k in reachable if k is not None)) if reachable else set()
    assert revived <= spelled  # and nothing it does not keep is spared
