"""Every safety invariant that guards deletion, as one pure function each: the verdicts.

One concept, four modules: the verdicts here; the table of guards that says which asset
each watches and what evidence it reads (gc_assets.sweep.guard_table); and the guards as
Dagster asset checks, judged inside their asset's step (gc_assets.defs.assets.guard_checks)
or in a step of their own (gc_assets.defs.checks). The checks report in the UI and block
downstream steps in the same run; deletion_receipts judges the same table again right
before it touches storage, because a separately launched sweep is not blocked by an
earlier run's failed check.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import unquote, urlsplit

import pandas as pd
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core.addresses import TRASH_PREFIX, trash_origin, trash_run
from gc_assets.core.config import RepositoryConfig
from gc_assets.core.uris import (
    classify_address,
    is_plain_key,
    key_spellings,
    under_prefix,
)

SAMPLE = 20


@dataclass(frozen=True)
class Verdict:
    name: str
    passed: bool
    description: str
    severity: str = "ERROR"  # "WARN" for findings that must not block the sweep
    metadata: dict[str, Any] = field(default_factory=dict)


def _sample(frame: DataFrame, column: str = "address") -> list[str]:
    return [str(r[column]) for r in frame.select(column).limit(SAMPLE).collect()]


def unretained_ref() -> Column:
    return F.col("ref_head") & ~F.col("retained")


def heads_and_tags_retained(retained_commits: DataFrame) -> Verdict:
    """Every commit a branch or tag points at is retained."""
    return ref_commits_verdict(_sample(retained_commits.filter(unretained_ref()), "commit_id"))


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
    """Objects the current data needs exist; history already truncated is only a warning.

    `commits_referencing`, when given, maps missing addresses to (address, commit_id) of
    the retained commits that reference them, to name the affected commits. It reads the
    repository's history, so it is called only when history is found missing.

    An inventory read from an S3 Inventory report (column `inventory_date`) lacks every
    object written after the report. Live entries carry no dates, so no missing live
    object can be shown to be older than the report: each is reported as a WARN that
    names the report's date, and none blocks the sweep (candidates come only from the
    report, so a missing live object can never become one).
    """
    if inventory.isEmpty():
        return empty_namespace_verdict()
    missing = missing_objects(live_files, inventory)
    if "inventory_date" in inventory.columns:
        return _missing_from_report(missing, inventory)
    # One query samples both kinds: missing objects at a head sort first, so the sample
    # holds only those when there are any, and otherwise the older ones.
    sampled = missing.select("address", "at_head").orderBy(F.desc("at_head")).limit(SAMPLE).collect()
    head_sample = [str(r["address"]) for r in sampled if r["at_head"]]
    if head_sample:
        at_head = missing.filter("at_head")
        return missing_at_head_verdict(at_head.count(), head_sample, in_trash(at_head, inventory))
    older_sample = [str(r["address"]) for r in sampled]
    if older_sample:
        gaps = commits_referencing(missing.select("address")) if commits_referencing is not None else None
        commits = (
            sorted({r["commit_id"] for r in gaps.select("commit_id").distinct().limit(SAMPLE).collect()})
            if gaps is not None
            else []
        )
        return missing_history_verdict(missing.count(), older_sample, commits, in_trash(missing, inventory))
    return all_present_verdict()


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


def in_trash(missing: DataFrame, inventory: DataFrame) -> dict[str, int]:
    """{trash run: how many of the missing live keys it holds under `_gc_trash/<run>/`}."""
    trashed = inventory.filter(F.col("address").startswith(f"{TRASH_PREFIX}/")).select(
        trash_run(F.col("address")).alias("run"), trash_origin(F.col("address")).alias("address")
    )
    found = trashed.join(missing.select("address"), "address", "left_semi").groupBy("run").count().collect()
    return {r["run"]: r["count"] for r in sorted(found, key=lambda r: r["run"])}


def _restore_hint(trashed: dict[str, int]) -> str:
    if not trashed:
        return ""
    runs = ", ".join(f"{run} ({count} objects)" for run, count in trashed.items())
    first = next(iter(trashed))
    return f"; they are in the trash of run {runs}: restore with `gc-assets restore --run-id {first}`"


def missing_objects(live_files: DataFrame, inventory: DataFrame, by: tuple[str, ...] = ()) -> DataFrame:
    """Live keys as referenced that storage holds under none of their spellings (`by`: the
    columns naming whose key it is, `repo` in a fleet).

    `data/per%20cent` is present when storage holds it as is or as `data/per cent`.
    """
    key = [*by, "address"]
    listed = inventory.select(*key)
    absent = live_files.filter("required").join(listed, key, "left_anti")
    schema = T.StructType(
        [T.StructField(c, T.StringType()) for c in by]
        + [T.StructField("address", T.StringType()), T.StructField("spelling", T.StringType())]
    )

    def spell(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            rows = [
                (*owner, address, spelling)
                for *owner, address in zip(*[frame[c] for c in key])
                for spelling in key_spellings(address)[1:]
            ]
            yield pd.DataFrame(rows, columns=[*by, "address", "spelling"], dtype=object)

    found = (
        absent.select(*key)
        .mapInPandas(spell, schema)
        .join(listed.withColumnRenamed("address", "spelling"), [*by, "spelling"], "left_semi")
        .select(*key)
    )
    return absent.join(found, key, "left_anti")


def _missing_from_report(missing: DataFrame, inventory: DataFrame) -> Verdict:
    report_date = inventory.agg(F.max("inventory_date")).first()[0]
    stamp = report_date.isoformat() if report_date is not None else "(empty report)"
    sample = _sample(missing)
    if not sample:
        return Verdict(
            "live_objects_present",
            True,
            f"every live object inside the namespace is in the inventory report of {stamp}",
        )
    return Verdict(
        "live_objects_present",
        False,
        f"{missing.count()} live objects are not in the inventory report of {stamp}; live entries carry no "
        f"dates, so each may have been written after the report (not blocking): {sample}",
        severity="WARN",
        metadata={"inventory_date": stamp, "missing_from_report": sample},
    )


def candidates_not_live(candidates: DataFrame, entries: DataFrame, namespace: str) -> Verdict:
    """Candidates are disjoint from the live set, recomputed from raw live entries in plain Python.

    This deliberately avoids the Spark normalization used by the mark: `entries` are
    the connector's raw addresses, turned into keys by gc_assets.core.uris.
    """
    schema = T.StructType([T.StructField("address", T.StringType(), False)])

    def keys(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            out = []
            for address in frame["address"]:
                key = classify_address(address, namespace)
                if key is not None:
                    out.extend(key_spellings(key))
            yield pd.DataFrame({"address": out}, dtype=object)

    live_keys = entries.select("address").mapInPandas(keys, schema)
    overlap = candidates.select("address").join(live_keys, "address", "left_semi")
    return live_candidates_verdict(_sample(overlap))


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
    format's window for in-flight writers."""
    return young_candidates_verdict(
        _sample(candidates.filter(too_young(F.lit(cutoff), F.lit(untracked_cutoff)))), cutoff, untracked_cutoff
    )


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


def head_commits(retained_commits: DataFrame) -> list[str]:
    """The commits the mark found at ref heads: the state the witness reads."""
    return sorted(r["commit_id"] for r in retained_commits.filter("ref_head").select("commit_id").collect())


def independent_witness(candidates: DataFrame, witness: DataFrame, live_files: DataFrame, namespace: str) -> Verdict:
    """What each ref head needs, as the format's reference reader sees it, is neither a
    candidate nor missing from the mark's live set at a head (docs/design.md §10).

    `witness` (commit_id, address) comes from the connector's witness_heads, which shares no
    code with the live-set path; its addresses become keys here with a normalization
    of its own (pathlib for files), so an error in the mark's address handling shows.
    """
    root = witness_root(namespace)
    schema = T.StructType(
        [T.StructField("commit_id", T.StringType(), False), T.StructField("address", T.StringType(), False)]
    )

    def keys(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            directories: dict[str, str] = {}  # per batch: a directory replaced later is resolved afresh
            pairs = [
                (head, witness_key(address, root, directories))
                for head, address in zip(frame["commit_id"], frame["address"])
            ]
            yield pd.DataFrame(
                [(h, key) for h, key in pairs if key is not None], columns=["commit_id", "address"], dtype=object
            )

    needed = witness.select("commit_id", "address").mapInPandas(keys, schema).cache()
    taken = needed.join(candidates.select("address"), "address", "left_semi")
    at_head = live_files.filter(F.col("at_head") & F.col("in_namespace")).select("address")
    unmarked = needed.join(at_head, "address", "left_anti")
    taken_sample = [f"{r['commit_id']}: {r['address']}" for r in taken.limit(SAMPLE).collect()]
    unmarked_sample = [f"{r['commit_id']}: {r['address']}" for r in unmarked.limit(SAMPLE).collect()]
    needed_count = needed.select("address").distinct().count()
    needed.unpersist()
    return witness_verdict(taken_sample, unmarked_sample, needed_count)


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
    """os.path.realpath(path), with the directory's real path looked up once: only a name that
    is itself a symbolic link (or a dot segment) needs resolving again."""
    directory, name = os.path.split(path)
    if not directory or name in ("", ".", ".."):
        return os.path.realpath(path)
    if directory not in directories:
        directories[directory] = os.path.realpath(directory)
    joined = os.path.join(directories[directory], name)
    return os.path.realpath(joined) if os.path.islink(joined) else joined


def candidates_inside_namespace(
    candidates: DataFrame, protected: tuple[str, ...], protected_patterns: tuple[str, ...] = ()
) -> Verdict:
    """Candidates are plain relative keys inside the namespace, outside protected prefixes and patterns."""
    compiled = [re.compile(p) for p in protected_patterns]
    schema = T.StructType([T.StructField("address", T.StringType(), False)])

    def offending(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            bad = [a for a in frame["address"] if not collectable_key(a, protected, compiled)]
            yield pd.DataFrame({"address": bad}, dtype=object)

    return outside_candidates_verdict(_sample(candidates.select("address").mapInPandas(offending, schema)), protected)


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


def receipts_cover_candidates(receipts: DataFrame, candidates: DataFrame) -> Verdict:
    """Exactly one receipt per candidate, and none for anything else (the purge's receipts,
    addressed by trash key, aside: no candidate is ever under `_gc_trash/`)."""
    return receipts_verdict(receipt_faults(receipts, candidates).get((), []))


def receipt_faults(
    receipts: DataFrame, candidates: DataFrame, by: tuple[str, ...] = ()
) -> dict[tuple[Any, ...], list[Any]]:
    """Up to SAMPLE addresses of each kind of fault (duplicated, uncovered, extra) per value of the
    columns `by`, in one query."""
    if "row_id" in receipts.columns:  # a file catalog's row receipts receipt rows, not candidates
        receipts = receipts.filter(F.col("row_id").isNull())
    key = [*by, "address"]
    per_address = (
        receipts.filter(~F.col("address").startswith(f"{TRASH_PREFIX}/")).groupBy(*key).agg(F.count("*").alias("n"))
    )
    both = per_address.join(candidates.select(*key).distinct().withColumn("candidate", F.lit(True)), key, "full_outer")
    kinds = F.array_compact(
        F.array(
            F.when(F.col("n") > 1, F.lit("duplicated")),
            F.when(F.col("n").isNull(), F.lit("uncovered")),
            F.when(F.col("candidate").isNull(), F.lit("extra")),
        )
    )
    faults = both.select(*key, F.explode(kinds).alias("kind"))
    rank = F.row_number().over(Window.partitionBy(*by, "kind").orderBy("address"))
    found: dict[tuple[Any, ...], list[Any]] = {}
    for row in faults.withColumn("rank", rank).filter(F.col("rank") <= SAMPLE).orderBy("kind", "rank").collect():
        found.setdefault(tuple(row[c] for c in by), []).append(row)
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
    return intact_verdict(_sample(existence.filter(~F.col("exists"))))


def intact_verdict(gone: list[str]) -> Verdict:
    return Verdict(
        "live_objects_intact",
        not gone,
        "every live object that was in storage before the sweep is still there"
        if not gone
        else f"live objects gone after the sweep: {gone}",
        metadata={"lost_live_objects": gone},
    )
