"""One live set across repositories: objects of this namespace that another configured
repository's retained versions reference (a Delta shallow clone's absolute `add.path`, an
Iceberg table's `add_files` of this table's files) are live here too.

Those other repositories are the ones whose external_prefixes reach here, and the ones a mark
found naming objects here, declared or not (a shallow clone configured without its source's
prefix: it is refused itself, and what it reads stays live in its source). Whatever their
retained versions need is read at this partition's as-of, through their own connector and
rules; one that cannot be read fails this mark closed, naming it, since what it needs here is
then unknown (docs/design.md §10).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from functools import reduce
from typing import Mapping, Optional, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.addresses import is_absolute_address, with_relative_keys
from gc_assets.core.config import GcConfig, RepositoryConfig
from gc_assets.core.state import REACHES, reach_of, reaches_at
from gc_assets.mark.partition import GcPartition
from gc_assets.mark.retained import retained
from gc_assets.sources import SourceError
from gc_assets.stores.state import StateFiles, state_files


def needed_by_others(spark: SparkSession, partition: GcPartition) -> Optional[DataFrame]:
    """Keys of the partition's namespace that other repositories need, in with_relative_keys'
    columns plus `needed_by` (the repository's name); None when no repository reaches here.

    `at_head` keeps the other repository's own verdict (its head needs the object), and
    `required` is false: a missing object is that repository's loss to report, not this one's."""
    frames = []
    for other in referrers_of(partition.config, partition.repo.name):
        entries = _references_of(spark, partition, other)
        keyed = with_relative_keys(
            entries.filter(is_absolute_address(F.col("address"))), partition.repo.storage_namespace
        )
        frames.append(
            keyed.filter("in_namespace").withColumn("required", F.lit(False)).withColumn("needed_by", F.lit(other.name))
        )
    return reduce(DataFrame.unionByName, frames) if frames else None


@dataclass(frozen=True)
class Referrers:
    """Who may need objects of each namespace: the repositories whose external_prefixes reach
    there, then those a mark found naming objects there (record_reaches) that are still
    configured. The records are listed once, when it is read, not once per repository: a set of
    thousands asks for each of its tables, and on an object store each listing is a request."""

    config: GcConfig
    found: Mapping[str, Sequence[str]]  # owner -> the repositories recorded reaching there

    @classmethod
    def read(cls, config: GcConfig) -> "Referrers":
        return cls(config, recorded_reaches(state_files(config)))

    def of(self, name: str) -> list[RepositoryConfig]:
        declared = list(self.config.referrers(name))
        known = {repo.name for repo in declared}
        found = [
            self.config.repository(other)
            for other in self.found.get(name, ())
            if other != name and self.config.has_repository(other) and other not in known
        ]
        return declared + found


def referrers_of(config: GcConfig, name: str) -> list[RepositoryConfig]:
    """The repositories whose retained versions may need objects of `name`'s namespace (Referrers)."""
    return Referrers.read(config).of(name)


def record_outside_references(config: GcConfig, as_of: dt.datetime, outside: Mapping[str, Mapping[str, str]]) -> None:
    """Record which configured repositories' namespaces the live set of each referrer of
    `outside` reaches, from its addresses outside its own namespace and every external prefix
    (referrer -> folder -> one address spelled as its source wrote it): read once, they stay
    live in those namespaces, declared or not."""
    reaches: dict[str, dict[str, str]] = {}
    for referrer, folders in outside.items():
        examples = reaches[referrer] = {}
        for folder, spelled in folders.items():
            owner = config.owner_of(folder + "/")
            if owner is not None and owner.name != referrer:
                examples.setdefault(owner.name, spelled)
    record_reaches(state_files(config), as_of, reaches)


def record_reaches(state: StateFiles, as_of: dt.datetime, reaches: Mapping[str, Mapping[str, str]]) -> None:
    """Say that the live set at `as_of` of each referrer of `reaches` names objects of each owner
    of its examples (owner -> one address it names there); forget the owners it no longer
    reaches, but only records of an as-of no later than this one (a backfill of an older date
    forgets nothing). The records are listed once, whatever the number of referrers."""
    for key in state.keys(f"{REACHES}/"):
        owner, referrer = reach_of(key)
        if referrer in reaches and owner not in reaches[referrer] and _recorded_as_of(state, key) <= as_of:
            state.remove(key)
    for referrer, examples in reaches.items():
        for owner, example in examples.items():
            key = reaches_at(owner, referrer)
            earlier = _recorded_as_of(state, key)
            newest = max(as_of, earlier) if earlier is not None else as_of
            state.write_text(key, json.dumps({"referrer": referrer, "as_of": newest.isoformat(), "example": example}))


def _recorded_as_of(state: StateFiles, key: str) -> Optional[dt.datetime]:
    text = state.read_text(key)
    return None if text is None else dt.datetime.fromisoformat(json.loads(text)["as_of"])


def recorded_reaches(state: StateFiles) -> dict[str, list[str]]:
    """Owner -> the repositories a mark found naming objects of its namespace (record_reaches), in one listing."""
    found: dict[str, list[str]] = {}
    for key in state.keys(f"{REACHES}/"):
        owner, referrer = reach_of(key)
        found.setdefault(owner, []).append(referrer)
    return {owner: sorted(referrers) for owner, referrers in found.items()}


def _lender(partition: GcPartition, other: RepositoryConfig) -> GcPartition:
    return GcPartition(partition.config, other, partition.date, partition.as_of)


def _references_of(spark: SparkSession, partition: GcPartition, other: RepositoryConfig) -> DataFrame:
    """The live entries of `other`'s retained versions at the partition's as-of, as its connector spells them."""
    lender = _lender(partition, other)
    try:
        judged = retained(spark, lender).frame
        return lender.source.live_entries(
            spark,
            judged.filter("retained").select("commit_id", "threshold"),
            judged.filter("ref_head").select("commit_id"),
        )
    except Exception as exc:
        declared = other in partition.config.referrers(partition.repo.name)
        how = "its external_prefixes reach here" if declared else "a mark of it read references here"
        raise SourceError(
            f"repository {partition.repo.name!r}: repository {other.name!r} references objects in its namespace "
            f"({how}), and what its retained versions need cannot be read: {exc}"
        ) from exc
