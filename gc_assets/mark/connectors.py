"""Repositories whose format has no set reader of its own in mark/ (lakeFS, native and export;
file catalogs) in a set's mark (mark.sets, docs/design.md §6.8): the repositories of each
connector are read together, through its commit_graphs, live_entries_together and
check_inventories, so a connector that reads many at once (the lakeFS export, the file catalog)
costs the set the same Spark jobs for two repositories or twenty; one that does not (native
lakeFS) reads each as its own run would. The frames take the repository as a column. Everything
after the mark (one live set across repositories, candidates, guards, receipts and the sweep) is
then the set's. A repository whose mark is refused fails alone, named.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from functools import partial, reduce
from typing import Any, Callable, Mapping, Sequence, TypeVar, Union

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core import retention
from gc_assets.core.config import RepositoryConfig
from gc_assets.core.names import REPO
from gc_assets.core.retention import Retention
from gc_assets.core.spark import local_frame, task_error
from gc_assets.mark.retained import judged, verdict_rows
from gc_assets.mark.sets import RETAINED_SCHEMA, SetMark, TableRules, read_together
from gc_assets.sources import RepositorySource, source_for
from gc_assets.sources.base import LIVE_SCHEMA, WITNESS_OF_MANY, Graph, LiveRead


@dataclass
class _Repository:
    repo: RepositoryConfig
    source: RepositorySource
    verdicts: dict[str, Retention]
    retained: list[str]  # the retained commits
    heads: list[str]  # the commits refs point at
    counters: dict[str, int]  # source.state_columns()


@dataclass
class ConnectorMark(SetMark):
    """The mark of every repository its connector could mark, and why each other one was refused."""

    retained: DataFrame
    live: DataFrame
    marked: dict[str, _Repository]
    refused: dict[str, str] = field(default_factory=dict)

    @property
    def repos(self) -> dict[str, RepositoryConfig]:
        return {name: one.repo for name, one in self.marked.items()}

    def rules(self, spark: SparkSession, name: str) -> TableRules:
        return TableRules.of(spark, self.marked[name].source, self.marked[name].repo)

    def counters(self, name: str) -> dict[str, int]:
        return self.marked[name].counters

    def inventory_refusals(self, spark: SparkSession, inventory: DataFrame) -> dict[str, str]:
        refused = {}
        for connector, group in _by_connector({name: one.source for name, one in self.marked.items()}).items():
            checked = together_or_each(partial(connector.check_inventories, spark, inventory=inventory), group)
            refused |= {name: task_error(why) if isinstance(why, Exception) else why for name, why in checked.items()}
        return refused

    def committed(self, spark: SparkSession) -> DataFrame:
        frames = [
            one.source.committed_addresses(spark).select(F.lit(name).alias(REPO), "address")
            for name, one in self.marked.items()
        ]
        return reduce(DataFrame.unionByName, frames, local_frame(spark, [], f"{REPO} string, address string"))

    def commits_referencing(self, retained: DataFrame, missing: DataFrame) -> DataFrame:
        """Each asked repository's own connector's answer: asked only about live objects missing
        from storage, which are few."""
        spark = missing.sparkSession
        asked = [row[REPO] for row in missing.select(REPO).distinct().collect() if row[REPO] in self.marked]
        frames = [
            self.marked[name]
            .source.commits_referencing(
                spark,
                retained.filter((F.col(REPO) == name) & F.col("retained")).select("commit_id", "threshold"),
                missing.filter(F.col(REPO) == name).select("address"),
            )
            .select(F.lit(name).alias(REPO), "address", "commit_id")
            for name in asked
        ]
        empty = local_frame(spark, [], f"{REPO} string, address string, commit_id string")
        return reduce(DataFrame.unionByName, frames, empty)

    def witness(self, spark: SparkSession, reads: Sequence[tuple[str, str, str]]) -> DataFrame:
        """What each reader's heads need, by its connector's witness_heads (sharing no code with
        its live entries), the readers of each connector read together, as rows of each
        repository the reader reaches into."""
        heads: dict[str, set[str]] = {}
        reach: set[tuple[str, str]] = set()
        for repo, reader, head in reads:
            heads.setdefault(reader, set()).add(head)
            reach.add((reader, repo))
        sources = {reader: self.marked[reader].source for reader in heads}
        frames = [
            connector.witness_heads_together(
                spark, {reader: (sources[reader], sorted(heads[reader])) for reader in group}
            )
            for connector, group in _by_connector(sources).items()
        ]
        needed = reduce(DataFrame.unionByName, frames, local_frame(spark, [], WITNESS_OF_MANY))
        readers = local_frame(spark, sorted(reach), "reader string, reached string")
        return needed.join(readers, needed[REPO] == readers["reader"]).select(
            F.col("reached").alias(REPO),
            F.concat(F.col("reader"), F.lit("@"), "commit_id").alias("commit_id"),
            "address",
        )


def mark_tables(spark: SparkSession, repos: Sequence[RepositoryConfig], as_of: dt.datetime) -> ConnectorMark:
    """The retained commits and live entries of every repository of `repos` as of `as_of`, the
    repositories of each connector read together (its commit_graphs, its live_entries_together)."""
    refused: dict[str, str] = {}
    sources: dict[str, RepositorySource] = {}
    for repo in repos:
        try:
            sources[repo.name] = source_for(repo)
        except Exception as exc:  # noqa: BLE001 - a repository without a connector fails alone
            refused[repo.name] = str(exc)
    graphs = commit_graphs_of(spark, sources)
    marked: dict[str, _Repository] = {}
    retained_rows: list[tuple[Any, ...]] = []
    for repo in repos:
        if repo.name not in sources:
            continue
        source = sources[repo.name]
        try:
            graph = graphs[repo.name]
            if isinstance(graph, Exception):
                raise graph
            commits, refs, verdicts = judged(spark, source, repo, as_of, graph)
        except ValueError as exc:  # SourceError, MarkRefusal, GraphError: named by the connector
            refused[repo.name] = str(exc)
            continue
        except Exception as exc:  # noqa: BLE001 - a repository that cannot be read fails alone
            refused[repo.name] = f"repository {repo.name!r}: cannot be read: {task_error(exc)}"
            continue
        retained_rows += [(repo.name, *row) for row in verdict_rows(commits, refs, verdicts)]
        kept = [commit_id for commit_id, verdict in verdicts.items() if verdict.retained]
        heads = sorted(retention.ref_heads(refs))
        marked[repo.name] = _Repository(repo, source, verdicts, kept, heads, source.state_columns())
    frames = read_together(partial(_read_live, spark), marked, refused, lambda one: f"repository {one.repo.name!r}")
    live = reduce(DataFrame.unionByName, frames, local_frame(spark, [], LIVE_SCHEMA))
    retained = local_frame(spark, [row for row in retained_rows if row[0] in marked], RETAINED_SCHEMA)
    return ConnectorMark(_with_counters(retained, marked), live, marked, refused)


def commit_graphs_of(spark: SparkSession, sources: dict[str, RepositorySource]) -> dict[str, Graph]:
    """Each repository's commit graph, or why it cannot be read: the repositories of each
    connector read together (its commit_graphs), each alone when that read fails."""
    graphs: dict[str, Graph] = {}
    for connector, group in _by_connector(sources).items():
        graphs.update(together_or_each(partial(connector.commit_graphs, spark), group))
    return graphs


def live_entries_of(spark: SparkSession, reads: dict[str, LiveRead]) -> DataFrame:
    """LIVE_SCHEMA rows of every repository of `reads`, each connector's read together
    (its live_entries_together): lazy, so a read that fails fails where the frame is used."""
    frames = [
        connector.live_entries_together(spark, {name: reads[name] for name in group})
        for connector, group in _by_connector({name: read.source for name, read in reads.items()}).items()
    ]
    return reduce(DataFrame.unionByName, frames, local_frame(spark, [], LIVE_SCHEMA))


Asked = TypeVar("Asked")
Answer = TypeVar("Answer")


def together_or_each(
    ask: Callable[[dict[str, Asked]], Mapping[str, Answer]], asked: dict[str, Asked]
) -> dict[str, Union[Answer, Exception]]:
    """`ask(asked)` of all repositories at once; when that fails (a file or a database that cannot
    be read fails the one Spark job of all), each asked alone, and one that fails answers its error."""
    try:
        return dict(ask(asked))
    except Exception as exc:  # noqa: BLE001 - find the repository at fault
        if len(asked) == 1:
            return {name: exc for name in asked}
    answers: dict[str, Union[Answer, Exception]] = {}
    for name, one in asked.items():
        answers |= together_or_each(ask, {name: one})
    return answers


def _by_connector(sources: dict[str, RepositorySource]) -> dict[type[RepositorySource], dict[str, RepositorySource]]:
    """`sources` grouped by connector, each group read together."""
    groups: dict[type[RepositorySource], dict[str, RepositorySource]] = {}
    for name, source in sources.items():
        groups.setdefault(type(source), {})[name] = source
    return groups


def stored_mark(spark: SparkSession, repo: RepositoryConfig, retained: DataFrame) -> ConnectorMark:
    """The mark an earlier run stored for `repo` (its retained_commits frame, with `repo`), read
    back by its connector: the verdicts and heads as stored, not judged again now, and the live
    entries of those retained commits as its connector reads them. A sweep of a stored mark is
    judged on it, so a commit since the mark is the sweep's re-validation to see, not a refusal."""
    rows = retained.filter(F.col("retained") | F.col("ref_head")).collect()
    verdicts = {
        row["commit_id"]: Retention(True, row["retained_by"], row["threshold"]) for row in rows if row["retained"]
    }
    heads = sorted(row["commit_id"] for row in rows if row["ref_head"])
    source = source_for(repo)
    marked = {repo.name: _Repository(repo, source, verdicts, sorted(verdicts), heads, {})}
    return ConnectorMark(retained, _read_live(spark, marked), marked)


def _with_counters(retained: DataFrame, marked: dict[str, _Repository]) -> DataFrame:
    """`retained` with each repository's state counters as long columns (null where it has none),
    as its own run's retained_commits has them."""
    columns = sorted({column for one in marked.values() for column in one.counters})
    if not columns:  # Spark Connect refuses withColumns of nothing
        return retained

    def by_repo(column: str) -> Column:
        pairs = [
            F.lit(x) for name, one in marked.items() if column in one.counters for x in (name, one.counters[column])
        ]
        return F.create_map(*pairs)[F.col(REPO)].cast("long")

    return retained.withColumns({column: by_repo(column) for column in columns})


def _read_live(spark: SparkSession, marked: dict[str, _Repository]) -> DataFrame:
    """Every repository's live entries, each connector's read together, kept with the executors."""
    reads = {name: LiveRead(one.source, one.verdicts, one.retained, one.heads) for name, one in marked.items()}
    return live_entries_of(spark, reads).localCheckpoint()
