"""One contender of a race for the lease, in a module of its own: each spawned process imports
only the lease and the local store, not the test module's Spark and Dagster."""

from __future__ import annotations

import datetime as dt

from gc_assets.stores.local import LocalStore
from gc_assets.sweep import lease


def race_for_the_lease(namespace: str, barrier, results, index: int) -> None:
    store = LocalStore(namespace)
    barrier.wait()
    try:
        lease.acquire(store, f"run-{index}", "race", dt.datetime.now(dt.timezone.utc))
        results.put("acquired")
    except lease.LeaseHeld:
        results.put("refused")
