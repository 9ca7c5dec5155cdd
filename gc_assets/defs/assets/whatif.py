"""retention_whatif: `gc-assets plan` in the UI, materialized on demand, nothing written but its metadata."""

import datetime as dt
import json
from pathlib import Path

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from gc_assets.core.config import Rules
from gc_assets.core.time import resolve_as_of
from gc_assets.defs.assets.common import utc_now
from gc_assets.defs.partitions import partition_key
from gc_assets.defs.resources import GcConfigResource, recorded_mark
from gc_assets.mark.partition import GcPartition
from gc_assets.questions.whatif import RulesChoice, plan_markdown, plan_retention
from gc_assets.stores import store_for


class WhatIfConfig(Config):
    repo: str = Field(default="", description="the repository to plan; empty: every repository of gc.yaml")
    date: str = Field(
        default="", description="the partition date YYYY-MM-DD whose inventory to reuse; empty: today (UTC)"
    )
    rules_files: list[str] = Field(
        default_factory=list, description="rules JSON files to compare; empty: each repository's own rules"
    )


def build_whatif_asset() -> AssetsDefinition:
    @asset(
        group_name="questions",
        kinds={"spark"},
        description=(
            "What-if retention: each rules file (or the repository's own rules) judged against the "
            "same commit graph and inventory, as a table of retained and expired commits, live "
            "objects, candidates, bytes reclaimable and the oldest restorable point per branch. "
            "Writes no receipts and never touches storage."
        ),
    )
    def retention_whatif(
        context: AssetExecutionContext, config: WhatIfConfig, gc_config: GcConfigResource, pyspark: LazyPySparkResource
    ) -> MaterializeResult:
        gc = gc_config.load()
        now = utc_now()
        date = dt.date.fromisoformat(config.date) if config.date else now.date()
        try:
            choices = [
                RulesChoice(path, Rules.model_validate(json.loads(Path(path).read_text())))
                for path in config.rules_files
            ]
        except (OSError, ValueError) as exc:
            raise Failure(f"rules_files: {exc}") from None
        spark = pyspark.spark_session
        sections, totals = [], {}
        for repo in [gc.repository(config.repo)] if config.repo else gc.repositories:
            key = partition_key(date, repo.name)
            recorded = recorded_mark(gc_config, key)  # the stored mark's as-of and times, held constant
            partition = GcPartition(gc, repo, date, recorded[0] if recorded else resolve_as_of(date, now, None))
            inventory = gc_config.stored(spark, "object_inventory", key)
            if inventory is None:
                inventory = store_for(repo).list(spark)
            configured = [RulesChoice(gc.source_path or "gc.yaml", None, configured=True)]
            plans = plan_retention(
                spark, partition, inventory, choices or configured, now, mark=recorded[1] if recorded else None
            )
            sections.append(f"### {repo.name} (as of {partition.as_of.isoformat()})\n\n{plan_markdown(plans)}")
            for index, plan in enumerate(plans):
                totals[f"{repo.name}/{index}/orphan_candidates"] = MetadataValue.int(plan.orphan_candidates)
                totals[f"{repo.name}/{index}/reclaimable_bytes"] = MetadataValue.int(plan.reclaimable_bytes)
        context.log.info(f"planned {len(sections)} repositories")
        return MaterializeResult(metadata={"plans": MetadataValue.md("\n\n".join(sections)), **totals})

    return retention_whatif
