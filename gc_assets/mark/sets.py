"""Many repositories marked at once, the repository a column, whatever their format (docs/design.md §6.2, §9).

Each format marks its tables in one set of Spark jobs (mark.delta_tables, mark.iceberg_tables)
and hands over the same frames: retained commits and live entries with `repo`, every address
its commits ever named, and readers for the guards. Everything after that is judged here once
for all of them: one live set across repositories (what any table of the set names in another's
namespace is live there, whatever either's format), each table's cutoffs and protected keys,
and the candidates of every table in one query (mark.candidates.orphans_each).
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import partial, reduce
from typing import Callable, Sequence, TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core import time
from gc_assets.core.addresses import is_absolute_address, with_relative_keys
from gc_assets.core.config import GcConfig, RepositoryConfig
from gc_assets.core.names import REPO
from gc_assets.core.spark import beside_task_count, local_frame, one_of, task_error
from gc_assets.mark.candidates import Judgement, orphans_each
from gc_assets.mark.live import deduplicated, outside_folders, outside_refusal
from gc_assets.mark.partition import GcPartition
from gc_assets.mark.retained import RETENTION_SCHEMA
from gc_assets.mark.shared import Referrers, record_outside_references
from gc_assets.sources.base import RepositorySource

RETAINED_SCHEMA = T.StructType([T.StructField(REPO, T.StringType(), False), *RETENTION_SCHEMA.fields])
# (repo, commit_id, address): what a ref head needs, read by the format's reference reader
WITNESS_SCHEMA = T.StructType([T.StructField(c, T.StringType(), False) for c in (REPO, "commit_id", "address")])


Table = TypeVar("Table")


def read_together(
    read: Callable[[dict[str, Table]], DataFrame],
    tables: dict[str, Table],
    refused: dict[str, str],
    source_of: Callable[[Table], str],
) -> list[DataFrame]:
    """`read(tables)` in one pass; when that pass fails (a file cannot be read), each table read
    alone, and one that fails is refused, naming `source_of` it, and leaves `tables`."""
    try:
        return [read(tables)]
    except Exception:  # noqa: BLE001 - find the table(s) at fault
        frames = []
        for name, table in list(tables.items()):
            try:
                frames.append(read({name: table}))
            except Exception as exc:  # noqa: BLE001 - this table's refusal alone
                refused[name] = f"{source_of(table)}: cannot be read: {task_error(exc)}"
                del tables[name]
        return frames


@dataclass(frozen=True)
class TableRules:
    """What a marked table's candidates are judged by besides its live set: its format's own rules."""

    format_prefixes: tuple[str, ...]  # never collected (Delta's `_delta_log/`)
    patterns: tuple[str, ...]  # keys never collected (hidden paths)
    collects_untracked: bool
    untracked_min_age: dt.timedelta  # the format's window for writers in flight
    source_time: dt.datetime  # when the state the mark read was current

    @classmethod
    def of(cls, spark: SparkSession, source: RepositorySource, repo: RepositoryConfig) -> "TableRules":
        """The rules `source`, `repo`'s connector, judges it by alone."""
        return cls(
            source.protected_prefixes,
            source.protected_patterns,
            source.collects_untracked,
            source.untracked_min_age(spark, repo),
            source.source_time(spark),
        )


class SetMark(ABC):
    """The mark of many tables of one format, or of several (Marks): every frame carries `repo`."""

    retained: DataFrame  # RETAINED_SCHEMA
    live: DataFrame  # LIVE_SCHEMA, as each table's format spells its addresses
    refused: dict[str, str]  # repository -> why its mark was refused

    @property
    @abstractmethod
    def repos(self) -> dict[str, RepositoryConfig]:
        """The tables marked."""

    @abstractmethod
    def rules(self, spark: SparkSession, name: str) -> TableRules:
        """Table `name`'s format rules, as its connector alone has them."""

    @abstractmethod
    def committed(self, spark: SparkSession) -> DataFrame:
        """(repo, address) of every address each table's commits ever named: expired versus untracked."""

    @abstractmethod
    def commits_referencing(self, retained: DataFrame, missing: DataFrame) -> DataFrame:
        """(repo, address, commit_id) of the retained commits (`retained`, RETAINED_SCHEMA) of each
        table of `missing` (repo, address: relative keys) that name its addresses."""

    @abstractmethod
    def witness(self, spark: SparkSession, reads: Sequence[tuple[str, str, str]]) -> DataFrame:
        """WITNESS_SCHEMA of each (repo, reader, head) of `reads`: what table `reader`'s `head` needs,
        read by its format's reference reader (sharing no code with the mark), as rows of `repo`
        whose commit_id is `reader@head`."""

    def counters(self, name: str) -> dict[str, int]:
        """Table `name`'s state counters (RepositorySource.state_columns: a file catalog's rows),
        columns of its rows of `retained` as well."""
        return {}

    def inventory_refusals(self, spark: SparkSession, inventory: DataFrame) -> dict[str, str]:
        """Why each table whose listing (`inventory`, with `repo`) contradicts its source is
        refused (RepositorySource.check_inventory)."""
        return {}


class Marks(SetMark):
    """The marks of several formats as one."""

    def __init__(self, parts: Sequence[SetMark]):
        self.parts = list(parts)
        self.retained = reduce(partial(DataFrame.unionByName, allowMissingColumns=True), [p.retained for p in parts])
        self.live = reduce(DataFrame.unionByName, [part.live for part in parts])
        self.refused = {name: why for part in parts for name, why in part.refused.items()}
        self.owner = {name: part for part in parts for name in part.repos}

    @property
    def repos(self) -> dict[str, RepositoryConfig]:
        return {name: repo for part in self.parts for name, repo in part.repos.items()}

    def rules(self, spark: SparkSession, name: str) -> TableRules:
        return self.owner[name].rules(spark, name)

    def committed(self, spark: SparkSession) -> DataFrame:
        return reduce(DataFrame.unionByName, [part.committed(spark) for part in self.parts])

    def commits_referencing(self, retained: DataFrame, missing: DataFrame) -> DataFrame:
        return reduce(DataFrame.unionByName, [part.commits_referencing(retained, missing) for part in self.parts])

    def witness(self, spark: SparkSession, reads: Sequence[tuple[str, str, str]]) -> DataFrame:
        frames = [part.witness(spark, [r for r in reads if self.owner[r[1]] is part]) for part in self.parts]
        return reduce(DataFrame.unionByName, frames)

    def counters(self, name: str) -> dict[str, int]:
        return self.owner[name].counters(name)

    def inventory_refusals(self, spark: SparkSession, inventory: DataFrame) -> dict[str, str]:
        return {name: why for part in self.parts for name, why in part.inventory_refusals(spark, inventory).items()}


@dataclass
class SetCandidates:
    """What the sweep phase of every marked table is judged on, the repository a column."""

    frame: DataFrame  # (repo, address, size, last_modified, reason)
    live: DataFrame  # (repo, *live_files' columns): one row per key, as mark.live makes it alone
    judgements: dict[str, Judgement]  # each table's cutoffs and protected keys
    source_times: dict[str, dt.datetime]  # each table's mark source_time
    untracked_windows: dict[str, dt.timedelta]  # each table's format window for writers in flight
    refused: dict[str, str]  # repository -> why its candidates were not decided


def candidates_of(
    spark: SparkSession,
    lake: GcConfig,
    marked: SetMark,
    as_of: dt.datetime,
    mark_time: dt.datetime,
    inventory: DataFrame,
    held: DataFrame,
    names: Sequence[str],
) -> SetCandidates:
    """The candidates of each marked table of `names` (mark.candidates.orphans_each, with each table's cutoffs and
    protected keys as mark.candidates.bounds makes them; what its referrers' retained versions
    need is live in it, as mark.shared makes it) and the tables refused now: those whose live
    set names an address outside their namespace and every external prefix (mark.live), and
    those a repository reaches into whose live set this set did not read. Any other marked
    table is a referrer of theirs, marked only for what it needs in their namespaces."""
    repos = marked.repos
    namespaces = {name: repo.storage_namespace for name, repo in repos.items()}
    externals = {name: repo.external_prefixes for name, repo in repos.items()}
    # Read three times (the outside folders, the candidates, the live set): keyed once.
    own = with_relative_keys(
        marked.live.withColumn("needed_by", F.lit(None).cast("string")), namespaces, externals
    ).localCheckpoint()
    outside = _outside_recorded(lake, repos, own, as_of)
    referrers = Referrers.read(lake)  # after this mark's own findings are recorded: they count now
    judged = {name: repos[name] for name in names if name in repos}
    refused = _unread_referrers(referrers, marked, judged) | _outside_refusals(
        spark, marked, own, {name: outside[name] for name in judged}
    )
    keyed = own.unionByName(with_relative_keys(_borrowed(spark, referrers, marked), namespaces, externals))
    judgements, source_times, windows = {}, {}, {}
    for name, repo in judged.items():
        if name in refused:
            continue
        rules = marked.rules(spark, name)
        source_times[name], windows[name] = rules.source_time, rules.untracked_min_age
        knowledge = time.knowledge_time(as_of, mark_time, rules.source_time)
        partition = GcPartition(lake, repo, as_of.date(), as_of)
        judgements[name] = Judgement(
            name,
            time.candidate_cutoff(knowledge, repo),
            time.untracked_cutoff(knowledge, repo, rules.untracked_min_age),
            rules.collects_untracked,
            partition.protected_prefixes(rules.format_prefixes),
            rules.patterns,
        )
    committed = with_relative_keys(marked.committed(spark), namespaces, externals)
    found = orphans_each(inventory, keyed, committed, list(judgements.values()), held)
    live = deduplicated(keyed, by=(REPO, "address"))
    return SetCandidates(found, live, judgements, source_times, windows, refused)


def _outside_recorded(
    lake: GcConfig, repos: dict[str, RepositoryConfig], keyed: DataFrame, as_of: dt.datetime
) -> dict[str, dict[str, str]]:
    """Each marked table's live folders outside its namespace and every external prefix (with
    an address each), recorded as mark.live records them: a table that names objects of
    another configured table is its referrer there, declared or not (mark.shared)."""
    outside: dict[str, dict[str, str]] = {name: {} for name in repos}
    for row in outside_folders(keyed, REPO):
        outside[row[REPO]][row["folder"]] = row["spelled"]
    record_outside_references(lake, as_of, outside)
    return outside


def _outside_refusals(
    spark: SparkSession, marked: SetMark, keyed: DataFrame, outside: dict[str, dict[str, str]]
) -> dict[str, str]:
    """Why each table whose live set names addresses outside its namespace and every external
    prefix is refused (mark.live.outside_refusal, as its mark alone says it): how many, one of
    them, and the retained commits naming it."""
    found = {name: min(folders.values()) for name, folders in outside.items() if folders}
    if not found:
        return {}
    counts = {
        row[REPO]: row["count"]
        for row in keyed.filter(~F.col("in_namespace") & ~F.col("external") & one_of(REPO, list(found)))
        .select(REPO, "address")
        .distinct()
        .groupBy(REPO)
        .count()
        .collect()
    }
    examples = local_frame(spark, sorted(found.items()), f"{REPO} string, address string")
    try:
        rows = marked.commits_referencing(marked.retained, examples).collect()
    except Exception:  # noqa: BLE001 - naming the commits is a courtesy; the refusal stands either way
        rows = []
    holders: dict[str, set[str]] = {}
    for row in rows:
        holders.setdefault(row[REPO], set()).add(row["commit_id"])
    return {
        name: outside_refusal(marked.repos[name], counts.get(name, 1), example, sorted(holders.get(name, ())))
        for name, example in found.items()
    }


def _unread_referrers(referrers: Referrers, marked: SetMark, judged: dict[str, RepositoryConfig]) -> dict[str, str]:
    """Tables of `judged` that another repository reaches into (its external_prefixes, mark.shared)
    while that repository's live set is not in this set: what it needs there is unknown."""
    refused = {}
    repos = marked.repos
    for name in judged:
        unread = [other.name for other in referrers.of(name) if other.name not in repos]
        if unread:
            why = "; ".join(f"{other}: {marked.refused.get(other, 'not a table of this run')}" for other in unread)
            refused[name] = (
                f"repository {name!r}: repositories {unread} reference objects in its namespace (their "
                f"external_prefixes reach here), and what their retained versions need was not read ({why})"
            )
    return refused


def _borrowed(spark: SparkSession, referrers: Referrers, marked: SetMark) -> DataFrame:
    """What each table's referrers keep live, as rows of that table (`repo`) naming the referrer
    (`needed_by`): their absolute addresses, of which with_relative_keys keeps those inside the
    table's namespace, live there as mark.shared makes them for a table marked alone."""
    repos = marked.repos
    pairs = [(o.name, name) for name in repos for o in referrers.of(name) if o.name in repos]
    reaching = F.broadcast(local_frame(spark, pairs, "needed_by string, needed_in string"))
    live = marked.live
    absolute = live.filter(is_absolute_address(F.col("address"))).withColumnRenamed(REPO, "needed_by")
    return absolute.join(reaching, "needed_by").select(
        F.col("needed_in").alias(REPO), *[c for c in live.columns if c != REPO], "needed_by"
    )


def raw_entries(spark: SparkSession, referrers: Referrers, marked: SetMark) -> DataFrame:
    """(repo, address) of every entry each table's retained versions name, and of what the tables
    reaching into its namespace name by absolute address, as their formats spell them: what
    core.guards.candidates_not_live_each turns into keys on its own."""
    return marked.live.select(REPO, "address").unionByName(_borrowed(spark, referrers, marked).select(REPO, "address"))


def witness_heads(spark: SparkSession, referrers: Referrers, marked: SetMark, names: Sequence[str]) -> DataFrame:
    """(repo, commit_id, address) of the head of each table of `names` and of every table of this
    set reaching into its namespace, read by each one's format's reference reader (delta-rs,
    pyiceberg): the set's independent witness, sharing no code with the mark."""
    heads: dict[str, list[str]] = {}
    for row in marked.retained.filter("ref_head").select(REPO, "commit_id").collect():
        heads.setdefault(row[REPO], []).append(row["commit_id"])
    repos = marked.repos
    reads = [
        (name, reader, head)
        for name in names
        for reader in [name, *[o.name for o in referrers.of(name) if o.name in repos]]
        for head in heads.get(reader, [])
    ]
    # A background job (sweep.together): on half the cores, whatever formats the set mixes.
    return marked.witness(spark, reads).coalesce(beside_task_count(spark, len(reads)))
