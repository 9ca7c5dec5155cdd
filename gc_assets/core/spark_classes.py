"""Build the archive of Spark's classes that local sessions map at start (core.spark.class_archive).

A cold local session loads and verifies some twenty thousand classes from Spark's jars, and
its first queries load thousands more: 5.1 to 6.2 s to a session and 4.7 to 5.2 s for its
first two jobs on two cores. The JVM can archive the classes one session loaded
(`-XX:ArchiveClassesAtExit`) and map them in every later one (`-XX:SharedArchiveFile`): 2.7 to
3.2 s and 2.8 to 3.3 s (docs/CLUSTERS.md). The archive is built from a session that does the
kinds of work a run does (frames from the driver, Python tasks, shuffles, broadcasts, windows,
Parquet written and read, local checkpoints), once per environment: `make install` runs
`python -m gc_assets.core.spark_classes`. It belongs to this JDK and these jars: the JVM ignores
it when either changes, and the command builds it again.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Iterator

import pandas as pd
from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F

from gc_assets.core.spark import (
    DRIVER_JAVA_OPTIONS_ENV,
    LOCAL_DRIVER_JAVA_OPTIONS,
    class_archive,
    local_frame,
    spark_session,
)


def build(archive: str) -> None:
    """Start a local session that archives its classes at exit into `archive`, work it, stop it
    and wait for its JVM to write the archive; `archive` is replaced whole, or not at all."""
    os.makedirs(os.path.dirname(archive), exist_ok=True)
    written = f"{archive}.{os.getpid()}.part"
    # Its own warnings (classes it cannot archive: signed jars, old class versions) are not errors.
    os.environ[DRIVER_JAVA_OPTIONS_ENV] = (
        f"{LOCAL_DRIVER_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={written} -Xlog:disable -Xlog:all=error:stderr"
    )
    spark = spark_session()
    gateway = spark.sparkContext._gateway  # type: ignore[attr-defined]
    try:
        with tempfile.TemporaryDirectory() as scratch:
            work(spark, scratch)
    finally:
        spark.stop()
        gateway.shutdown()
        jvm = gateway.proc  # the JVM exits when its input closes, and writes the archive as it does
        jvm.stdin.close()
        jvm.wait(timeout=300)
    if not os.path.isfile(written):
        raise SystemExit(f"the JVM wrote no class archive ({written}): is this a JDK 13 or later?")
    os.replace(written, archive)


def work(spark: SparkSession, scratch: str) -> None:
    """What a run's queries ask of Spark, small: each loads the classes of its kind of plan."""
    rows = [(f"repo-{i % 7}", f"part={i % 13}/file-{i}.parquet", i * 11, i % 3 == 0) for i in range(3000)]
    frame = local_frame(spark, rows, "repo string, address string, size long, live boolean").localCheckpoint()

    def tagged(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for each in frames:
            yield each.assign(size=each["size"] + 1)

    python = frame.mapInPandas(tagged, frame.schema).mapInArrow(lambda batches: batches, frame.schema)
    repos = local_frame(spark, [(f"repo-{i}", i) for i in range(7)], "repo string, n int")
    joined = python.join(F.broadcast(repos), "repo").join(
        frame.select("repo", "address"), ["repo", "address"], "left_anti"
    )
    first = Window.partitionBy("repo").orderBy("address")
    ranked = frame.withColumn("n", F.row_number().over(first)).filter("n <= 3")
    grouped = frame.groupBy("repo").agg(
        F.count("*"),
        F.sum("size"),
        F.max(F.struct("size", "address")),
        F.collect_set("live"),
        F.max_by("address", "size"),
    )
    exploded = frame.select("repo", F.explode(F.array(F.struct("address", "size"))).alias("f")).select("repo", "f.*")
    for query in (joined, ranked, grouped, exploded.distinct(), frame.filter(F.col("address").startswith("part=1"))):
        query.collect()
    path = os.path.join(scratch, "frame")
    frame.repartition("repo").write.partitionBy("repo").parquet(path)
    spark.read.parquet(path).unionByName(frame).groupBy("repo").count().toPandas()


def main() -> None:
    archive = class_archive()
    started = time.monotonic()
    build(archive)
    megabytes = os.path.getsize(archive) / 2**20
    print(f"Spark's classes archived in {time.monotonic() - started:.1f} s: {archive} ({megabytes:.0f} MiB)")


if __name__ == "__main__":
    sys.exit(main())
