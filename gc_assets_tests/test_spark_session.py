"""The Spark session settings and helpers: a local run's JVM compiles with the quick compiler
only (as HotSpot reports it in a run's log: test_cli) and maps the class archive `make install`
built, unless GC_ASSETS_DRIVER_JAVA_OPTIONS says otherwise; clusters and Spark Connect keep
their own JVM options; a local run shuffles into as many partitions as it has cores; `one_of`
matches the values it names exactly; `local_frame` holds a list's rows without Python workers,
each frame a plan of its own that no earlier cached read answers;
the Python workers fork from a daemon that keeps their imports out of the collector's way and
import the installed PySpark rather than Spark's zip of it."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pyarrow as pa
from hypothesis import strategies as st

from gc_assets.core.spark import (
    CODEGEN_CACHE_ENTRIES,
    CODEGEN_CACHE_KEY,
    DATAFRAME_DEBUGGING_KEY,
    DRIVER_JAVA_OPTIONS_ENV,
    DRIVER_MEMORY_ENV,
    JAVA_OPTIONS_KEY,
    LOCAL_DRIVER_JAVA_OPTIONS,
    PYTHON_DAEMON_KEY,
    PYTHON_DAEMON_MODULE,
    SHUFFLE_PARTITIONS_ENV,
    SPARK_MASTER_ENV,
    SPARK_REMOTE_ENV,
    class_archive,
    default_spark_config,
    local_frame,
    local_java_options,
    one_of,
    task_error,
)
from gc_assets.core.spark_daemon import bundled_archives
from gc_assets_tests.examples_in_one_job import check_in_one_job, per_case


def test_driver_java_options_are_local_only_and_can_be_replaced_or_dropped(monkeypatch):
    for name in (SPARK_MASTER_ENV, SPARK_REMOTE_ENV, DRIVER_JAVA_OPTIONS_ENV):
        monkeypatch.delenv(name, raising=False)
    assert default_spark_config()[JAVA_OPTIONS_KEY] == local_java_options()

    monkeypatch.setenv(DRIVER_JAVA_OPTIONS_ENV, "-Xss4m")
    assert default_spark_config()[JAVA_OPTIONS_KEY] == "-Xss4m"

    monkeypatch.setenv(DRIVER_JAVA_OPTIONS_ENV, "")
    assert JAVA_OPTIONS_KEY not in default_spark_config()  # Spark's own setting (spark-defaults.conf) applies

    monkeypatch.delenv(DRIVER_JAVA_OPTIONS_ENV)
    monkeypatch.setenv(SPARK_MASTER_ENV, "spark://127.0.0.1:7077")
    assert JAVA_OPTIONS_KEY not in default_spark_config()
    monkeypatch.delenv(SPARK_MASTER_ENV)
    monkeypatch.setenv(SPARK_REMOTE_ENV, "sc://127.0.0.1:15002")
    assert JAVA_OPTIONS_KEY not in default_spark_config()


def test_a_local_session_maps_the_class_archive_of_its_environment_where_one_was_built(monkeypatch, tmp_path):
    environment = tmp_path / "venv"
    monkeypatch.setattr(sys, "prefix", str(environment))
    monkeypatch.delenv(DRIVER_MEMORY_ENV, raising=False)
    assert local_java_options() == f"{LOCAL_DRIVER_JAVA_OPTIONS} -Xms2g"  # none built: the jars, as before
    archive = environment / "share" / "gc_assets" / "spark-classes.jsa"
    assert class_archive() == str(archive)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archived classes")
    options = local_java_options().split()
    assert options[: len(LOCAL_DRIVER_JAVA_OPTIONS.split())] == LOCAL_DRIVER_JAVA_OPTIONS.split()
    assert f"-XX:SharedArchiveFile={archive}" in options
    # The JVM's own warnings (an archive of another JDK, say) go to stderr: stdout carries --json.
    assert options[-2:] == ["-Xlog:disable", "-Xlog:all=warning:stderr"]
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "with space"))
    (tmp_path / "with space" / "share" / "gc_assets").mkdir(parents=True)
    Path(class_archive()).write_bytes(b"archived classes")
    assert local_java_options() == f"{LOCAL_DRIVER_JAVA_OPTIONS} -Xms2g"  # Spark splits the options on whitespace


def test_a_local_driver_takes_its_whole_memory_as_its_initial_heap_in_the_jvms_spelling(monkeypatch):
    for memory, option in (("4g", "-Xms4g"), ("1536M", "-Xms1536m"), ("2gb", "-Xms2g"), ("2G ", "-Xms2g")):
        monkeypatch.setenv(DRIVER_MEMORY_ENV, memory)
        assert local_java_options().split()[len(LOCAL_DRIVER_JAVA_OPTIONS.split())] == option
    monkeypatch.setenv(DRIVER_MEMORY_ENV, "lots")  # Spark refuses it, with its own message
    assert not [option for option in local_java_options().split() if option.startswith("-Xms")]


def test_the_archive_make_install_built_maps_into_a_session_started_as_a_run_starts_it():
    """`-Xshare:on`: the JVM refuses to start unless it maps every archive it is given, so a
    session of this environment's options (the archive built with other options, of another
    JDK, or by a training session that never wrote it) fails here instead of starting slowly."""
    assert Path(class_archive()).is_file(), "no class archive: `make install` builds it (core.spark_classes)"
    assert f"-XX:SharedArchiveFile={class_archive()}" in local_java_options()
    started = subprocess.run(
        [sys.executable, "-c", "from gc_assets.core.spark import spark_session; spark_session().range(3).count()"],
        env={**os.environ, DRIVER_JAVA_OPTIONS_ENV: f"{local_java_options()} -Xshare:on"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr[-3000:]


def test_a_local_run_shuffles_into_one_partition_per_core_a_cluster_into_eight(monkeypatch):
    for name in (SPARK_MASTER_ENV, SPARK_REMOTE_ENV, SHUFFLE_PARTITIONS_ENV):
        monkeypatch.delenv(name, raising=False)

    def partitions() -> str:
        return default_spark_config()["spark.sql.shuffle.partitions"]

    assert partitions() == str(os.cpu_count())  # local[*]
    for master, expected in [("local[3]", "3"), ("local[5,2]", "5"), ("local", "1"), ("spark://127.0.0.1:7077", "8")]:
        monkeypatch.setenv(SPARK_MASTER_ENV, master)
        assert partitions() == expected, master
    monkeypatch.setenv(SHUFFLE_PARTITIONS_ENV, "12")
    assert partitions() == "12"
    monkeypatch.delenv(SPARK_MASTER_ENV)
    monkeypatch.delenv(SHUFFLE_PARTITIONS_ENV)
    monkeypatch.setenv(SPARK_REMOTE_ENV, "sc://127.0.0.1:15002")
    assert partitions() == "8"


@st.composite
def _names_and_chosen(draw) -> tuple[list[str], list[str]]:
    names = draw(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=30, unique=True))
    return names, draw(st.lists(st.sampled_from(names), unique=True))


def _kept_by_one_of(spark, cases: Sequence[tuple[list[str], list[str]]]) -> list[tuple[set[str], set[int]]]:
    """Each case's (names kept by `one_of` on the names, numbers kept by `one_of` on their numbers), in one job."""
    frame = spark.createDataFrame(
        [(case, name, i) for case, (names, _) in enumerate(cases) for i, name in enumerate(names)],
        "case int, repo string, i int",
    )
    by_name = per_case([one_of("repo", chosen) for _, chosen in cases])
    by_number = per_case([one_of("i", [names.index(n) for n in chosen]) for names, chosen in cases])
    kept: list[tuple[set[str], set[int]]] = [(set(), set()) for _ in cases]
    for row in frame.select("case", "repo", "i", by_name.alias("by_name"), by_number.alias("by_number")).collect():
        if row["by_name"] is True:  # as a filter keeps a row
            kept[row["case"]][0].add(row["repo"])
        if row["by_number"] is True:
            kept[row["case"]][1].add(row["i"])
    return kept


def test_one_of_keeps_exactly_the_rows_of_the_values_it_names(spark):
    """Names of any characters (quotes, backslashes, newlines, SQL escapes) are matched as
    written, as `isin` matches them; an empty list keeps nothing."""

    def check(case: tuple[list[str], list[str]], kept: tuple[set[str], set[int]]) -> None:
        names, chosen = case
        assert kept == (set(chosen), {names.index(n) for n in chosen})

    check_in_one_job(_names_and_chosen(), lambda cases: _kept_by_one_of(spark, cases), check)


def test_a_failed_jobs_reason_is_the_python_workers_own_exception(spark):
    def broken(frames):
        for _ in frames:
            raise PermissionError("[Errno 13] Permission denied: '/lake/t'")
        yield from ()

    try:
        spark.range(1).mapInPandas(broken, "id long").collect()
    except Exception as exc:  # noqa: BLE001 - what Spark hands the driver
        assert task_error(exc) == "PermissionError: [Errno 13] Permission denied: '/lake/t'"
        assert str(exc).strip().splitlines()[0] != task_error(exc)  # not Spark's own first line
    else:
        raise AssertionError("the job did not fail")
    assert task_error(ValueError("first line\nsecond")) == "first line"


def test_a_local_frame_holds_the_rows_a_python_list_makes_and_needs_no_python_worker(spark):
    """The same rows, types and nullability as `createDataFrame` of the list; nulls, aware
    timestamps of any zone and no rows at all; read by the JVM alone (no Python RDD in its lineage)."""
    schema = "commit_id string, threshold timestamp, retained boolean, size long"
    paris = dt.timezone(dt.timedelta(hours=1))
    rows = [
        ("a'b\\c", dt.datetime(2024, 3, 31, 23, 59, 59, 999999, tzinfo=dt.timezone.utc), True, 2**62),
        ("ä", dt.datetime(2024, 4, 1, 0, 30, tzinfo=paris), False, None),
        ("", None, None, -1),
    ]
    for given in (rows, []):
        ours, theirs = local_frame(spark, given, schema), spark.createDataFrame(given, schema)
        assert ours.schema == theirs.schema
        assert sorted(ours.collect(), key=str) == sorted(theirs.collect(), key=str)
        assert "PythonRDD" not in ours._jdf.queryExecution().toRdd().toDebugString()
        assert "PythonRDD" in theirs._jdf.queryExecution().toRdd().toDebugString()  # what the helper avoids


def test_a_cached_read_through_a_local_frame_never_answers_a_later_read_of_the_same_names(spark, tmp_path):
    """Spark's cache serves any later plan equal to a cached one. Two frames of equal rows from
    Arrow would be equal plans, so a cached read of a file (delta_log caches its parse) would
    answer a later read of the same name with what the file held then: a table written again at
    the same path would keep its old live set."""
    log = tmp_path / "00000.json"

    def content(batches):
        for batch in batches:
            texts = [open(path).read() for path in batch.column("path").to_pylist()]
            yield pa.RecordBatch.from_pydict({"text": texts})

    def read():
        return local_frame(spark, [(str(log),)], "path string").mapInArrow(content, "text string").cache()

    log.write_text("the first table")
    first = read()
    assert first.first()["text"] == "the first table"
    log.write_text("the table written again")
    assert read().first()["text"] == "the table written again"
    first.unpersist()


def test_python_workers_come_from_the_freezing_daemon_and_skip_their_imports_when_collecting(spark):
    """A reused worker's collection after a task that imported something freezes the survivors
    (gc_assets.core.spark_daemon): a later task sees them frozen. With PySpark's own daemon
    nothing is ever frozen."""
    assert default_spark_config()[PYTHON_DAEMON_KEY] == PYTHON_DAEMON_MODULE

    def freeze_count(frames):
        import gc

        import pandas as pd

        for _ in frames:
            pass
        yield pd.DataFrame({"frozen": [gc.get_freeze_count()]})

    one_task = spark.range(1).coalesce(1)
    counts = [one_task.mapInPandas(freeze_count, "frozen long").collect()[0]["frozen"] for _ in range(4)]
    assert max(counts) > 10_000, counts  # pandas, pyarrow and PySpark's own objects


def test_python_workers_import_the_installed_pyspark_and_py4j_not_the_zips_spark_puts_first(spark):
    """Python compiles what it imports from a zip anew in every process; the installed copies
    have their compiled files. Spark's jar on the path holds no Python, and every task read its
    directory again."""

    def origins(frames):
        import sys

        import pandas as pd
        import py4j
        import pyspark

        for _ in frames:
            pass
        archives = [
            entry
            for entry in [*sys.path, *sys.path_importer_cache]
            if entry.endswith((".zip", ".jar")) and "pyspark" in entry
        ]
        yield pd.DataFrame({"origin": [pyspark.__file__, py4j.__file__, *archives]})

    found = [row["origin"] for row in spark.range(1).coalesce(1).mapInPandas(origins, "origin string").collect()]
    assert len(found) == 2 and not any(".zip" in origin or ".jar" in origin for origin in found), found


def test_only_the_archives_of_an_installed_pyspark_are_left_out(tmp_path):
    site = tmp_path / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    for package in ("pyspark", "py4j"):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
    lib.mkdir(parents=True)
    bundled = [
        str(lib / "pyspark.zip"),
        str(lib / "py4j-0.10.9.9-src.zip"),
        str(site / "pyspark" / "jars" / "core.jar"),
    ]
    assert bundled_archives([*bundled, "/opt/app", str(site)]) == bundled
    # A cluster's own Spark: its zips are the only PySpark its workers have.
    spark_home = tmp_path / "spark"
    assert (
        bundled_archives([str(spark_home / "python/lib/pyspark.zip"), str(spark_home / "jars/core.jar"), str(site)])
        == []
    )
    # The installed copies not on the path, or one of them not installed.
    assert bundled_archives([*bundled, "/opt/app"]) == []
    (site / "py4j" / "__init__.py").unlink()
    assert bundled_archives([*bundled, str(site)]) == [bundled[0], bundled[2]]


def test_generated_code_stays_compiled_for_more_queries_than_sparks_default_keeps(spark):
    """Spark keeps 100 compiled classes by default; a run compiles about 420, and a process that
    runs again would compile them all again."""
    assert default_spark_config()[CODEGEN_CACHE_KEY] == CODEGEN_CACHE_ENTRIES
    compilations = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    # The suite's session runs interpreted (conftest); a run's own session generates code.
    generated = {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK"}
    interpreted = {key: spark.conf.get(key) for key in generated}
    for key, value in generated.items():
        spark.conf.set(key, value)
    try:

        def compile_plan(i: int) -> None:  # planned and compiled, no job run
            spark.range(1).selectExpr(f"id * {i} + {i}")._jdf.queryExecution().executedPlan().execute()

        start = compilations.getCount()
        for i in range(1, 106):
            compile_plan(i)
        compiled = compilations.getCount()
        assert compiled - start >= 105
        compile_plan(1)  # the first one, 104 queries later
        assert compilations.getCount() == compiled
    finally:
        for key, value in interpreted.items():
            spark.conf.set(key, value)


def test_column_expressions_record_no_python_call_site(spark):
    """PySpark's DataFrame debugging is off in every session gc_assets starts: no JVM calls and
    no walk of the Python stack for each column expression."""
    from pyspark.errors.utils import is_debugging_enabled

    assert default_spark_config()[DATAFRAME_DEBUGGING_KEY] == "false"
    assert spark.conf.get(DATAFRAME_DEBUGGING_KEY) == "false"
    assert not is_debugging_enabled()  # what PySpark's column functions ask, once per process
