"""Asset checks, one per guard of gc_assets.sweep.verification.GUARDS, named as the UI shows them.

Checks that protect deletion are blocking with ERROR severity: when one fails, the
downstream assets of the same run are not materialized.
"""

from __future__ import annotations

import inspect

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetIn,
    AssetsDefinition,
    MetadataValue,
    MultiPartitionsDefinition,
    asset_check,
)
from dagster_pyspark import LazyPySparkResource

from gc_assets.core import guards
from gc_assets.defs.assets.common import (
    INPUTS_METADATA,
    checked_inputs,
    gc_partition,
    inputs_fingerprint,
    latest_mark,
)
from gc_assets.defs.resources import GcConfigResource
from gc_assets.sweep.verification import GUARDS, Evidence, Guard


def check_result(verdict: guards.Verdict, inputs: str) -> AssetCheckResult:
    """The verdict as Dagster shows it, with the fingerprint of the inputs it judged (which the
    sweep of the same run compares before reusing it)."""
    metadata = {key: MetadataValue.json(value) if isinstance(value, list) else value for key, value in verdict.metadata.items()}
    return AssetCheckResult(
        passed=verdict.passed,
        severity=AssetCheckSeverity.WARN if verdict.severity == "WARN" else AssetCheckSeverity.ERROR,
        description=verdict.description,
        metadata={**metadata, INPUTS_METADATA: MetadataValue.text(inputs)},
    )


def _check_of(guard: Guard, partitions: MultiPartitionsDefinition) -> AssetsDefinition:
    def judge(context, gc_config, pyspark, **frames) -> AssetCheckResult:
        inputs = inputs_fingerprint(gc_config, str(context.partition_key), checked_inputs(guard))
        evidence = Evidence(pyspark.spark_session, gc_partition(context, gc_config), frames, lambda: latest_mark(context))
        return check_result(guard.judge(evidence), inputs)

    # Dagster hands a check each asset it reads through the parameter of that name, so the
    # signature names the guard's assets (they all arrive in `frames`) after the resources.
    fixed = {"context": AssetCheckExecutionContext, "gc_config": GcConfigResource, "pyspark": LazyPySparkResource}
    parameters = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=a) for n, a in fixed.items()]
    parameters += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in (guard.asset, *guard.reads)]
    judge.__signature__ = inspect.Signature(parameters)
    return asset_check(
        name=guard.name,
        asset=guard.asset,
        partitions_def=partitions,
        blocking=guard.blocking,
        additional_ins={name: AssetIn(name) for name in guard.reads},
        description=guard.description,
    )(judge)


def build_checks(partitions: MultiPartitionsDefinition) -> list[AssetsDefinition]:
    return [_check_of(guard, partitions) for guard in GUARDS if guard.is_check]

