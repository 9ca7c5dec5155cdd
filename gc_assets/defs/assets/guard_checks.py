"""Judging a guard of gc_assets.sweep.guard_table.GUARDS as an asset check, in its asset's own
step or in a step of its own (gc_assets.defs.checks).

A guard whose inputs its asset's step already holds is judged inside that step, right after
the asset is stored (one step, no second read of the inputs).
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping, Optional

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    MetadataValue,
    MultiPartitionsDefinition,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame

from gc_assets.core import guards
from gc_assets.defs.assets.common import (
    INPUTS_METADATA,
    PartitionedContext,
    checked_inputs,
    gc_partition,
    inputs_fingerprint,
    latest_mark,
)
from gc_assets.defs.resources import GcConfigResource
from gc_assets.sweep.guard_table import GUARDS, Evidence, Guard

GUARDS_BY_NAME = {guard.name: guard for guard in GUARDS}
SECONDS_METADATA = "seconds"  # on each check result: wall time of judging it


def check_result(verdict: guards.Verdict, inputs: str, seconds: float) -> AssetCheckResult:
    """The verdict as Dagster shows it, with the fingerprint of the inputs it judged (which the
    sweep of the same run compares before reusing it) and how long judging took (a step holds
    several checks, so its own duration no longer tells)."""
    return AssetCheckResult(
        check_name=verdict.name,
        passed=verdict.passed,
        severity=_severity(verdict),
        description=verdict.description,
        metadata={
            **_metadata(verdict),
            INPUTS_METADATA: MetadataValue.text(inputs),
            SECONDS_METADATA: MetadataValue.float(round(seconds, 3)),
        },
    )


def check_evaluation(
    verdict: guards.Verdict, partition: str, target: Optional[AssetCheckEvaluationTargetMaterializationData]
) -> AssetCheckEvaluation:
    """The verdict of one partition's guard judged in a step over many partitions (a fleet run),
    naming its partition and the materialization it judged."""
    guard = GUARDS_BY_NAME[verdict.name]
    return AssetCheckEvaluation(
        asset_key=AssetKey(guard.asset),
        check_name=verdict.name,
        passed=verdict.passed,
        metadata=_metadata(verdict),
        target_materialization_data=target,
        severity=_severity(verdict),
        description=verdict.description,
        blocking=guard.blocking,
        partition=partition,
    )


def _severity(verdict: guards.Verdict) -> AssetCheckSeverity:
    return AssetCheckSeverity.WARN if verdict.severity == "WARN" else AssetCheckSeverity.ERROR


def _metadata(verdict: guards.Verdict) -> dict[str, Any]:
    return {
        key: MetadataValue.json(value) if isinstance(value, list) else value for key, value in verdict.metadata.items()
    }


def evidence_of(
    context: PartitionedContext,
    gc_config: GcConfigResource,
    pyspark: LazyPySparkResource,
    frames: Mapping[str, DataFrame],
) -> Evidence:
    """What the checks of one step judge: its frames, its partition, and the mark read once when needed."""
    return Evidence(pyspark.spark_session, gc_partition(context, gc_config), frames, lambda: latest_mark(context))


def judge(
    guard: Guard, context: PartitionedContext, gc_config: GcConfigResource, evidence: Evidence
) -> AssetCheckResult:
    started = time.monotonic()
    inputs = inputs_fingerprint(gc_config, str(context.partition_key), checked_inputs(guard))
    verdict = guard.judge(evidence)
    return check_result(verdict, inputs, time.monotonic() - started)


def _in_step_guards(asset: str) -> list[Guard]:
    return [guard for guard in GUARDS if guard.is_check and guard.in_step and guard.asset == asset]


def in_step_check_specs(asset: str, partitions: MultiPartitionsDefinition) -> list[AssetCheckSpec]:
    """The checks `asset`'s own step judges (its decorator declares them), partitioned as the
    asset: each result names its date and repository, so the UI shows the latest per partition."""
    return [
        AssetCheckSpec(
            guard.name, asset=asset, blocking=guard.blocking, description=guard.description, partitions_def=partitions
        )
        for guard in _in_step_guards(asset)
    ]


def judge_in_step(
    context: AssetExecutionContext,
    gc_config: GcConfigResource,
    pyspark: LazyPySparkResource,
    asset: str,
    inputs: Mapping[str, DataFrame],
) -> Iterator[AssetCheckResult]:
    """The in-step checks of `asset`, on the partition as stored (the step yields its Output
    first, which the IO manager validates and writes) and the step's own inputs. A failed
    blocking check fails the step once every result is reported, so nothing downstream runs."""
    stored = gc_config.stored(pyspark.spark_session, asset, context.partition_key)
    assert stored is not None, f"{asset} {context.partition_key} was stored by this step"
    evidence = evidence_of(context, gc_config, pyspark, {**inputs, asset: stored})
    for guard in _in_step_guards(asset):
        yield judge(guard, context, gc_config, evidence)
