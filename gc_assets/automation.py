"""Sensors and schedules that keep partitions in step with gc.yaml."""

from __future__ import annotations

from dagster import (
    DefaultSensorStatus,
    ScheduleDefinition,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from gc_assets.config import ConfigError, load_config
from gc_assets.partitions import REPOSITORIES


def build_automation() -> tuple[list[SensorDefinition], list[ScheduleDefinition]]:
    @sensor(
        name="repository_registry",
        minimum_interval_seconds=60,
        default_status=DefaultSensorStatus.RUNNING,
        description="Adds a repositories partition for every repository in gc.yaml.",
    )
    def repository_registry(context: SensorEvaluationContext):
        try:
            configured = [repo.name for repo in load_config().repositories]
        except ConfigError as exc:
            return SkipReason(str(exc))
        existing = set(context.instance.get_dynamic_partitions(REPOSITORIES.name))
        new = [name for name in configured if name not in existing]
        if not new:
            return SkipReason("every configured repository has a partition")
        return SensorResult(dynamic_partitions_requests=[REPOSITORIES.build_add_request(new)])

    return [repository_registry], []
