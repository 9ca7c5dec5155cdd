"""The suite's cost per test file, from a junit XML file that pytest wrote
(`--junitxml`, with the properties `gc_assets_tests.suite_costs` records):

    python -m gc_assets_tests.durations suite.xml [--top N] [--write]

prints a Markdown table, slowest file first: seconds, tests, cold processes, graph runs;
`--write` also keeps each file's seconds in gc_assets_tests/file_seconds.json, the order in
which the suite hands files to its processes (conftest.py)."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


@dataclass
class FileCost:
    seconds: float = 0.0
    tests: int = 0
    cold_processes: int = 0
    graph_runs: int = 0


def file_costs(junit_path: str) -> dict[str, FileCost]:
    """Each test file's summed seconds, test count and recorded costs."""
    costs: dict[str, FileCost] = defaultdict(FileCost)
    for case in ElementTree.parse(junit_path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((part for part in module if part.startswith("test_")), ".".join(module))
        cost = costs[name]
        cost.seconds += float(case.get("time", 0))
        cost.tests += 1
        for prop in case.iter("property"):
            if prop.get("name") in ("cold_processes", "graph_runs"):
                setattr(cost, prop.get("name"), getattr(cost, prop.get("name")) + int(prop.get("value")))
    return dict(costs)


def table(costs: dict[str, FileCost], top: int = 0) -> str:
    rows = sorted(costs.items(), key=lambda item: -item[1].seconds)
    lines = ["| file | seconds | tests | cold processes | graph runs |", "|---|---:|---:|---:|---:|"]
    for name, cost in rows[:top] if top else rows:
        lines.append(f"| {name} | {cost.seconds:.0f} | {cost.tests} | {cost.cold_processes} | {cost.graph_runs} |")
    total = FileCost(
        sum(c.seconds for c in costs.values()),
        sum(c.tests for c in costs.values()),
        sum(c.cold_processes for c in costs.values()),
        sum(c.graph_runs for c in costs.values()),
    )
    lines.append(
        f"| **all {len(costs)} files** | {total.seconds:.0f} | {total.tests} | {total.cold_processes} "
        f"| {total.graph_runs} |"
    )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit")
    parser.add_argument("--top", type=int, default=0, help="only the N slowest files")
    parser.add_argument("--write", action="store_true", help=f"keep each file's seconds in {FILE_SECONDS.name}")
    arguments = parser.parse_args(argv)
    costs = file_costs(arguments.junit)
    print(table(costs, arguments.top))
    if arguments.write:
        seconds = {name: round(cost.seconds, 1) for name, cost in sorted(costs.items())}
        FILE_SECONDS.write_text(json.dumps(seconds, indent=1) + "\n")


if __name__ == "__main__":
    main()
