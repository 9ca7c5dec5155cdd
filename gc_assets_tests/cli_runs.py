"""`gc-assets` run in the test process: no new interpreter, Dagster import or JVM; Spark calls
reuse the test session. test_cli.py runs the real command once, as scripts do, and so does
test_secrets.py, whose claims are about what a process writes."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from typing import Any, Iterator

from gc_assets.cli import main


@contextlib.contextmanager
def _streams_on_descriptors() -> Iterator[None]:
    """sys.stdout and sys.stderr writing to file descriptors 1 and 2, as in a process of its own:
    what the command writes to sys.stderr while `terminal.quiet` points descriptor 2 at the log
    file goes there, not to the terminal."""
    saved = sys.stdout, sys.stderr
    # Not closed afterwards: a log handler made during the command may keep writing to them.
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = saved


def run_cli(capfd, *args: str) -> subprocess.CompletedProcess:
    """`gc-assets ARGS` in this process: its exit status and what it wrote to descriptors 1 and 2
    (`capfd` captures them). Environment variables are the caller's (monkeypatch.setenv)."""
    capfd.readouterr()  # what the test printed before is not the command's
    with _streams_on_descriptors():
        status = main(list(args))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["gc-assets", *args], status, out, err)


def run_cli_in_memory(*args: str) -> subprocess.CompletedProcess:
    """`gc-assets ARGS` in this process, what it writes to sys.stdout and sys.stderr kept in
    memory: for module fixtures, which have no `capfd`."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(args))
    return subprocess.CompletedProcess(["gc-assets", *args], status, out.getvalue(), err.getvalue())


def summary_of(stdout: str) -> Any:
    """A command's JSON answer: the last line of what it wrote to standard output."""
    return json.loads(stdout.strip().splitlines()[-1])
