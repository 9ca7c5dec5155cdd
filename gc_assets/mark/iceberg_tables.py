"""Many Iceberg tables marked at once, the repository a column (docs/design.md §6.3, §9): the
Iceberg part of a set's mark (mark.sets).

Each table's metadata is loaded on the driver by its own connector (sources.iceberg), which
judges its snapshots by the table's rules as it does alone; then the manifest lists of every
retained snapshot of every table are read in one pass on executors and each distinct manifest
once, with the connector's own readers. A table whose metadata cannot be loaded or read fails
alone, named; the others go on.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from functools import partial, reduce
from typing import Any, Callable, Iterator, Sequence

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core import retention
from gc_assets.core.config import RepositoryConfig
from gc_assets.core.names import REPO
from gc_assets.core.spark import beside_task_count, local_frame
from gc_assets.mark.retained import judged, verdict_rows
from gc_assets.mark.sets import RETAINED_SCHEMA, WITNESS_SCHEMA, SetMark, TableRules, read_together
from gc_assets.sources.iceberg import (
    METADATA_SCHEMA,
    SNAPSHOT_SCHEMA,
    IcebergSource,
    committed_of,
    head_reader,
    live_of,
    metadata_rows,
    snapshot_rows,
    snapshots_referencing,
    statistics_rows,
)


@dataclass
class _Table:
    source: IcebergSource
    snapshots: list[tuple[Any, ...]]  # SNAPSHOT_SCHEMA rows of the retained snapshots
    metadata: list[tuple[Any, ...]]  # METADATA_SCHEMA rows


@dataclass
class IcebergMark(SetMark):
    """The mark of every Iceberg table that could be marked, and why each other one was refused."""

    retained: DataFrame
    live: DataFrame
    tables: dict[str, _Table]
    refused: dict[str, str] = field(default_factory=dict)

    @property
    def repos(self) -> dict[str, RepositoryConfig]:
        return {name: table.source.repo for name, table in self.tables.items()}

    def rules(self, spark: SparkSession, name: str) -> TableRules:
        source = self.tables[name].source
        return TableRules.of(spark, source, source.repo)

    def readers_of(self, names: Sequence[str]) -> dict[str, tuple[dict[str, str], str]]:
        return {name: self.tables[name].source.readers[name] for name in names}

    def committed(self, spark: SparkSession) -> DataFrame:
        """Every file, manifest, manifest list and statistics file of every snapshot of every table."""
        names = list(self.tables)
        snapshots = [row for name in names for row in snapshot_rows(name, self._metadata(name), None, set())]
        statistics = [row for name in names for row in statistics_rows(name, self._metadata(name))]
        frame = local_frame(spark, snapshots, SNAPSHOT_SCHEMA)
        return committed_of(
            spark, frame, self.readers_of(names), local_frame(spark, statistics, f"{REPO} string, address string")
        )

    def commits_referencing(self, retained: DataFrame, missing: DataFrame) -> DataFrame:
        """Each asked table's own query (sources.iceberg.snapshots_referencing): asked only about
        live objects missing from storage, which are few."""
        spark = missing.sparkSession
        asked = [row[REPO] for row in missing.select(REPO).distinct().collect() if row[REPO] in self.tables]
        kept = {
            (row[REPO], row["commit_id"])
            for row in retained.filter("retained").select(REPO, "commit_id").collect()
            if row[REPO] in asked
        }
        frames = [
            snapshots_referencing(
                spark,
                local_frame(
                    spark,
                    snapshot_rows(name, self._metadata(name), {c for r, c in kept if r == name}, set()),
                    SNAPSHOT_SCHEMA,
                ),
                self.readers_of([name]),
                self.tables[name].source.namespace,
                missing.filter(F.col(REPO) == name),
            )
            for name in asked
        ]
        return reduce(
            DataFrame.unionByName, frames, local_frame(spark, [], "repo string, address string, commit_id string")
        )

    def witness(self, spark: SparkSession, reads: Sequence[tuple[str, str, str]]) -> DataFrame:
        """What each head snapshot needs, through pyiceberg's own scan planning (sources.iceberg.head_reader),
        on executors, from the metadata file the mark loaded."""
        tables = {
            reader: (self.tables[reader].source.table.metadata_location, self.readers_of([reader])[reader][0])
            for _, reader, _ in reads
        }

        def read(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            loaded: dict[str, Callable[[str], list[str]]] = {}
            for frame in frames:
                for repo, reader, head in frame.itertuples(index=False):
                    if reader not in loaded:
                        loaded[reader] = head_reader(*tables[reader])
                    files = loaded[reader](head)
                    yield pd.DataFrame({REPO: repo, "commit_id": f"{reader}@{head}", "address": files}, dtype=object)

        frame = local_frame(spark, list(reads), "repo string, reader string, head string")
        return frame.repartition(beside_task_count(spark, len(reads))).mapInPandas(read, WITNESS_SCHEMA)

    def _metadata(self, name: str) -> Any:
        return self.tables[name].source.table.metadata


def mark_tables(spark: SparkSession, repos: Sequence[RepositoryConfig], as_of: dt.datetime) -> IcebergMark:
    """The retained snapshots and live entries of every Iceberg repository of `repos` as of `as_of`."""
    refused: dict[str, str] = {}
    tables: dict[str, _Table] = {}
    retained_rows: list[tuple[Any, ...]] = []
    for repo in repos:
        try:
            rows, tables[repo.name] = _table_of(spark, repo, as_of)
            retained_rows += rows
        except Exception as exc:  # noqa: BLE001 - a table that cannot be loaded or judged fails alone
            refused[repo.name] = str(exc)
    live = _live(spark, tables, refused)
    retained = local_frame(spark, [row for row in retained_rows if row[0] in tables], RETAINED_SCHEMA)
    return IcebergMark(retained, live, tables, refused)


def _table_of(spark: SparkSession, repo: RepositoryConfig, as_of: dt.datetime) -> tuple[list[tuple[Any, ...]], _Table]:
    """One table's retained-snapshot rows and what its live set is read from: its connector's rules."""
    source = IcebergSource.from_config(repo)
    commits, refs, verdicts = judged(spark, source, repo, as_of)
    heads = retention.ref_heads(refs)
    kept = {c.commit_id for c in commits if verdicts[c.commit_id].retained}
    metadata = source.table.metadata
    table = _Table(
        source, snapshot_rows(repo.name, metadata, kept, heads), metadata_rows(repo.name, source.table, heads)
    )
    return [(repo.name, *row) for row in verdict_rows(commits, refs, verdicts)], table


def _live(spark: SparkSession, tables: dict[str, _Table], refused: dict[str, str]) -> DataFrame:
    """Every table's live entries in one pass, kept with the executors; when that pass fails (a
    manifest cannot be read), each table alone, and one that fails is refused."""
    frames = read_together(partial(_read_live, spark), tables, refused, lambda t: t.source.table.metadata_location)
    return reduce(DataFrame.unionByName, frames, local_frame(spark, [], METADATA_SCHEMA))


def _read_live(spark: SparkSession, tables: dict[str, _Table]) -> DataFrame:
    snapshots = local_frame(spark, [row for t in tables.values() for row in t.snapshots], SNAPSHOT_SCHEMA)
    metadata = local_frame(spark, [row for t in tables.values() for row in t.metadata], METADATA_SCHEMA)
    readers = {name: table.source.readers[name] for name, table in tables.items()}
    return live_of(spark, snapshots, readers, metadata).localCheckpoint()
