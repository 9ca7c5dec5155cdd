"""Property tests of the whole lakeFS decision: random lakes (merges, branches, tags,
deleted branches, staged and imported entries, absolute URIs, rules with patterns,
fractional days and tag retention, the real cutoff with objects younger than it).

The semantics are pure (retention, address classification), so the 200-example
properties run without Spark; the Spark path is held to the same brute-force oracle on
fixed random lakes, many lakes to one pipeline, so that it judges 200 lakes as well.
"""

from __future__ import annotations

import copy
import datetime as dt
import random
import tempfile
import unicodedata
from pathlib import Path
from typing import Optional
from urllib.parse import quote

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gc_assets.core.addresses import with_relative_keys
from gc_assets.core.config import BranchRule, RepositoryConfig, Rules, TagRule
from gc_assets.core.retention import evaluate
from gc_assets.core.uris import classify_address, key_spellings, under_prefix
from gc_assets.demo.lakegen import Lake, export_tables, write_export
from gc_assets.mark.candidates import orphans
from gc_assets.mark.live import deduplicated
from gc_assets.sources.lakefs_export import LakeFSExportSource
from gc_assets.sweep.sweeper import revalidated
from gc_assets_tests.oracles import (
    expected_candidates,
    lake_graph,
    oracle_key,
    oracle_spellings,
    retained_brute_force,
)

# The deletion paths' steps split their rows, as a cluster's do (conftest.rows_split_in_two).
pytestmark = pytest.mark.usefixtures("rows_split_in_two")

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)
NAMESPACE_DIR = "/lakes/ns"
NAMESPACE = f"file://{NAMESPACE_DIR}"
PROTECTED = ("_lakefs/", "_gc/", "_gc_trash/")


ODD_NAMES = ["odd name", "caf\u00e9", "cafe\u0301", "100%", "a+b", "%41"]


def _spelling(lake: Lake, key: str) -> str:
    """Refer to an object the way a commit might: relative or absolute, odd scheme case,
    percent-encoded, in the other Unicode normal form, through `.` segments."""
    relative = lake.rng.choice(
        [
            key,
            key,
            quote(key),
            unicodedata.normalize("NFC", key),
            unicodedata.normalize("NFD", key),
            f"./{key}",
            key.replace("/", "/./", 1),
        ]
    )
    return lake.rng.choice(
        [
            relative,
            relative,
            f"{NAMESPACE}/{relative}",
            f"FILE://{NAMESPACE_DIR}/{relative}",
            f"{NAMESPACE_DIR}/{relative}",
        ]
    )


def _odd_object(lake: Lake, at: dt.datetime) -> str:
    """An object whose name has spaces, accents in either normal form, or a literal '%'."""
    key = f"data/{lake.name}/{lake.rng.choice(ODD_NAMES)}-{lake.rng.getrandbits(32):08x}"
    lake.objects[key] = (lake.rng.randint(10, 400), at - dt.timedelta(minutes=1))
    return key


def random_lake(name: str, seed: int, steps: int) -> Lake:
    """A random history; branch and tag names start with the lake's name, so several lakes
    share one export without colliding."""
    lake = Lake(name, rng=random.Random(f"{name}-{seed}"))
    rng = lake.rng
    trunk = f"{name}-main"
    lake.commit(trunk, T0, ["p0"])
    for step in range(steps):
        at = T0 + dt.timedelta(hours=rng.randint(0, 24 * 40))  # clocks are not monotonic
        roll = rng.random()
        branches = sorted(lake.branches)
        if roll < 0.15:
            lake.branch(f"{name}-b{step}", rng.choice(branches))
        elif roll < 0.25 and len(branches) > 1:
            target, source = rng.sample(branches, 2)
            lake.commit(target, at, merge_from=source)
        elif roll < 0.32 and len(branches) > 1:
            del lake.branches[rng.choice([b for b in branches if b != trunk])]
        elif roll < 0.40:
            lake.tags[f"{name}-t{step}"] = rng.choice(sorted(lake.commits))
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
            if rng.random() < 0.2:
                put[f"odd{step}"] = (_spelling(lake, _odd_object(lake, at)), 1)
            if rng.random() < 0.1:
                put["imported"] = ("s3://elsewhere/imported/object", 1)
            deletes = tuple(rng.sample(existing, min(len(existing), rng.randint(0, 2))))
            lake.commit(branch, at, put, delete=deletes)
    return lake


def random_rules(rng: random.Random, names: list[str]) -> Optional[Rules]:
    """Rules over lakes named `names`: exact branches, patterns (the longest match wins),
    fractional days, tags kept or not, with or without their own retention."""
    if rng.random() < 0.1:
        return None

    def days() -> float:
        return round(rng.uniform(0, 30), rng.choice([0, 1, 3]))

    exact = rng.sample([f"{n}-{b}" for n in names for b in ("main", "b3", "b7")], rng.randint(0, 2))
    patterns = rng.sample(["*-main", "*-b1*", f"{names[0]}-b*", "*"], rng.randint(0, 2))
    branches = [BranchRule(branch_id=b, retention_days=days()) for b in exact]
    branches += [BranchRule(pattern=p, retention_days=days()) for p in patterns]
    tags = TagRule(retain=rng.random() < 0.7, retention_days=rng.choice([None, days()]))
    return Rules(default_retention_days=rng.choice([None, days(), days()]), branches=tuple(branches), tags=tags)


def rules_for(name: str) -> st.SearchStrategy[Optional[Rules]]:
    """Random rules for the lake called `name` (see random_rules)."""
    return st.integers(0, 2**32 - 1).map(lambda seed: random_rules(random.Random(seed), [name]))


@st.composite
def lake_cases(draw):
    """(lake, rules, as_of, cutoff) for one random lake named `lake0`."""
    seed = draw(st.integers(0, 2**32 - 1))
    lake = random_lake("lake0", seed, draw(st.integers(0, 30)))
    rules = draw(rules_for("lake0"))
    as_of = T0 + dt.timedelta(hours=draw(st.integers(24, 24 * 45)))
    cutoff = as_of - dt.timedelta(hours=draw(st.sampled_from([0.5, 1, 24, 72])))
    return lake, rules, as_of, cutoff


def reachable_keys(lake: Lake, commit_ids) -> set[str]:
    """Keys (the oracle's own decoding) named by the entries of `commit_ids` and by staged entries."""
    keys = {oracle_key(a, NAMESPACE) for c in commit_ids for a, _ in lake.commits[c].entries.values()}
    keys |= {oracle_key(address, NAMESPACE) for _, _, address, _ in lake.staged}
    return {k for k in keys if k is not None}


def spelled(keys: set[str]) -> set[str]:
    return set().union(*(oracle_spellings(k) for k in keys)) if keys else set()


def oracle_reasons(lake: Lake, found: set[str]) -> dict[str, str]:
    """`expired` for an object some commit ever named, `untracked` otherwise."""
    ever = spelled(
        {k for c in lake.commits.values() for a, _ in c.entries.values() if (k := oracle_key(a, NAMESPACE)) is not None}
    )
    return {k: "expired" if k in ever else "untracked" for k in found}


@given(lake_cases())
def test_pure_semantics_keep_every_reachable_object_and_name_the_reason(case):
    """Retention evaluation and address classification, composed as the mark composes them,
    select exactly the oracle's candidates with the oracle's reasons."""
    lake, rules, as_of, cutoff = case
    commits, refs = lake_graph(lake)
    retained = {c for c, v in evaluate(commits, refs, rules, as_of).items() if v.retained}
    assert retained == set(retained_brute_force(commits, refs, rules, as_of))

    def live_of(addresses) -> set[str]:
        keys = {classify_address(a, NAMESPACE) for a in addresses}
        return {s for k in keys if k is not None for s in key_spellings(k)}

    live = live_of([a for c in retained for a, _ in lake.commits[c].entries.values()] + [s[2] for s in lake.staged])
    ever = live_of([a for c in lake.commits.values() for a, _ in c.entries.values()])
    decided = {
        key: "expired" if key in ever else "untracked"
        for key, (_, mtime) in lake.objects.items()
        if mtime < cutoff and key not in live and not under_prefix(key, PROTECTED)
    }
    assert set(decided) == expected_candidates(lake, NAMESPACE, rules, as_of, cutoff, PROTECTED)
    assert not set(decided) & spelled(reachable_keys(lake, retained))
    assert decided == oracle_reasons(lake, set(decided))


def merged_export(lakes: list[Lake]) -> dict[str, pa.Table]:
    """One export holding several lakes: their commit ids, ref names and object keys never collide."""
    tables = [export_tables(lake) for lake in lakes]
    return {name: pa.concat_tables([t[name] for t in tables]) for name in tables[0]}


def commit_ids(spark, values):
    return spark.createDataFrame([(c,) for c in sorted(values)], "commit_id string")


SPARK_BATCHES = 4
LAKES_PER_BATCH = 50


def spark_batch(rng: random.Random) -> tuple[list[Lake], list[Optional[Rules]], dt.datetime, dt.datetime]:
    """50 lakes with their own rules, an as-of time and cutoff, drawn until the oracle
    expects both expired and untracked candidates (a batch that expects none tests little)."""
    while True:
        names = [f"lake{i}" for i in range(LAKES_PER_BATCH)]
        lakes = [random_lake(name, rng.getrandbits(32), rng.randint(0, 30)) for name in names]
        rules = [random_rules(rng, [name]) for name in names]
        keys = [set(lake.objects) for lake in lakes]
        assert sum(map(len, keys)) == len(set().union(*keys))
        as_of = T0 + dt.timedelta(hours=rng.randint(24, 24 * 45))
        cutoff = as_of - dt.timedelta(hours=rng.choice([1, 24, 72]))
        expected = [
            expected_candidates(lake, NAMESPACE, rule, as_of, cutoff, PROTECTED) for lake, rule in zip(lakes, rules)
        ]
        reasons = {r for lake, found in zip(lakes, expected) for r in oracle_reasons(lake, found).values()}
        if reasons == {"expired", "untracked"}:
            return lakes, rules, as_of, cutoff


@pytest.mark.parametrize("batch", range(SPARK_BATCHES))
def test_spark_decision_equals_the_oracle_on_fixed_random_lakes(spark, batch):
    """50 random lakes, each with its own rules, judged by one Spark pipeline (4 batches:
    200 lakes): the candidates and their reasons are the oracle's, and no object reachable
    from a retained commit or a staged entry is among them."""
    lakes, rules, as_of, cutoff = spark_batch(random.Random(f"spark-batch-{batch}"))
    retained = {lake.name: retained_brute_force(*lake_graph(lake), rule, as_of) for lake, rule in zip(lakes, rules)}
    all_retained = {c for kept in retained.values() for c in kept}
    heads = {c for lake in lakes for c in [*lake.branches.values(), *lake.tags.values()]}

    with tempfile.TemporaryDirectory() as directory:
        write_export(merged_export(lakes), Path(directory), "parquet")
        source = LakeFSExportSource(Path(directory).as_uri())
        live = deduplicated(
            with_relative_keys(
                source.live_entries(spark, commit_ids(spark, all_retained), commit_ids(spark, heads)), NAMESPACE
            )
        )
        committed = deduplicated(
            with_relative_keys(
                source.live_entries(
                    spark, commit_ids(spark, {c for lake in lakes for c in lake.commits}), commit_ids(spark, heads)
                ),
                NAMESPACE,
            )
        )
        inventory = spark.createDataFrame(
            [(key, size, mtime) for lake in lakes for key, (size, mtime) in lake.objects.items()],
            "address string, size long, last_modified timestamp",
        )
        candidates = {
            r["address"]: r["reason"] for r in orphans(inventory, live, committed, cutoff, PROTECTED).collect()
        }

    for lake, rule in zip(lakes, rules):
        found = {k for k in lake.objects if k in candidates}
        assert not found & spelled(reachable_keys(lake, retained[lake.name])), lake.name
        assert found == expected_candidates(lake, NAMESPACE, rule, as_of, cutoff, PROTECTED), lake.name
        assert {k: candidates[k] for k in found} == oracle_reasons(lake, found), lake.name


def mutate(lake: Lake, seed: int, steps: int) -> None:
    """What may happen between mark and sweep: commits re-referencing old objects (reverts),
    branches created from old commits, tags moved, branches deleted, new staged entries."""
    rng = random.Random(seed)
    trunk = f"{lake.name}-main"
    for step in range(steps):
        at = T0 + dt.timedelta(hours=rng.randint(0, 24 * 50))
        roll = rng.random()
        branches = sorted(lake.branches)
        if roll < 0.4:
            key = rng.choice(sorted(lake.objects))
            lake.commit(rng.choice(branches), at, {f"revert/{step}": (_spelling(lake, key), 1)})
        elif roll < 0.6:
            lake.branches[f"{lake.name}-from-old-{step}"] = rng.choice(sorted(lake.commits))
        elif roll < 0.75:
            lake.tags[f"{lake.name}-moved-{step}"] = rng.choice(sorted(lake.commits))
        elif roll < 0.85 and len(branches) > 1:
            del lake.branches[rng.choice([b for b in branches if b != trunk])]
        else:
            key = rng.choice(sorted(lake.objects))
            lake.staged.append((rng.choice(branches), f"staged/again-{step}", key, 1))


REVALIDATION_BATCHES = 5
INTERLEAVINGS_PER_BATCH = 40


def kept_now(lakes: list[Lake], rules: Optional[Rules], as_of: dt.datetime) -> set[str]:
    """Every spelling of every key the lakes' current state keeps (the oracle's reading)."""
    return set().union(
        *(spelled(reachable_keys(lake, retained_brute_force(*lake_graph(lake), rules, as_of))) for lake in lakes)
    )


def interleavings(rng: random.Random) -> tuple[list[Lake], list[Lake], Optional[Rules], dt.datetime, dt.datetime]:
    """40 marked lakes, the same lakes changed afterwards, one set of rules, as-of and cutoff,
    drawn until some change revives a candidate (a batch that revives nothing tests half)."""
    names = [f"lake{i}" for i in range(INTERLEAVINGS_PER_BATCH)]
    while True:
        rules = random_rules(rng, names)  # re-validation evaluates the one repository's rules
        as_of = T0 + dt.timedelta(hours=rng.randint(24, 24 * 45))
        cutoff = as_of - dt.timedelta(hours=rng.choice([1, 24, 72]))
        marked = [random_lake(name, rng.getrandbits(32), rng.randint(0, 30)) for name in names]
        current = [copy.deepcopy(lake) for lake in marked]
        for lake in current:
            mutate(lake, rng.getrandbits(32), rng.randint(1, 6))
        candidates = set().union(
            *(expected_candidates(lake, NAMESPACE, rules, as_of, cutoff, PROTECTED) for lake in marked)
        )
        if candidates & kept_now(current, rules, as_of) and candidates - kept_now(current, rules, as_of):
            return marked, current, rules, as_of, cutoff


@pytest.mark.parametrize("batch", range(REVALIDATION_BATCHES))
def test_revalidation_revives_exactly_what_the_current_state_keeps(spark, batch):
    """40 random interleavings of a mark, repository changes and a sweep per batch (200 in
    all), in two exports re-validated together (one set's re-validation each batch): the
    candidates revived in each are exactly those that a commit retained at sweep time, or a
    staged entry, still names there. Nothing kept is acted on, and nothing that is not kept is spared."""
    marked_lakes, current, rules, as_of, cutoff = interleavings(random.Random(f"revalidation-batch-{batch}"))
    half = len(marked_lakes) // 2
    exports = {"first": slice(0, half), "second": slice(half, None)}
    marked_rows, candidate_rows, repos, expected = [], [], {}, {}
    with tempfile.TemporaryDirectory() as directory:
        for name, lakes in exports.items():
            graph = [sum(parts, []) for parts in zip(*(lake_graph(lake) for lake in marked_lakes[lakes]))]
            heads = {r.commit_id for r in graph[1]}
            marked_rows += [(name, c, v.retained, c in heads) for c, v in evaluate(*graph, rules, as_of).items()]
            candidates = set().union(
                *(expected_candidates(lake, NAMESPACE, rules, as_of, cutoff, PROTECTED) for lake in marked_lakes[lakes])
            )
            candidate_rows += [(name, key) for key in sorted(candidates)]
            expected[name] = candidates & kept_now(current[lakes], rules, as_of)
            write_export(merged_export(current[lakes]), Path(directory) / name, "parquet")
            repos[name] = RepositoryConfig(
                name=name,
                format="lakefs-export",
                storage_namespace=NAMESPACE,
                source=(Path(directory) / name).as_uri(),
                rules=rules,
            )
        marked = spark.createDataFrame(marked_rows, "repo string, commit_id string, retained boolean, ref_head boolean")
        frame = spark.createDataFrame(candidate_rows, "repo string, address string")
        found = revalidated(spark, repos, as_of, marked, frame)
        revived = {name: set() for name in repos}
        for row in found.revived.collect():
            revived[row["repo"]].add(row["address"])

    assert not found.refused and set(found.checks) == set(repos)
    assert revived == expected
