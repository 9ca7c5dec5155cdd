"""The Azure and GCS stores against real emulators (Azurite, fake-gcs-server), each test run on
both: sliced listing equals a plain listing, deletion in the store's batch size with per-key
receipts under injected throttling and failures and a rerun that finishes the job, the
pre-delete check, moves that never overwrite, and the small objects leases and journals use."""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass

import pytest
from pyspark.sql import types as T

from gc_assets.core.config import RepositoryConfig
from gc_assets.stores import StoreError, store_for
from gc_assets.stores.azure import range_prefix
from gc_assets.stores.blobs import BlobStore, delete_checked
from gc_assets.stores.many import exists_many, list_many
from gc_assets.stores.retries import RetryPolicy
from gc_assets.stores.slices import Slice
from gc_assets_tests import many_namespaces
from gc_assets_tests.blob_servers import BlobFaults, FaultyBlobClient, azurite, fake_gcs  # noqa: F401 - the fixtures
from gc_assets_tests.sweep_runs import race_exclusive_writes

FAST = RetryPolicy(attempts=6, base_delay=0.001, max_delay=0.01)
CANDIDATES = T.StructType(
    [
        T.StructField("address", T.StringType(), False),
        T.StructField("size", T.LongType(), False),
        T.StructField("last_modified", T.TimestampType(), False),
    ]
)


@pytest.fixture(params=["azurite", "fake_gcs"], scope="module")
def cloud(request):
    return request.getfixturevalue(request.param)


def _store(cloud, container: str, prefix: str, **options) -> BlobStore:
    namespace = cloud.namespace(container, prefix)
    repo = RepositoryConfig(
        name="r", format="lakefs-export", storage_namespace=namespace, source=f"{namespace}/_lakefs/export"
    )
    store = store_for(repo)
    assert isinstance(store, BlobStore) and store.namespace == namespace
    for name, value in {"policy": FAST, **options}.items():
        setattr(store, name, value)
    return store


def _candidates(spark, store: BlobStore, addresses: list[str]):
    listed = {r["address"]: r for r in store.list(spark).collect()}
    return spark.createDataFrame([(a, listed[a]["size"], listed[a]["last_modified"]) for a in addresses], CANDIDATES)


@pytest.mark.parametrize(
    "piece, expected",
    [
        (Slice("p/", True, "p/a", "p/b"), "p/a"),  # an alphabet cut: every key starts with p/a
        (Slice("p/", True, "p/a1/", "p/a3/"), "p/a"),
        (Slice("p/", True, None, "p/b"), "p/"),
        (Slice("p/", True, "p/x", "q"), "p/"),  # never above the slice's own prefix
    ],
)
def test_an_azure_key_range_is_listed_from_the_longest_prefix_its_keys_share(piece, expected):
    assert range_prefix(piece) == expected


def test_sliced_listing_equals_a_plain_listing(cloud, spark):
    container = "listing"
    cloud.create(container)
    keys = [f"ns/d{i % 7}/e{i % 3}/k{i:04d}" for i in range(240)]
    keys += [f"ns/flat/{c}{i}" for c in "aZ0_~" for i in range(12)] + ["ns/top", "ns/dir/", "other/x"]
    for key in keys:
        cloud.put(container, key, key.encode())
    store = _store(cloud, container, "ns", slice_depth=3, fanout=3, discovery_page_size=4)
    slices = store.slices("ns/")
    assert len(slices) >= 3 and any(s.start or s.end for s in slices)  # key ranges, not one listing
    rows = store.list(spark).collect()
    listed = [r["address"] for r in rows]
    assert len(listed) == len(set(listed))  # every object once
    assert set(listed) == {k[len("ns/") :] for k in cloud.keys(container, "ns/") if not k.endswith("/")}
    sizes = {r["address"]: r["size"] for r in rows}
    assert sizes["d0/e0/k0000"] == len(b"ns/d0/e0/k0000") and all(r["etag"] for r in rows)
    assert {r["address"] for r in store.list(spark, prefix="flat").collect()} == {
        k[3:] for k in keys if k.startswith("ns/flat/")
    }


def test_deletion_in_batches_with_receipts_throttling_failures_and_a_rerun(cloud, spark):
    container = "deletion"
    cloud.create(container)
    addresses = [f"data/{i:04d}" for i in range(300)]
    for address in addresses:
        cloud.put(container, f"ns/{address}", b"x")
    cloud.put(container, "ns/keep/live", b"live")
    store = _store(cloud, container, "ns")
    candidates = _candidates(spark, store, addresses)
    cloud.client(container).remove("ns/data/0000")  # gone before the sweep
    cloud.put(container, "ns/data/0001", b"rewritten")  # changed since the inventory
    denied, flaky = frozenset({"ns/data/0002"}), frozenset({"ns/data/0003", "ns/data/0299"})
    store.client_factory = BlobFaults(throttle_calls=2, denied=denied, flaky=flaky)
    receipts = {r["address"]: (r["action"], r["error"]) for r in store.delete(spark, candidates).collect()}
    assert receipts.pop("data/0000") == ("already_absent", None)
    assert receipts.pop("data/0001") == ("failed", "modified_since_inventory")
    action, code = receipts.pop("data/0002")
    assert action == "failed" and code in ("AuthorizationPermissionMismatch", "403")
    assert set(receipts.values()) == {("deleted", None)} and len(receipts) == 297  # throttled and flaky keys retried
    assert cloud.keys(container, "ns/") == {"ns/data/0001", "ns/data/0002", "ns/keep/live"}

    store.client_factory = BlobFaults()
    rerun = {
        r["address"]: r["action"]
        for r in store.delete(spark, _candidates(spark, store, ["data/0001", "data/0002"])).collect()
    }
    assert rerun == {"data/0001": "deleted", "data/0002": "deleted"}
    assert cloud.keys(container, "ns/") == {"ns/keep/live"}


def test_batches_hold_at_most_the_stores_limit_and_throttling_is_retried(cloud):
    container = "batches"
    cloud.create(container)
    client = cloud.client(container)
    versions = []
    for i in range(client.batch_size + 7):
        client.write(f"b/{i}", b"x", False)
        versions.append((f"{i}", client.head(f"b/{i}").version))
    sizes: list[int] = []
    faulty = BlobFaults(throttle_calls=3, batches=sizes)(cloud.settings, container)
    receipts = delete_checked(faulty, "b/", versions, FAST)
    assert {r.action for r in receipts} == {"deleted"} and len(receipts) == client.batch_size + 7
    assert sizes == [client.batch_size, 7]  # three throttled attempts, then the two batches
    assert client.batch_size == (256 if cloud.scheme == "abfss" else 100)
    gave_up = delete_checked(BlobFaults(throttle_calls=99)(cloud.settings, container), "", [("x", "1")], FAST)
    assert [(r.action, r.error) for r in gave_up] == [("failed", "ServerBusy" if cloud.scheme == "abfss" else "429")]


def test_a_conditional_delete_spares_an_object_rewritten_after_its_check(cloud):
    container = "conditional"
    cloud.create(container)
    client = cloud.client(container)
    client.write("k", b"old", False)
    seen = client.head("k").version
    client.write("k", b"new", False)
    [receipt] = delete_checked(client, "", [("k", seen)], FAST)
    if cloud.scheme == "gs":  # fake-gcs-server ignores ifGenerationMatch on deletes
        assert receipt.action == "deleted"
        return
    assert (receipt.action, receipt.error) == ("failed", "ConditionNotMet")
    assert client.read("k") == b"new"


def test_moves_never_overwrite_and_restore_moves_back(cloud, spark):
    container = "moves"
    cloud.create(container)
    for key in ("ns/a", "ns/b", "ns/c", "ns/_gc_trash/r/b"):
        cloud.put(container, key, key.encode())
    store = _store(cloud, container, "ns")
    moves = spark.createDataFrame(
        [("a", "_gc_trash/r/a"), ("b", "_gc_trash/r/b"), ("gone", "_gc_trash/r/gone"), ("c", "../escape")],
        "address string, destination string",
    )
    receipts = {r["address"]: (r["action"], r["error"]) for r in store.move(spark, moves).collect()}
    assert receipts == {
        "a": ("moved", None),
        "b": ("failed", "destination_exists"),
        "gone": ("already_absent", None),
        "c": ("failed", "unsafe_key"),
    }
    assert cloud.client(container).read("ns/_gc_trash/r/b") == b"ns/_gc_trash/r/b"  # not overwritten
    assert cloud.keys(container, "ns/") == {"ns/_gc_trash/r/a", "ns/b", "ns/c", "ns/_gc_trash/r/b"}
    back = store.move(
        spark, spark.createDataFrame([("_gc_trash/r/a", "a")], "address string, destination string")
    ).collect()
    assert [(r["action"]) for r in back] == ["moved"] and cloud.client(container).read("ns/a") == b"ns/a"
    exists = {
        r["address"]: r["exists"]
        for r in store.exists(spark, spark.createDataFrame([("a",), ("zz",)], "address string")).collect()
    }
    assert exists == {"a": True, "zz": False}


@dataclass
class LostAnswers:
    """Executor clients whose calls act but answer with the store's own retryable error, as when
    a connection resets after the server acted: the first copy of each source in `copies`, and
    the first batch delete when `first_delete`."""

    copies: frozenset[str] = frozenset()
    first_delete: bool = False

    def __call__(self, settings, container):
        return LostAnswerClient(settings.client(container), self)


class LostAnswerClient:
    def __init__(self, client, lost: LostAnswers):
        self._client, self._lost, self._copied, self._deleted = client, lost, set(), False

    def __getattr__(self, name):
        return getattr(self._client, name)

    def _answer_lost(self) -> Exception:
        return FaultyBlobClient(self._client, BlobFaults())._throttle()

    def copy_if_absent(self, source, destination, version):
        copied = self._client.copy_if_absent(source, destination, version)
        if source in self._lost.copies and source not in self._copied:
            self._copied.add(source)
            raise self._answer_lost()
        return copied

    def delete_batch(self, items):
        answers = self._client.delete_batch(items)
        if self._lost.first_delete and not self._deleted:
            self._deleted = True
            raise self._answer_lost()
        return answers


def test_a_copy_whose_answer_was_lost_or_an_identical_destination_completes_the_move(cloud, spark):
    """A retried copy meets its own earlier copy (the condition fails): the destination holds the
    source's bytes, so the move is done and the source goes. Different bytes are never taken for it."""
    container = "lost-answers"
    cloud.create(container)
    for key in ("ns/lost", "ns/twice", "ns/other", "ns/plain"):
        cloud.put(container, key, f"bytes of {key}".encode())
    cloud.put(container, "ns/_gc_trash/r/twice", b"bytes of ns/twice")  # an earlier attempt's copy
    cloud.put(container, "ns/_gc_trash/r/other", b"bytes of ns/OTHER")  # same size, other bytes
    store = _store(cloud, container, "ns", client_factory=LostAnswers(copies=frozenset({"ns/lost"})))
    moves = spark.createDataFrame(
        [(name, f"_gc_trash/r/{name}") for name in ("lost", "twice", "other", "plain")],
        "address string, destination string",
    )
    receipts = {r["address"]: (r["action"], r["error"]) for r in store.move(spark, moves).collect()}
    assert receipts == {
        "lost": ("moved", None),
        "twice": ("moved", None),
        "other": ("failed", "destination_exists"),
        "plain": ("moved", None),
    }
    assert cloud.keys(container, "ns/") == {
        "ns/other",
        *(f"ns/_gc_trash/r/{name}" for name in ("lost", "twice", "other", "plain")),
    }
    assert cloud.client(container).read("ns/_gc_trash/r/other") == b"bytes of ns/OTHER"  # not overwritten
    assert cloud.client(container).read("ns/_gc_trash/r/lost") == b"bytes of ns/lost"


def test_a_batch_delete_whose_answer_was_lost_ends_in_receipts_that_say_the_objects_are_gone(cloud, spark):
    """The retried batch meets objects its first attempt removed (a conditional delete of a
    missing blob may answer 412, not 404): a gone object is never `failed`, and a move whose
    source delete lost its answer is a move."""
    container = "lost-deletes"
    cloud.create(container)
    for key in ("ns/d1", "ns/d2", "ns/m1", "ns/m2", "ns/keep"):
        cloud.put(container, key, f"bytes of {key}".encode())
    store = _store(cloud, container, "ns")
    candidates = _candidates(spark, store, ["d1", "d2"])
    store.client_factory = LostAnswers(first_delete=True)
    deleted = {r["address"]: (r["action"], r["error"]) for r in store.delete(spark, candidates).collect()}
    assert deleted == {"d1": ("already_absent", None), "d2": ("already_absent", None)}
    moves = spark.createDataFrame(
        [(name, f"_gc_trash/r/{name}") for name in ("m1", "m2")], "address string, destination string"
    )
    moved = {r["address"]: (r["action"], r["error"]) for r in store.move(spark, moves).collect()}
    assert moved == {"m1": ("moved", None), "m2": ("moved", None)}
    assert cloud.keys(container, "ns/") == {"ns/keep", "ns/_gc_trash/r/m1", "ns/_gc_trash/r/m2"}


def test_small_objects_for_leases_and_journals(cloud):
    container = "small"
    cloud.create(container)
    store = _store(cloud, container, "ns")
    assert store.read_text("_gc/lease") is None and store.modified_time("_gc/lease") is None
    assert store.write_text("_gc/lease", "first", exclusive=True)
    assert not store.write_text("_gc/lease", "second", exclusive=True)  # If-None-Match: * / ifGenerationMatch=0
    assert store.read_text("_gc/lease") == "first"
    assert store.write_text("_gc/lease", "third")
    assert store.read_text("_gc/lease") == "third"
    stamped = store.modified_time("_gc/lease")
    assert abs(stamped - dt.datetime.now(dt.timezone.utc)) < dt.timedelta(minutes=5)
    store.write_text("_gc/holds/x", "h")
    assert store.keys("_gc/") == ["_gc/holds/x", "_gc/lease"] and store.keys("_gc/holds/") == ["_gc/holds/x"]
    store.remove("_gc/lease")
    store.remove("_gc/lease")  # absent: not an error
    assert store.read_text("_gc/lease") is None
    assert len(race_exclusive_writes(store, "_gc/race", 8)) == 1


def test_the_repositorys_endpoint_override_wins_over_the_environment(cloud, spark, monkeypatch):
    """gc.yaml's `azure.endpoint_url` / `gcs.endpoint_url` reaches the driver and the executors
    while the environment's endpoint is a closed port; credentials still come from the environment."""
    container = "override"
    cloud.create(container)
    cloud.put(container, "ns/a", b"a")
    closed = "http://127.0.0.1:9"
    if cloud.scheme == "abfss":
        variable = "AZURE_STORAGE_CONNECTION_STRING"
        value = os.environ[variable].replace(cloud.endpoint, f"{closed}/devstoreaccount1")
        override = {"azure": {"endpoint_url": cloud.endpoint}}
    else:
        variable, value, override = "STORAGE_EMULATOR_HOST", closed, {"gcs": {"endpoint_url": cloud.endpoint}}
    monkeypatch.setenv(variable, value)
    monkeypatch.setitem(spark.sparkContext.environment, variable, value)
    namespace = cloud.namespace(container, "ns")
    repo = RepositoryConfig(
        name="r", format="lakefs-export", storage_namespace=namespace, source=f"{namespace}/x", **override
    )
    store = store_for(repo)
    store.policy = FAST
    assert [r["address"] for r in store.list(spark).collect()] == ["a"]
    assert store.read_text("a") == "a"
    without = store_for(
        RepositoryConfig(name="r", format="lakefs-export", storage_namespace=namespace, source=f"{namespace}/x")
    )
    without.policy = FAST
    with pytest.raises(StoreError):
        without.read_text("a")


def test_the_state_directory_keeps_its_frames_here_committed_by_a_manifest(cloud, spark):
    """state_dir on Azure or GCS (stores.state.ObjectState): executors write the parts through the
    store's client, the manifest makes them visible, and a replaced frame's parts are removed."""
    from pyspark.sql import functions as F

    from gc_assets.core.config import GcConfig
    from gc_assets.stores.state import FRAME_MANIFEST, ObjectState, state_files

    cloud.create("state")
    state = state_files(GcConfig(state_dir=cloud.namespace("state", "gc")))
    assert isinstance(state, ObjectState)
    key = "orphan_candidates/repo=r/date=2024-01-01"
    state.write(spark, spark.range(30).repartition(3).select(F.col("id").alias("n")), key, {"run_id": "one"})
    first = cloud.keys("state", f"gc/{key}/")
    assert f"gc/{key}/{FRAME_MANIFEST}" in first and len([k for k in first if k.endswith(".parquet")]) == 3
    staged = state.stage(spark, spark.range(5).select((F.col("id") + 100).alias("n")), key)
    assert sorted(r["n"] for r in state.read(spark, key).collect()) == list(range(30))  # not committed yet
    staged.commit({"run_id": "two"})
    assert sorted(r["n"] for r in state.read(spark, key).collect()) == list(range(100, 105))
    assert state.record(key) == {"run_id": "two"} and state.read_table(key).num_rows == 5
    assert not {k for k in cloud.keys("state", f"gc/{key}/") if k.endswith(".parquet")} & first
    assert state.frames("orphan_candidates/repo=r", "date=*") == [key]


def test_many_namespaces_are_listed_probed_and_acted_on_in_one_job_each_by_the_stores_own_rules(cloud, spark):
    """stores.many over two namespaces of one container: the listing is each store's own,
    repository by repository; the actions keep the store's rules (many_namespaces); existence is
    each namespace's own."""
    container = "many"
    cloud.create(container)
    for key in many_namespaces.KEYS:
        cloud.put(container, key, key.encode())
    stores = {name: _store(cloud, container, name) for name in ("one", "two")}
    listed = list_many(spark, stores).collect()
    assert sorted((r["repo"], r["address"], r["size"], r["etag"]) for r in listed) == sorted(
        (name, r["address"], r["size"], r["etag"])
        for name, store in stores.items()
        for r in store.list(spark).collect()
    )
    many_namespaces.act_on_two_namespaces(
        spark, stores, lambda key, data: cloud.put(container, key, data), lambda: cloud.keys(container)
    )
    client = cloud.client(container)
    assert client.read("one/trash/c") == b"one/c" and client.read("two/b") == b"two/b"
    assert client.read("two/taken/b") == b"two/taken/b"  # not overwritten
    probes = spark.createDataFrame(
        [("one", "trash/c"), ("one", "c"), ("two", "b"), ("two", "a")], "repo string, address string"
    )
    found = {(r["repo"], r["address"]): r["exists"] for r in exists_many(stores, probes).collect()}
    assert found == {("one", "trash/c"): True, ("one", "c"): False, ("two", "b"): True, ("two", "a"): False}
