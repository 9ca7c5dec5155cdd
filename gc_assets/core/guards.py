"""Every safety invariant that guards deletion, as one pure function each: the verdicts.

Each guard is one Spark query over the frames of a set of repositories, their rows named by
`repo`, and gives every repository of the set the verdict its partition gets alone (the
`_each` functions); a partition judged alone is a set of one (the functions without it). A
fleet run and a single partition's checks are judged by the same code.

One concept, three modules: the verdicts here; the table of guards that says which asset
each watches and whether it blocks (gc_assets.sweep.guard_table); and the set's collection
(gc_assets.sweep.together), which gathers what each guard reads and whose verdicts Dagster
records as each partition's asset checks (gc_assets.defs.set_records). A sweep of a stored mark
is judged there too, right before it touches storage (together.judged_again), because a
separately launched sweep is not blocked by an earlier run's failed check. A failed blocking
one stops its repository there.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence
from urllib.parse import unquote, urlsplit

import pandas as pd
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core.addresses import TRASH_PREFIX, trash_origin, trash_run
from gc_assets.core.config import RepositoryConfig
from gc_assets.core.names import REPO
from gc_assets.core.spark import ALONE, alone, local_frame, one_of
from gc_assets.core.uris import (
    classify_address,
    is_plain_key,
    key_spellings,
    under_prefix,
)

SAMPLE = 20
_KEY = [REPO, "address"]
_KEYS_SCHEMA = T.StructType([T.StructField(REPO, T.StringType()), T.StructField("address", T.StringType())])


@dataclass(frozen=True)
class Verdict:
    name: str
    passed: bool
    description: str
    severity: str = "ERROR"  # "WARN" for findings that must not block the sweep
    metadata: dict[str, Any] = field(default_factory=dict)


def _sample(frame: DataFrame, column: str = "address") -> list[str]:
    return [str(r[column]) for r in frame.select(column).limit(SAMPLE).collect()]


def samples(frame: DataFrame, column: str = "address") -> dict[str, list[str]]:
    """Up to SAMPLE values of `column` per repository, the first in order, in one query."""
    first = Window.partitionBy(REPO).orderBy(column)
    rows = frame.select(REPO, column).withColumn("n", F.row_number().over(first)).filter(F.col("n") <= SAMPLE)
    found: dict[str, list[str]] = {}
    for row in rows.collect():
        found.setdefault(row[REPO], []).append(str(row[column]))
    return found


def counts(frame: DataFrame) -> dict[str, int]:
    return {row[REPO]: int(row["count"]) for row in frame.groupBy(REPO).count().collect()}


def unretained_ref() -> Column:
    return F.col("ref_head") & ~F.col("retained")


def heads_and_tags_retained(retained_commits: DataFrame) -> Verdict:
    """Every commit a branch or tag points at is retained."""
    return heads_and_tags_retained_each(alone(retained_commits), [ALONE])[ALONE]


def heads_and_tags_retained_each(retained_commits: DataFrame, names: Sequence[str]) -> dict[str, Verdict]:
    lost = samples(retained_commits.filter(unretained_ref()), "commit_id")
    return {name: ref_commits_verdict(lost.get(name, [])) for name in names}


def ref_commits_verdict(sample: list[str]) -> Verdict:
    return Verdict(
        "heads_and_tags_retained",
        not sample,
        "every branch head and tag commit is retained" if not sample else f"ref commits not retained: {sample}",
        metadata={"unretained_ref_commits": sample},
    )


def live_objects_present(
    live_files: DataFrame, inventory: DataFrame, commits_referencing: Callable[[DataFrame], DataFrame] | None = None
) -> Verdict:
    """Objects the current data needs exist; history already truncated is only a warning
    (live_objects_present_each for a set of one)."""
    referencing = None
    if commits_referencing is not None:
        asked = commits_referencing  # answered with the repository column of a set of one
        referencing = lambda gone: asked(gone.select("address")).withColumn(REPO, F.lit(ALONE))  # noqa: E731
    return live_objects_present_each(alone(live_files), alone(inventory), [ALONE], referencing)[ALONE]


def live_objects_present_each(
    live_files: DataFrame,
    inventory: DataFrame,
    names: Sequence[str],
    commits_referencing: Callable[[DataFrame], DataFrame] | None = None,
) -> dict[str, Verdict]:
    """Objects each repository's current data needs exist; history already truncated is only a
    warning. An empty namespace is an ERROR: it is unreachable or wrongly configured.

    `commits_referencing`, when given, maps missing (repo, address) to (repo, address,
    commit_id) of each repository's retained commits that reference them, to name the affected
    commits. It reads history, so it is called once, and only with the repositories whose
    history is found missing.

    An inventory read from an S3 Inventory report (its rows' `inventory_date` set) lacks every
    object written after the report. Live entries carry no dates, so no missing live
    object can be shown to be older than the report: each is reported as a WARN that
    names the report's date, and none blocks the sweep (candidates come only from the
    report, so a missing live object can never become one). In a set, only the repositories
    listed from a report are judged so; the others' listings block as a listing does.
    """
    listed = counts(inventory)
    verdicts = {name: empty_namespace_verdict() for name in names if not listed.get(name)}
    judged = [name for name in names if listed.get(name)]
    missing = missing_objects(live_files, inventory)
    if "inventory_date" in inventory.columns:
        dates = {
            r[REPO]: r["date"]
            for r in inventory.groupBy(REPO).agg(F.max("inventory_date").alias("date")).collect()
            if r["date"] is not None
        }
        verdicts.update(_missing_from_report(missing, dates, [name for name in judged if name in dates]))
        judged = [name for name in judged if name not in dates]
        missing = missing.filter(one_of(REPO, judged))
    # One query samples both kinds: missing objects at a head sort first, so a repository's
    # sample holds only those when it has any, and otherwise the older ones.
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
    by_repo: dict[str, list[Any]] = {}
    for row in sampled:
        by_repo.setdefault(row[REPO], []).append(row)
    at_head = sorted(name for name, rows in by_repo.items() if rows[0]["at_head"])
    # a repository missing objects at a head is told which trash holds those; any other, its history
    trashed = in_trash(missing.filter(F.col("at_head") | ~one_of(REPO, at_head)), inventory) if by_repo else {}
    history = sorted(set(by_repo) - set(at_head))
    commits = _affected_commits(commits_referencing, missing.filter(one_of(REPO, history))) if history else {}
    for name in judged:
        rows = by_repo.get(name, [])
        if name in at_head:
            sample = [str(row["address"]) for row in rows if row["at_head"]]
            verdicts[name] = missing_at_head_verdict(rows[0]["missing_at_head"], sample, trashed.get(name, {}))
        elif rows:
            sample = [str(row["address"]) for row in rows]
            verdicts[name] = missing_history_verdict(
                rows[0]["missing"], sample, commits.get(name, []), trashed.get(name, {})
            )
        else:
            verdicts[name] = all_present_verdict()
    return {name: verdicts[name] for name in names}


def _affected_commits(
    commits_referencing: Callable[[DataFrame], DataFrame] | None, missing: DataFrame
) -> dict[str, list[str]]:
    """Per repository, a sample of the retained commits that reference its missing objects."""
    if commits_referencing is None:
        return {}
    gaps = commits_referencing(missing.select(REPO, "address")).select(REPO, "commit_id").distinct()
    return {name: sorted(ids) for name, ids in samples(gaps, "commit_id").items()}


def missing_at_head_verdict(count: int, sample: list[str], trashed: dict[str, int]) -> Verdict:
    return Verdict(
        "live_objects_present",
        False,
        f"{count} objects referenced by a branch head, tag or staging area are missing "
        f"from storage (or the listing is incomplete): {sample}{_restore_hint(trashed)}",
        metadata={"missing_at_head": sample, "in_trash_of_runs": trashed},
    )


def missing_history_verdict(count: int, sample: list[str], commits: list[str], trashed: dict[str, int]) -> Verdict:
    """Objects only older retained commits need are gone: a WARN, which does not block."""
    return Verdict(
        "live_objects_present",
        False,
        f"{count} objects of older retained commits are already gone (history truncated "
        f"earlier); affected commits: {commits}{_restore_hint(trashed)}",
        severity="WARN",
        metadata={"missing_history": sample, "affected_commits": commits, "in_trash_of_runs": trashed},
    )


def empty_namespace_verdict() -> Verdict:
    return Verdict(
        "live_objects_present",
        False,
        "the namespace is empty (nothing was listed): it is unreachable or wrongly configured, "
        "and every live object would count as missing",
    )


def all_present_verdict() -> Verdict:
    return Verdict("live_objects_present", True, "every live object inside the namespace is in the inventory")


def in_trash(missing: DataFrame, inventory: DataFrame) -> dict[str, dict[str, int]]:
    """{repository: {trash run: how many of its missing live keys the run holds under
    `_gc_trash/<run>/`}}, in one query."""
    trashed = inventory.filter(F.col("address").startswith(f"{TRASH_PREFIX}/")).select(
        REPO, trash_run(F.col("address")).alias("run"), trash_origin(F.col("address")).alias("address")
    )
    found = trashed.join(missing.select(*_KEY), _KEY, "left_semi").groupBy(REPO, "run").count().collect()
    runs: dict[str, dict[str, int]] = {}
    for r in sorted(found, key=lambda r: (r[REPO], r["run"])):
        runs.setdefault(r[REPO], {})[r["run"]] = r["count"]
    return runs


def _restore_hint(trashed: dict[str, int]) -> str:
    if not trashed:
        return ""
    runs = ", ".join(f"{run} ({count} objects)" for run, count in trashed.items())
    first = next(iter(trashed))
    return f"; they are in the trash of run {runs}: restore with `gc-assets restore --run-id {first}`"


def missing_objects(live_files: DataFrame, inventory: DataFrame) -> DataFrame:
    """Each repository's live keys as referenced that its storage holds under none of their
    spellings: `data/per%20cent` is present when storage holds it as is or as `data/per cent`."""
    listed = inventory.select(*_KEY)
    absent = live_files.filter("required").join(listed, _KEY, "left_anti")
    schema = T.StructType([T.StructField(c, T.StringType()) for c in (*_KEY, "spelling")])

    def spell(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            rows = [
                (repo, address, spelling)
                for repo, address in zip(frame[REPO], frame["address"])
                for spelling in key_spellings(address)[1:]
            ]
            yield pd.DataFrame(rows, columns=[*_KEY, "spelling"], dtype=object)

    found = (
        absent.select(*_KEY)
        .mapInPandas(spell, schema)
        .join(listed.withColumnRenamed("address", "spelling"), [REPO, "spelling"], "left_semi")
        .select(*_KEY)
    )
    return absent.join(found, _KEY, "left_anti")


def _missing_from_report(
    missing: DataFrame, dates: Mapping[str, dt.datetime], names: Sequence[str]
) -> dict[str, Verdict]:
    """live_objects_present_each against an S3 Inventory report of each of `names`, made at its
    date of `dates`: a missing object is a WARN."""
    if not names:
        return {}
    found, missing_count = samples(missing), counts(missing)
    verdicts = {}
    for name in names:
        stamp = dates[name].isoformat()
        sample = found.get(name, [])
        verdicts[name] = (
            Verdict(
                "live_objects_present",
                False,
                f"{missing_count[name]} live objects are not in the inventory report of {stamp}; live entries carry "
                f"no dates, so each may have been written after the report (not blocking): {sample}",
                severity="WARN",
                metadata={"inventory_date": stamp, "missing_from_report": sample},
            )
            if sample
            else Verdict(
                "live_objects_present",
                True,
                f"every live object inside the namespace is in the inventory report of {stamp}",
            )
        )
    return verdicts


def candidates_not_live(candidates: DataFrame, entries: DataFrame, namespace: str) -> Verdict:
    """Candidates are disjoint from the live set, recomputed from raw live entries in plain
    Python (candidates_not_live_each for a set of one)."""
    return candidates_not_live_each(alone(candidates), alone(entries), {ALONE: namespace})[ALONE]


def candidates_not_live_each(
    candidates: DataFrame, entries: DataFrame, namespaces: Mapping[str, str]
) -> dict[str, Verdict]:
    """Each repository's candidates are disjoint from its live set, recomputed from the raw live
    entries in plain Python.

    This deliberately avoids the Spark normalization used by the mark: `entries` are the
    connector's raw (repo, address) rows, each made a key of its repository's namespace by
    gc_assets.core.uris.
    """
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
    return {name: live_candidates_verdict(overlap.get(name, [])) for name in namespaces}


def live_candidates_verdict(sample: list[str]) -> Verdict:
    return Verdict(
        "candidates_not_live",
        not sample,
        "no candidate is referenced by a retained commit or staging area"
        if not sample
        else f"candidates that are live: {sample}",
        metadata={"live_candidates": sample},
    )


def candidates_older_than_min_age(candidates: DataFrame, cutoff: dt.datetime, untracked_cutoff: dt.datetime) -> Verdict:
    """Every candidate is older than the cutoff, and an untracked one also older than the
    format's window for in-flight writers (candidates_older_than_min_age_each for a set of one)."""
    return candidates_older_than_min_age_each(alone(candidates), {ALONE: (cutoff, untracked_cutoff)})[ALONE]


def candidates_older_than_min_age_each(
    candidates: DataFrame, cutoffs: Mapping[str, tuple[dt.datetime, dt.datetime]]
) -> dict[str, Verdict]:
    """Each repository's candidates are older than its (cutoff, untracked cutoff)."""
    bounds = local_frame(
        candidates.sparkSession,
        [(name, cutoff, untracked) for name, (cutoff, untracked) in cutoffs.items()],
        "repo string, cutoff timestamp, untracked_cutoff timestamp",
    )
    judged = candidates.join(F.broadcast(bounds), REPO)
    young = samples(judged.filter(too_young(F.col("cutoff"), F.col("untracked_cutoff"))))
    return {
        name: young_candidates_verdict(young.get(name, []), cutoff, untracked)
        for name, (cutoff, untracked) in cutoffs.items()
    }


def too_young(cutoff: Column, untracked_cutoff: Column) -> Column:
    return (F.col("last_modified") >= cutoff) | (
        (F.col("reason") != "expired") & (F.col("last_modified") >= untracked_cutoff)
    )


def young_candidates_verdict(sample: list[str], cutoff: dt.datetime, untracked_cutoff: dt.datetime) -> Verdict:
    bounds = f"{cutoff.isoformat()} ({untracked_cutoff.isoformat()} for untracked objects)"
    return Verdict(
        "candidates_older_than_min_age",
        not sample,
        f"every candidate was last modified before {bounds}"
        if not sample
        else f"candidates too young for {bounds}: {sample}",
        metadata={
            "cutoff": cutoff.isoformat(),
            "untracked_cutoff": untracked_cutoff.isoformat(),
            "young_candidates": sample,
        },
    )


def independent_witness(candidates: DataFrame, witness: DataFrame, live_files: DataFrame, namespace: str) -> Verdict:
    """What each ref head needs, as the format's reference reader sees it, is neither a
    candidate nor missing from the mark's live set at a head (docs/design.md §10;
    independent_witness_each for a set of one)."""
    frames = (alone(candidates), alone(witness), alone(live_files))
    return independent_witness_each(*frames, {ALONE: namespace})[ALONE]


def independent_witness_each(
    candidates: DataFrame, witness: DataFrame, live_files: DataFrame, namespaces: Mapping[str, str]
) -> dict[str, Verdict]:
    """independent_witness for each repository of `namespaces`.

    `witness` (repo, commit_id, address) is what the heads of each repository, and of every
    repository reaching into its namespace, need as the format's own reader says; it comes
    from the connector's witness_heads, which shares no code with the live-set path."""
    return witnessed_each(candidates, witness_keys(witness, namespaces), live_files, list(namespaces))


def witness_keys(witness: DataFrame, namespaces: Mapping[str, str]) -> DataFrame:
    """(repo, commit_id, address) of `witness`, read now, its addresses made keys of each repo's
    namespace by a normalization of their own (witness_key: pathlib for files), so that an error
    in the mark's address handling shows."""
    roots = {name: witness_root(namespace) for name, namespace in namespaces.items()}
    schema = T.StructType([T.StructField(c, T.StringType(), False) for c in (REPO, "commit_id", "address")])

    def keys(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            directories: dict[str, str] = {}  # per batch: a directory replaced later is resolved afresh
            rows = []
            for repo, head, address in zip(frame[REPO], frame["commit_id"], frame["address"]):
                key = witness_key(address, roots[repo], directories)
                if key is not None:
                    rows.append((repo, head, key))
            yield pd.DataFrame(rows, columns=[REPO, "commit_id", "address"], dtype=object)

    return witness.select(REPO, "commit_id", "address").mapInPandas(keys, schema).localCheckpoint()


def witnessed_each(
    candidates: DataFrame, needed: DataFrame, live_files: DataFrame, names: Sequence[str]
) -> dict[str, Verdict]:
    """independent_witness for each repository of `names`, on the keys its heads need (witness_keys)."""
    labelled = F.concat_ws(": ", "commit_id", "address").alias("label")
    taken = samples(needed.join(candidates.select(*_KEY), _KEY, "left_semi").select(REPO, labelled), "label")
    at_head = live_files.filter(F.col("at_head") & F.col("in_namespace")).select(*_KEY)
    unmarked = samples(needed.join(at_head, _KEY, "left_anti").select(REPO, labelled), "label")
    witnessed = counts(needed.select(*_KEY).distinct())
    return {
        name: witness_verdict(taken.get(name, []), unmarked.get(name, []), witnessed.get(name, 0)) for name in names
    }


def witness_verdict(taken_sample: list[str], unmarked_sample: list[str], needed_count: int) -> Verdict:
    passed = not taken_sample and not unmarked_sample
    if passed:
        description = (
            f"the {needed_count} objects the ref heads need (read by the format's own reader) "
            "are live and not candidates"
        )
    else:
        description = (
            f"the format's own reader says the head commits need objects that are candidates {taken_sample} or that "
            f"the mark did not keep at a head {unmarked_sample}: the mark's knowledge is incomplete"
        )
    return Verdict(
        "independent_witness",
        passed,
        description,
        metadata={
            "witnessed_objects": needed_count,
            "needed_candidates": taken_sample,
            "unmarked_head_objects": unmarked_sample,
        },
    )


def witness_root(namespace: str) -> tuple[str, str]:
    """(kind, root) of a namespace for witness_key: a resolved directory, or `bucket/prefix`."""
    parsed = urlsplit(namespace)
    if parsed.scheme == "file":
        return "file", str(Path(unquote(parsed.path)).resolve())
    return "s3", f"{parsed.netloc.lower()}/{parsed.path.strip('/')}".rstrip("/")


def witness_key(address: str, root: tuple[str, str], directories: dict[str, str]) -> str | None:
    """The key the witness's address names inside the namespace, or None outside it.

    `directories` remembers each directory's real path: a table's files share few directories.
    """
    kind, base = root
    parsed = urlsplit(address)
    scheme = parsed.scheme.lower() if len(parsed.scheme) > 1 else ""
    if not scheme and not address.startswith("/"):
        return address  # relative to the namespace already
    if kind == "file" and scheme in ("", "file"):
        real = _real_path(_file_path(address) if scheme else unquote(address), directories)
        if real == base:
            return "."
        inside = base.rstrip("/") + "/"
        return real[len(inside) :] if real.startswith(inside) else None
    if kind == "s3" and scheme in ("s3", "s3a", "s3n"):
        after_scheme = address.split("://", 1)[1]
        key = after_scheme.split("/", 1)[1] if "/" in after_scheme else ""
        location = f"{parsed.netloc.lower()}/{key}"
        return location[len(base) + 1 :] if location.startswith(base + "/") else None
    return None


def _file_path(address: str) -> str:
    """The path of a `file:` URI to its very end: `#` and `?` belong to a local file's name."""
    rest = address.split(":", 1)[1]
    if rest.startswith("//"):
        authority_and_path = rest[2:]
        rest = "/" + authority_and_path.split("/", 1)[1] if "/" in authority_and_path else "/"
    return unquote(rest)


def _real_path(path: str, directories: dict[str, str]) -> str:
    """os.path.realpath(path), each directory's real path looked up once: only a name that is
    itself a symbolic link (or a dot segment) needs resolving again."""
    directory, name = os.path.split(path)
    if not directory or name in ("", ".", ".."):
        return os.path.realpath(path)
    joined = os.path.join(_real_directory(directory, directories), name)
    return os.path.realpath(joined) if os.path.islink(joined) else joined


def _real_directory(directory: str, directories: dict[str, str]) -> str:
    """os.path.realpath(directory), from its parent's real path (remembered in `directories`) and
    its own name: a table's partition directories share their parents, so each costs one lstat."""
    if directory not in directories:
        parent, name = os.path.split(directory)
        if parent in ("", directory) or name in ("", ".", ".."):
            directories[directory] = os.path.realpath(directory)
        else:
            directories[directory] = _real_path(directory, directories)
    return directories[directory]


def candidates_inside_namespace(
    candidates: DataFrame, protected: tuple[str, ...], protected_patterns: tuple[str, ...] = ()
) -> Verdict:
    """Candidates are plain relative keys inside the namespace, outside protected prefixes and
    patterns (candidates_inside_namespace_each for a set of one)."""
    return candidates_inside_namespace_each(alone(candidates), {ALONE: (protected, protected_patterns)})[ALONE]


def candidates_inside_namespace_each(
    candidates: DataFrame, protected: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]
) -> dict[str, Verdict]:
    """candidates_inside_namespace with each repository's (protected prefixes, patterns)."""
    rules = {name: (prefixes, [re.compile(p) for p in patterns]) for name, (prefixes, patterns) in protected.items()}

    def offending(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            bad = [
                (repo, key)
                for repo, key in zip(frame[REPO], frame["address"])
                if not collectable_key(key, *rules[repo])
            ]
            yield pd.DataFrame(bad, columns=_KEY, dtype=object)

    found = samples(candidates.select(*_KEY).mapInPandas(offending, _KEYS_SCHEMA))
    return {
        name: outside_candidates_verdict(found.get(name, []), prefixes) for name, (prefixes, _) in protected.items()
    }


def collectable_key(key: str, protected: tuple[str, ...], patterns: list[re.Pattern[str]]) -> bool:
    """A plain key inside the namespace, under no protected prefix and matching no protected pattern."""
    return is_plain_key(key) and not under_prefix(key, protected) and not any(p.search(key) for p in patterns)


def outside_candidates_verdict(sample: list[str], protected: tuple[str, ...]) -> Verdict:
    return Verdict(
        "candidates_inside_namespace",
        not sample,
        f"every candidate is a key inside the namespace and outside {list(protected)}"
        if not sample
        else f"candidates outside the namespace or under a protected prefix: {sample}",
        metadata={"offending_candidates": sample},
    )


def candidates_not_held(candidates: DataFrame, held: DataFrame) -> Verdict:
    """No candidate is under a hold placed by restore."""
    sample = _sample(candidates.select("address").join(held, "address", "left_semi"))
    return Verdict(
        "candidates_not_held",
        not sample,
        "no candidate is held" if not sample else f"candidates held since a restore: {sample}",
        metadata={"held_candidates": sample},
    )


def blast_radius(candidate_count: int, inventory_count: int, repo: RepositoryConfig) -> Verdict:
    fraction = candidate_count / inventory_count if inventory_count else 0.0
    passed = fraction <= repo.max_delete_fraction
    return Verdict(
        "blast_radius",
        passed,
        f"{candidate_count} of {inventory_count} objects ({fraction:.1%}) are candidates; "
        f"the limit is {repo.max_delete_fraction:.0%}",
        metadata={"candidate_fraction": fraction, "max_delete_fraction": repo.max_delete_fraction},
    )


def blast_radius_each(
    candidates: DataFrame, inventory: DataFrame, repos: Mapping[str, RepositoryConfig]
) -> dict[str, Verdict]:
    found, listed = counts(candidates), counts(inventory)
    return {name: blast_radius(found.get(name, 0), listed.get(name, 0), repo) for name, repo in repos.items()}


def receipts_cover_candidates(receipts: DataFrame, candidates: DataFrame) -> Verdict:
    """Exactly one receipt per candidate, and none for anything else (the purge's receipts,
    addressed by trash key, aside: no candidate is ever under `_gc_trash/`)."""
    return receipts_cover_candidates_each(alone(receipts), alone(candidates), [ALONE])[ALONE]


def receipts_cover_candidates_each(
    receipts: DataFrame, candidates: DataFrame, names: Sequence[str]
) -> dict[str, Verdict]:
    faults = receipt_faults(receipts, candidates)
    return {name: receipts_verdict(faults.get(name, [])) for name in names}


def receipt_faults(receipts: DataFrame, candidates: DataFrame) -> dict[str, list[Any]]:
    """Up to SAMPLE addresses of each kind of fault (duplicated, uncovered, extra) per
    repository, in one query."""
    if "row_id" in receipts.columns:  # a file catalog's row receipts receipt rows, not candidates
        receipts = receipts.filter(F.col("row_id").isNull())
    per_address = (
        receipts.filter(~F.col("address").startswith(f"{TRASH_PREFIX}/")).groupBy(*_KEY).agg(F.count("*").alias("n"))
    )
    both = per_address.join(
        candidates.select(*_KEY).distinct().withColumn("candidate", F.lit(True)), _KEY, "full_outer"
    )
    kinds = F.array_compact(
        F.array(
            F.when(F.col("n") > 1, F.lit("duplicated")),
            F.when(F.col("n").isNull(), F.lit("uncovered")),
            F.when(F.col("candidate").isNull(), F.lit("extra")),
        )
    )
    faults = both.select(*_KEY, F.explode(kinds).alias("kind"))
    rank = F.row_number().over(Window.partitionBy(REPO, "kind").orderBy("address"))
    found: dict[str, list[Any]] = {}
    for row in faults.withColumn("rank", rank).filter(F.col("rank") <= SAMPLE).orderBy("kind", "rank").collect():
        found.setdefault(row[REPO], []).append(row)
    return found


def receipts_verdict(faults: list[Any]) -> Verdict:
    duplicated, uncovered, extra = (
        [str(r["address"]) for r in faults if r["kind"] == kind] for kind in ("duplicated", "uncovered", "extra")
    )
    passed = not (duplicated or uncovered or extra)
    return Verdict(
        "receipts_cover_candidates",
        passed,
        "one receipt per candidate"
        if passed
        else (
            f"duplicated receipts {duplicated}, candidates without receipt {uncovered}, "
            f"receipts for non-candidates {extra}"
        ),
        metadata={"duplicated": duplicated, "uncovered": uncovered, "extra": extra},
    )


def live_objects_intact(existence: DataFrame) -> Verdict:
    """After the sweep, every live object that was in the inventory still exists."""
    return live_objects_intact_each(alone(existence), [ALONE])[ALONE]


def live_objects_intact_each(existence: DataFrame, names: Sequence[str]) -> dict[str, Verdict]:
    """live_objects_intact: `existence` (repo, address, exists) of the live objects that were in
    storage before the sweep."""
    gone = samples(existence.filter(~F.col("exists")))
    return {name: intact_verdict(gone.get(name, [])) for name in names}


def intact_verdict(gone: list[str]) -> Verdict:
    return Verdict(
        "live_objects_intact",
        not gone,
        "every live object that was in storage before the sweep is still there"
        if not gone
        else f"live objects gone after the sweep: {gone}",
        metadata={"lost_live_objects": gone},
    )
