"""The guards of gc_assets.core.guards, judged for many repositories at once: the frames carry
a `repo` column, each guard is one Spark query whatever the number of repositories, and each
repository gets the verdict its partition would get alone, built by the same verdict functions.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Iterator, Mapping, Sequence

import pandas as pd
from pyspark.sql import DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core import guards
from gc_assets.core.config import RepositoryConfig
from gc_assets.core.guards import SAMPLE, Verdict
from gc_assets.core.names import REPO
from gc_assets.core.uris import classify_address, key_spellings

_KEY = [REPO, "address"]
_KEYS_SCHEMA = T.StructType([T.StructField(REPO, T.StringType()), T.StructField("address", T.StringType())])


def samples(frame: DataFrame, column: str = "address") -> dict[str, list[str]]:
    """Up to SAMPLE values of `column` per repository, in one query."""
    first = Window.partitionBy(REPO).orderBy(column)
    rows = frame.select(REPO, column).withColumn("n", F.row_number().over(first)).filter(F.col("n") <= SAMPLE)
    found: dict[str, list[str]] = {}
    for row in rows.collect():
        found.setdefault(row[REPO], []).append(str(row[column]))
    return found


def counts(frame: DataFrame) -> dict[str, int]:
    return {row[REPO]: int(row["count"]) for row in frame.groupBy(REPO).count().collect()}


def heads_and_tags_retained(retained_commits: DataFrame, names: Sequence[str]) -> dict[str, Verdict]:
    lost = samples(retained_commits.filter(guards.unretained_ref()), "commit_id")
    return {name: guards.ref_commits_verdict(lost.get(name, [])) for name in names}


def candidates_not_live(candidates: DataFrame, entries: DataFrame, namespaces: Mapping[str, str]) -> dict[str, Verdict]:
    """guards.candidates_not_live: `entries` are the connector's raw (repo, address) rows, each
    made a key of its repository's namespace in plain Python."""
    namespaces = dict(namespaces)

    def keys(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            out = []
            for repo, address in zip(frame[REPO], frame["address"]):
                key = classify_address(address, namespaces[repo])
                if key is not None:
                    out.extend((repo, spelling) for spelling in key_spellings(key))
            yield pd.DataFrame(out, columns=_KEY, dtype=object)

    live_keys = entries.select(*_KEY).mapInPandas(keys, _KEYS_SCHEMA)
    overlap = samples(candidates.select(*_KEY).join(live_keys, _KEY, "left_semi"))
    return {name: guards.live_candidates_verdict(overlap.get(name, [])) for name in namespaces}


def candidates_older_than_min_age(
    spark: SparkSession, candidates: DataFrame, cutoffs: Mapping[str, tuple[dt.datetime, dt.datetime]]
) -> dict[str, Verdict]:
    """guards.candidates_older_than_min_age with each repository's (cutoff, untracked cutoff)."""
    bounds = spark.createDataFrame(
        [(name, cutoff, untracked) for name, (cutoff, untracked) in cutoffs.items()],
        "repo string, cutoff timestamp, untracked_cutoff timestamp",
    )
    judged = candidates.join(F.broadcast(bounds), REPO)
    young = samples(judged.filter(guards.too_young(F.col("cutoff"), F.col("untracked_cutoff"))))
    return {
        name: guards.young_candidates_verdict(young.get(name, []), cutoff, untracked)
        for name, (cutoff, untracked) in cutoffs.items()
    }


def candidates_inside_namespace(
    candidates: DataFrame, protected: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]
) -> dict[str, Verdict]:
    """guards.candidates_inside_namespace with each repository's (protected prefixes, patterns)."""
    rules = {name: (prefixes, [re.compile(p) for p in patterns]) for name, (prefixes, patterns) in protected.items()}

    def offending(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            bad = [
                (repo, key)
                for repo, key in zip(frame[REPO], frame["address"])
                if not guards.collectable_key(key, *rules[repo])
            ]
            yield pd.DataFrame(bad, columns=_KEY, dtype=object)

    found = samples(candidates.select(*_KEY).mapInPandas(offending, _KEYS_SCHEMA))
    return {
        name: guards.outside_candidates_verdict(found.get(name, []), prefixes)
        for name, (prefixes, _) in protected.items()
    }


def blast_radius(
    candidates: DataFrame, inventory: DataFrame, repos: Mapping[str, RepositoryConfig]
) -> dict[str, Verdict]:
    found, listed = counts(candidates), counts(inventory)
    return {name: guards.blast_radius(found.get(name, 0), listed.get(name, 0), repo) for name, repo in repos.items()}


def live_objects_present(live_files: DataFrame, inventory: DataFrame, names: Sequence[str]) -> dict[str, Verdict]:
    """guards.live_objects_present, without naming the affected commits or the trash runs: an
    empty namespace or a missing object at a head is an ERROR, objects only older retained
    commits need are a WARN."""
    listed = counts(inventory)
    missing = guards.missing_objects(live_files, inventory, by=(REPO,))
    # missing objects at a head sort first: a repository's sample holds only those when it has any
    first = Window.partitionBy(REPO).orderBy(F.desc("at_head"), "address")
    whole = Window.partitionBy(REPO)
    sampled = (
        missing.select(REPO, "address", "at_head")
        .withColumn("n", F.row_number().over(first))
        .withColumn("missing", F.count("*").over(whole))
        .withColumn("missing_at_head", F.count_if("at_head").over(whole))
        .filter(F.col("n") <= SAMPLE)
        .collect()
    )
    by_repo: dict[str, list[Row]] = {}
    for row in sampled:
        by_repo.setdefault(row[REPO], []).append(row)
    verdicts = {}
    for name in names:
        rows = by_repo.get(name, [])
        if not listed.get(name):
            verdicts[name] = guards.empty_namespace_verdict()
        elif rows and rows[0]["at_head"]:
            head_sample = [str(row["address"]) for row in rows if row["at_head"]]
            verdicts[name] = guards.missing_at_head_verdict(rows[0]["missing_at_head"], head_sample, {})
        elif rows:
            older_sample = [str(row["address"]) for row in rows]
            verdicts[name] = guards.missing_history_verdict(rows[0]["missing"], older_sample, [], {})
        else:
            verdicts[name] = guards.all_present_verdict()
    return verdicts


def independent_witness(
    candidates: DataFrame, witness: DataFrame, live_files: DataFrame, namespaces: Mapping[str, str]
) -> dict[str, Verdict]:
    """guards.independent_witness: `witness` (repo, commit_id, address) is what the heads of each
    repository, and of every repository reaching into its namespace, need as the format's own
    reader says; each address becomes a key of `repo`'s namespace with guards.witness_key."""
    roots = {name: guards.witness_root(namespace) for name, namespace in namespaces.items()}
    schema = T.StructType([T.StructField(c, T.StringType(), False) for c in (REPO, "commit_id", "address")])

    def keys(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            directories: dict[str, str] = {}
            rows = []
            for repo, head, address in zip(frame[REPO], frame["commit_id"], frame["address"]):
                key = guards.witness_key(address, roots[repo], directories)
                if key is not None:
                    rows.append((repo, head, key))
            yield pd.DataFrame(rows, columns=[REPO, "commit_id", "address"], dtype=object)

    needed = witness.select(REPO, "commit_id", "address").mapInPandas(keys, schema).localCheckpoint()
    labelled = F.concat_ws(": ", "commit_id", "address").alias("label")
    taken = samples(needed.join(candidates.select(*_KEY), _KEY, "left_semi").select(REPO, labelled), "label")
    at_head = live_files.filter(F.col("at_head") & F.col("in_namespace")).select(*_KEY)
    unmarked = samples(needed.join(at_head, _KEY, "left_anti").select(REPO, labelled), "label")
    witnessed = counts(needed.select(*_KEY).distinct())
    return {
        name: guards.witness_verdict(taken.get(name, []), unmarked.get(name, []), witnessed.get(name, 0))
        for name in namespaces
    }


def receipts_cover_candidates(receipts: DataFrame, candidates: DataFrame, names: Sequence[str]) -> dict[str, Verdict]:
    faults = guards.receipt_faults(receipts, candidates, by=(REPO,))
    return {name: guards.receipts_verdict(faults.get((name,), [])) for name in names}


def live_objects_intact(existence: DataFrame, names: Sequence[str]) -> dict[str, Verdict]:
    """guards.live_objects_intact: `existence` (repo, address, exists) of the live objects that
    were in storage before the sweep."""
    gone = samples(existence.filter(~F.col("exists")))
    return {name: guards.intact_verdict(gone.get(name, [])) for name in names}
