"""Many namespaces listed, probed and acted on in one Spark job each, the repository a column: a
set's tables are many and small, so each task takes whole namespaces (Store.reader) instead of
one job per namespace, and the jobs do not grow with the tables. Readers with equal connections
(the same S3 endpoint and credentials) share one client in a task.

Each listed object carries the version an action must name (`version_id`: a versioned S3
bucket's current version as listed, null elsewhere), and every delete or move of a row with one
acts on exactly that version, as the store's own run does (docs/STORES.md)."""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator, Optional

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core.names import REPO
from gc_assets.core.spark import local_frame, shuffle_partitions, task_count
from gc_assets.stores.base import (
    ACTION_SCHEMA,
    DELETE_BATCH_SIZE,
    EXISTS_SCHEMA,
    INVENTORY_SCHEMA,
    VERSION_ID,
    NamespaceReader,
    Store,
    rows_to_frame,
    with_version_id,
)

BATCH_ROWS = 10_000
REPO_FIELD = T.StructField(REPO, T.StringType(), False)
FLEET_INVENTORY_SCHEMA = T.StructType([REPO_FIELD, *INVENTORY_SCHEMA.fields, VERSION_ID])
FLEET_EXISTS_SCHEMA = T.StructType([REPO_FIELD, *EXISTS_SCHEMA.fields])
FLEET_ACTION_SCHEMA = T.StructType([REPO_FIELD, *ACTION_SCHEMA.fields, VERSION_ID])


class _Clients:
    """One client per distinct connection, made when a task first needs it."""

    def __init__(self, readers: dict[str, NamespaceReader], connections: dict[str, int]):
        self.readers, self.connections, self.made = readers, connections, {}

    def of(self, repo: str) -> Any:
        connection = self.connections[repo]
        if connection not in self.made:
            self.made[connection] = self.readers[repo].connect()
        return self.made[connection]


def _connections(readers: dict[str, NamespaceReader]) -> dict[str, int]:
    """Each repository's connection, numbered: equal connections (compared on the driver) share a number."""
    distinct: list[Any] = []
    numbered = {}
    for repo, reader in readers.items():
        connection = reader.connection()
        if connection not in distinct:
            distinct.append(connection)
        numbered[repo] = distinct.index(connection)
    return numbered


def list_many(spark: SparkSession, stores: dict[str, Store]) -> DataFrame:
    """Every object of many namespaces in one listing, with the repository (the key of `stores`)
    it lies in and its listed version, in FLEET_INVENTORY_SCHEMA."""
    readers = {repo: store.reader() for repo, store in stores.items()}
    connections = _connections(readers)

    def list_namespaces(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        clients = _Clients(readers, connections)
        rows = (
            (repo, version, *row)
            for frame in frames
            for repo in frame[REPO]
            for version, row in readers[repo].listed_versions(clients.of(repo))
        )
        while batch := list(itertools.islice(rows, BATCH_ROWS)):  # small namespaces leave together
            yield rows_to_frame(batch, (REPO, "version_id"))[FLEET_INVENTORY_SCHEMA.names]

    namespaces = local_frame(spark, [(repo,) for repo in readers], f"{REPO} string")
    return namespaces.repartition(task_count(spark, len(readers))).mapInPandas(list_namespaces, FLEET_INVENTORY_SCHEMA)


def exists_many(stores: dict[str, Store], addresses: DataFrame) -> DataFrame:
    """Whether each (repo, address) exists in its repository's namespace, in FLEET_EXISTS_SCHEMA;
    a task fails when an answer is unknown (never `exists = False` for it)."""
    readers = {repo: store.reader() for repo, store in stores.items()}
    connections = _connections(readers)

    def check(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        clients = _Clients(readers, connections)
        for frame in frames:
            answers = [
                pd.DataFrame({REPO: repo, "address": keys, "exists": readers[repo].present(clients.of(repo), keys)})
                for repo, keys in frame.groupby(REPO, sort=False)["address"].agg(list).items()
            ]
            if answers:
                yield pd.concat(answers, ignore_index=True)

    return addresses.select(REPO, "address").mapInPandas(check, FLEET_EXISTS_SCHEMA)


def listed_under(inventory: DataFrame, prefix: str) -> dict[str, list[str]]:
    """Each repository's listed keys under `prefix` (its small records: holds, trash runs), collected."""
    keys: dict[str, list[str]] = {}
    for row in inventory.filter(F.col("address").startswith(prefix)).select(REPO, "address").collect():
        keys.setdefault(row[REPO], []).append(row["address"])
    return keys


def delete_many(spark: SparkSession, stores: dict[str, Store], candidates: DataFrame) -> DataFrame:
    """Delete each (repo, address) in its repository's namespace, unchanged since its listed
    `last_modified` and `size` (Store.delete's rules), and its listed `version_id` where it has
    one, in FLEET_ACTION_SCHEMA: one job for every namespace."""

    def act(reader: NamespaceReader, client: Any, frame: pd.DataFrame) -> list[tuple[Any, ...]]:
        keys, mtimes, sizes = list(frame["address"]), list(frame["mtime_us"]), list(frame["size"])
        versions = _listed_versions(frame)
        if versions is None:
            return [(*row, None) for row in reader.deleted(client, keys, mtimes, sizes)]
        return reader.deleted_versions(client, keys, mtimes, sizes, versions)

    columns = [REPO, "address", F.unix_micros("last_modified").alias("mtime_us"), "size", "version_id"]
    return _acting(spark, stores, with_version_id(candidates).select(*columns), act)


def move_many(spark: SparkSession, stores: dict[str, Store], moves: DataFrame) -> DataFrame:
    """Move each (repo, address) to its `destination` in its repository's namespace (Store.move's
    rules: never over an existing destination, only when unchanged since `last_modified`; its
    listed `version_id` copied and then deleted where it has one)."""

    def act(reader: NamespaceReader, client: Any, frame: pd.DataFrame) -> list[tuple[Any, ...]]:
        keys, destinations, mtimes = list(frame["address"]), list(frame["destination"]), list(frame["mtime_us"])
        versions = _listed_versions(frame)
        if versions is None:
            return [(*row, None) for row in reader.moved(client, keys, destinations, mtimes)]
        return reader.moved_versions(client, keys, destinations, mtimes, versions)

    columns = [REPO, "address", "destination", F.unix_micros("last_modified").alias("mtime_us"), "version_id"]
    return _acting(spark, stores, with_version_id(moves).select(*columns), act)


def _listed_versions(rows: pd.DataFrame) -> Optional[list[Optional[str]]]:
    """One repository's listed versions, or None when none was listed (a store without versions).
    A namespace is listed by one task, so its rows name versions all or none."""
    if rows["version_id"].isna().all():
        return None
    return [None if pd.isna(version) else str(version) for version in rows["version_id"]]


Act = Callable[[NamespaceReader, Any, pd.DataFrame], list[tuple[Any, ...]]]


def _acting(spark: SparkSession, stores: dict[str, Store], rows: DataFrame, act: Act) -> DataFrame:
    """`act(reader, client, rows of one repository)` over every task's rows, a store batch at a time."""
    readers = {repo: store.reader() for repo, store in stores.items()}
    connections = _connections(readers)

    def body(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        clients = _Clients(readers, connections)
        for frame in frames:
            acted: list[tuple[Any, ...]] = []  # one frame out for each in: a chunk holds many small repositories
            for repo, mine in frame.groupby(REPO, sort=False):
                for start in range(0, len(mine), DELETE_BATCH_SIZE):
                    done = act(readers[repo], clients.of(repo), mine.iloc[start : start + DELETE_BATCH_SIZE])
                    acted += [(repo, *row) for row in done]
            if acted:
                yield pd.DataFrame(acted, columns=FLEET_ACTION_SCHEMA.names)

    return rows.repartition(shuffle_partitions(spark)).mapInPandas(body, FLEET_ACTION_SCHEMA)
