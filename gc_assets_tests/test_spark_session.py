"""The Spark session settings: a local run's JVM compiles with the quick compiler only, unless
GC_ASSETS_DRIVER_JAVA_OPTIONS says otherwise; clusters and Spark Connect keep their own JVM options."""

from __future__ import annotations

from gc_assets.core.spark import (
    DRIVER_JAVA_OPTIONS_ENV,
    LOCAL_DRIVER_JAVA_OPTIONS,
    SPARK_MASTER_ENV,
    SPARK_REMOTE_ENV,
    default_spark_config,
)

JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def test_the_running_session_compiles_with_the_quick_compiler_only(spark):
    """Asked of the JVM itself (its HotSpot option), not of the settings that were meant to reach it."""
    jvm = spark.sparkContext._jvm
    diagnostics = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    assert diagnostics.getVMOption("TieredStopAtLevel").getValue() == "1"


def test_driver_java_options_are_local_only_and_can_be_replaced_or_dropped(monkeypatch):
    for name in (SPARK_MASTER_ENV, SPARK_REMOTE_ENV, DRIVER_JAVA_OPTIONS_ENV):
        monkeypatch.delenv(name, raising=False)
    assert default_spark_config()[JAVA_OPTIONS] == LOCAL_DRIVER_JAVA_OPTIONS

    monkeypatch.setenv(DRIVER_JAVA_OPTIONS_ENV, "-Xss4m")
    assert default_spark_config()[JAVA_OPTIONS] == "-Xss4m"

    monkeypatch.setenv(DRIVER_JAVA_OPTIONS_ENV, "")
    assert JAVA_OPTIONS not in default_spark_config()  # Spark's own setting (spark-defaults.conf) applies

    monkeypatch.delenv(DRIVER_JAVA_OPTIONS_ENV)
    monkeypatch.setenv(SPARK_MASTER_ENV, "spark://127.0.0.1:7077")
    assert JAVA_OPTIONS not in default_spark_config()
    monkeypatch.delenv(SPARK_MASTER_ENV)
    monkeypatch.setenv(SPARK_REMOTE_ENV, "sc://127.0.0.1:15002")
    assert JAVA_OPTIONS not in default_spark_config()
