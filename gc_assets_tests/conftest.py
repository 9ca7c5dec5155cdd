"""One SparkSession for the whole session (local[2], one shuffle partition unless a file asks for two, UI off,
few jobs retained)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Test lakes fabricate their history by setting modification times; the ctime rule is
# tested with stores that set trust_mtime=False explicitly.
os.environ.setdefault("GC_ASSETS_TRUST_LOCAL_MTIME", "1")
from gc_assets.core.spark import SHUFFLE_PARTITIONS_ENV, default_spark_config, prepare_environment  # noqa: E402

# One shuffle partition in each test process's session and the runs it starts: each task beyond
# the first only adds its start (four files on two workers: 293.5 s with two, 253.0 s with one).
# Rows are still split where splitting is what is tested: the deletion paths' files take two
# (`rows_split_in_two`), and so do the command line's own runs in test_cli, test_secrets and
# the cluster of test_distributed.
os.environ.setdefault(SHUFFLE_PARTITIONS_ENV, "1")

prepare_environment()


def _product_frames_read_from_arrow() -> None:
    """Every test's witness that the product builds no frame of a Python list or an RDD: Spark
    makes that a Python RDD, and every job that reads it starts Python workers to unpickle its
    rows. core.spark.local_frame gives Spark Arrow instead."""
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql.session import SparkSession

    from_python = SparkSession.createDataFrame

    def create_data_frame(self, data, *args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("gc_assets.") and not isinstance(data, (pa.Table, pd.DataFrame)):
            raise AssertionError(f"{caller} makes a frame of a {type(data).__name__}: core.spark.local_frame")
        return from_python(self, data, *args, **kwargs)

    SparkSession.createDataFrame = create_data_frame


_product_frames_read_from_arrow()
# Each test process has a Dagster instance of its own: two processes writing one SQLite
# instance wait on each other's locks.
_WORKER_HOME = Path(tempfile.mkdtemp(prefix=f"dagster_home_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_"))
_INSTANCE_SETTINGS = Path(__file__).parents[1] / "dagster.yaml"
# No test reads captured step logs; capturing them starts a poller process and a `tail -F` per step.
NO_STEP_LOG_CAPTURE = (
    "compute_logs:\n  module: dagster._core.storage.noop_compute_log_manager\n  class: NoOpComputeLogManager\n"
)
_SETTINGS_TEXT = _INSTANCE_SETTINGS.read_text() if _INSTANCE_SETTINGS.exists() else ""  # mutmut's copy has none
(_WORKER_HOME / "dagster.yaml").write_text(_SETTINGS_TEXT + "\n" + NO_STEP_LOG_CAPTURE)
os.environ["DAGSTER_HOME"] = str(_WORKER_HOME)


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_WORKER_HOME, ignore_errors=True)


# Each test records its graph runs and cold processes for the durations table (docs/TEST_DURATIONS.md).
pytest_plugins = ["gc_assets_tests.suite_costs"]
warnings.filterwarnings("ignore", message=".*partitions_def on an AssetCheckSpec.*")

# The session keeps this few jobs in its status store, fewer than one run starts: what reads
# it (the benchmark's job count) must cope with a long-lived session's evictions.
RETAINED_JOBS = 20


def jobs_started(spark) -> int:
    """Jobs the session has started: the scheduler's own counter, which no retention limit caps."""
    return int(spark.sparkContext._jsc.sc().dagScheduler().numTotalJobs())


settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    config = {
        **default_spark_config(),
        "spark.master": "local[2]",
        "spark.ui.enabled": "false",
        "spark.ui.retainedJobs": str(RETAINED_JOBS),
        # The suite's queries are many and tiny: compiling each one's Java code costs more than
        # running it interpreted (a warm trash run of the small lake: 9.1 s with, 7.8 s without;
        # test_lakefs_native and test_guards alone: 157 s, 143 s, and 138 s with the quick compiler
        # only, as a run's own JVM has it). Runs in processes of their own (the command line, the
        # cluster) keep Spark's code generation.
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    }
    for key, value in config.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def rows_split_in_two(spark):
    """Two shuffle partitions for a whole file (its in-process steps and the runs it starts):
    where a step splits its rows is where bugs in handling many partitions show."""
    before = os.environ[SHUFFLE_PARTITIONS_ENV]
    os.environ[SHUFFLE_PARTITIONS_ENV] = "2"
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    yield
    os.environ[SHUFFLE_PARTITIONS_ENV] = before
    spark.conf.set("spark.sql.shuffle.partitions", before)


# -- scheduling: heaviest files first ------------------------------------------------------
# `make test` gives pytest-xdist whole files (`--dist loadfile --no-loadscope-reorder`) in the
# order collected. A heavy file handed out last runs alone on one worker while the other idles,
# so files go out heaviest first, by their seconds in the last measured run
# (gc_assets_tests/file_seconds.json, written by `python -m gc_assets_tests.durations --write`).
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
UNMEASURED_FILE_SECONDS = 30.0  # a new file goes out among the middling ones


def pytest_collection_modifyitems(session, config, items) -> None:
    seconds = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    items.sort(key=lambda item: -seconds.get(item.path.stem, UNMEASURED_FILE_SECONDS))
