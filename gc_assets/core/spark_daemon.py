"""PySpark's daemon for the executors' Python workers, with their imports kept out of the
collector's way and read from compiled files.

PySpark's daemon forks one Python worker per task slot and, after every task a reused worker
runs, calls `gc.collect()`. A worker that has imported pyarrow, pandas and this package holds
several hundred thousand objects, and each of those collections walked them all: in a warm
trash run of a small lake, 84 % of the Python workers' time was that walk. Here a worker that
has imported something new collects once and then freezes what survived (`gc.freeze`): later
collections walk only what later tasks made. Spark starts it in place of `pyspark.daemon`
(`spark.python.daemon.module`); it must not import pandas or pyarrow itself, since the
daemon forks after it is imported.

Spark puts its own copies of PySpark and Py4J first on the workers' path, as zip files, and
Python compiles every module it imports from a zip anew: 2.7 s of the workers' CPU in a cold run
over 1,000 tables (importing PySpark's worker: 0.62 s from the zip, 0.10 s compiled). Where the
zips lie inside the very PySpark installed unzipped on the path (pip's layout:
`<site>/pyspark/python/lib/pyspark.zip`), they leave the path, and the workers import the
installed copies' compiled files; so does the Spark jar Spark adds there, which holds no Python.
Elsewhere (a cluster's own Spark) the path is left as Spark made it.
"""

from __future__ import annotations

import gc
import os
import sys


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


def bundled_archives(path: list[str]) -> list[str]:
    """The archives of `path` a pip-installed PySpark in `<site>` (itself on `path`) brought: its
    zips in `<site>/pyspark/python/lib/` (pyspark.zip, py4j-<version>-src.zip) whose package is
    installed unzipped in `<site>`, and its jars in `<site>/pyspark/jars/`, which hold no Python."""
    found = []
    for entry in path:
        directory = os.path.dirname(entry)
        if entry.endswith(".zip"):
            site = os.path.dirname(os.path.dirname(os.path.dirname(directory)))
            package = os.path.basename(entry).split("-")[0].removesuffix(".zip")
            bundled = directory == os.path.join(site, "pyspark", "python", "lib") and os.path.isfile(
                os.path.join(site, package, "__init__.py")
            )
        else:
            site = os.path.dirname(os.path.dirname(directory))
            bundled = entry.endswith(".jar") and directory == os.path.join(site, "pyspark", "jars")
        if bundled and site in path:
            found.append(entry)
    return found


if __name__ == "__main__":
    # Gone from the path, and from the finders: every task's importlib.invalidate_caches() (PySpark's
    # worker calls it) would read each archive's directory again (Spark's core jar: 5,973 entries).
    for bundled in bundled_archives(sys.path):
        sys.path.remove(bundled)
        sys.path_importer_cache.pop(bundled, None)
    from pyspark import daemon

    daemon.gc = FreezingCollector()
    daemon.manager()
