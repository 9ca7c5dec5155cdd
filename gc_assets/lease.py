"""A lease in the namespace (`_gc/lease.json`) so two sweeps of one repository never overlap,
even from two Dagster instances.

The lease names its owner (run, host, process) and expires; a sweep renews it after
every chunk. An expired lease, or one whose process is gone from this very host, may
be taken over.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from dataclasses import asdict, dataclass
from typing import Optional, Protocol

LEASE_KEY = "_gc/lease.json"
LEASE_DURATION = dt.timedelta(hours=1)


class SmallObjects(Protocol):
    def read_text(self, key: str) -> Optional[str]: ...

    def write_text(self, key: str, text: str, exclusive: bool = False) -> bool: ...

    def remove(self, key: str) -> None: ...

    def modified_time(self, key: str) -> Optional[dt.datetime]: ...


class LeaseHeld(RuntimeError):
    """Another sweep of this repository holds the lease."""


class ClockSkew(RuntimeError):
    """Storage and driver disagree on the time by more than the repository allows."""


@dataclass(frozen=True)
class Lease:
    run_id: str
    partition: str
    host: str
    pid: int
    expires_at: str

    def expired(self, now: dt.datetime) -> bool:
        return dt.datetime.fromisoformat(self.expires_at) <= now

    def owner_gone(self) -> bool:
        """True only when the owner ran on this host and its process no longer exists."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def _new(run_id: str, partition: str, now: dt.datetime) -> Lease:
    return Lease(run_id, partition, socket.gethostname(), os.getpid(), (now + LEASE_DURATION).isoformat())


def _read(store: SmallObjects) -> Optional[Lease]:
    text = store.read_text(LEASE_KEY)
    return Lease(**json.loads(text)) if text else None


def acquire(store: SmallObjects, run_id: str, partition: str, now: dt.datetime) -> Lease:
    lease = _new(run_id, partition, now)
    if store.write_text(LEASE_KEY, json.dumps(asdict(lease)), exclusive=True):
        return lease
    current = _read(store)
    if current is not None and current.run_id != run_id and not current.expired(now) and not current.owner_gone():
        raise LeaseHeld(
            f"another sweep holds the lease of this repository: run {current.run_id} (partition "
            f"{current.partition}) on {current.host}, pid {current.pid}, until {current.expires_at}"
        )
    if _read(store) == current:  # take over only the lease we judged stale
        store.remove(LEASE_KEY)
    if not store.write_text(LEASE_KEY, json.dumps(asdict(lease)), exclusive=True):
        raise LeaseHeld("another sweep took the lease of this repository at the same moment")
    return lease


def renew(store: SmallObjects, lease: Lease, now: dt.datetime) -> Lease:
    current = _read(store)
    if current is None or current.run_id != lease.run_id:
        raise LeaseHeld(f"the lease of run {lease.run_id} was lost (now held by {current.run_id if current else 'nobody'})")
    renewed = _new(lease.run_id, lease.partition, now)
    store.write_text(LEASE_KEY, json.dumps(asdict(renewed)))
    return renewed


def release(store: SmallObjects, lease: Lease) -> None:
    current = _read(store)
    if current is not None and current.run_id == lease.run_id:
        store.remove(LEASE_KEY)


def check_clock(store: SmallObjects, now: dt.datetime, max_skew: dt.timedelta) -> dt.timedelta:
    """Compare the storage's stamp on the lease just written with the driver's clock.

    Every age is judged by storage times against a cutoff from the driver's clock: a
    driver clock running ahead makes young objects look old. Returns the skew.
    """
    stamped = store.modified_time(LEASE_KEY)
    if stamped is None:
        raise ClockSkew(f"the lease {LEASE_KEY} just written is missing: cannot compare clocks")
    skew = abs(stamped - now)
    if skew > max_skew:
        raise ClockSkew(
            f"storage time {stamped.isoformat()} (of {LEASE_KEY}) and the driver clock {now.isoformat()} differ by "
            f"{skew.total_seconds():.0f} s, more than max_clock_skew_minutes ({max_skew.total_seconds() / 60:g}); "
            "fix the clocks before trash or delete"
        )
    return skew
