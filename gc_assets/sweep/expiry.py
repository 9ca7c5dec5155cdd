"""A format's own expiry before a sweep acts, and its independent check (docs/design.md §6.3).

Iceberg's metadata must not list a snapshot whose files the sweep removes: a reader of that
snapshot would find them gone. So what the mark expired is expired through the table's catalog
first (RepositorySource.commit_expiry). That it was is then not taken from the expiry's own
account: a new connector reads the metadata the catalog holds now, and a snapshot the mark
expired that it still lists refuses the sweep of that table before anything of it moves.
lakeFS and Delta keep their history as it is (a vacuumed Delta version stays in the log, as
with delta-rs), so for them nothing is committed and nothing is checked.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from gc_assets.mark.partition import GcPartition
from gc_assets.sources import source_for
from gc_assets.sources.base import CommittedExpiry, SourceError

# Formats whose sweep first expires, in their own metadata, what the mark expired (Iceberg's order).
EXPIRES_FIRST = {"iceberg"}


def expired_first(spark: SparkSession, partition: GcPartition, expired_at_mark: frozenset[str]) -> CommittedExpiry:
    """The repository's own expiry of `expired_at_mark` (the commits its mark expired), committed;
    raises SourceError when its metadata refuses the commit, or when the metadata its catalog
    holds afterwards, read anew, still lists one of them."""
    expiry = partition.source.commit_expiry(spark, partition.repo, partition.as_of, expired_at_mark)
    if partition.repo.format in EXPIRES_FIRST and expired_at_mark:
        commits, _ = source_for(partition.repo).commit_graph(spark)  # a new connector: the metadata now
        still = sorted(expired_at_mark & {commit.commit_id for commit in commits})
        if still:
            raise SourceError(
                f"repository {partition.repo.name!r}: its metadata still lists {len(still)} commit(s) the mark "
                f"expired after the expiry, e.g. {still[0]}: the sweep would remove files they need. Nothing "
                "was moved or deleted; run again (a new mark judges the metadata as it is now)"
            )
    return expiry
