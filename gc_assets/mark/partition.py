"""One unit of work: a repository's configuration at one partition date and as-of time."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import cached_property

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gc_assets.core.config import GcConfig, RepositoryConfig
from gc_assets.core.state import GC_OWN_PREFIXES
from gc_assets.core.uris import namespace_contains
from gc_assets.sources import RepositorySource, source_for


class UnsafeSettings(ValueError):
    """A repository's settings would let the GC act on what it cannot know is garbage."""


@dataclass(frozen=True)
class GcPartition:
    config: GcConfig
    repo: RepositoryConfig
    date: dt.date
    as_of: dt.datetime

    @cached_property
    def source(self) -> RepositorySource:
        """Built once per partition, so a connector's caches (a Delta log listing) are shared."""
        return source_for(self.repo)

    def protected_prefixes(self, source: RepositorySource) -> tuple[str, ...]:
        """The format's own prefixes, the product's, the configured ones and the export itself."""
        prefixes = list(source.protected_prefixes) + list(GC_OWN_PREFIXES) + list(self.repo.protected_prefixes)
        inside = namespace_contains(self.repo.storage_namespace, self.repo.source_uri)
        if inside:
            prefixes.append(inside.rstrip("/") + "/")
        return tuple(dict.fromkeys(prefixes))

    def with_partition_columns(self, frame: DataFrame) -> DataFrame:
        return frame.select(F.lit(self.repo.name).alias("repo"), F.lit(self.date).alias("gc_date"), "*")


@dataclass(frozen=True)
class Mark:
    """The live_files materialization a sweep relies on."""

    run_id: str
    mark_time: dt.datetime
    source_time: dt.datetime  # when the state the mark read was current (docs/design.md §10)


def knowledge_time(partition: GcPartition, mark: Mark) -> dt.datetime:
    """The latest moment the mark's knowledge covers: nothing written after it was seen by it."""
    return min(mark.mark_time, partition.as_of, mark.source_time)


def candidate_cutoff(partition: GcPartition, mark: Mark) -> dt.datetime:
    """No object modified at or after this time is ever a candidate (docs/design.md §2, §10)."""
    return knowledge_time(partition, mark) - partition.repo.min_object_age


def untracked_guard(repo: RepositoryConfig, format_guard: dt.timedelta) -> dt.timedelta:
    """How old an untracked object must be: the format's window for in-flight writers, or the
    configured override (below the format's window only with allow_unsafe_min_age)."""
    if repo.untracked_min_age_hours is None:
        return max(format_guard, repo.min_object_age)
    override = dt.timedelta(hours=repo.untracked_min_age_hours)
    if override < format_guard and not repo.allow_unsafe_min_age:
        raise UnsafeSettings(
            f"repository {repo.name!r}: untracked_min_age_hours {repo.untracked_min_age_hours:g} is below the "
            f"format's own guard for in-flight writers ({format_guard.total_seconds() / 3600:g} hours); "
            "that needs allow_unsafe_min_age: true"
        )
    return max(override, repo.min_object_age)


def untracked_cutoff(partition: GcPartition, mark: Mark, format_guard: dt.timedelta) -> dt.datetime:
    """No untracked object modified at or after this time is a candidate (docs/design.md §10)."""
    return knowledge_time(partition, mark) - untracked_guard(partition.repo, format_guard)
