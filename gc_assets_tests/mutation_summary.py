"""The last line of `make mutation`: how many of mutmut's mutants the tests killed.

Reads the results mutmut leaves in `mutants/**/*.meta`, with mutmut's own meaning of
each exit code. A mutant counts as killed when a test failed ("killed") or when it ran
past mutmut's time limit ("timeout": a loop that no longer ends, which the tests noticed
by not finishing); survived, untested and suspicious mutants are not killed. The
mutants that were not killed are listed first, so the line above the summary says what
to look at (`mutmut show NAME`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mutmut.stats import status_by_exit_code

KILLED = ("killed", "timeout")


def statuses(mutants: Path) -> dict[str, str]:
    """Every mutant's status by name, from all of mutmut's per-file result files."""
    result: dict[str, str] = {}
    for meta in sorted(mutants.rglob("*.meta")):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            result[name] = status_by_exit_code[code]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=Path, default=Path("mutants"), help="mutmut's working copy")
    parser.add_argument("--fail-under", type=float, default=0.0, help="exit 1 when fewer percent are killed")
    args = parser.parse_args(argv)
    status = statuses(args.mutants)
    if not status:
        print(f"mutation: no mutmut results under {args.mutants}", file=sys.stderr)
        return 1
    for name, verdict in sorted(status.items()):
        if verdict not in KILLED:
            print(f"  {verdict}: {name}")
    killed = sum(verdict in KILLED for verdict in status.values())
    percent = 100.0 * killed / len(status)
    print(f"mutation: killed {killed} of {len(status)} mutants ({percent:.1f}%)")
    # A mutant left "not checked" means the run stopped early, and the percentage means nothing.
    complete = "not checked" not in status.values()
    return 0 if complete and percent >= args.fail_under else 1


if __name__ == "__main__":
    sys.exit(main())
