"""Asset checks, one per guard of gc_assets.sweep.guard_table.GUARDS, named as the UI shows them.

Checks that protect deletion are blocking with ERROR severity: when one fails, the
downstream assets of the same run are not materialized. Most are judged inside their
asset's step (gc_assets.defs.assets.guard_checks); the ones built here are steps of their own.
"""

from __future__ import annotations

import inspect

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetIn,
    AssetsDefinition,
    MultiPartitionsDefinition,
    asset_check,
)
from dagster_pyspark import LazyPySparkResource

from gc_assets.defs.assets.guard_checks import evidence_of
from gc_assets.defs.assets.guard_checks import judge as judge_guard
from gc_assets.defs.resources import GcConfigResource
from gc_assets.sweep.guard_table import GUARDS, Guard


def _check_of(guard: Guard, partitions: MultiPartitionsDefinition) -> AssetsDefinition:
    def judge(context, gc_config, pyspark, **frames) -> AssetCheckResult:
        return judge_guard(guard, context, gc_config, evidence_of(context, gc_config, pyspark, frames))

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
    """The checks that are steps of their own: those whose inputs their asset's step does not hold."""
    return [_check_of(guard, partitions) for guard in GUARDS if guard.is_check and not guard.in_step]
