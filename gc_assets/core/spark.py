"""Spark session settings shared by the Dagster resource, the CLI, the benchmarks and the tests."""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
import threading
import uuid
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence, Union

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

SPARK_MASTER_ENV = "GC_ASSETS_SPARK_MASTER"
SPARK_REMOTE_ENV = "GC_ASSETS_SPARK_REMOTE"
DRIVER_JAVA_OPTIONS_ENV = "GC_ASSETS_DRIVER_JAVA_OPTIONS"
# A local run's JVM lives for that one run (each `gc-assets run`, each run Dagster launches):
# the optimizing compiler's work competes with the run for the cores and is not paid back.
# The quick compiler alone reserves 48 MiB for compiled code, which a run over many tables
# (each query's generated classes compiled anew) fills: the JVM then flushes and recompiles,
# and stops compiling altogether when it is full. 256 MiB: about the JVM's default with both (240).
# The throughput collector: G1's concurrent marking took a quarter of a warm run's JVM time on
# two cores (a warm trash run of a small lake 7.6 -> 7.2 s; eight test files side by side on two
# processes 187 -> 168 s).
LOCAL_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m -XX:+UseParallelGC"
# The heap is the driver memory from the start. A run keeps what it marks with the executors,
# about 1 GiB at a thousand tables, and a heap grown step by step from the JVM's small default
# was compacted whole at each step: a 1,000-table dry run's collector took 3.5 s of CPU, 2.3 s of
# pauses and five full collections, now 1.9 s, 1.3 s and one. Pages are taken only as they are used.
INITIAL_HEAP_OPTION = "-Xms{}"
JAVA_OPTIONS_KEY = "spark.driver.extraJavaOptions"
# The classes a local session loads, archived once by `make install` (core.spark_classes): the
# JVM maps them instead of loading and verifying them from Spark's jars (application class-data
# sharing). A missing, stale or foreign archive is ignored by the JVM, which then loads the jars.
CLASS_ARCHIVE_OPTION = "-XX:SharedArchiveFile={} -Xlog:disable -Xlog:all=warning:stderr"
# The executors' Python workers fork from this daemon (executors have gc_assets installed).
PYTHON_DAEMON_MODULE = "gc_assets.core.spark_daemon"
PYTHON_DAEMON_KEY = "spark.python.daemon.module"
DATAFRAME_DEBUGGING_KEY = "spark.python.sql.dataFrameDebugging.enabled"
# A dry run of one table compiles about 420 classes of generated code and Spark keeps the last
# 100: a process that runs again (a test, the next run of a sensor or of the UI's code server)
# compiled them all again. With room for them, a second run compiles 10.
CODEGEN_CACHE_KEY = "spark.sql.codegen.cache.maxEntries"
CODEGEN_CACHE_ENTRIES = "1000"
DRIVER_MEMORY_ENV = "GC_ASSETS_DRIVER_MEMORY"
SHUFFLE_PARTITIONS_ENV = "GC_ASSETS_SHUFFLE_PARTITIONS"
# Debian's libpostgresql-jdbc-java: with it, Spark's JDBC source reads a PostgreSQL file catalog.
POSTGRESQL_JDBC_JAR = "/usr/share/java/postgresql.jar"


def prepare_environment() -> None:
    """Executors must run this interpreter, or they lack the project's packages."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def default_spark_config() -> dict[str, Any]:
    """local[*] unless GC_ASSETS_SPARK_MASTER (a cluster) or GC_ASSETS_SPARK_REMOTE (Spark Connect) is set."""
    prepare_environment()
    config: dict[str, Any] = {
        "spark.app.name": "gc_assets",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.showConsoleProgress": "false",
    }
    remote = os.environ.get(SPARK_REMOTE_ENV)
    if remote:
        config["spark.remote"] = remote
    else:
        config["spark.master"] = os.environ.get(SPARK_MASTER_ENV, "local[*]")
        config[PYTHON_DAEMON_KEY] = PYTHON_DAEMON_MODULE
        # PySpark's DataFrame debugging records the Python call site of every column expression
        # for error messages: five JVM calls and a walk of the Python stack each, thousands a run
        # (a warm trash run of a small lake 6.7 -> 6.2 s without).
        config[DATAFRAME_DEBUGGING_KEY] = "false"
        config[CODEGEN_CACHE_KEY] = CODEGEN_CACHE_ENTRIES
        if config["spark.master"].startswith("local"):
            # Adaptive execution runs each shuffle and broadcast stage as a job of its own, a
            # fixed ~0.1 s each that one process gains nothing from; a cluster keeps it.
            config["spark.sql.adaptive.enabled"] = "false"
            # Broadcasts only where the code asks for them (F.broadcast): a frame read from Arrow
            # carries its true size, so the planner would broadcast a join's side while the lake
            # is small and shuffle it once it grows, and a run's jobs (a broadcast is one) would
            # change with the lake's size.
            config["spark.sql.autoBroadcastJoinThreshold"] = "-1"
            # A join that is not broadcast gets a runtime Bloom filter, one job more, wherever the
            # planner guesses its other side is a large scan (a frame of no known size is): which
            # joins get one would follow how each side was read, not the lake.
            config["spark.sql.optimizer.runtime.bloomFilter.enabled"] = "false"
            # A guard's `limit(n).collect()` that finds nothing (the passing case) scans one
            # partition, then the rest in a second job: here all partitions go in the first.
            config["spark.sql.limit.initialNumPartitions"] = "1000000"
            java_options = os.environ.get(DRIVER_JAVA_OPTIONS_ENV, local_java_options())
            if java_options:
                config[JAVA_OPTIONS_KEY] = java_options
        if os.path.exists(POSTGRESQL_JDBC_JAR):
            config["spark.jars"] = POSTGRESQL_JDBC_JAR
        config["spark.driver.host"] = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
        config["spark.driver.memory"] = driver_memory()
        config["spark.ui.enabled"] = os.environ.get("GC_ASSETS_SPARK_UI", "false")
    cores = local_cores(config.get("spark.master", ""))
    config["spark.sql.shuffle.partitions"] = os.environ.get(SHUFFLE_PARTITIONS_ENV, str(cores or 8))
    return config


def spark_session() -> "SparkSession":
    """The session of default_spark_config, as the command line starts it (or the one this
    process already has)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in default_spark_config().items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def start_session_early() -> None:
    """spark_session on a thread of its own: the JVM starts (3 to 4 s) while the driver imports
    Dagster and plans its run, and whoever asks for the session next waits for this one
    (getOrCreate holds the builder's lock). A failure here is the next start's to raise again."""

    def start() -> None:
        try:
            spark_session()
        except Exception:  # noqa: BLE001, S110 - the run's own start raises it where it is reported
            pass

    threading.Thread(target=start, name="spark-start", daemon=True).start()


def class_archive() -> str:
    """Where this environment's archive of Spark's classes is (core.spark_classes builds it)."""
    return os.path.join(sys.prefix, "share", "gc_assets", "spark-classes.jsa")


def local_java_options() -> str:
    """A local session's JVM options: LOCAL_DRIVER_JAVA_OPTIONS, the driver memory as the initial
    heap, and the class archive where one was built. Its JVM then warns on stderr, not on stdout,
    which carries `--json` summaries."""
    options = LOCAL_DRIVER_JAVA_OPTIONS
    memory = re.fullmatch(r"(\d+)([kmgt])b?", driver_memory().strip().lower())
    if memory:  # Spark's spelling ("2g", "2gb") as the JVM's ("2g"); any other is Spark's to judge
        options += " " + INITIAL_HEAP_OPTION.format("".join(memory.groups()))
    archive = class_archive()
    if not os.path.isfile(archive) or any(c.isspace() for c in archive):  # options split on whitespace
        return options
    return f"{options} {CLASS_ARCHIVE_OPTION.format(archive)}"


def local_cores(master: str) -> Optional[int]:
    """The cores a `local`, `local[N]`, `local[N,F]` or `local[*]` master runs tasks on; None for
    any other master. One machine runs no more tasks at once than it has cores, and each task
    beyond them only adds its start (tens of milliseconds with Python): a run over 20 small
    tables took 42.6 s with 8 partitions per shuffle on 2 cores, 28.7 s with 2."""
    found = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master.strip())
    if found is None:
        return None
    if found.group(1) is None:
        return 1
    return (os.cpu_count() or 1) if found.group(1) == "*" else max(1, int(found.group(1)))


def session_summary(spark: "SparkSession") -> str:
    """The session a run works in, for its log: Spark's version, master and shuffle width, and for
    a JVM of this process its compiler, collector, heap and class archive as HotSpot itself reports
    them (options set for a session that already existed never reached it). A Spark Connect
    session has no JVM here."""
    conf = spark.conf
    summary = (
        f"Spark {spark.version}, master {conf.get('spark.master', 'remote')}, "
        f"{conf.get('spark.sql.shuffle.partitions')} shuffle partitions"
    )
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return summary
    bean = jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    hotspot = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(bean)

    def mebibytes(option: str) -> int:
        return int(hotspot.getVMOption(option).getValue()) // 2**20

    level = hotspot.getVMOption("TieredStopAtLevel").getValue()
    code_cache = mebibytes("ReservedCodeCacheSize")
    collector = next(
        (name for name in ("ParallelGC", "G1GC", "SerialGC") if hotspot.getVMOption(f"Use{name}").getValue() == "true"),
        "another collector",
    )
    heap, initial = mebibytes("MaxHeapSize"), mebibytes("InitialHeapSize")
    sized = f"heap {heap}m" + (" from the start" if initial == heap else f" grown from {initial}m")
    archive = hotspot.getVMOption("SharedArchiveFile").getValue()
    classes = f", class archive {os.path.basename(archive)}" if archive else ""
    return (
        f"{summary}; driver JVM TieredStopAtLevel={level}, ReservedCodeCacheSize={code_cache}m, "
        f"{collector}, {sized}{classes}"
    )


def driver_memory() -> str:
    """The driver's memory (local mode: the executors' too); a Spark Connect server is sized by its own start."""
    return os.environ.get(DRIVER_MEMORY_ENV, "2g")


def shuffle_partitions(spark: SparkSession) -> int:
    """The session's task count: `spark.sql.shuffle.partitions`, the width of every distributed step."""
    return int(spark.conf.get("spark.sql.shuffle.partitions"))


def task_count(spark: SparkSession, items: int) -> int:
    """Tasks for `items` independent reads: one each, at most `shuffle_partitions`,
    so that each task opens its clients (or a table's metadata) once for several items."""
    return max(1, min(items, shuffle_partitions(spark)))


def beside_task_count(spark: SparkSession, items: int) -> int:
    """Tasks for `items` reads a background job makes beside the run's phases (the witness): half
    of task_count's cores at most, so that the phases' own jobs keep the other half. Spark hands
    the first job's tasks every free core; a witness of 1,000 Delta heads on both of two cores
    held the live set's write 2.9 s."""
    return max(1, min(items, shuffle_partitions(spark) // 2))


def one_of(column: str, values: Sequence[Union[str, int]]) -> "Column":
    """`column IN values` as one SQL expression: one call into Spark however many values. `isin`
    makes a literal per value, a call each, and each call waits for the driver's GIL; with a
    fleet run's event thread recording beside it, 1,000 names took 24 s (0.8 s idle)."""
    from pyspark.sql import functions as F

    if not values:
        return F.lit(False)
    literals = (
        str(v) if isinstance(v, int) else "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'" for v in values
    )
    return F.expr(f"`{column}` IN ({', '.join(literals)})")


# The repository of a partition judged alone by a rule written for a set of repositories.
ALONE = "."


def alone(frame: "DataFrame") -> "DataFrame":
    """One partition's rows as the rows of a set of one: its `repo` column is ALONE."""
    from pyspark.sql import functions as F

    from gc_assets.core.names import REPO

    return frame.withColumn(REPO, F.lit(ALONE))


def local_frame(spark: "SparkSession", rows: Iterable[Sequence[Any]], schema: Union["StructType", str]) -> "DataFrame":
    """Rows the driver holds, as a frame the JVM reads from Arrow. `createDataFrame` of a Python
    list makes a Python RDD: every job that reads it starts Python workers to unpickle a few rows
    (143 commit ids joined with a listing and counted: 153 ms; from Arrow, 82 ms). Columns of
    scalars; timestamps are aware datetimes of any zone (naive ones are read as UTC).

    Each frame is a plan of its own, as a list's RDD was: Spark's cache serves any later plan
    equal to a cached one, and two frames of equal rows would be equal plans, so a cached read of
    files named in one (delta_log's parse) would answer a later read of the same names with what
    they held then. The optimizer drops the marker."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    struct = schema if isinstance(schema, StructType) else StructType.fromDDL(schema)
    frame = spark.createDataFrame(arrow_rows(rows, struct), struct)
    return frame.filter(F.lit(uuid.uuid4().hex).isNotNull())


def arrow_rows(rows: Iterable[Sequence[Any]], schema: Union["StructType", str]) -> "pa.Table":
    """Rows the driver holds as an Arrow table of a Spark schema (local_frame's columns)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    struct = schema if isinstance(schema, StructType) else StructType.fromDDL(schema)
    arrow_schema = to_arrow_schema(struct, timezone="UTC")
    columns = list(zip(*rows)) or [()] * len(struct.fields)
    return pa.table(
        [
            pa.array(_in_utc(values) if pa.types.is_timestamp(f.type) else values, f.type)
            for values, f in zip(columns, arrow_schema)
        ],
        arrow_schema,
    )


def _in_utc(values: Sequence[Any]) -> list[Any]:
    """Aware datetimes in UTC: pyarrow keeps another zone's wall clock as if it were UTC's."""
    return [v.astimezone(dt.timezone.utc) if v is not None and v.tzinfo is not None else v for v in values]


def task_error(exc: BaseException) -> str:
    """Why a Spark job failed, in one line: the exception a Python worker raised (its traceback's
    last line) rather than Spark's "An exception was thrown from the Python worker", else the
    message's first line; at most 300 characters."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
        lines = [line for line in lines if not line[0].isspace()][-1:]
    return (lines[0].strip() if lines else type(exc).__name__)[:300]
