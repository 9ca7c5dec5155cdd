"""The S3 store against a real HTTP S3 endpoint (moto's server): sliced listing equals a
plain listing, deletion in batches with per-key receipts under injected faults, a rerun
that finishes the job, moves and existence checks; plus the pure slicing and retry rules."""

from __future__ import annotations

import random
import statistics
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import types as T

from gc_assets.stores.executor import Receipt
from gc_assets.stores.local import LocalStore
from gc_assets.stores.many import exists_many, list_many
from gc_assets.stores.retries import RetryPolicy, call_with_retries
from gc_assets.stores.s3.actions import holds_same_bytes, move_one
from gc_assets.stores.s3.client import S3_FAILURES, S3Settings
from gc_assets.stores.s3.store import S3Store
from gc_assets.stores.slices import DelimiterPage, discover_slices, tile
from gc_assets_tests import many_namespaces
from gc_assets_tests.s3_server import FaultInjection, s3  # noqa: F401 - the fixture
from gc_assets_tests.sweep_runs import race_exclusive_writes

FAST = RetryPolicy(attempts=6, base_delay=0.001, max_delay=0.01)
CANDIDATE_SCHEMA = T.StructType(
    [
        T.StructField("address", T.StringType(), False),
        T.StructField("size", T.LongType(), False),
        T.StructField("last_modified", T.TimestampType(), False),
    ]
)

keys_strategy = st.lists(st.text(alphabet="ab/0Z_.é", min_size=1, max_size=8), min_size=0, max_size=40, unique=True)


def _delimiter_pages(keys: list[str], page_size: int):
    """A delimiter listing over an in-memory key set, one page of `page_size` entries."""

    def list_page(prefix: str) -> DelimiterPage:
        entries: dict[str, bool] = {}
        for key in sorted(k for k in keys if k.startswith(prefix)):
            rest = key[len(prefix) :]
            entry = prefix + rest.split("/", 1)[0] + "/" if "/" in rest else key
            entries.setdefault(entry, "/" in rest)
        page = sorted(entries.items())[:page_size]
        return DelimiterPage(
            [e for e, is_prefix in page if is_prefix], any(not p for _, p in page), len(entries) > page_size
        )

    return list_page


@given(keys_strategy, st.lists(st.text(alphabet="ab/0Z_.é", min_size=1, max_size=4), max_size=6))
def test_tiles_hold_every_key_exactly_once(keys, boundaries):
    slices = tile("p/", ["p/" + b for b in boundaries])
    for key in ["p/" + k for k in keys]:
        assert sum(s.holds(key) for s in slices) == 1


@given(keys_strategy, st.integers(1, 3), st.integers(1, 4), st.integers(1, 6))
def test_discovered_slices_hold_every_key_exactly_once(keys, depth, fanout, page_size):
    namespace_keys = ["ns/" + k for k in keys]
    slices = discover_slices(_delimiter_pages(namespace_keys, page_size), "ns/", depth, fanout)
    for key in namespace_keys:
        assert sum(s.holds(key) for s in slices) == 1, (key, slices)


def _throttled(times: int, code: str = "SlowDown"):
    calls = []

    def operation():
        calls.append(1)
        if len(calls) <= times:
            raise ClientError(
                {"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "Op"
            )
        return "done"

    return operation, calls


def test_retries_back_off_exponentially_with_jitter_then_give_up():
    sleeps: list[float] = []
    operation, calls = _throttled(3)
    policy = RetryPolicy(attempts=5, base_delay=1.0, max_delay=5.0)
    assert call_with_retries("op", operation, policy, S3_FAILURES, sleep=sleeps.append, rng=random.Random(1)) == "done"
    assert len(calls) == 4 and len(sleeps) == 3
    assert all(0 <= pause <= min(5.0, 2**n) for n, pause in enumerate(sleeps))
    assert len(set(sleeps)) == 3  # jittered, not a fixed schedule

    operation, calls = _throttled(10)
    with pytest.raises(ClientError):
        call_with_retries("op", operation, policy, S3_FAILURES, sleep=sleeps.append)
    assert len(calls) == 5  # the budget, then the last error is raised

    operation, calls = _throttled(10, code="AccessDenied")
    with pytest.raises(ClientError):
        call_with_retries("op", operation, policy, S3_FAILURES, sleep=sleeps.append)
    assert len(calls) == 1  # a 4xx is never retried


def test_backoff_is_full_jitter_uniform_below_an_exponential_cap():
    """Attempt n waits uniform(0, min(max_delay, base * 2**n)): over 4,000 throttled calls the
    pauses of each attempt fill their whole range evenly (mean half the cap, each quarter a
    quarter of them), and the cap doubles per attempt until max_delay."""
    policy = RetryPolicy(attempts=7, base_delay=0.5, max_delay=10.0)
    rng = random.Random(7)
    by_attempt: dict[int, list[float]] = {}
    for _ in range(4000):
        pauses: list[float] = []
        operation, _ = _throttled(6)
        call_with_retries("op", operation, policy, S3_FAILURES, sleep=pauses.append, rng=rng)
        for attempt, pause in enumerate(pauses):
            by_attempt.setdefault(attempt, []).append(pause)
    assert sorted(by_attempt) == [0, 1, 2, 3, 4, 5]
    for attempt, cap in zip(range(6), [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]):
        pauses = by_attempt[attempt]
        assert min(pauses) >= 0 and max(pauses) <= cap
        assert max(pauses) > 0.98 * cap and min(pauses) < 0.02 * cap
        assert abs(statistics.fmean(pauses) / cap - 0.5) < 0.03
        for quarter in range(4):
            share = sum(quarter * cap / 4 <= p < (quarter + 1) * cap / 4 for p in pauses) / len(pauses)
            assert abs(share - 0.25) < 0.04, (attempt, quarter, share)


def _put(s3, bucket: str, keys: list[str]) -> None:
    client = s3.client()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: client.put_object(Bucket=bucket, Key=key, Body=b"x" * (len(key) % 7 + 1)), keys))


def _plain_listing(s3, bucket: str, prefix: str) -> dict[str, tuple[int, str]]:
    client = s3.client()
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if not item["Key"].endswith("/"):
                found[item["Key"][len(prefix) :]] = (item["Size"], item["ETag"].strip('"'))
    return found


def test_sliced_listing_equals_a_plain_full_listing(s3, spark):
    s3.create_bucket("listing")
    rng = random.Random(3)
    keys = [f"lake/data/{rng.getrandbits(32):08x}/{rng.getrandbits(64):016x}" for _ in range(60)]
    keys += [f"lake/flat/{rng.getrandbits(24):06x}" for _ in range(60)]
    keys += [
        "lake/flat/0",
        "lake/flat/a",
        "lake/flat/a/b",
        "lake/flat/ü/x",
        "lake/flat/with space+plus",
        "lake/top",
        "lake/data/dir/",
    ]
    keys += ["lakeside/not-in-namespace", "other/x"]
    _put(s3, "listing", keys)
    store = S3Store("s3://listing/lake", S3Settings.from_environment(), FAST, fanout=6, discovery_page_size=30)
    slices = store.slices("lake/")
    assert len(slices) > 60  # flat/ was cut by key ranges, data/ grouped into 6 ranges
    assert any(s.start is not None for s in slices) and any(not s.recursive for s in slices)
    listed = store.list(spark).collect()
    addresses = [r["address"] for r in listed]
    assert len(addresses) == len(set(addresses))  # no object listed twice
    assert {r["address"]: (r["size"], r["etag"]) for r in listed} == _plain_listing(s3, "listing", "lake/")
    assert "data/dir/" not in addresses  # folder markers are not data


def _candidates(spark, s3, bucket: str, prefix: str, addresses: set[str]):
    """The candidates as an inventory would give them: address, size, last_modified."""
    rows = []
    for page in s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if item["Key"][len(prefix) :] in addresses:
                rows.append((item["Key"][len(prefix) :], item["Size"], item["LastModified"]))
    return spark.createDataFrame(rows, CANDIDATE_SCHEMA)


def test_deletion_under_faults_records_every_key_and_a_rerun_finishes_the_job(s3, spark):
    s3.create_bucket("deletion")
    keys = [f"ns/data/{i:05d}" for i in range(1010)]
    _put(s3, "deletion", keys + ["ns/live/keep-me"])
    addresses = {k.removeprefix("ns/") for k in keys}
    candidates = _candidates(spark, s3, "deletion", "ns/", addresses)
    denied = {f"data/{i:05d}" for i in range(0, 1010, 200)}
    flaky = {f"data/{i:05d}" for i in range(7, 1010, 300)}
    gone_before = {"data/00001", "data/00002", "data/00003"}
    rewritten = {"data/00004"}
    client = s3.client()
    for address in gone_before:
        client.delete_object(Bucket="deletion", Key="ns/" + address)
    client.put_object(Bucket="deletion", Key="ns/data/00004", Body=b"rewritten after the inventory")
    faults = FaultInjection(
        throttle_calls=2, denied=frozenset("ns/" + a for a in denied), flaky=frozenset("ns/" + a for a in flaky)
    )
    store = S3Store("s3://deletion/ns", S3Settings.from_environment(), FAST, client_factory=faults)

    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")  # one partition: batches of 1000 + 10
    try:
        receipts = {r["address"]: (r["action"], r["error"]) for r in store.delete(spark, candidates).collect()}
        assert len(receipts) == len(addresses)
        expected = {a: ("deleted", None) for a in addresses}
        expected.update({a: ("failed", "AccessDenied") for a in denied})
        expected.update({a: ("already_absent", None) for a in gone_before})
        expected.update({a: ("failed", "modified_since_inventory") for a in rewritten})
        assert receipts == expected  # throttled batches and flaky keys were retried, none dropped
        assert s3.keys("deletion", "ns/") == {"ns/live/keep-me"} | {"ns/" + a for a in denied | rewritten}

        rerun = {
            r["address"]: (r["action"], r["error"])
            for r in S3Store("s3://deletion/ns", S3Settings.from_environment(), FAST)
            .delete(spark, candidates)
            .collect()
        }
        finished = {a: ("already_absent", None) for a in addresses}
        finished.update({a: ("deleted", None) for a in denied})
        finished.update({a: ("failed", "modified_since_inventory") for a in rewritten})
        assert rerun == finished
        assert s3.keys("deletion", "ns/") == {"ns/live/keep-me", "ns/data/00004"}
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)


def test_throttling_beyond_the_retry_budget_fails_every_key_and_deletes_nothing(s3, spark):
    s3.create_bucket("throttled")
    keys = [f"ns/x/{i}" for i in range(20)]
    _put(s3, "throttled", keys)
    candidates = _candidates(spark, s3, "throttled", "ns/", {k.removeprefix("ns/") for k in keys})
    store = S3Store(
        "s3://throttled/ns", S3Settings.from_environment(), FAST, client_factory=FaultInjection(throttle_calls=1000)
    )
    receipts = store.delete(spark, candidates).collect()
    assert sorted((r["action"], r["error"]) for r in receipts) == [("failed", "SlowDown")] * 20
    assert s3.keys("throttled") == set(keys)


def test_listing_is_retried_when_throttled(s3, spark):
    s3.create_bucket("slowlist")
    keys = [f"ns/{c}/{i}" for c in "abc" for i in range(5)]
    _put(s3, "slowlist", keys)
    faults = FaultInjection(throttle_operation="list_objects_v2", throttle_calls=2, throttle_code="InternalError")
    store = S3Store("s3://slowlist/ns", S3Settings.from_environment(), FAST, client_factory=faults)
    assert sorted(r["address"] for r in store.list(spark).collect()) == sorted(k.removeprefix("ns/") for k in keys)


def test_move_to_trash_and_back_never_overwrites_and_exists_sees_it(s3, spark):
    s3.create_bucket("moves")
    keys = [f"ns/data/{i}" for i in range(6)]
    _put(s3, "moves", keys)
    s3.client().delete_object(Bucket="moves", Key="ns/data/5")
    moves = spark.createDataFrame(
        [(f"data/{i}", f"_gc_trash/run-1/data/{i}") for i in range(6)] + [("../escape", "_gc_trash/run-1/x")],
        "address string, destination string",
    )
    store = S3Store("s3://moves/ns", S3Settings.from_environment(), FAST)
    receipts = {r["address"]: (r["action"], r["error"]) for r in store.move(spark, moves).collect()}
    assert receipts == {
        **{f"data/{i}": ("moved", None) for i in range(5)},
        "data/5": ("already_absent", None),
        "../escape": ("failed", "unsafe_key"),
    }
    assert s3.keys("moves") == {f"ns/_gc_trash/run-1/data/{i}" for i in range(5)}
    trashed = store.list(spark, prefix="_gc_trash/run-1")
    assert sorted(r["address"] for r in trashed.collect()) == [f"_gc_trash/run-1/data/{i}" for i in range(5)]
    back = trashed.selectExpr("address", "substring(address, 17) as destination", "last_modified")
    s3.client().put_object(Bucket="moves", Key="ns/data/4", Body=b"written meanwhile")
    restored = {r["address"]: (r["action"], r["error"]) for r in store.move(spark, back).collect()}
    assert restored == {
        **{f"_gc_trash/run-1/data/{i}": ("moved", None) for i in range(4)},
        "_gc_trash/run-1/data/4": ("failed", "destination_exists"),  # never overwritten
    }
    probe = spark.createDataFrame([("data/0",), ("_gc_trash/run-1/data/0",)], "address string")
    assert {r["address"]: r["exists"] for r in store.exists(spark, probe).collect()} == {
        "data/0": True,
        "_gc_trash/run-1/data/0": False,
    }


def test_small_objects_are_written_exclusively_read_and_removed(s3):
    s3.create_bucket("small")
    store = S3Store("s3://small/ns", S3Settings.from_environment(), FAST)
    assert store.read_text("_gc/lease.json") is None
    assert store.write_text("_gc/lease.json", "first", exclusive=True)
    assert not store.write_text("_gc/lease.json", "second", exclusive=True)  # a conditional write, not a race
    assert store.read_text("_gc/lease.json") == "first"
    assert (
        store.keys("_gc/") == ["_gc/lease.json"]
        and store.keys("_g") == ["_gc/lease.json"]
        and store.keys("_gc/x/") == []
    )
    assert store.write_text("_gc/lease.json", "renewed")
    assert store.read_text("_gc/lease.json") == "renewed"
    store.remove("_gc/lease.json")
    assert store.read_text("_gc/lease.json") is None and s3.keys("small") == set()


def test_concurrent_exclusive_writers_have_exactly_one_winner(s3):
    """8 writers released together on one key, 10 times: S3's conditional create lets one win."""
    s3.create_bucket("race")
    store = S3Store("s3://race/ns", S3Settings.from_environment(), FAST)
    for round_ in range(10):
        assert len(race_exclusive_writes(store, f"_gc/lease/{round_:012d}.json", 8)) == 1
    assert len(s3.keys("race")) == 10


class _LostAnswer:
    """A client whose CopyObject lands and then answers PreconditionFailed: a retried copy meeting
    its own first copy, whose answer was lost (moto ignores If-None-Match, so it never answers
    this itself). With `meanwhile`, other bytes land at the destination instead."""

    def __init__(self, client, meanwhile: bytes | None = None):
        self.client, self.meanwhile = client, meanwhile

    def copy_object(self, **request):
        if self.meanwhile is None:
            self.client.copy_object(**{k: v for k, v in request.items() if k != "IfNoneMatch"})
        else:
            self.client.put_object(Bucket=request["Bucket"], Key=request["Key"], Body=self.meanwhile)
        raise ClientError(
            {"Error": {"Code": "PreconditionFailed", "Message": "At least one precondition"}}, "CopyObject"
        )

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_a_copy_whose_answer_was_lost_completes_the_move_and_other_bytes_never_do(s3):
    s3.create_bucket("lost")
    client = s3.client()
    for key, body in (("ns/data/a", b"alpha"), ("ns/data/b", b"beta")):
        client.put_object(Bucket="lost", Key=key, Body=body)

    moved = move_one(_LostAnswer(client), "lost", "ns/", "data/a", "_gc_trash/r/data/a", None, FAST)
    other = move_one(_LostAnswer(client, b"not beta"), "lost", "ns/", "data/b", "_gc_trash/r/data/b", None, FAST)

    assert moved == Receipt("data/a", "moved")
    assert client.get_object(Bucket="lost", Key="ns/_gc_trash/r/data/a")["Body"].read() == b"alpha"
    assert other == Receipt("data/b", "failed", "destination_exists")
    assert client.get_object(Bucket="lost", Key="ns/_gc_trash/r/data/b")["Body"].read() == b"not beta"
    assert holds_same_bytes(client, "lost", "ns/", "data/a", "_gc_trash/r/data/a", FAST)
    assert not holds_same_bytes(client, "lost", "ns/", "data/b", "_gc_trash/r/data/b", FAST)
    assert not holds_same_bytes(client, "lost", "ns/", "data/a", "_gc_trash/r/missing", FAST)


def test_a_multipart_etag_is_never_taken_for_the_same_bytes():
    class Heads:
        def head_object(self, Bucket, Key):
            return {"ETag": '"0123456789abcdef0123456789abcdef-2"', "ContentLength": 5}

    assert not holds_same_bytes(Heads(), "b", "", "a", "b", FAST)


def test_many_namespaces_list_and_probe_together_as_each_alone_and_an_unknown_answer_fails(s3, spark, tmp_path):
    """stores.many (a fleet's listing): S3 namespaces and a local one in one job each; each
    namespace's rows are what its own store lists, and a HEAD that keeps failing fails the
    probe instead of answering `exists = False`."""
    s3.create_bucket("many")
    _put(s3, "many", [f"a/{i}/x" for i in range(5)] + [f"ab/{i}" for i in range(3)] + ["b/only"])
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "f").write_text("1")
    stores = {
        "a": S3Store("s3://many/a", S3Settings.from_environment(), FAST),  # not "ab": a prefix is a directory
        "b": S3Store("s3://many/b", S3Settings.from_environment(), FAST),
        "local": LocalStore(tmp_path.as_uri()),
    }

    listed = list_many(spark, stores).collect()

    for repo, store in stores.items():
        alone = sorted((r["address"], r["size"], r["last_modified"], r["etag"]) for r in store.list(spark).collect())
        together = sorted((r["address"], r["size"], r["last_modified"], r["etag"]) for r in listed if r["repo"] == repo)
        assert together == alone and alone, repo
    probes = spark.createDataFrame(
        [("a", "0/x"), ("a", "9/x"), ("b", "only"), ("b", "a/0/x"), ("local", "d/e/f"), ("local", "d/e")],
        "repo string, address string",
    )
    assert {(r["repo"], r["address"], r["exists"]) for r in exists_many(stores, probes).collect()} == {
        ("a", "0/x", True),
        ("a", "9/x", False),
        ("b", "only", True),
        ("b", "a/0/x", False),
        ("local", "d/e/f", True),
        ("local", "d/e", True),  # a directory is there: never reported gone
    }
    throttled = S3Store(
        "s3://many/a",
        S3Settings.from_environment(),
        FAST,
        client_factory=FaultInjection(throttle_operation="head_object", throttle_calls=1000),
    )
    with pytest.raises(Exception, match="cannot tell whether objects exist"):
        exists_many({**stores, "a": throttled}, probes).collect()


def test_many_namespaces_delete_and_move_in_one_job_each_by_the_s3_stores_own_rules(s3, spark):
    """stores.many.delete_many and move_many on S3 (a set swept together) keep S3Store's rules
    (many_namespaces)."""
    s3.create_bucket("many-acts")
    _put(s3, "many-acts", many_namespaces.KEYS)
    stores = {name: S3Store(f"s3://many-acts/{name}", S3Settings.from_environment(), FAST) for name in ("one", "two")}
    client = s3.client()
    before = client.get_object(Bucket="many-acts", Key="two/taken/b")["Body"].read()
    many_namespaces.act_on_two_namespaces(
        spark,
        stores,
        lambda key, data: client.put_object(Bucket="many-acts", Key=key, Body=data),
        lambda: s3.keys("many-acts"),
    )
    assert client.get_object(Bucket="many-acts", Key="two/taken/b")["Body"].read() == before, "not overwritten"
