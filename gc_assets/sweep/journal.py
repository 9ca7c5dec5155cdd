"""The sweep journal: what one mark's sweep intends and did, kept outside the receipts partition.

A sweep killed mid-way leaves a record of everything it did or was doing: the rerun of the
same mark takes journaled receipts as they are, acts only on the rest and tells objects an
earlier attempt moved or deleted as that attempt's work (attribute_absent).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core.names import REPO
from gc_assets.core.state import TRASH_PREFIX
from gc_assets.stores.base import with_version_id
from gc_assets.stores.state import StateFiles
from gc_assets.sweep.receipts import JOURNAL_SCHEMA

INTENT_SCHEMA = "address string, run_id string, mode string"
# A chunk's outcome: a receipt, and the version it acted on where the store acts on listed
# versions (a versioned S3 bucket); null elsewhere and in journals written before versions were kept.
OUTCOME_SCHEMA = JOURNAL_SCHEMA + ", version_id string"


class SweepJournal:
    """What one mark's sweep intends and did, kept outside the receipts partition (which is
    rewritten on every materialization): `_sweeps/set/date=D/mark=M/` for the set a run collected
    and swept, or `<state_dir>/_sweeps/repo=R/date=D/mark=M/` for one repository of mark M swept
    by a later run, each row naming its repository (`repo`; in a repository's journal kept by an
    earlier version, rows without it are that repository's).

    Before a chunk acts, its intent (address, run_id, mode) is written; after, its outcome
    receipts. Each is complete once its `_SUCCESS` exists. The finished sweep's receipts
    are written last: a rerun of the same mark returns them and touches nothing. One
    repository's journal also reads its rows of the set's journal of the same mark (`shared`:
    that journal's root and the repository), so a mark swept in a set resumes alone exactly.
    """

    def __init__(
        self,
        spark: SparkSession,
        files: StateFiles,
        root: str,
        shared: Optional[tuple[str, str]] = None,
        of_set: bool = False,
    ) -> None:
        """`of_set`: the journal of a set, whose rows name their repository."""
        self.spark, self.files, self.root, self.shared = spark, files, root, shared
        self.carried = f"{REPO} string, " if of_set else ""

    @property
    def where(self) -> str:
        return self.files.uri(self.root)

    def _read(self, pattern: str, schema: str) -> DataFrame:
        own = self.files.read_many(self.spark, self.files.frames(self.root, pattern), self.carried + schema)
        if self.shared is None:
            return own
        root, repo = self.shared
        if self.carried:  # a repository's own rows that an earlier version wrote without naming it
            own = own.withColumn(REPO, F.coalesce(F.col(REPO), F.lit(repo)))
        theirs = self.files.read_many(self.spark, self.files.frames(root, pattern), f"{REPO} string, {schema}")
        theirs = theirs.filter(F.col(REPO) == repo)
        return own.unionByName(theirs if self.carried else theirs.drop(REPO))

    def write(self, frame: DataFrame, name: str) -> DataFrame:
        """Write `frame` under `name` and read it back: decided exactly once, whatever reads it later."""
        return self.files.write(self.spark, frame, f"{self.root}/{name}")

    def keep(self, name: str, table: pa.Table) -> None:
        """A small frame the driver holds (a chunk's intent or outcome) kept under `name` without a
        Spark job, durable before the caller goes on."""
        self.files.keep_table(f"{self.root}/{name}", table)

    def read(self, name: str) -> Optional[DataFrame]:
        """The frame written under `name`, or None."""
        return self.files.read(self.spark, f"{self.root}/{name}") if self.files.frames(self.root, name) else None

    def keep_lines(self, name: str, lines: list[str]) -> None:
        """Small receipts kept whole under `name`, durable before the caller goes on."""
        self.files.write_text(f"{self.root}/{name}", "".join(line + "\n" for line in lines))

    def kept_lines(self, folder: str) -> list[str]:
        """Every line kept under `folder` (keep_lines), in the order of their names."""
        keys = self.files.keys(f"{self.root}/{folder}/")
        return [line for key in keys for line in (self.files.read_text(key) or "").splitlines()]

    def intents(self) -> DataFrame:
        return self._read("intent-*", INTENT_SCHEMA)

    def outcomes(self) -> DataFrame:
        """Receipts of every complete chunk of every attempt, as the stores reported them."""
        return self._read("chunk-*", OUTCOME_SCHEMA)

    def finished(self, repo: str) -> Optional[tuple[DataFrame, dict[str, Any]]]:
        """`repo`'s receipts (with `repo`) and metadata of this mark's finished sweep, here or in
        the set's journal it shares, or None: a finished journal's metadata names each repository."""
        for root in [self.root, *([self.shared[0]] if self.shared else [])]:
            metadata = json.loads(self.files.read_text(f"{root}/metadata.json") or "{}")
            done = self.files.read(self.spark, f"{root}/receipts") if metadata else None
            if done is None:
                continue
            if REPO not in done.columns:  # a repository's own journal, kept by an earlier version
                if root == self.root and self.shared is not None and self.shared[1] == repo:
                    return with_version_id(done.select(F.lit(repo).alias(REPO), *done.columns)), metadata
                continue
            if repo in metadata:
                return with_version_id(done.filter(F.col(REPO) == repo)), metadata[repo]
        return None

    def finish(self, actions: DataFrame, metadata: dict[str, Any]) -> DataFrame:
        """The finished sweep's receipts, after its metadata (a set's: each repository's, by name)."""
        self.files.write_text(f"{self.root}/metadata.json", json.dumps(metadata))  # before the receipts: the end
        return self.write(actions, "receipts")


def attribute_absent(
    outcomes: DataFrame,
    intents: DataFrame,
    trashed: Callable[[DataFrame], DataFrame],
    keys: Sequence[str] = ("address",),
) -> DataFrame:
    """Outcomes with each `already_absent` that an earlier attempt of this sweep caused told truthfully.

    A crash (or a killed run) between acting and journaling leaves an intent without an
    outcome; the rerun then finds the object gone. It was trashed by that attempt when it
    is in that attempt's trash (`trashed` answers which probes exist), deleted by an
    earlier run when that run meant to delete it. `keys` name an object: its address, and
    in a set's journal its repository first.
    """
    keys = list(keys)
    earlier = intents.select(*keys, F.col("run_id").alias("by"), F.col("mode").alias("by_mode"))
    absent = outcomes.filter(F.col("action") == "already_absent").select(*keys, "run_id", "at")
    pairs = absent.join(earlier, keys)
    # In some run's trash, it was moved by that run (a retried Spark task of this run included);
    # a deletion is told as such only for an earlier run: within one run, absence is ambiguous.
    probes = pairs.filter(F.col("by_mode") == "trash").withColumn(
        "probe", F.concat(F.lit(f"{TRASH_PREFIX}/"), F.col("by"), F.lit("/"), F.col("address"))
    )
    owners = keys[:-1]  # the repository, in a set's journal
    found = (
        trashed(probes.select(*owners, F.col("probe").alias("address")))
        .filter("exists")
        .select(*owners, F.col("address").alias("probe"))
    )
    moved = probes.join(found, [*owners, "probe"], "left_semi").select(
        *keys, F.lit("trashed").alias("action"), "by", "at"
    )
    removed = pairs.filter((F.col("by_mode") == "delete") & (F.col("by") != F.col("run_id"))).select(
        *keys, F.lit("deleted").alias("action"), "by", "at"
    )
    versions = outcomes.select(*keys, "version_id")  # the version the absent one was listed as
    told = (
        moved.unionByName(removed)
        .groupBy(*keys)
        .agg(F.min(F.struct((F.col("action") != "trashed").alias("rank"), "action", "by", "at")).alias("pick"))
        .select(
            *keys,
            "pick.action",
            F.lit(None).cast("string").alias("error"),
            F.col("pick.by").alias("run_id"),
            "pick.at",
        )
        .join(versions, keys, "left")
    )
    return outcomes.join(told.select(*keys), keys, "left_anti").unionByName(told)
