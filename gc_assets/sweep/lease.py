"""A fenced lease in the namespace (`_gc/lease/<token>.json`) so two sweeps of one repository
never act at once, even from two Dagster instances or two machines.

Each holder gets the next fencing token by creating the record of that token with a
conditional write (local: exclusive create; S3: `If-None-Match: *`), which exactly one
contender wins. A holder renews its own record from a heartbeat thread and, before
every chunk, checks that no newer token exists: a sweep whose lease was taken over
stops before it touches storage again. A released lease leaves no record; one left by
a crash is stale once it expired, or when its process is gone (a process id is trusted
only on the same host and the same boot).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import socket
import threading
from dataclasses import asdict, dataclass, replace
from typing import Callable, Mapping, Optional, Protocol

from gc_assets.core.state import LEASE_PREFIX

LEASE_DURATION = dt.timedelta(hours=1)
TOKEN_DIGITS = 12


class SmallObjects(Protocol):
    def read_text(self, key: str) -> Optional[str]: ...

    def write_text(self, key: str, text: str, exclusive: bool = False) -> bool: ...

    def keys(self, prefix: str) -> list[str]: ...

    def remove(self, key: str) -> None: ...

    def modified_time(self, key: str) -> Optional[dt.datetime]: ...


class LeaseHeld(RuntimeError):
    """Another sweep of this repository holds the lease, or took it over."""


class ClockSkew(RuntimeError):
    """Storage and driver disagree on the time by more than the repository allows."""


@functools.lru_cache(maxsize=1)
def boot_id() -> str:
    """This machine's boot, so a pid recorded before a reboot (or in another container) is never
    trusted. Read once: a process outlives no boot, and a set takes a lease for every repository."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Lease:
    token: int
    run_id: str
    partition: str
    host: str
    boot: str
    pid: int
    expires_at: str

    @property
    def key(self) -> str:
        return record_key(self.token)

    def stale(self, now: dt.datetime) -> bool:
        return dt.datetime.fromisoformat(self.expires_at) <= now or self.owner_gone()

    def owner_gone(self) -> bool:
        """True only when the owner ran on this host in this boot and its process no longer exists."""
        if self.host != socket.gethostname() or not self.boot or self.boot != boot_id():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def record_key(token: int) -> str:
    return f"{LEASE_PREFIX}{token:0{TOKEN_DIGITS}d}.json"


def newest(store: SmallObjects) -> Optional[Lease]:
    """The record with the highest token (None when no sweep ever held the lease)."""
    tokens = sorted(key for key in store.keys(LEASE_PREFIX) if key.endswith(".json"))
    for key in reversed(tokens):
        text = store.read_text(key)
        if text:
            return Lease(**json.loads(text))
    return None


def _write(store: SmallObjects, lease: Lease, exclusive: bool) -> bool:
    return store.write_text(lease.key, json.dumps(asdict(lease)), exclusive=exclusive)


def _landed(store: SmallObjects, lease: Lease) -> bool:
    """Whether the record refused to an exclusive write is our own: the first attempt of a
    retried write may have landed with its answer lost (a reset, an answer cut short), and
    the retry is then refused. The record names this run, process and expiry."""
    text = store.read_text(lease.key)
    try:
        return text is not None and Lease(**json.loads(text)) == lease
    except (TypeError, ValueError):
        return False


def acquire(store: SmallObjects, run_id: str, partition: str, now: dt.datetime) -> Lease:
    """The next token, won by a conditional create; LeaseHeld when a live holder has it."""
    current = newest(store)
    if current is not None and not current.stale(now):
        raise LeaseHeld(
            f"another sweep holds the lease of this repository: run {current.run_id} (partition "
            f"{current.partition}, token {current.token}) on {current.host}, pid {current.pid}, "
            f"until {current.expires_at}"
        )
    token = (current.token if current else 0) + 1
    lease = Lease(
        token, run_id, partition, socket.gethostname(), boot_id(), os.getpid(), (now + LEASE_DURATION).isoformat()
    )
    if not _write(store, lease, exclusive=True) and not _landed(store, lease):
        raise LeaseHeld(f"another sweep took token {token} of this repository's lease at the same moment")
    try:
        verify(store, lease)  # we may have read an emptier listing than a holder of a higher token wrote
    except LeaseHeld:
        store.remove(lease.key)
        raise
    for key in store.keys(LEASE_PREFIX):
        if key < lease.key:
            store.remove(key)
    return lease


def verify(store: SmallObjects, lease: Lease) -> None:
    """Raise LeaseHeld when a newer token exists: the lease was taken over."""
    current = newest(store)
    if current is None or current.token != lease.token or current.run_id != lease.run_id:
        holder = f"run {current.run_id}, token {current.token}" if current else "nobody"
        raise LeaseHeld(
            f"the lease of run {lease.run_id} (token {lease.token}) was taken over (now: {holder}): stopping"
        )


def renew(store: SmallObjects, lease: Lease, now: dt.datetime) -> Lease:
    verify(store, lease)
    renewed = replace(lease, expires_at=(now + LEASE_DURATION).isoformat())
    _write(store, renewed, exclusive=False)  # only the holder ever writes its own token's record
    return renewed


def release(store: SmallObjects, lease: Lease) -> None:
    """Remove our record, leaving nothing behind; a lease taken over is left to its holder."""
    current = newest(store)
    if current is not None and current.token == lease.token and current.run_id == lease.run_id:
        store.remove(lease.key)


class Heartbeats:
    """Renews leases, one per repository of a set swept together, from one background thread
    while chunks run; remembers each one lost, and the others go on being renewed."""

    def __init__(
        self,
        stores: Mapping[str, SmallObjects],
        leases: dict[str, Lease],
        clock: Callable[[], dt.datetime],
        every: dt.timedelta = LEASE_DURATION / 4,
    ):
        self.stores, self.leases, self.clock, self.every = stores, dict(leases), clock, every
        self.lost: dict[str, BaseException] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="gc-lease-heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeats":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.every.total_seconds()):
            for name, held in list(self.leases.items()):
                if name in self.lost:
                    continue
                try:
                    self.leases[name] = renew(self.stores[name], held, self.clock())
                except Exception as exc:  # noqa: BLE001 - the sweep asks before each chunk that acts on it
                    self.lost[name] = exc

    def lost_lease(self, name: str) -> Optional[LeaseHeld]:
        """Before a chunk acts on `name`: why its lease is lost (not renewed, or a newer token exists), or None."""
        held = self.leases[name]
        if name in self.lost:
            return LeaseHeld(f"the lease of run {held.run_id} could not be renewed: {self.lost[name]}")
        try:
            verify(self.stores[name], held)
        except LeaseHeld as exc:
            return exc
        return None


def check_clock(store: SmallObjects, key: str, now: dt.datetime, max_skew: dt.timedelta) -> dt.timedelta:
    """Compare the storage's stamp on the lease record just written with the driver's clock.

    Every age is judged by storage times against a cutoff from the driver's clock: a
    driver clock running ahead makes young objects look old. Returns the skew.
    """
    stamped = store.modified_time(key)
    if stamped is None:
        raise ClockSkew(f"the lease {key} just written is missing: cannot compare clocks")
    skew = abs(stamped - now)
    if skew > max_skew:
        raise ClockSkew(
            f"storage time {stamped.isoformat()} (of {key}) and the driver clock {now.isoformat()} differ by "
            f"{skew.total_seconds():.0f} s, more than max_clock_skew_minutes ({max_skew.total_seconds() / 60:g}); "
            "fix the clocks before trash or delete"
        )
    return skew
