"""One unit of work: a repository's configuration at one partition date and as-of time."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import cached_property

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gc_assets.core import time
from gc_assets.core.config import GcConfig, RepositoryConfig
from gc_assets.core.state import GC_OWN_PREFIXES
from gc_assets.core.uris import namespace_contains
from gc_assets.sources import RepositorySource, source_for


class MarkRefusal(ValueError):
    """The mark refuses to decide: what it read cannot be the whole truth (no commits, no objects)."""


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

    def protected_prefixes(self, format_prefixes: tuple[str, ...]) -> tuple[str, ...]:
        """The format's own prefixes (its source's protected_prefixes), the product's, the configured
        ones, the namespaces of the repositories nested inside this one (they collect their own) and
        the export itself."""
        prefixes = list(format_prefixes) + list(GC_OWN_PREFIXES) + list(self.repo.protected_prefixes)
        prefixes += list(self.config.nested_in(self.repo.name))
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
    return time.knowledge_time(partition.as_of, mark.mark_time, mark.source_time)


def candidate_cutoff(partition: GcPartition, mark: Mark) -> dt.datetime:
    """The rule of gc_assets.core.time.candidate_cutoff, for this partition and mark."""
    return time.candidate_cutoff(knowledge_time(partition, mark), partition.repo)


def untracked_cutoff(partition: GcPartition, mark: Mark, format_guard: dt.timedelta) -> dt.datetime:
    """The rule of gc_assets.core.time.untracked_cutoff, for this partition and mark."""
    return time.untracked_cutoff(knowledge_time(partition, mark), partition.repo, format_guard)
