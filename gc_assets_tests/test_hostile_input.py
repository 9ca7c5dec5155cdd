"""Hostile input: odd addresses, symlinks out of the namespace, future commits, a clock
that jumps, empty repositories, no rules, a huge range. Each is handled or refused,
and nothing the live-set rules keep is ever deleted."""

from __future__ import annotations

import datetime as dt
import os
import unicodedata
from pathlib import Path

import pyarrow.parquet as pq
from dagster import DagsterInstance
from hypothesis import given
from hypothesis import strategies as st

from gc_assets.core.addresses import (
    ABSOLUTE_ADDRESS_PATTERN,
    UNRESOLVED_KEY_PATTERN,
    is_absolute_address,
    is_unresolved_key,
    with_relative_keys,
)
from gc_assets.core.retention import Commit, Ref, evaluate
from gc_assets.core.uris import (
    canonical_address,
    classify_address,
    escapes,
    key_spellings,
)
from gc_assets.demo.lakegen import Lake, write_lake
from gc_assets.runner import run_partition
from gc_assets_tests.lakes import GC_DATE, write_config

UTC = dt.timezone.utc
OLD = dt.datetime(2022, 3, 1, 12, tzinfo=UTC)
RULES = {"default_retention_days": 7}


def _keys(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def _hostile_lake(tmp_path: Path, spark_safe: bool = True) -> tuple[Lake, Path, Path]:
    """A lake whose head refers to objects through every odd spelling, plus decoys."""
    namespace = tmp_path / "lake" / "hostile"
    lake = Lake("hostile")
    odd_keys = {
        "plain": "data/plain",
        "dotted": "data/dotted",
        "spaced": "data/with space",
        "trailing": "data/trailing space ",
        "newline": "data/new\nline",
        "nfc": unicodedata.normalize("NFC", "data/café"),
        "encoded": "data/per cent",
        "absolute": "data/absolute",
        "hash": "data/hash#1",
        "query": "data/what?v=1",
    }
    for key in odd_keys.values():
        lake.objects[key] = (5, OLD)
    entries = {
        "p/plain": (odd_keys["plain"], 5),
        "p/dotted": ("data/./sub/../dotted", 5),
        "p/spaced": (odd_keys["spaced"], 5),
        "p/trailing": (odd_keys["trailing"], 5),
        "p/newline": (odd_keys["newline"], 5),
        "p/nfd": (unicodedata.normalize("NFD", odd_keys["nfc"]), 5),  # same name, other normalization
        "p/encoded": ("data/per%20cent", 5),
        "p/absolute": (f"{namespace.as_uri()}/{odd_keys['absolute']}", 5),
        # '#' and '?' are characters of a local file's name, not a URI's fragment or query. Only
        # the retained commit below the head names them: a missing head object would block the sweep.
        "p/hash": (f"{namespace}/{odd_keys['hash']}", 5),
        "p/query": (f"{namespace.as_uri()}/{odd_keys['query']}", 5),
        "p/elsewhere": ("file:///etc/passwd", 5),
        "p/bucket": ("s3://other-bucket/data/plain", 5),
    }
    lake.commit("main", OLD, entries)
    lake.commit(
        "main",
        dt.datetime(2030, 1, 1, tzinfo=UTC),
        {"p/future": ("data/future-commit", 5)},
        delete=("p/hash", "p/query"),
    )  # a future head
    lake.objects["data/future-commit"] = (5, OLD)
    decoys = ["data/orphan-1", "data/orphan 2", "data/orphan-3\t"]
    for key in decoys:
        lake.objects[key] = (5, OLD)
    write_lake(lake, namespace)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("must survive")
    os.symlink(outside, namespace / "data" / "link-out")
    os.symlink(outside / "secret", namespace / "data" / "file-link")
    config = write_config(
        tmp_path / "gc.yaml",
        [
            {
                "name": "hostile",
                "format": "lakefs-export",
                "storage_namespace": namespace.as_uri(),
                "source": (namespace / "_lakefs" / "export").as_uri(),
                "rules": RULES,
                "max_delete_fraction": 1.0,
                "external_prefixes": ["file:///etc", "s3://other-bucket"],
            }
        ],
        tmp_path / "state",
    )
    return lake, namespace, config


def test_hostile_addresses_protect_what_they_name_and_nothing_else_is_touched(tmp_path, spark):
    lake, namespace, config = _hostile_lake(tmp_path)
    outcome = run_partition(str(config), "hostile", GC_DATE, mode="delete", instance=DagsterInstance.ephemeral())
    assert outcome.success, outcome.error
    receipts = {
        r["address"]: r["action"] for r in pq.read_table(outcome.summary["outputs"]["deletion_receipts"]).to_pylist()
    }
    assert receipts == {"data/orphan-1": "deleted", "data/orphan 2": "deleted", "data/orphan-3\t": "deleted"}
    survivors = _keys(namespace)
    for key in [
        "data/plain",
        "data/dotted",
        "data/with space",
        "data/trailing space ",
        "data/new\nline",
        unicodedata.normalize("NFC", "data/café"),
        "data/per cent",
        "data/absolute",
        "data/future-commit",
        "data/hash#1",
        "data/what?v=1",
    ]:
        assert key in survivors, key
    assert (tmp_path / "outside" / "secret").read_text() == "must survive"
    assert (namespace / "data" / "link-out").is_symlink() and (namespace / "data" / "file-link").is_symlink()
    live = {
        r["address"]: r["in_namespace"] for r in pq.read_table(outcome.summary["outputs"]["live_files"]).to_pylist()
    }
    assert live["file:///etc/passwd"] is False
    assert live["s3://other-bucket/data/plain"] is False


def test_repository_without_commits_is_refused(tmp_path, spark):
    namespace = tmp_path / "lake" / "empty"
    lake = Lake("empty")
    lake.objects["data/only"] = (5, OLD)
    write_lake(lake, namespace)
    config = write_config(
        tmp_path / "gc.yaml",
        [
            {
                "name": "empty",
                "format": "lakefs-export",
                "storage_namespace": namespace.as_uri(),
                "source": (namespace / "_lakefs" / "export").as_uri(),
                "rules": RULES,
            }
        ],
        tmp_path / "state",
    )
    outcome = run_partition(str(config), "empty", GC_DATE, mode="delete", instance=DagsterInstance.ephemeral())
    assert not outcome.success and "has no commits" in outcome.error
    assert (namespace / "data" / "only").exists()


def test_empty_namespace_is_an_error_not_everything_orphaned(tmp_path, spark):
    namespace = tmp_path / "lake" / "none"
    namespace.mkdir(parents=True)
    export = tmp_path / "export"
    lake = Lake("none")
    lake.commit("main", OLD, ["p"])
    from gc_assets.demo.lakegen import export_tables, write_export

    write_export(export_tables(lake), export)
    config = write_config(
        tmp_path / "gc.yaml",
        [
            {
                "name": "none",
                "format": "lakefs-export",
                "storage_namespace": namespace.as_uri(),
                "source": export.as_uri(),
            }
        ],
        tmp_path / "state",
    )
    outcome = run_partition(str(config), "none", GC_DATE, mode="delete", instance=DagsterInstance.ephemeral())
    assert not outcome.success and outcome.summary["checks"]["live_objects_present"] == "failed"
    assert "orphan_candidates" not in outcome.summary["outputs"]


def test_no_rules_keeps_every_commit_and_collects_only_untracked(tmp_path, spark):
    lake = Lake("norules")
    lake.commit("main", OLD, ["a", "b"])
    lake.commit("main", OLD + dt.timedelta(days=1), ["a"], delete=("b",))
    untracked = lake.upload_untracked(OLD)
    namespace = tmp_path / "lake" / "norules"
    write_lake(lake, namespace)
    config = write_config(
        tmp_path / "gc.yaml",
        [
            {
                "name": "norules",
                "format": "lakefs-export",
                "storage_namespace": namespace.as_uri(),
                "source": (namespace / "_lakefs" / "export").as_uri(),
                "max_delete_fraction": 1.0,
            }
        ],
        tmp_path / "state",
    )
    outcome = run_partition(str(config), "norules", GC_DATE, mode="dry_run", instance=DagsterInstance.ephemeral())
    assert outcome.success, outcome.error
    candidates = pq.read_table(outcome.summary["outputs"]["orphan_candidates"]).to_pylist()
    assert [(c["address"], c["reason"]) for c in candidates] == [(untracked, "untracked")]
    assert outcome.summary["expired_commits"] == 0


def test_clock_jump_backwards_keeps_the_earlier_cutoff(tmp_path, spark):
    """The cutoff is min(mark_time, as_of, source_time) - min_age: an as-of in the future (dry run
    only) cannot make objects written after the mark look old, nor can a stale source."""
    from gc_assets.core.config import GcConfig, RepositoryConfig
    from gc_assets.mark.partition import GcPartition, Mark, candidate_cutoff

    repo = RepositoryConfig(name="r", format="delta", storage_namespace="file:///x")
    mark = Mark("run", dt.datetime(2024, 1, 1, tzinfo=UTC), dt.datetime(2024, 1, 1, tzinfo=UTC))
    partition = GcPartition(GcConfig(), repo, dt.date(2024, 1, 5), dt.datetime(2024, 1, 6, tzinfo=UTC))
    assert candidate_cutoff(partition, mark) == dt.datetime(2023, 12, 31, tzinfo=UTC)
    earlier = GcPartition(GcConfig(), repo, dt.date(2023, 12, 1), dt.datetime(2023, 12, 2, tzinfo=UTC))
    assert candidate_cutoff(earlier, mark) == dt.datetime(2023, 12, 1, tzinfo=UTC)
    stale_export = Mark("run", dt.datetime(2024, 1, 1, tzinfo=UTC), dt.datetime(2023, 12, 20, tzinfo=UTC))
    assert candidate_cutoff(partition, stale_export) == dt.datetime(2023, 12, 19, tzinfo=UTC)


def test_commits_dated_in_the_future_are_retained():
    """A future commit is newer than every threshold: it is kept, and so is the head at the cutoff."""
    from gc_assets.core.config import Rules

    future = dt.datetime(2099, 1, 1, tzinfo=UTC)
    commits = [
        Commit("old", (), OLD),
        Commit("older-head", ("old",), OLD + dt.timedelta(days=1)),
        Commit("future", ("older-head",), future),
    ]
    verdicts = evaluate(
        commits, [Ref("main", "branch", "future")], Rules(default_retention_days=1), OLD + dt.timedelta(days=30)
    )
    assert {c for c, v in verdicts.items() if v.retained} == {"future", "older-head"}


def test_a_single_range_with_a_million_entries(tmp_path, spark):
    """One range of 1,000,000 entries: read once, joined on executors, nothing collected."""
    import pyarrow as pa

    from gc_assets.sources.lakefs_export import LakeFSExportSource

    n = 1_000_000
    export = tmp_path / "export"
    tables = {
        "commits": pa.table(
            {
                "commit_id": ["c"],
                "parents": pa.array([[]], pa.list_(pa.string())),
                "created_at": pa.array([OLD], pa.timestamp("us", tz="UTC")),
                "metarange_id": ["m"],
            }
        ),
        "refs": pa.table({"name": ["main"], "kind": ["branch"], "commit_id": ["c"]}),
        "metaranges": pa.table({"metarange_id": ["m"], "range_id": ["r"]}),
        "ranges": pa.table(
            {
                "range_id": pa.array(["r"] * n),
                "path": pa.array([f"p/{i}" for i in range(n)]),
                "address": pa.array([f"data/{i:07d}" for i in range(n)]),
                "size": pa.array([1] * n, pa.int64()),
            }
        ),
    }
    for name, table in tables.items():
        (export / name).mkdir(parents=True)
        pq.write_table(table, export / name / "part-00000.parquet")
    source = LakeFSExportSource(export.as_uri())
    ids = spark.createDataFrame([("c",)], "commit_id string")
    live = with_relative_keys(source.live_entries(spark, ids, ids), "file:///lake")
    assert live.filter("in_namespace and at_head").count() == n


@given(st.lists(st.sampled_from(list("ab/.%2é \n") + ["%20", "..", "//"]), max_size=12).map("".join))
def test_every_unusual_spelling_goes_through_the_spelling_path(key):
    """Spark sends a key through key_spellings only when it matches UNRESOLVED_KEY_PATTERN:
    every key with more than one spelling, or one that escapes, must match it."""
    import re

    if len(key_spellings(key)) > 1 or (key and escapes(key)):
        assert re.search(UNRESOLVED_KEY_PATTERN, key)
    assert all(not escapes(s) for s in key_spellings(key)[1:])


# Pieces of odd addresses: every branch of both patterns, and each of Java's line terminators.
ODD_PIECES = ["a", "B", "/", ".", "..", "%", "%2F", "%zz", ":", "s3:", "S3a:", "1:", "file:", "x+y.z-:", "é", "~", " "]
ODD_PIECES += ["\n", "\r", "\r\n", "\u0085", "\u2028", "\u2029", "\U0001f600"]
# Bytes that are not UTF-8: Java reads each as U+FFFD, which only the non-ASCII branch matches.
NOT_UTF8 = ["61FF62", "80", "2FC0AF", "733A2F2FFE"]


def test_guarded_patterns_answer_as_the_patterns_do(spark):
    """is_absolute_address and is_unresolved_key search their patterns only where a cheap test of
    their own says the pattern can match: on 4,000 random odd addresses and on bytes that are not
    UTF-8, each answers as Spark's `rlike` of its bare pattern, row for row."""
    import random

    from pyspark.sql import functions as F

    rng = random.Random("guarded-patterns")
    addresses = {"".join(rng.choice(ODD_PIECES) for _ in range(rng.randint(0, 6))) for _ in range(4000)}
    odd = spark.createDataFrame([(a,) for a in sorted(addresses)], "address string")
    for hexed in NOT_UTF8:
        odd = odd.unionByName(spark.range(1).select(F.unhex(F.lit(hexed)).cast("string").alias("address")))
    address = F.col("address")
    answers = odd.select(
        F.hex("address").alias("bytes"),
        is_absolute_address(address).alias("absolute"),
        address.rlike(ABSOLUTE_ADDRESS_PATTERN).alias("absolute_pattern"),
        is_unresolved_key(address).alias("unresolved"),
        address.rlike(UNRESOLVED_KEY_PATTERN).alias("unresolved_pattern"),
    ).collect()
    assert len(answers) == len(addresses) + len(NOT_UTF8)
    mine = [(row.bytes, row.absolute, row.unresolved) for row in answers]
    assert mine == [(row.bytes, row.absolute_pattern, row.unresolved_pattern) for row in answers]
    assert {row.absolute for row in answers} == {row.unresolved for row in answers} == {True, False}


PREFIXES = [
    "",
    "data/",
    "./",
    "x/../",
    "S3://",
    "s3a://",
    "file://",
    "FILE:///lake/",
    "/lake/",
    "file:/lake/",
    "s3://b/p/",
    "s3://b/p",
]
SPELLING_EXAMPLES = 200


def test_spark_and_python_agree_on_relative_keys(spark):
    """The mark's Spark normalization and the guard's Python one classify every address alike:
    200 random lists of odd addresses (prefixes that do and do not name the namespace, dots,
    percent signs, accents) judged in one Spark pass per namespace."""
    import random

    rng = random.Random("spark-python-agreement")
    addresses = sorted(
        {
            rng.choice(PREFIXES) + "".join(rng.choice("ab/.%é") for _ in range(rng.randint(0, 8)))
            for _ in range(SPELLING_EXAMPLES)
            for _ in range(rng.randint(1, 40))
        }
    )
    assert any(escapes(a) for a in addresses if not a.startswith(("s", "S", "f", "F", "/")))
    frame = spark.createDataFrame(
        [(a, 1, "committed", True) for a in addresses], "address string, size long, source string, at_head boolean"
    )
    for namespace in ("file:///lake", "s3://b/p"):
        rows = {(r["address"], r["in_namespace"]) for r in with_relative_keys(frame, namespace).collect()}
        inside = 0
        for address in addresses:
            key = classify_address(address, namespace)
            if key is None:
                assert (canonical_address(address), False) in rows, address
            else:
                inside += 1
                assert (key, not escapes(key)) in rows, address
                assert all((spelling, True) in rows for spelling in key_spellings(key)[1:]), address
        assert 0 < inside < len(addresses)
