"""Sweeps racing for one repository's lease from several processes, in a module of its own: each
spawned process imports only the lease and the namespace's store, not the test module's Spark
and Dagster."""

from __future__ import annotations

import datetime as dt
import multiprocessing

from gc_assets.stores.local import LocalStore
from gc_assets.sweep import lease

CONTENDERS = 4


def race_for_the_lease(namespace: str, barrier, results, index: int) -> None:
    store = _store(namespace)
    barrier.wait()
    try:
        lease.acquire(store, f"run-{index}", "race", dt.datetime.now(dt.timezone.utc))
        results.put("acquired")
    except lease.LeaseHeld:
        results.put("refused")


def race_rounds(namespace: str, rounds: int) -> None:
    """`rounds` races of CONTENDERS processes released at once: exactly one wins each, and from
    the second round on it takes over the lease of the last round's winner, gone from this host."""
    context = multiprocessing.get_context("spawn")
    for round_ in range(rounds):
        barrier, results = context.Barrier(CONTENDERS), context.Queue()
        workers = [
            context.Process(target=race_for_the_lease, args=(namespace, barrier, results, i)) for i in range(CONTENDERS)
        ]
        for worker in workers:
            worker.start()
        outcomes = sorted(results.get(timeout=120) for _ in workers)
        for worker in workers:
            worker.join(30)
        assert outcomes == ["acquired"] + ["refused"] * (CONTENDERS - 1)
        assert lease.newest(_store(namespace)).token == round_ + 1


def _store(namespace: str):
    if namespace.startswith("file:"):
        return LocalStore(namespace)
    from gc_assets.stores import store_at

    return store_at(namespace)
