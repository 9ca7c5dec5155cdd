"""What each test costs besides its seconds: the whole-graph runs it executes and the cold
processes it starts (a `gc-assets`, Dagster or Spark process that pays its own start).
Recorded as junit properties (`graph_runs`, `cold_processes`) that `gc_assets_tests.durations`
sums per file."""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest
from dagster import JobDefinition

_COUNTS: Counter = Counter()
_COMMANDS: list[str] = []  # what the cold processes of the running test were, for a reader of the junit file
# A started process that pays a cold start of gc-assets, Dagster or a Spark JVM, as its argv says.
_COLD_MARKERS = ("gc_assets", "gc-assets", "dagster", "spark-class", "spark-submit", "connect-server", "pyspark")


def _cold(args) -> bool:
    words = [str(args)] if isinstance(args, (str, bytes)) else [str(word) for word in args]
    if words and words[0].endswith("spark-submit") and words[-1] == "pyspark-shell":
        return False  # this test process's own session starting: the warm JVM the tests share
    return any(marker in word for word in words for marker in _COLD_MARKERS)


def _command(args) -> str:
    words = [str(args)] if isinstance(args, (str, bytes)) else [str(word) for word in args]
    return " ".join([words[0].rsplit("/", 1)[-1], *words[1:3]])[:120]


def _counting_popen_init(original):
    def init(self, args, *rest, **options):
        if _cold(args):
            _COUNTS["cold_processes"] += 1
            _COMMANDS.append(_command(args))
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
    _COMMANDS.clear()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    if call.when == "teardown":  # before the report is made: it copies the properties
        for name in ("graph_runs", "cold_processes"):
            item.user_properties.append((name, _COUNTS[name]))
        if _COMMANDS:
            item.user_properties.append(("cold_commands", " | ".join(_COMMANDS)))
    yield
