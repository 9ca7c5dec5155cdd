"""What each test costs besides its seconds: the whole-graph runs it executes and the cold
processes (a `gc-assets`, Python, Dagster or JVM process) it starts. Recorded as junit
properties (`graph_runs`, `cold_processes`) that `gc_assets_tests.durations` sums per file."""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest
from dagster import JobDefinition

_COUNTS: Counter = Counter()
# A started process that pays its own interpreter, Dagster or JVM start, as a test's argv names it.
_COLD_MARKERS = ("python", "gc-assets", "gc_assets", "dagster", "spark-class", "java", "pyspark")


def _cold(args) -> bool:
    words = [args] if isinstance(args, (str, bytes)) else list(args)
    first = str(words[0]) if words else ""
    return any(marker in first for marker in _COLD_MARKERS) or any("gc_assets" in str(word) for word in words[1:3])


def _counting_popen_init(original):
    def init(self, args, *rest, **options):
        if _cold(args):
            _COUNTS["cold_processes"] += 1
        return original(self, args, *rest, **options)

    return init


def _counting_execute(original):
    def execute_in_process(self, *args, **kwargs):
        _COUNTS["graph_runs"] += 1
        return original(self, *args, **kwargs)

    return execute_in_process


_ORIGINALS = (subprocess.Popen.__init__, JobDefinition.execute_in_process)


def pytest_configure(config) -> None:
    """Counted once however often pytest starts in this process (mutmut starts it per mutant)."""
    subprocess.Popen.__init__ = _counting_popen_init(_ORIGINALS[0])
    JobDefinition.execute_in_process = _counting_execute(_ORIGINALS[1])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Counts for the test's setup, call and teardown; a module fixture's cost lands on the
    module's first test, which is still the file's."""
    _COUNTS.clear()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    if call.when == "teardown":  # before the report is made: it copies the properties
        for name in ("graph_runs", "cold_processes"):
            item.user_properties.append((name, _COUNTS[name]))
    yield
