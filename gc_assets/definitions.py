"""The single entry point: assets, checks, jobs, automation and resources of gc_assets."""

from __future__ import annotations

import os
from typing import Optional

from dagster import AssetSelection, Definitions, define_asset_job, in_process_executor
from dagster_pyspark import LazyPySparkResource

from gc_assets.assets.mark import build_mark_assets
from gc_assets.assets.sweep import build_sweep_assets
from gc_assets.automation import build_automation
from gc_assets.checks import build_checks
from gc_assets.config import CONFIG_ENV_VAR, DEFAULT_CONFIG_PATH, GcConfig, load_config
from gc_assets.partitions import gc_partitions
from gc_assets.resources import GcConfigResource, SparkParquetIOManager
from gc_assets.spark import default_spark_config

MARK = AssetSelection.groups("mark")
SWEEP = AssetSelection.groups("sweep")


def build_definitions(config: Optional[GcConfig] = None, config_path: str = "") -> Definitions:
    """Definitions for a gc.yaml; its partitions_start_date fixes the first daily partition."""
    config = config or GcConfig()
    partitions = gc_partitions(config.partitions_start_date)
    gc_config = GcConfigResource(config_path=config_path or (config.source_path or ""))
    pyspark = LazyPySparkResource(spark_config=default_spark_config())
    gc_job = define_asset_job("gc_job", selection=MARK | SWEEP, description="Mark and sweep.")
    mark_job = define_asset_job("mark_job", selection=MARK, description="Mark only.")
    sweep_job = define_asset_job("sweep_job", selection=SWEEP, description="Sweep only.")
    sensors, schedules = build_automation()
    return Definitions(
        assets=[*build_mark_assets(partitions), *build_sweep_assets(partitions)],
        asset_checks=build_checks(partitions),
        jobs=[gc_job, mark_job, sweep_job],
        sensors=sensors,
        schedules=schedules,
        executor=in_process_executor,
        resources={
            "gc_config": gc_config,
            "pyspark": pyspark,
            "io_manager": SparkParquetIOManager(pyspark=pyspark, gc_config=gc_config),
        },
    )


def _configured() -> Definitions:
    path = os.environ.get(CONFIG_ENV_VAR) or DEFAULT_CONFIG_PATH
    return build_definitions(load_config(path), path) if os.path.exists(path) else build_definitions()


defs = _configured()
