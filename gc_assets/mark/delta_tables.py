"""Many Delta tables marked at once, the repository a column (docs/design.md §6.2, §9): the
Delta part of a set's mark (mark.sets, which judges every format's candidates and guards).

Each table's log is listed on the driver; every commit file of every table is parsed in one
pass on executors; the commit times, metadata and protocol of every version of every table
come back in one collect; retention is judged per table on the driver; and every table is
replayed in one aggregation. The rules are DeltaSource's, through the same functions
(delta.version_graph, table_metadata, table_rules, tombstone_bound and delta_log's replay),
so a table marked with others is marked as it is alone, while the Spark jobs do not grow with
the number of tables. A table whose log cannot be read, or whose mark is refused, fails alone,
named; the others go on.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from functools import partial, reduce
from typing import Any, Iterator, Optional, Sequence

import pandas as pd
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core import retention
from gc_assets.core.config import RepositoryConfig
from gc_assets.core.names import REPO
from gc_assets.core.spark import beside_task_count, local_frame
from gc_assets.mark.partition import MarkRefusal
from gc_assets.mark.retained import verdict_rows
from gc_assets.mark.sets import RETAINED_SCHEMA, WITNESS_SCHEMA, SetMark, TableRules, read_together
from gc_assets.sources import delta_log
from gc_assets.sources.delta import (
    DeltaSource,
    Thresholds,
    checkpoint_retention,
    checkpoint_written,
    deleted_file_retention,
    delta_rs_files,
    hidden_path_patterns,
    table_metadata,
    table_prefixes,
    table_rules,
    tombstone_bound,
    version_graph,
)

_BOUNDS_SCHEMA = "repo string, v0 long, base long, bound_millis long, unknown_is_newer boolean, head long"


@dataclass
class _Table:
    repo: RepositoryConfig
    source: DeltaSource
    versions: dict[int, Row] = field(default_factory=dict)  # what _versions collected
    partition_columns: list[str] = field(default_factory=list)
    configuration: dict[str, str] = field(default_factory=dict)


@dataclass
class FleetMark(SetMark):
    """The mark of every table that could be marked, and why each other one was refused."""

    retained: DataFrame  # RETAINED_SCHEMA
    live: DataFrame  # LIVE_SCHEMA
    commits: DataFrame  # every commit of every table, parsed
    checkpoints: DataFrame  # (repo, version, *ACTION_SCHEMA) of every checkpoint read
    replays: DataFrame  # _BOUNDS_SCHEMA: where each table's replay starts (v0, base) and ends (head)
    tables: dict[str, _Table]  # the tables marked
    refused: dict[str, str] = field(default_factory=dict)  # repository -> the refusal's message

    @property
    def repos(self) -> dict[str, RepositoryConfig]:
        return {name: table.repo for name, table in self.tables.items()}

    def rules(self, spark: SparkSession, name: str) -> TableRules:
        """DeltaSource's: `_delta_log/` (and UniForm's metadata), hidden paths, the deleted-file retention."""
        table = self.tables[name]
        return TableRules(
            table_prefixes(table.configuration),
            hidden_path_patterns(table.partition_columns),
            DeltaSource.collects_untracked,
            deleted_file_retention(table.configuration),
            table.source.source_time(spark),
        )

    def committed(self, spark: SparkSession) -> DataFrame:
        return _committed(spark, self)

    def commits_referencing(self, retained: DataFrame, missing: DataFrame) -> DataFrame:
        return commits_referencing(self, retained, missing)

    def witness(self, spark: SparkSession, reads: Sequence[tuple[str, str, str]]) -> DataFrame:
        """Each head version's files as delta-rs reads them (sources.delta.delta_rs_files), on executors."""
        readers = {name: (t.source.table_uri, t.source.settings) for name, t in self.tables.items()}

        def read(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            for frame in frames:
                for repo, reader, head in frame.itertuples(index=False):
                    table_uri, settings = readers[reader]
                    files = delta_rs_files(table_uri, settings, head)
                    yield pd.DataFrame({REPO: repo, "commit_id": f"{reader}@{head}", "address": files}, dtype=object)

        tables = local_frame(spark, list(reads), "repo string, reader string, head string")
        return tables.repartition(beside_task_count(spark, len(reads))).mapInPandas(read, WITNESS_SCHEMA)


def mark_tables(spark: SparkSession, repos: Sequence[RepositoryConfig], as_of: dt.datetime) -> FleetMark:
    """The retained commits and live entries of every Delta repository of `repos` as of `as_of`."""
    refused: dict[str, str] = {}
    tables = _listed(repos, refused)
    commits = _parsed_commits(spark, tables, refused)
    for row in _versions(commits):
        tables[row[REPO]].versions[row["version"]] = row
    checkpoints = _Checkpoints(spark)
    newest = {name: (table, _newest_checkpoint(table)) for name, table in tables.items()}
    checkpoints.read({name: (table, cp) for name, (table, cp) in newest.items() if cp is not None})
    retained_rows: list[tuple[Any, ...]] = []
    bounds: list[tuple[Any, ...]] = []
    for name, table in list(tables.items()):
        try:
            rows, replay = _judged(spark, table, as_of, checkpoints)
        except Exception as exc:  # noqa: BLE001 - any refusal of one table is that table's alone
            refused[name] = str(exc)
            del tables[name]
            continue
        retained_rows += rows
        if replay is not None:
            v0, bound, base = replay
            head = table.source.listing().head
            bounds.append((name, v0, base.version if base else None, bound.millis, bound.unknown_is_newer, head))
    checkpoints.read(
        {
            row[0]: (tables[row[0]], tables[row[0]].source.listing().checkpoints[row[2]])
            for row in bounds
            if row[2] is not None
        }
    )
    actions = checkpoints.actions(tables, refused)
    bounds = [row for row in bounds if row[0] in tables]
    retained = local_frame(spark, [row for row in retained_rows if row[0] in tables], RETAINED_SCHEMA)
    replays = F.broadcast(local_frame(spark, bounds, _BOUNDS_SCHEMA))
    return FleetMark(retained, _replayed(commits, actions, replays), commits, actions, replays, tables, refused)


def _newest_checkpoint(table: _Table) -> Optional[delta_log.Checkpoint]:
    checkpoints = table.source.listing().checkpoints
    return checkpoints[max(checkpoints)] if checkpoints else None


class _Checkpoints:
    """The checkpoints the fleet reads, in batches (delta_log.read_checkpoints); one that must be
    read alone is read by its table's connector when asked for."""

    def __init__(self, spark: SparkSession):
        self.spark = spark
        self.batches: list[DataFrame] = []  # (key, version, *ACTION_SCHEMA)
        self.batched: set[tuple[str, int]] = set()
        self.alone: set[tuple[str, int]] = set()
        self.tops: dict[tuple[str, int], Row] = {}  # each batched checkpoint's metaData and protocol

    def read(self, wanted: dict[str, tuple[_Table, delta_log.Checkpoint]]) -> None:
        """Read the checkpoints of `wanted` (by repository) not read yet, in one batch."""
        new = {name: pair for name, pair in wanted.items() if (name, pair[1].version) not in self.batched | self.alone}
        if not new:
            return
        listings = {name: (table.source.listing(), checkpoint) for name, (table, checkpoint) in new.items()}
        try:
            frame, alone = delta_log.read_checkpoints(self.spark, listings)
        except Exception:  # noqa: BLE001 - an unreadable part: each is read alone, and refuses alone
            self.alone |= {(name, pair[1].version) for name, pair in new.items()}
            return
        self.alone |= {(name, new[name][1].version) for name in alone}
        self.batched |= {(name, pair[1].version) for name, pair in new.items() if name not in alone}
        self.batches.append(frame)
        top = frame.groupBy("key", "version").agg(
            F.first("metaData", ignorenulls=True).alias("metaData"),
            F.first("protocol", ignorenulls=True).alias("protocol"),
        )
        self.tops.update({(row["key"], row["version"]): row for row in top.collect()})

    def of(self, table: _Table, checkpoint: delta_log.Checkpoint) -> DataFrame:
        """One table's checkpoint: its rows of a batch, or read alone."""
        if (table.repo.name, checkpoint.version) in self.batched:
            rows = reduce(DataFrame.unionByName, self.batches).filter(
                (F.col("key") == table.repo.name) & (F.col("version") == checkpoint.version)
            )
            return rows.drop("key")
        return table.source.checkpoint(self.spark, checkpoint)

    def top(self, table: _Table, checkpoint: delta_log.Checkpoint) -> tuple[Optional[Row], Optional[Row]]:
        """(metaData, protocol) of a table's checkpoint: collected with its batch, else read alone."""
        key = (table.repo.name, checkpoint.version)
        if key in self.tops:
            return self.tops[key]["metaData"], self.tops[key]["protocol"]
        actions = self.of(table, checkpoint)
        meta = actions.filter(F.col("metaData").isNotNull()).select("metaData").limit(1).collect()
        protocol = actions.filter(F.col("protocol").isNotNull()).select("protocol").limit(1).collect()
        return (meta[0]["metaData"] if meta else None), (protocol[0]["protocol"] if protocol else None)

    def actions(self, tables: dict[str, _Table], refused: dict[str, str]) -> DataFrame:
        """Every checkpoint read, (repo, version, *ACTION_SCHEMA); a table whose checkpoint read alone
        is refused drops out."""
        frames = [batch.withColumnRenamed("key", REPO) for batch in self.batches]
        for name, version in sorted(self.alone):
            if name not in tables:
                continue
            table = tables[name]
            try:
                frame = table.source.checkpoint(self.spark, table.source.listing().checkpoints[version])
            except Exception as exc:  # noqa: BLE001 - that table's refusal alone
                refused[name] = str(exc)
                del tables[name]
                continue
            frames.append(frame.select(F.lit(name).alias(REPO), *frame.columns))
        if not frames:
            schema = T.StructType([T.StructField(REPO, T.StringType()), T.StructField("version", T.LongType())])
            return local_frame(self.spark, [], T.StructType([*schema.fields, *delta_log.ACTION_SCHEMA.fields]))
        return reduce(DataFrame.unionByName, frames)


def _listed(repos: Sequence[RepositoryConfig], refused: dict[str, str]) -> dict[str, _Table]:
    """Each repository's connector with its log listed; one that cannot be listed is refused."""
    tables = {}
    for repo in repos:
        try:
            source = DeltaSource.from_config(repo)
            delta_log.verify_last_checkpoint(source.listing())
            tables[repo.name] = _Table(repo, source)
        except Exception as exc:  # noqa: BLE001 - a missing or damaged log is this table's refusal
            refused[repo.name] = str(exc)
    return tables


def _parsed_commits(spark: SparkSession, tables: dict[str, _Table], refused: dict[str, str]) -> DataFrame:
    """Every JSON commit of every table, parsed on executors in one pass, with the table's
    repository. When the pass fails (a file cannot be read), each table is parsed alone, and
    one that fails is refused."""
    frames = read_together(partial(_parsed_together, spark), tables, refused, lambda t: t.source.listing().log_uri)
    if not frames:
        raise MarkRefusal("no Delta table could be read")
    return reduce(DataFrame.unionByName, frames)


def _parsed_together(spark: SparkSession, tables: dict[str, _Table]) -> DataFrame:
    by_settings: list[tuple[Any, list[str]]] = []
    owners = []
    for name, table in tables.items():
        listing = table.source.listing()
        files = [listing.commits[v] for v in sorted(listing.commits)]
        owners += [(uri, name) for uri in files]
        for settings, group in by_settings:
            if settings == listing.settings:
                group.extend(files)
                break
        else:
            by_settings.append((listing.settings, files))
    frames = [delta_log.parsed_log_files(spark, files, settings) for settings, files in by_settings]
    if not frames:
        raise MarkRefusal("no Delta table could be listed")
    owner = local_frame(spark, owners, "file string, repo string")
    parsed = reduce(DataFrame.unionByName, frames).join(F.broadcast(owner), "file")
    # Read by the versions' collect and by the replay: parsed once, kept with the executors.
    return parsed.localCheckpoint()


def _versions(commits: DataFrame) -> list[Row]:
    """Per (repository, version): the times version_graph reads, the version's metaData and
    protocol, and its first broken line (delta_log.broken_line: the table is refused)."""
    broken = F.when(delta_log.broken_line(), F.struct("line_no", "file", "error", "add", "remove", "cdc"))
    return (
        commits.groupBy(REPO, "version")
        .agg(
            F.max("commitInfo.inCommitTimestamp").alias("in_commit"),
            F.max("commitInfo.timestamp").alias("commit_info"),
            F.max("file_mtime").alias("file_mtime"),
            F.max_by("metaData", F.when(F.col("metaData").isNotNull(), F.col("line_no"))).alias("metaData"),
            F.max_by("protocol", F.when(F.col("protocol").isNotNull(), F.col("line_no"))).alias("protocol"),
            F.min(broken).alias("broken"),
        )
        .collect()
    )


def _judged(
    spark: SparkSession, table: _Table, as_of: dt.datetime, checkpoints: _Checkpoints
) -> tuple[list[tuple[Any, ...]], Optional[tuple[int, delta_log.Bound, Optional[delta_log.Checkpoint]]]]:
    """One table's retained-commit rows and, when it retains any version, the oldest (v0), the
    tombstone bound and v0's base checkpoint: DeltaSource's rules, on what was collected."""
    listing = table.source.listing()
    broken = [row["broken"] for _, row in sorted(table.versions.items()) if row["broken"] is not None]
    if broken:
        raise delta_log.DeltaLogError(
            f"commit {broken[0]['file']} line {broken[0]['line_no']}: {delta_log.broken_line_error(broken[0])}"
        )
    table.partition_columns, table.configuration = _metadata(table, checkpoints)
    configuration = table.configuration
    times = {version: row for version, row in table.versions.items() if version >= listing.start}
    commits, refs = version_graph(listing, times, lambda checkpoint: checkpoint_written(spark, checkpoint))
    verdicts = retention.evaluate(commits, refs, table_rules(table.repo, configuration), as_of)
    rows = [(table.repo.name, *row) for row in verdict_rows(commits, refs, verdicts)]
    kept = [c for c in commits if verdicts[c.commit_id].retained]
    if not kept:
        return rows, None
    v0 = min(int(c.commit_id) for c in kept)
    base = listing.checkpoint_at_or_before(v0)
    bound = tombstone_bound(
        listing,
        {int(c.commit_id): c.created_at for c in commits},
        v0,
        Thresholds.of([verdicts[c.commit_id].threshold for c in kept]),
        lambda: checkpoint_written(spark, listing.checkpoints[listing.start]),
        lambda: checkpoint_retention(checkpoints.of(table, base)),  # type: ignore[arg-type]
    )
    return rows, (v0, bound, base)


def _metadata(table: _Table, checkpoints: _Checkpoints) -> tuple[list[str], dict[str, str]]:
    """DeltaSource.metadata from what was collected: the newest metaData and protocol of the
    head's replay (its base checkpoint's, when the commits after it hold none)."""
    listing = table.source.listing()
    base = listing.checkpoint_at_or_before(listing.head)
    first = base.version + 1 if base else 0
    newer = [table.versions[v] for v in sorted(table.versions, reverse=True) if v >= first]
    meta = next((row["metaData"] for row in newer if row["metaData"] is not None), None)
    protocol = next((row["protocol"] for row in newer if row["protocol"] is not None), None)
    if (meta is None or protocol is None) and base is not None:
        base_meta, base_protocol = checkpoints.top(table, base)
        meta, protocol = meta or base_meta, protocol or base_protocol
    if meta is None:
        raise delta_log.DeltaLogError(f"{listing.log_uri}: no metaData action up to version {listing.head}")
    return table_metadata(
        listing.log_uri, meta["partitionColumns"], meta["configuration"], protocol.asDict() if protocol else None
    )


def _replay(commits: DataFrame, checkpoints: DataFrame, replays: DataFrame) -> tuple[DataFrame, DataFrame, DataFrame]:
    """Each table's actions with its replay's bounds (replays' columns): all its commits, those
    its replay runs on (the commits after its base checkpoint) and its base checkpoint's."""
    judged = commits.join(replays, REPO)
    replayed = judged.filter(F.col("version") > F.coalesce(F.col("base"), F.lit(-1)))
    base = checkpoints.join(replays, REPO).filter(F.col("version") == F.col("base"))
    return judged, replayed, base


def _replayed(commits: DataFrame, checkpoints: DataFrame, replays: DataFrame) -> DataFrame:
    """DeltaSource.live_entries of every table at once: snapshot(v0) ∪ files added after v0 ∪
    files tombstoned after the bound, each table with its own v0, base checkpoint and bound."""
    judged, replayed, base = _replay(commits, checkpoints, replays)
    events = delta_log.file_events(replayed, REPO, "v0").unionByName(delta_log.file_events(base, REPO, "v0"))
    tombstones = delta_log.tombstoned_files(judged, None, REPO).unionByName(
        delta_log.tombstoned_files(base, None, REPO)
    )
    cdc_later = delta_log.cdc_files(replayed, REPO, "v0").filter(F.col("version") > F.col("v0")).drop("v0")
    live = delta_log.live_files(events, cdc_later, F.col("v0"), REPO)
    entries = live.unionByName(tombstones.select(REPO, "address", "size", F.lit(False).alias("at_head")))
    # Replayed once and kept with the executors: the candidates, the live set and the guards'
    # plain-Python recomputation all read it.
    return entries.select(
        REPO,
        "address",
        F.col("size").cast("long").alias("size"),
        F.lit("committed").alias("source"),
        F.coalesce("at_head", F.lit(False)).alias("at_head"),
    ).localCheckpoint()


def commits_referencing(fleet: FleetMark, retained: DataFrame, missing: DataFrame) -> DataFrame:
    """DeltaSource.commits_referencing of every table of `missing` (repo, address) at once:
    (repo, address, commit_id) of its retained versions (`retained`, RETAINED_SCHEMA) whose
    snapshot holds the file, from the commits the mark parsed (only those of the tables asked about)."""
    asked = fleet.replays.join(F.broadcast(missing.select(REPO).distinct()), REPO, "left_semi")
    _, replayed, base = _replay(fleet.commits, fleet.checkpoints, F.broadcast(asked))
    carried = (REPO, "v0", "head")
    events = delta_log.file_events(replayed, *carried).unionByName(delta_log.file_events(base, *carried))
    holding = delta_log.commits_holding(events, missing, F.col("v0"), F.col("head"), REPO)
    kept = retained.filter("retained").select(REPO, "commit_id")
    return holding.join(kept, [REPO, "commit_id"]).select(REPO, "address", "commit_id").distinct()


def _committed(spark: SparkSession, fleet: FleetMark) -> DataFrame:
    """DeltaSource.committed_addresses of every table: every file its commits and its newest checkpoint name."""
    marked = F.broadcast(local_frame(spark, [(n,) for n in fleet.tables], "repo string"))
    commits = fleet.commits.join(marked, REPO)
    newest = [
        (name, max(t.source.listing().checkpoints))
        for name, t in fleet.tables.items()
        if t.source.listing().checkpoints
    ]
    checkpoints = fleet.checkpoints.join(
        F.broadcast(local_frame(spark, newest, "repo string, version long")), [REPO, "version"]
    )
    events = delta_log.file_events(commits, REPO).unionByName(delta_log.file_events(checkpoints, REPO))
    named = delta_log.physical_files(events, REPO).unionByName(
        delta_log.cdc_files(commits, REPO).select("address", "size", REPO)
    )
    return named.select(REPO, "address").distinct()
