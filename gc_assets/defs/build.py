"""Definitions for a gc.yaml: assets, checks, jobs, automation and resources of gc_assets."""

from __future__ import annotations

from typing import Optional

from dagster import (
    AssetSelection,
    Definitions,
    define_asset_job,
    in_process_executor,
)
from dagster_pyspark import LazyPySparkResource

from gc_assets.core.config import (
    GcConfig,
)
from gc_assets.core.spark import default_spark_config
from gc_assets.defs.assets.collect import build_partition_assets, mode_run_config
from gc_assets.defs.assets.whatif import build_whatif_asset
from gc_assets.defs.automation import build_automation
from gc_assets.defs.partitions import gc_partitions
from gc_assets.defs.resources import GcConfigResource
from gc_assets.defs.set_runs import build_fleet_job

MARK = AssetSelection.groups("mark")
SWEEP = AssetSelection.groups("sweep")
FORMAT_KINDS = {
    "lakefs": "lakefs",
    "lakefs-export": "lakefs",
    "delta": "delta",
    "iceberg": "iceberg",
    "file-catalog": "sql",
}
STORE_KINDS = {"s3": "s3", "abfss": "azure", "gs": "gcs"}  # namespace scheme -> the UI's kind
# Assets that read the repositories' metadata, and assets that read or change their storage.
READS_METADATA = {"retained_commits", "live_files"}
TOUCHES_STORAGE = {"object_inventory", "deletion_receipts"}
# Backfill policy: none, on purpose. Dagster then backfills one run per (date, repository)
# partition tagged with its partition keys, so the run queue's per-repository limit
# applies; any BackfillPolicy launches partition-range runs without those tags.


def configured_kinds(config: GcConfig) -> dict[str, set[str]]:
    """Kinds the UI shows beyond spark/parquet: the formats and object stores gc.yaml uses."""
    formats = {FORMAT_KINDS[repo.format] for repo in config.repositories}
    stores = {
        STORE_KINDS[scheme]
        for repo in config.repositories
        if (scheme := repo.storage_namespace.split("://")[0]) in STORE_KINDS
    }
    return {
        **{asset: formats for asset in READS_METADATA},
        **{asset: stores for asset in TOUCHES_STORAGE},
    }


def build_definitions(config: Optional[GcConfig] = None, config_path: str = "") -> Definitions:
    """Definitions for a gc.yaml; its partitions_start_date fixes the first daily partition."""
    config = config or GcConfig()
    config_path = config_path or (config.source_path or "")
    partitions = gc_partitions(config.partitions_start_date)
    gc_config = GcConfigResource(config_path=config_path)
    pyspark = LazyPySparkResource(spark_config=default_spark_config())
    # An empty mode means the repository's configured one; the launchpad shows it to edit.
    sweep_defaults = mode_run_config("")
    gc_job = define_asset_job(
        "gc_job", selection=MARK | SWEEP, config=sweep_defaults, description="Mark and sweep one partition."
    )
    mark_job = define_asset_job(
        "mark_job", selection=MARK, description="Mark only: retained commits and live files; never touches storage."
    )
    sweep_job = define_asset_job(
        "sweep_job",
        selection=AssetSelection.assets("deletion_receipts"),
        config=sweep_defaults,
        description="Sweep only: the candidates of the partition's latest mark, every guard judged again first.",
    )
    fleet_job = build_fleet_job(config.partitions_start_date)
    sensors, schedules = build_automation(config_path, fleet_job)
    return Definitions(
        assets=[build_partition_assets(partitions, configured_kinds(config)), build_whatif_asset()],
        jobs=[gc_job, mark_job, sweep_job, fleet_job],
        sensors=sensors,
        schedules=schedules,
        executor=in_process_executor,
        resources={
            "gc_config": gc_config,
            "pyspark": pyspark,
        },
    )
