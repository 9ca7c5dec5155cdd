"""Holds: restoring says "these objects are needed", and they are kept until released
(`gc-assets release`) or, with `hold_days`, until the hold expires (docs/design.md §5).

A hold is one record per restore, `_gc/holds/<run_id>.json`, listing the addresses it holds.
The mark leaves held objects out of the candidates, the sweep judges again that none is
held, and the purge of expired trash keeps a held object's trashed copy.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.spark import local_frame
from gc_assets.core.state import HOLDS_PREFIX
from gc_assets.stores.base import Store
from gc_assets.sweep.run_ids import checked_run_id


def record_hold(store: Store, run_id: str, addresses: list[str], now: dt.datetime) -> None:
    """Restoring says "these objects are needed": hold them until released (docs/design.md §5)."""
    record = {"run_id": run_id, "held_at": now.isoformat(), "addresses": sorted(addresses)}
    store.write_text(f"{HOLDS_PREFIX}{run_id}.json", json.dumps(record))


def held_addresses(store: Store, record_keys: list[str], now: dt.datetime, hold_days: Optional[float]) -> set[str]:
    """Addresses under a hold that has not expired (holds last until released, or `hold_days`)."""
    held: set[str] = set()
    for key in record_keys:
        text = store.read_text(key)
        if text is None:
            continue
        record = json.loads(text)
        placed = dt.datetime.fromisoformat(record["held_at"])
        if hold_days is not None and placed + dt.timedelta(days=hold_days) <= now:
            continue
        held.update(record["addresses"])
    return held


def hold_records(inventory: DataFrame) -> list[str]:
    """Keys of the hold records the inventory lists."""
    return [
        r["address"] for r in inventory.filter(F.col("address").startswith(HOLDS_PREFIX)).select("address").collect()
    ]


def held_frame_of(
    spark: SparkSession, store: Store, inventory: DataFrame, now: dt.datetime, hold_days: Optional[float]
) -> DataFrame:
    """Addresses restored and held (`_gc/holds/`) as a frame of `address`."""
    held = held_addresses(store, hold_records(inventory), now, hold_days)
    return local_frame(spark, [(a,) for a in sorted(held)], "address string")


def release(store: Store, run_id: str) -> int:
    """Lift the holds of restore `run_id` (its objects may become candidates again): how many it held.

    RunIdError when `run_id` names no hold record."""
    run_id = checked_run_id(store, run_id, HOLDS_PREFIX)
    record = json.loads(store.read_text(f"{HOLDS_PREFIX}{run_id}.json") or "{}")
    store.remove(f"{HOLDS_PREFIX}{run_id}.json")
    return len(record.get("addresses", []))
