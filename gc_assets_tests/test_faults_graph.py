"""Faults through the whole graph: the fault proxy (fault_proxy.py) between the product and moto
(here; Azurite and fake-gcs-server: test_faults_graph_blobs, the same tests), with throttles,
resets and answers cut short on a seeded 10 % of requests, during the listing, the mark's reads
and the sweep: at most one of each kind per phase and run (each fault costs the run a retry, on
moto over half a second). A stall costs a whole timeout: each store's first run stalls one
request of each phase (a timeout retried), later runs none. The delete run's mark is a second
mark of the same lake: its random faults are in the sweep alone. Every kind is injected in
every phase on every store: a kind a phase has not had by the store's last run is injected
there once (targeted), and the test checks it.

Each run (dry run, trash, delete) either finishes with exactly the brute-force oracle's
receipts or fails (or leaves `failed` receipts), and then a rerun without faults finishes
exactly; on S3 the trash run sweeps the dry run's mark alone (its rerun marks anew). After every
run, failed or not, no live object is missing, no receipt says `deleted` or `trashed` of an
object still in its place, and none says `failed` of an object that is gone (the emulator
itself is the witness, read around the proxy). The faults injected per phase are
printed and named in every assertion message. In every run, the answer to the first delete of
objects is lost (the delete acted, the product cannot know), besides the random faults.

Requests wait at most FAST_TIMEOUT seconds for an answer here (GC_ASSETS_READ_TIMEOUT_SECONDS):
a stall of STALL_SECONDS ends in a timeout and a retry. Time rule as in test_blob_gc.py.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance

from gc_assets import cli
from gc_assets.core.config import load_config
from gc_assets.core.time import partition_date_of
from gc_assets.runner import RunOutcome, run_partition
from gc_assets.stores import store_for
from gc_assets.sweep import lease
from gc_assets_tests.fault_proxy import KINDS, FaultProxy, Request
from gc_assets_tests.lakes import export_entry, lake_on_disk, write_config
from gc_assets_tests.oracles import expected_candidates
from gc_assets_tests.s3_server import s3  # noqa: F401 - the fixture
from gc_assets_tests.sweep_runs import sweep_only

CONTAINER = "gc-faults"
FAST_TIMEOUT = 1.0  # seconds; the product's default is 10 to connect, 30 to read
STALL_SECONDS = 3.0  # longer than FAST_TIMEOUT: a stalled answer always times out
HUNG_SECONDS = 120.0  # a stall longer than any default timeout of the three SDKs (60 s)
LEASE_BOUND = 30.0  # what the test waits for one lease read before calling it hung
RANDOM_KINDS = ("throttle", "reset", "truncate")  # a stall costs a whole timeout: targeted, one per phase and store
PER_PHASE = dict.fromkeys(RANDOM_KINDS, 1)  # random faults of a kind per phase and run
PHASES = ("listing", "mark_reads", "sweep")
TARGET_WITHIN = 20  # a targeted fault hits a phase's request at a seeded position up to this (every phase has 30+)


@dataclass
class Cloud:
    """One emulator seen two ways: directly (setup and the witness) and through a proxy (the product)."""

    name: str  # "s3", "azure", "gcs": the proxy's spelling of a throttle
    upstream: tuple[str, int]
    namespace: Callable[[str], str]  # prefix -> storage namespace URI
    create: Callable[[], None]
    upload: Callable[[Any, str], set[str]]  # (directory, prefix) -> keys
    put: Callable[[str, bytes], None]
    keys: Callable[[], set[str]]
    override: Callable[[str], dict[str, Any]]  # proxy URL -> gc.yaml repository override


def _upstream(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def _once_only(create: Callable[[], None]) -> Callable[[], None]:
    """The container is created by the first test of the module that needs it."""
    done: list[bool] = []

    def run() -> None:
        if not done:
            create()
            done.append(True)

    return run


@pytest.fixture(params=["s3"], scope="module")
def cloud(request) -> Cloud:
    """S3 here; Azurite and fake-gcs-server in test_faults_graph_blobs, which runs these tests
    beside this file."""
    return cloud_of(request)


def cloud_of(request) -> Cloud:
    """The emulator `request.param` names (its module fixture), seen directly and through a proxy."""
    emulator = request.getfixturevalue(request.param)
    if request.param == "s3":
        client = emulator.client()
        return Cloud(
            "s3",
            _upstream(emulator.url),
            lambda prefix: f"s3://{CONTAINER}/{prefix}",
            _once_only(lambda: emulator.create_bucket(CONTAINER)),
            lambda directory, prefix: emulator.upload_tree(directory, CONTAINER, prefix),
            lambda key, data: client.put_object(Bucket=CONTAINER, Key=key, Body=data),
            lambda: emulator.keys(CONTAINER),
            lambda url: {"s3": {"endpoint_url": url}},
        )
    name = "azure" if request.param == "azurite" else "gcs"
    path = urlsplit(emulator.endpoint).path  # Azurite's account: /devstoreaccount1
    return Cloud(
        name,
        _upstream(emulator.endpoint),
        lambda prefix: emulator.namespace(CONTAINER, prefix),
        _once_only(lambda: emulator.create(CONTAINER)),
        lambda directory, prefix: emulator.upload_tree(directory, CONTAINER, prefix),
        lambda key, data: emulator.put(CONTAINER, key, data),
        lambda: emulator.keys(CONTAINER),
        lambda url: {name: {"endpoint_url": url + path}},
    )


@pytest.fixture
def fast_timeouts(monkeypatch):
    monkeypatch.setenv("GC_ASSETS_CONNECT_TIMEOUT_SECONDS", str(FAST_TIMEOUT))
    monkeypatch.setenv("GC_ASSETS_READ_TIMEOUT_SECONDS", str(FAST_TIMEOUT))


def _once(predicate: Callable[[Request], bool]) -> Callable[[Request], bool]:
    fired = threading.Event()

    def match(request: Request) -> bool:
        if fired.is_set() or not predicate(request):
            return False
        fired.set()
        return True

    return match


def _from_request(proxy: FaultProxy, phase: str, position: int) -> Callable[[Request], bool]:
    """Once: the first request of `phase` from its `position`-th of the run on (an earlier rule may take that one)."""
    return _once(lambda request: request.phase() == phase and proxy.requests[phase] >= position)


def _lease_listing(request: Request) -> bool:
    return request.is_listing() and any("_gc/lease" in value for values in request.query.values() for value in values)


def test_a_stalled_lease_listing_is_retried_within_the_timeout(cloud, spark, tmp_path, fast_timeouts):
    """The delete run that hung 13 minutes in GcsClient.keys under lease.newest: the first
    listing of the lease records never answers (the proxy holds it HUNG_SECONDS); the read
    must time out and be retried, well within LEASE_BOUND."""
    cloud.create()
    proxy = FaultProxy(cloud.upstream, cloud.name, kinds=(), stall_seconds=HUNG_SECONDS)
    proxy.rules.append((_once(_lease_listing), "stall"))
    proxy.start()
    prefix = f"lease-{int(time.time() * 1000)}"
    record = lease.Lease(7, "run-7", "2022-03-31|repo", "host", "", 1, "2099-01-01T00:00:00+00:00")
    cloud.put(f"{prefix}/{record.key}", json.dumps(record.__dict__).encode())
    config = write_config(
        tmp_path / "gc.yaml",
        [
            {
                "name": "repo",
                "format": "lakefs-export",
                "storage_namespace": cloud.namespace(prefix),
                "source": cloud.namespace(prefix) + "/_lakefs/export",
                **cloud.override(proxy.url),
            }
        ],
        tmp_path / "state",
    )
    store = store_for(load_config(config).repository("repo"))
    found: list[Any] = []

    def read() -> None:
        try:
            found.append(lease.newest(store))
        except Exception as exc:  # shown by the assertion below: a thread's exception is otherwise lost
            found.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    started = time.monotonic()
    try:
        reader.start()
        reader.join(LEASE_BOUND)
        took = time.monotonic() - started
        assert not reader.is_alive(), (
            f"lease.newest still waiting after {took:.0f} s on a stalled listing; faults {proxy.counts()}"
        )
        assert found == [record], f"{found} after {took:.1f} s; faults {proxy.counts()}"
        assert proxy.counts() == {"listing": {"stall": 1}}
        assert took < 4 * FAST_TIMEOUT + 5, f"{took:.1f} s"
    finally:
        proxy.stop()


def _lease_write(request: Request) -> bool:
    """The upload of a lease record (S3 and Azure name it in the path, GCS in the multipart body)."""
    return request.method in ("PUT", "POST") and ("_gc/lease/" in request.target or b"_gc/lease/" in request.body)


def test_a_lease_record_written_with_its_answer_lost_is_ours(cloud, spark, tmp_path, fast_timeouts):
    """The proxy cuts short the answer to the first upload of a lease record: the record is
    written, the client retries, and the retry's exclusive write is refused. The sweep must see
    its own record there, not another sweep's, and hold the lease."""
    cloud.create()
    proxy = FaultProxy(cloud.upstream, cloud.name, kinds=())
    proxy.rules.append((_once(_lease_write), "truncate"))
    proxy.start()
    prefix = f"lease-lost-{int(time.time() * 1000)}"
    config = write_config(
        tmp_path / "gc.yaml",
        [
            {
                "name": "repo",
                "format": "lakefs-export",
                "storage_namespace": cloud.namespace(prefix),
                "source": cloud.namespace(prefix) + "/_lakefs/export",
                **cloud.override(proxy.url),
            }
        ],
        tmp_path / "state",
    )
    store = store_for(load_config(config).repository("repo"))
    try:
        held = lease.acquire(store, "run-lost-answer", "2022-03-31|repo", dt.datetime.now(dt.timezone.utc))
        assert proxy.counts() == {"sweep": {"truncate": 1}}, proxy.counts()
        assert held.token == 1 and lease.newest(store) == held
        lease.release(store, held)
        assert not [k for k in cloud.keys() if k.startswith(f"{prefix}/_gc/lease/")]
    finally:
        proxy.stop()


def _object_delete(request: Request) -> bool:
    """A delete of objects outside `_gc/`: S3 DeleteObjects, an Azure Blob Batch, a GCS batch or
    (fake-gcs-server has no batches) a single GCS delete."""
    if b"_gc/" in request.body or "_gc%2F" in request.target or "/_gc/" in request.target:
        return False
    query = request.query
    batch = "delete" in query or query.get("comp") == ["batch"] or request.path.startswith("/batch/")
    return (request.method == "POST" and batch) or (request.method == "DELETE" and "/storage/v1/b/" in request.path)


def _outside_gc(keys: set[str], prefix: str) -> set[str]:
    """The keys of the namespace `prefix`, but for the collector's own."""
    return {
        k for k in keys if k.startswith(f"{prefix}/") and not k.startswith((f"{prefix}/_gc/", f"{prefix}/_gc_trash/"))
    }


def _receipts(outcome: RunOutcome) -> list[dict]:
    path = outcome.summary["outputs"].get("deletion_receipts")
    return pq.read_table(path).to_pylist() if path else []


@dataclass
class Witness:
    """What storage must hold after any run, and what a run's receipts may say, checked around the proxy."""

    cloud: Cloud
    prefix: str
    uploaded: set[str]
    expected: set[str]  # the oracle's candidates (keys inside the namespace)

    @property
    def live(self) -> set[str]:
        return self.uploaded - {f"{self.prefix}/{key}" for key in self.expected}

    def check(self, outcome: RunOutcome, what: str) -> None:
        keys = self.cloud.keys()
        assert self.live <= keys, f"{what}: live objects lost: {sorted(self.live - keys)[:5]}"
        receipts = _receipts(outcome)
        acted = [r for r in receipts if r["action"] in ("deleted", "trashed")]
        still = sorted(r["address"] for r in acted if f"{self.prefix}/{r['address']}" in keys)
        assert not still, f"{what}: receipts say deleted/trashed of objects still there: {still[:5]}"
        failed = [r for r in receipts if r["action"] == "failed"]
        gone = sorted(r["address"] for r in failed if f"{self.prefix}/{r['address']}" not in keys)
        assert not gone, f"{what}: receipts say failed (left in place) of objects that are gone: {gone[:5]}"
        assert {r["address"] for r in receipts} <= self.expected, f"{what}: a receipt for a non-candidate"


def _whole_graph(config, as_of: dt.datetime, mode: str, instance: DagsterInstance) -> Callable[[], RunOutcome]:
    return partial(
        run_partition, str(config), "repo", partition_date_of(as_of), as_of=as_of, mode=mode, instance=instance
    )


@dataclass
class Targets:
    """The targeted faults of a store's runs: a stall in each phase of its first run, and in its
    last run every kind a phase has not had yet; `injected` is what its runs had, (phase, kind)."""

    proxy: FaultProxy
    rng: random.Random
    injected: set[tuple[str, str]]

    def rules(self, first: bool, last: bool) -> list[tuple[Callable[[Request], bool], str]]:
        wanted = [(phase, "stall") for phase in PHASES] if first else []
        if last:
            wanted += [(p, k) for p in PHASES for k in KINDS if (p, k) not in self.injected and (p, k) not in wanted]
        return [(_from_request(self.proxy, p, self.rng.randint(1, TARGET_WITHIN)), k) for p, k in wanted]

    def missing(self) -> list[tuple[str, str]]:
        return [(p, k) for p in PHASES for k in KINDS if (p, k) not in self.injected]


def _run_with_faults(
    proxy: FaultProxy,
    witness: Witness,
    mode: str,
    run: Callable[[], RunOutcome],
    report: dict,
    targets: Targets,
    first: bool = False,
    last: bool = False,
    rerun: Optional[Callable[[], RunOutcome]] = None,
    random_in: Optional[tuple[str, ...]] = None,
) -> list[RunOutcome]:
    """`run` with faults, the answer to its first delete always lost among them, and the store's
    targeted faults (Targets), random faults in the phases `random_in` (None: every phase); a
    failed run is followed by `rerun` (by default `run` again) without faults. Returns the runs,
    the one that finished last."""
    proxy.reset_counts()
    proxy.phases = random_in
    proxy.rules[:] = [(_once(_object_delete), "truncate"), *targets.rules(first, last)]
    started = time.monotonic()
    outcome = run()
    faults = proxy.counts()
    targets.injected |= {(phase, kind) for phase, kinds in faults.items() for kind in kinds}
    entry: dict[str, Any] = {
        "faults": faults,
        "requests": dict(proxy.requests),
        "seconds": round(time.monotonic() - started, 1),
        "success": outcome.success,
        "receipts": outcome.summary["receipts"],
    }
    if not outcome.success:
        entry["error"] = (outcome.error or str(outcome.summary["checks"]))[:300]
    if outcome.success and "failed" in outcome.summary["receipts"]:
        entry["failed_receipts"] = [r for r in _receipts(outcome) if r["action"] == "failed"][:5]
    report[mode] = entry
    print(f"\n[{witness.cloud.name} {mode}] {json.dumps(entry, default=str)}")
    witness.check(outcome, f"{mode} with faults {faults}")
    if outcome.success and "failed" not in outcome.summary["receipts"]:
        return [outcome]
    # Failed, or finished with `failed` receipts (an object left in place): a rerun finishes the job.
    with proxy.quiet():
        second = (rerun or run)()
    entry["rerun_success"] = second.success
    assert second.success, f"{mode}: the rerun without faults failed: {second.error} (faults before: {faults})"
    assert "failed" not in second.summary["receipts"], f"{mode}: the rerun without faults: {second.summary['receipts']}"
    witness.check(second, f"{mode} rerun after faults {faults}")
    return [outcome, second]


def _trash_runs(keys: set[str], prefix: str) -> set[str]:
    return {k.split("/")[2] for k in keys if k.startswith(f"{prefix}/_gc_trash/")}


def test_whole_graph_under_faults_finishes_exactly_or_fails_and_reruns_exactly(cloud, spark, tmp_path, fast_timeouts):
    seed = {"s3": 11, "azure": 12, "gcs": 13}[cloud.name]
    proxy = FaultProxy(
        cloud.upstream,
        cloud.name,
        seed=seed,
        rate=0.10,
        kinds=RANDOM_KINDS,
        stall_seconds=STALL_SECONDS,
        per_phase=PER_PHASE,
    ).start()
    targets = Targets(proxy, random.Random(seed), set())
    prefix = f"graph-{int(time.time() * 1000)}"
    report: dict[str, Any] = {}
    try:
        lake = lake_on_disk(tmp_path / "local", fmt="jsonl", churn=15)
        cloud.create()
        uploaded = cloud.upload(lake.namespace, prefix)
        namespace = cloud.namespace(prefix)
        repo = {**export_entry("repo", namespace), **cloud.override(proxy.url)}
        config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")
        manifest = json.loads((lake.namespace / "_lakefs" / "export" / "_manifest.json").read_text())

        def exported_now() -> dt.datetime:
            time.sleep(1.1 - time.time() % 1)  # past the next whole second: storage times are whole seconds,
            # and every write is now strictly before as_of
            moment = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
            cloud.put(
                f"{prefix}/_lakefs/export/_manifest.json",
                json.dumps({**manifest, "exported_at": moment.isoformat()}).encode(),
            )
            return moment

        as_of = exported_now()
        expected = expected_candidates(lake.lake, namespace, lake.rules, as_of, as_of)
        assert expected and all(f"{prefix}/{key}" in uploaded for key in expected)
        witness = Witness(cloud, prefix, uploaded, expected)
        instance = DagsterInstance.ephemeral()

        whole_trash = trash_run = _whole_graph(config, as_of, "trash", instance)
        if cloud.name == "s3":  # the mark is the same in every mode: one dry run, whose mark the trash run sweeps
            *_, dry = _run_with_faults(
                proxy, witness, "dry_run", _whole_graph(config, as_of, "dry_run", instance), report, targets, first=True
            )
            candidates = {r["address"] for r in pq.read_table(dry.summary["outputs"]["orphan_candidates"]).to_pylist()}
            assert candidates == expected, report
            assert dry.summary["receipts"] == {"would_delete": len(expected)}, report
            assert _outside_gc(cloud.keys(), prefix) == uploaded, report
            trash_run = partial(sweep_only, config, "repo", as_of, instance, "trash")

        # A rerun marks anew (a finished sweep of a mark is never swept again, `failed` receipts and all).
        trashed = _run_with_faults(
            proxy, witness, "trash", trash_run, report, targets, first=cloud.name != "s3", rerun=whole_trash
        )
        assert _outside_gc(cloud.keys(), prefix) == witness.live, report
        # A rerun trashes what the faulted run left: the moves are those of both.
        moved = {r["address"] for run in trashed for r in _receipts(run) if r["action"] == "trashed"}
        assert moved and moved <= expected, report
        with proxy.quiet():  # every object back, from every run that moved some
            for run_id in _trash_runs(cloud.keys(), prefix):
                arguments = ["--config", str(config), "--repo", "repo", "--run-id", run_id]
                assert cli.main(["restore", *arguments]) == 0, report
                assert cli.main(["release", *arguments]) == 0, report
        assert _outside_gc(cloud.keys(), prefix) == uploaded, report

        as_of = exported_now()
        *_, deleted = _run_with_faults(
            proxy,
            witness,
            "delete",
            _whole_graph(config, as_of, "delete", instance),
            report,
            targets,
            last=True,
            random_in=("sweep",),
        )
        assert _outside_gc(cloud.keys(), prefix) == witness.live, report
        receipts = _receipts(deleted)
        if "rerun_success" not in report["delete"]:  # a rerun's candidates are what the first run left
            assert {r["address"] for r in receipts} == expected, report
        assert {r["action"] for r in receipts} <= {"deleted", "already_absent"}, (report, receipts)
        assert set(deleted.summary["checks"].values()) == {"passed"}, (report, deleted.summary["checks"])
        assert not targets.missing(), (targets.missing(), report)
    finally:
        proxy.stop()
        print(f"\n[{cloud.name}] faults per run and phase: {json.dumps(report, default=str)}")
