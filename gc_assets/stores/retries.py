"""What every store's requests share: the timeouts one request waits at most, and exponential
backoff with full jitter for throttling and transient errors (a 4xx is never retried), within
a deadline per operation of one attempt at those timeouts: an endpoint that takes requests and
never answers is named (NoAnswer) within two attempts, not after eight. Each store says which
of its SDK's failures are worth another attempt (Failures)."""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, TypeVar
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

R = TypeVar("R")

CONNECT_TIMEOUT_ENV = "GC_ASSETS_CONNECT_TIMEOUT_SECONDS"
READ_TIMEOUT_ENV = "GC_ASSETS_READ_TIMEOUT_SECONDS"


@dataclass(frozen=True)
class Timeouts:
    """Seconds one request of any store waits to connect, and for each read of its answer.

    A stalled connection then ends in a timeout, which the caller's RetryPolicy retries or
    reports, never in a wait without end (a sweep would hold its lease meanwhile). Set on the
    driver (GC_ASSETS_CONNECT_TIMEOUT_SECONDS, GC_ASSETS_READ_TIMEOUT_SECONDS); executors get
    them with the settings. The read timeout bounds the wait for each response (a listing of
    any size is many responses), so one attempt lasts at most connect + read (`attempt`).
    """

    connect: float = 10.0
    read: float = 30.0

    @property
    def attempt(self) -> float:
        """The longest one request waits without an answer: to connect, then for the answer."""
        return self.connect + self.read

    @classmethod
    def from_environment(cls) -> "Timeouts":
        return cls(_seconds(CONNECT_TIMEOUT_ENV, cls.connect), _seconds(READ_TIMEOUT_ENV, cls.read))


def _seconds(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < 3600:
        raise ValueError(f"{name}={value!r}: a number of seconds above 0 and below 3600")
    return seconds


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: attempt n waits uniform(0, min(max_delay, base * 2**n)),
    and no retry starts once `deadline` seconds have passed since the operation's first attempt.

    The deadline is one attempt at the requests' `timeouts` (a store's policy has its settings'
    timeouts): an endpoint that never answers gets a second chance (a lost response is
    retried), and its operation ends within two attempts, its last one started by the deadline
    (80 s at the default timeouts, 60 s when it accepts connections, well inside two minutes).
    Throttling and resets fail fast: the pauses of all 8 attempts add up to 6.35 s at most, so
    at the default timeouts they are retried as many times as ever (timeouts that add up to
    less leave them fewer). Eight attempts that each time out would take 8 x 30 s and more.
    """

    attempts: int = 8
    base_delay: float = 0.05
    max_delay: float = 10.0
    timeouts: Timeouts = field(default_factory=Timeouts.from_environment)

    @property
    def deadline(self) -> float:
        return self.timeouts.attempt

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.max_delay, self.base_delay * (2**attempt)))


class NoAnswer(Exception):
    """Every attempt of an operation timed out: the endpoint took no request, or answered none in
    time. Its text is what the stores' messages name instead of the SDK's timeout error, which
    says neither where nor how long."""

    def __init__(self, endpoint: str, attempts: int, seconds: float):
        super().__init__(f"the endpoint {endpoint} did not answer within {seconds:.0f} s ({attempts} attempts)")


def origin(url: str) -> str:
    """`scheme://host[:port]` of a request's URL: the endpoint, without bucket, key or query."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True)
class Failures:
    """How one SDK's failures read: whether one is worth another attempt (throttling, 5xx, a
    connection failure; never a 4xx), the code a message names, and the endpoint a timeout
    names (None for any other failure)."""

    retryable: Callable[[BaseException], bool]
    code: Callable[[BaseException], str]
    timed_out: Callable[[BaseException], Optional[str]]


def call_with_retries(
    what: str,
    operation: Callable[[], R],
    policy: RetryPolicy,
    failures: Failures,
    sleep: Callable[[float], None] = time.sleep,
    rng: Optional[random.Random] = None,
    clock: Callable[[], float] = time.monotonic,
) -> R:
    """Run `operation`, retrying the failures its store's `failures` accept until the policy's
    attempts or deadline run out; the last failure is raised, as NoAnswer when every attempt
    timed out."""
    rng = rng or random.Random()
    started = clock()
    answered = False
    for attempt in range(policy.attempts):
        try:
            return operation()
        except Exception as exc:
            endpoint = failures.timed_out(exc)
            answered = answered or endpoint is None
            pause = policy.delay(attempt, rng)
            last = attempt + 1 == policy.attempts or clock() - started + pause > policy.deadline
            if not failures.retryable(exc) or last:
                if endpoint is not None and not answered:
                    raise NoAnswer(endpoint, attempt + 1, clock() - started) from exc
                raise
            log.warning(
                "%s: %s, retry %d of %d in %.3fs", what, failures.code(exc), attempt + 1, policy.attempts - 1, pause
            )
            sleep(pause)
    raise AssertionError("unreachable: the last attempt returns or raises")
