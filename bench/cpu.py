"""Where a cold run's processor time goes: its process tree sampled while it runs (psutil, and
on Linux each JVM thread's name and time from /proc), summed into the parts a run is made of.

A cold run on two cores is bound by the processor, so its wall clock follows the sum of these
parts, not the longest one; a part that grows shows which work to cut. A process or a JVM thread
that ends keeps the time of its last sample (every SAMPLE_SECONDS): a Py4J thread ends with the
driver's thread that called through it.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import psutil

from bench.sampling import PeriodicSampler

SAMPLE_SECONDS = 0.2
DRIVER = "driver's Python"
TASKS = "JVM tasks"
PLANNING = "JVM planning (Py4J threads)"
COMPILER = "JVM compilers"
COLLECTOR = "JVM collector"
JVM_OTHER = "JVM other threads"
WORKERS = "executors' Python"
OTHER = "other processes"
SERVER = "Dagster's PostgreSQL server"  # outside the run's tree: measured by the bench apart
PARTS = (DRIVER, TASKS, PLANNING, COMPILER, COLLECTOR, JVM_OTHER, WORKERS, OTHER, SERVER)
# The names HotSpot and Spark give their threads, as /proc shows them (cut to 15 characters).
THREAD_PARTS = (
    (re.compile(r"Executor task"), TASKS),
    (re.compile(r"Thread-\d+$"), PLANNING),  # Py4J's: one per driver thread, where queries are planned
    (re.compile(r"C[12] CompilerThre"), COMPILER),
    (re.compile(r"GC Thread|VM Thread"), COLLECTOR),
)


@dataclass
class CpuSplit:
    """Core-seconds per part (PARTS), the kernel's share of them, and the run's wall clock."""

    wall: float
    parts: dict[str, float] = field(default_factory=dict)
    kernel: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def line(self) -> str:
        shown = ", ".join(f"{name} {self.parts.get(name, 0.0):.1f}" for name in PARTS if self.parts.get(name))
        return (
            f"CPU of the cold run (core-seconds): {shown}; total {self.total:.1f} ({self.kernel:.1f} in the kernel) "
            f"in {self.wall:.1f} s, {self.total / self.wall:.2f} cores busy"
        )


@dataclass(frozen=True)
class Sample:
    """One process's user and kernel seconds as last read; a JVM's per named thread too."""

    part: str
    user: float
    system: float
    threads: tuple[tuple[str, float, float], ...] = ()  # (name, user, system)


def split(samples: Iterable[Sample], wall: float) -> CpuSplit:
    """The parts of `samples` (one per process): a JVM's threads each in their part by name
    (THREAD_PARTS), and what its threads do not account for (threads no sample saw, time after a
    thread's last sample) in JVM_OTHER."""
    result = CpuSplit(wall, {name: 0.0 for name in PARTS})
    for sample in samples:
        result.kernel += sample.system
        if not sample.threads:
            result.parts[sample.part] += sample.user + sample.system
            continue
        named = 0.0
        for name, user, system in sample.threads:
            part = next((p for pattern, p in THREAD_PARTS if pattern.match(name)), JVM_OTHER)
            result.parts[part] += user + system
            named += user + system
        result.parts[JVM_OTHER] += max(0.0, sample.user + sample.system - named)
    return result


def process_part(process: psutil.Process, root: int, jvms: set[int]) -> str:
    """Which part a process of the tree below `root` is: the driver, a JVM (`jvms` collects
    them), a Python worker forked below a JVM, or something else (a launcher script)."""
    if process.pid == root:
        return DRIVER
    command = process.cmdline()
    if command and os.path.basename(command[0]) == "java":
        jvms.add(process.pid)
        return JVM_OTHER  # its threads, where /proc names them, decide its parts
    parents = {parent.pid for parent in process.parents()}
    if parents & jvms and command and "python" in os.path.basename(command[0]):
        return WORKERS
    return OTHER


def jvm_threads(pid: int) -> dict[str, tuple[str, float, float]]:
    """(name, user, system) of each thread of a JVM by its id, from /proc (Linux); none elsewhere."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    found = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                text = stat.read()
            name = text[text.index("(") + 1 : text.rindex(")")]
            fields = text[text.rindex(")") + 2 :].split()
            found[tid] = (name, int(fields[11]) / ticks, int(fields[12]) / ticks)
        except (OSError, ValueError, IndexError):
            continue  # ended since the listing, or ending as it was read
    return found


class TreeSampler(PeriodicSampler):
    """The process tree below `root`, each process's last sample kept (every SAMPLE_SECONDS)."""

    def __init__(self, root: int):
        super().__init__(SAMPLE_SECONDS)
        self.root = root
        self.last: dict[int, Sample] = {}
        self.jvms: set[int] = set()
        self.threads: dict[int, dict[str, tuple[str, float, float]]] = {}  # each JVM's threads, ended ones too

    def sample(self) -> None:
        try:
            root = psutil.Process(self.root)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return  # the run has ended: its last sample stands
        for process in tree:
            try:
                part = process_part(process, self.root, self.jvms)
                times = process.cpu_times()
            except (psutil.Error, OSError):
                continue  # ended between the tree's listing and this read: its last sample stands
            threads = ()
            if process.pid in self.jvms:
                seen = self.threads.setdefault(process.pid, {})
                seen.update(jvm_threads(process.pid))
                threads = tuple(seen.values())
            self.last[process.pid] = Sample(part, times.user, times.system, threads)


def run_sampled(command: Sequence[str], env: Mapping[str, str]) -> tuple[subprocess.CompletedProcess, CpuSplit]:
    """`command` run to its end (its output captured as text), with where its CPU went."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with TreeSampler(process.pid) as sampler:
        stdout, stderr = process.communicate()
    wall = time.perf_counter() - started
    result = subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr)
    return result, split(sampler.last.values(), wall)
