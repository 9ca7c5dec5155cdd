"""Gather, from one partition's materialized assets, the facts gc_assets.core.reasons judges."""

from __future__ import annotations

import datetime as dt
from typing import Mapping, Optional, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core import retention
from gc_assets.core.config import Rules
from gc_assets.core.reasons import Explanation, Facts, Reference, explain
from gc_assets.core.retention import Ref
from gc_assets.core.spark import local_frame
from gc_assets.core.uris import classify_address, is_absolute_uri
from gc_assets.mark.partition import GcPartition
from gc_assets.sources.iceberg import NOT_COMMITTED
from gc_assets.stores import store_for
from gc_assets.sweep.holds import held_addresses, hold_records


def explain_address(
    spark: SparkSession, partition: GcPartition, frames: Mapping[str, DataFrame], address: str, now: dt.datetime
) -> Explanation:
    """Explain `address` (a key, a full URI, or a logical path) from the assets in `frames`."""
    namespace = partition.repo.storage_namespace
    key = classify_address(address, namespace) if is_absolute_uri(address) else address
    if key is None:
        return explain(address, Facts(key=None))
    source = partition.source
    inventory, live = frames["object_inventory"], frames["live_files"]
    known = (
        inventory.filter(F.col("address") == key).limit(1).count()
        or live.filter(F.col("address") == key).limit(1).count()
    )
    if not known and not is_absolute_uri(address):
        key = _physical_key(spark, partition, frames["retained_commits"], address) or key
    listed = inventory.filter(F.col("address") == key).select("size", "last_modified").first()
    needed_by = F.col("needed_by") if "needed_by" in live.columns else F.lit(None).cast("string")  # older marks
    living = (
        live.filter((F.col("address") == key) & F.col("in_namespace"))
        .select("source", needed_by.alias("needed_by"))
        .first()
    )
    candidate = frames["orphan_candidates"].filter(F.col("address") == key).select("reason").first()
    commits, refs = source.commit_graph(spark)
    rules = source.retention_rules(spark, partition.repo)
    references = _references(spark, partition, frames["retained_commits"], key, rules, refs)
    newest = max(references, key=lambda r: r.created_at, default=None)
    expired_at = (
        retention.expired_at(commits, refs, rules, newest.commit_id)
        if newest is not None and not newest.retained and partition.repo.retention is None
        else None
    )
    store = store_for(partition.repo)
    holds = [
        record
        for record in hold_records(inventory)
        if key in held_addresses(store, [record], now, partition.repo.hold_days)
    ]
    facts = Facts(
        key=key,
        live_source=living["source"] if living else None,
        needed_by=living["needed_by"] if living else None,
        in_inventory=listed is not None,
        last_modified=_utc(listed["last_modified"]) if listed else None,
        size=listed["size"] if listed else None,
        candidate_reason=candidate["reason"] if candidate else None,
        references=tuple(references),
        expired_at=expired_at,
        protected_prefixes=partition.protected_prefixes(source.protected_prefixes),
        nested_in=partition.config.nested_in(partition.repo.name),
        protected_patterns=source.protected_patterns,
        hold=holds[0] if holds else None,
        min_object_age_hours=partition.repo.min_object_age.total_seconds() / 3600,
        untracked_collectable=source.collects_untracked,
    )
    return explain(address, facts)


def _physical_key(spark: SparkSession, partition: GcPartition, commits: DataFrame, path: str) -> str | None:
    """The key a logical path names in the newest commit that has it (lakeFS paths)."""
    named = partition.source.logical_addresses(spark, path).join(commits.select("commit_id", "created_at"), "commit_id")
    newest = named.orderBy(F.desc("created_at"), "commit_id").select("address").first()
    return classify_address(newest["address"], partition.repo.storage_namespace) if newest else None


def _references(
    spark: SparkSession,
    partition: GcPartition,
    commits: DataFrame,
    key: str,
    rules: Optional[Rules],
    refs: Sequence[Ref],
) -> list[Reference]:
    """Every commit of the graph that references the key, with its retention (one scan)."""
    spellings = local_frame(spark, [(key,), (f"{partition.repo.storage_namespace}/{key}",)], "address string")
    found = (
        partition.source.commits_referencing(spark, commits.select("commit_id"), spellings)
        .select("commit_id")
        .distinct()
    )
    rows = commits.join(found, "commit_id", "left_semi").collect()
    kinds = {ref.name: ref.kind for ref in refs}
    return [
        Reference(
            r["commit_id"],
            _utc(r["created_at"]),
            bool(r["retained"]),
            r["retained_by"],
            _utc(r["threshold"]),
            _rule(partition, rules, r["retained_by"], kinds) if r["retained"] else None,
        )
        for r in rows
    ]


def _rule(partition: GcPartition, rules: Optional[Rules], retained_by: str, kinds: dict[str, str]) -> str:
    if retained_by == NOT_COMMITTED.retained_by:
        return "no catalog to expire snapshots through: every snapshot of the table's metadata is kept"
    if partition.repo.retention is not None:
        return "the table's own expire-snapshots properties"
    return retention.rule_of(rules, retained_by, kinds.get(retained_by, retention.DANGLING))


def _utc(moment: dt.datetime | None) -> dt.datetime | None:
    """Spark hands timestamps back naive, in the driver's local time."""
    return None if moment is None else moment.astimezone(dt.timezone.utc)
