"""PySpark's daemon for the executors' Python workers, with their imports kept out of the
collector's way.

PySpark's daemon forks one Python worker per task slot and, after every task a reused worker
runs, calls `gc.collect()`. A worker that has imported pyarrow, pandas and this package holds
several hundred thousand objects, and each of those collections walked them all: in a warm
trash run of a small lake, 84 % of the Python workers' time was that walk. Here a worker that
has imported something new collects once and then freezes what survived (`gc.freeze`): later
collections walk only what later tasks made. Spark starts it in place of `pyspark.daemon`
(`spark.python.daemon.module`); it must not import pandas or pyarrow itself, since the
daemon forks after it is imported.
"""

from __future__ import annotations

import gc
import sys

from pyspark import daemon


class FreezingCollector:
    """`gc` as the daemon's workers call it: `collect()` freezes the survivors of the first
    collection after each new import, so the next ones skip them."""

    def __init__(self) -> None:
        self.modules_when_frozen = 0

    def collect(self, generation: int = 2) -> int:
        found = gc.collect(generation)
        if len(sys.modules) > self.modules_when_frozen:
            gc.freeze()
            self.modules_when_frozen = len(sys.modules)
        return found

    def __getattr__(self, name: str):
        return getattr(gc, name)


if __name__ == "__main__":
    daemon.gc = FreezingCollector()
    daemon.manager()
