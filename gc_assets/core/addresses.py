"""Address normalization on Spark, the columnar twin of gc_assets.core.uris.

Live entries become keys relative to the namespace. An address that might name an
object inside the namespace must stay protected, so schemes are compared
case-insensitively and keys with '.'/'..'/empty segments also protect their
resolved spelling.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gc_assets.core.state import TRASH_PREFIX
from gc_assets.core.uris import (
    SCHEME_PATTERN,
    canonical_address,
    classify_address,
    escapes,
    key_spellings,
    namespace_uri_prefixes,
    under_external_prefix,
)

_SCHEME = SCHEME_PATTERN.pattern.rstrip(":").lstrip("^")
# An absolute URI or an absolute path; anything else is a key relative to a namespace.
ABSOLUTE_ADDRESS_PATTERN = f"^{_SCHEME}:|^/"
# Keys that key_spellings() may spell differently, or that name nothing: dot segments,
# empty segments, a leading or trailing slash, percent-escapes, non-ASCII characters, the empty key.
UNRESOLVED_KEY_PATTERN = r"(^|/)\.\.?(/|$)|//|^/|/$|%[0-9A-Fa-f]{2}|[^\x00-\x7F]|^$"


# Spark's `rlike` searches its pattern from every position of every row, each branch at each: on
# 300,000 keys of Delta tables, filtering by UNRESOLVED_KEY_PATTERN took 1.0 s on 2 cores, 0.27 s
# guarded as below (0.28 and 0.15 s for ABSOLUTE_ADDRESS_PATTERN). Each function below searches its
# pattern only in the rows a cheap test of its own says it can match: the test holds wherever the
# pattern matches, so the answer is the pattern's, row for row.
def has_scheme(address: Column) -> Column:
    """`address` begins with a URI scheme (SCHEME_PATTERN): a colon after its first letter."""
    return (F.instr(address, ":") > 1) & address.rlike(f"^{_SCHEME}:")


def is_absolute_address(address: Column) -> Column:
    """`address` matches ABSOLUTE_ADDRESS_PATTERN: an absolute path or a scheme."""
    return address.startswith("/") | has_scheme(address)


def is_unresolved_key(address: Column) -> Column:
    """`address` matches UNRESOLVED_KEY_PATTERN. Each branch needs one of: a leading dot or a
    slash and a dot, two slashes, a leading or trailing slash, a percent sign, a byte that is not
    ASCII (more bytes than characters, or bytes that are not UTF-8, which Java reads as U+FFFD),
    the empty key, or a line terminator (Java's `$` also matches before a final one; the
    non-ASCII ones are counted above)."""
    maybe = (
        address.startswith(".")
        | address.contains("/.")
        | address.contains("//")
        | address.startswith("/")
        | address.endswith("/")
        | address.contains("%")
        | (F.octet_length(address) != F.length(address))
        | ~F.is_valid_utf8(address)
        | (address == "")
        | address.contains("\n")
        | address.contains("\r")
    )
    return maybe & address.rlike(UNRESOLVED_KEY_PATTERN)


def relative_key_column(address: Column, namespace: str) -> Column:
    """Relative key of `address`, or null when it is an absolute URI outside the namespace."""
    lowered = F.when(
        has_scheme(address),
        F.concat(
            F.lower(F.regexp_extract(address, f"^({_SCHEME}):", 1)), F.regexp_extract(address, f"^{_SCHEME}(:.*)$", 1)
        ),
    ).otherwise(address)
    result = F.when(~is_absolute_address(address), address)
    for prefix in namespace_uri_prefixes(namespace):
        result = result.when(
            lowered.startswith(prefix) & (F.length(lowered) > len(prefix)),
            F.substring(lowered, len(prefix) + 1, 1 << 30),
        )
    return result


def with_relative_keys(
    entries: DataFrame,
    namespace: str | Mapping[str, str],
    external_prefixes: tuple[str, ...] | Mapping[str, tuple[str, ...]] = (),
) -> DataFrame:
    """Replace `address` by its relative key where inside, adding `in_namespace`, `required`
    and `external`.

    Absolute addresses are classified in their canonical spelling (uris.classify_address:
    `file:` through the real path, `s3a`/`s3n` as `s3`), so an alias of the namespace is
    inside. Outside addresses keep their canonical URI: they are live, never collected,
    and `external` says whether they lie under a configured external prefix (an outside
    address that does not is refused by the mark). A relative key whose path escapes
    the namespace (`../x`) is outside too. Keys that other spellings may name (see
    uris.key_spellings) get one extra row per spelling, which protects that spelling
    but is not `required` to exist in storage. `spelled` keeps the address as the source wrote it.

    Many repositories at once: `namespace` and `external_prefixes` map each repository's name
    to its own, and each row is judged by those of its `repo` column.
    """
    # Read by four branches below (relative or absolute, usual or unusual): computed once.
    entries = entries.localCheckpoint()
    is_absolute = is_absolute_address(F.col("address"))
    relative = entries.filter(~is_absolute).select(
        *[c for c in entries.columns if c != "address"],
        "address",
        F.col("address").alias("spelled"),
        F.lit(True).alias("in_namespace"),
        F.lit(True).alias("required"),
        F.lit(False).alias("external"),
    )
    keyed = relative.unionByName(_classified(entries.filter(is_absolute), namespace, external_prefixes))
    unusual = F.col("in_namespace") & is_unresolved_key(F.col("address"))
    return keyed.filter(~unusual).unionByName(_spelled(keyed.filter(unusual)))


def _classified(
    absolute: DataFrame,
    namespace: str | Mapping[str, str],
    external_prefixes: tuple[str, ...] | Mapping[str, tuple[str, ...]],
) -> DataFrame:
    """Absolute addresses as keys inside the namespace, or canonical URIs outside it (on executors)."""
    schema = T.StructType(
        [f for f in absolute.schema.fields if f.name != "address"]
        + [
            T.StructField("address", T.StringType(), False),
            T.StructField("spelled", T.StringType(), False),
            T.StructField("in_namespace", T.BooleanType(), False),
            T.StructField("required", T.BooleanType(), False),
            T.StructField("external", T.BooleanType(), False),
        ]
    )

    def classify(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            if isinstance(namespace, str):
                namespaces = [namespace] * len(frame)
                externals = [external_prefixes] * len(frame)
            else:
                namespaces = [namespace[repo] for repo in frame["repo"]]
                externals = [
                    external_prefixes.get(repo, ()) if isinstance(external_prefixes, Mapping) else external_prefixes
                    for repo in frame["repo"]
                ]
            keys = [classify_address(a, n) for a, n in zip(frame["address"], namespaces)]
            out = frame.drop(columns=["address"])
            out["address"] = [
                key if key is not None else canonical_address(a) for key, a in zip(keys, frame["address"])
            ]
            out["spelled"] = frame["address"].values
            out["in_namespace"] = [key is not None for key in keys]
            out["required"] = out["in_namespace"]
            out["external"] = [
                key is None and under_external_prefix(a, e) for key, a, e in zip(keys, frame["address"], externals)
            ]
            yield out[schema.fieldNames()]

    return absolute.mapInPandas(classify, schema)


def _spelled(unusual: DataFrame) -> DataFrame:
    """Every spelling of unusual keys (rare, so a Python UDF is cheap); escaping keys are outside."""
    schema = unusual.schema

    def spell(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            rows = []
            for record in frame.to_dict("records"):
                key = record["address"]
                inside = not escapes(key)
                rows.append({**record, "in_namespace": inside, "required": inside, "external": False})
                rows.extend({**record, "address": spelling, "required": False} for spelling in key_spellings(key)[1:])
            yield pd.DataFrame(rows, columns=frame.columns)

    return unusual.mapInPandas(spell, schema)


def under_prefixes_column(column: str, prefixes: list[str] | tuple[str, ...]) -> Column:
    """Whether the key in `column` is one of `prefixes` or lies below one (mirrors uris.under_prefix)."""
    return _under_prefixes(column, {"": prefixes}, "''")


def under_owned_prefixes_column(owner: str, column: str, prefixes: Mapping[str, Iterable[str]]) -> Column:
    """Whether the key in `column` is one of the prefixes of the repository the column `owner`
    names (`prefixes`: repository -> its prefixes) or lies below one."""
    return _under_prefixes(column, prefixes, f"`{owner}`")


def _under_prefixes(column: str, prefixes: Mapping[str, Iterable[str]], owner: str) -> Column:
    """A key lies below a prefix exactly when one of its ancestors (the key cut at a '/', or the
    whole key) is the prefix without its trailing '/', so each ancestor, after its owner and a
    NUL, is looked up in the set of all (owner, prefix) pairs: one flat expression whatever their
    number (an outer repository protects every table discovered inside it; one condition per
    prefix overflowed Spark's planner at a thousand). The pairs are written as UTF-8 hex
    literals, which no quoting or escaping setting can misread; Spark folds them into one hash set.
    """
    pairs = sorted({f"{who}\0{prefix.rstrip('/')}" for who, theirs in prefixes.items() for prefix in theirs})
    if not pairs:
        return F.lit(False)
    key = f"`{column}`"
    ancestors = (
        f"transform(sequence(1, size(split({key}, '/'))), depth -> array_join(slice(split({key}, '/'), 1, depth), '/'))"
    )
    literals = ", ".join(f"cast(X'{pair.encode().hex()}' as string)" for pair in pairs)
    return F.expr(f"exists({ancestors}, ancestor -> concat({owner}, cast(X'00' as string), ancestor) IN ({literals}))")


def matches_any_column(address: Column, patterns: list[str] | tuple[str, ...]) -> Column:
    """Whether `address` matches one of the regular expressions (Java syntax, searched anywhere)."""
    condition = F.lit(False)
    for pattern in patterns:
        condition = condition | address.rlike(pattern)
    return condition


def trash_origin(address: Column) -> Column:
    """`_gc_trash/<run>/<original>` -> original ("" for any other address)."""
    return F.regexp_extract(address, f"^{TRASH_PREFIX}/[^/]+/(.+)$", 1)


def trash_run(address: Column) -> Column:
    """`_gc_trash/<run>/<original>` -> run."""
    return F.split(address, "/").getItem(1)
