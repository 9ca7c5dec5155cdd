"""Address classification against a table of known answers, written by hand.

The product's one canonical spelling (docs/design.md §10): which key an address names inside
a namespace, or that it is outside; and which other spellings a live key protects.
"""

from __future__ import annotations

import os
import unicodedata
from typing import Sequence

import pytest
from hypothesis import strategies as st

from gc_assets.core.uris import (
    canonical_address,
    classify_address,
    key_spellings,
    namespace_contains,
    under_prefix,
)
from gc_assets_tests.examples_in_one_job import check_in_one_job, per_case

NFC_E = unicodedata.normalize("NFC", "é")
NFD_E = unicodedata.normalize("NFD", "é")

CLASSIFICATION = [
    # address, namespace, key inside (None: outside)
    ("data/a", "s3://b/ns", "data/a"),
    ("s3://b/ns/data/a", "s3://b/ns", "data/a"),
    ("s3a://b/ns/data/a", "s3://b/ns", "data/a"),
    ("S3N://b/ns/data/a", "s3://b/ns", "data/a"),
    ("s3://B/ns/data/a", "s3://b/ns", "data/a"),  # bucket names are lower case
    ("s3://b/ns2/data/a", "s3://b/ns", None),
    ("s3://b/ns", "s3://b/ns", None),  # the namespace itself is no object
    ("s3://b/ns/", "s3://b/ns", None),
    ("s3://other/ns/data/a", "s3://b/ns", None),
    ("s3://b/ns/data/a%20b", "s3://b/ns", "data/a%20b"),  # S3 keys are literal
    ("gs://b/ns/data/a", "s3://b/ns", None),
    ("file:///lake/data/a", "file:///lake", "data/a"),
    ("file:/lake/data/a", "file:///lake", "data/a"),
    ("file://localhost/lake/data/a", "file:///lake", "data/a"),
    ("FILE:///lake/data/a", "file:///lake", "data/a"),
    ("/lake/data/a", "file:///lake", "data/a"),
    ("file:///lake/data/./a", "file:///lake", "data/a"),
    ("file:///lake/x/../data/a", "file:///lake", "data/a"),
    ("file:///lake/../etc/passwd", "file:///lake", None),
    ("file:///lake/data/a%20b", "file:///lake", "data/a%20b"),  # decoded spelling protected below
    ("file:///lakehouse/data/a", "file:///lake", None),
    ("file://server/lake/data/a", "file:///lake", None),
    ("s3://b/ns/data/a", "file:///lake", None),
    ("file:///lake/data/a", "s3://b/ns", None),
    # Azure: every spelling of one container is one namespace (account and container lower case)
    ("abfss://c@acct.dfs.core.windows.net/ns/data/a", "abfss://c@acct.dfs.core.windows.net/ns", "data/a"),
    ("wasbs://c@acct.blob.core.windows.net/ns/data/a", "abfss://c@acct.dfs.core.windows.net/ns", "data/a"),
    ("wasb://C@ACCT.blob.core.windows.net/ns/data/a", "abfss://c@acct.dfs.core.windows.net/ns", "data/a"),
    ("az://c/ns/data/a", "abfss://c@acct.dfs.core.windows.net/ns", "data/a"),  # the namespace's account
    ("az://c/ns/data/a", "wasbs://c@acct.blob.core.windows.net/ns", "data/a"),
    ("abfss://c@acct.dfs.core.windows.net/ns/Data/A", "abfss://c@acct.dfs.core.windows.net/ns", "Data/A"),
    ("abfss://c@other.dfs.core.windows.net/ns/data/a", "abfss://c@acct.dfs.core.windows.net/ns", None),
    ("abfss://d@acct.dfs.core.windows.net/ns/data/a", "abfss://c@acct.dfs.core.windows.net/ns", None),
    ("az://d/ns/data/a", "abfss://c@acct.dfs.core.windows.net/ns", None),
    ("abfss://c@acct.dfs.core.usgovcloudapi.net/ns/data/a", "abfss://c@acct.dfs.core.windows.net/ns", None),
    ("abfss://c@acct.dfs.core.windows.net/ns", "abfss://c@acct.dfs.core.windows.net/ns", None),
    ("abfss://acct.dfs.core.windows.net/ns/data/a", "abfss://c@acct.dfs.core.windows.net/ns", None),
    (
        "https://acct.blob.core.windows.net/c/ns/data/a",
        "abfss://c@acct.dfs.core.windows.net/ns",
        None,
    ),  # not read: outside
    ("s3://c/ns/data/a", "abfss://c@acct.dfs.core.windows.net/ns", None),
    # GCS
    ("gs://b/ns/data/a", "gs://b/ns", "data/a"),
    ("gcs://B/ns/data/a", "gs://b/ns", "data/a"),
    ("gs://b/ns2/data/a", "gs://b/ns", None),
    ("s3://b/ns/data/a", "gs://b/ns", None),
    ("az://b/ns/data/a", "gs://b/ns", None),
]


@pytest.mark.parametrize("address, namespace, expected", CLASSIFICATION)
def test_classification_known_answers(address, namespace, expected):
    assert classify_address(address, namespace) == expected


def test_classification_sees_through_symlinks(tmp_path):
    real = tmp_path / "real"
    (real / "data").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(real)
    (real / "data" / "link").symlink_to(real / "data" / "target")
    assert classify_address(f"file://{tmp_path}/alias/data/a", real.as_uri()) == "data/a"
    assert classify_address(f"file://{tmp_path}/real/data/link", f"file://{tmp_path}/alias") == "data/target"
    assert canonical_address(f"{tmp_path}/alias/data/a") == f"file://{os.path.realpath(real)}/data/a"
    assert namespace_contains(real.as_uri(), f"file://{tmp_path}/alias/data") == "data"
    assert namespace_contains(f"file://{tmp_path}/alias", real.as_uri()) == ""
    assert namespace_contains(real.as_uri(), tmp_path.as_uri()) is None


SPELLINGS = [
    ("data/a", ["data/a"]),
    ("data/a%20b", ["data/a%20b", "data/a b"]),
    ("data/./a", ["data/./a", "data/a"]),
    ("data//a", ["data//a", "data/a"]),
    ("data/a/", ["data/a/", "data/a"]),
    (f"data/{NFC_E}", [f"data/{NFC_E}", f"data/{NFD_E}"]),
    (f"data/{NFD_E}", [f"data/{NFD_E}", f"data/{NFC_E}"]),
    ("../a", ["../a"]),  # escaping: no other spelling, and the key itself is outside
    ("data/../../a", ["data/../../a"]),
]


@pytest.mark.parametrize("key, expected", SPELLINGS)
def test_spellings_known_answers(key, expected):
    assert key_spellings(key) == expected


def test_azure_spellings_on_spark_are_one_namespace(spark):
    """The columnar twin (addresses.with_relative_keys) classifies as uris does: spellings of the
    namespace's container are keys, another container is outside, external only under a prefix."""
    from gc_assets.core.addresses import with_relative_keys

    namespace = "abfss://c@acct.dfs.core.windows.net/ns"
    addresses = [
        "wasbs://c@acct.blob.core.windows.net/ns/data/a",
        "az://c/ns/data/b",
        "ABFS://c@acct.dfs.core.windows.net/ns/data/c",
        "az://imports/raw/x",
        "abfss://imports@acct.dfs.core.windows.net/raw/y",
    ]
    entries = spark.createDataFrame([(a,) for a in addresses], "address string")
    rows = with_relative_keys(entries, namespace, ("abfss://imports@acct.dfs.core.windows.net/raw",)).collect()
    found = {r["spelled"]: (r["address"], r["in_namespace"], r["external"]) for r in rows}
    assert found == {
        addresses[0]: ("data/a", True, False),
        addresses[1]: ("data/b", True, False),
        addresses[2]: ("data/c", True, False),
        addresses[3]: ("az://imports/raw/x", False, False),  # whose account? outside, and not external
        addresses[4]: ("abfss://imports@acct.dfs.core.windows.net/raw/y", False, True),
    }


# Characters that make prefix matching hard: separators, dots, quotes and escapes (the Spark
# filter is written as SQL), and a non-ASCII letter.
_PATH_TEXT = st.text(alphabet="ab/.'\\\"é`", max_size=7)


_KEYS_AND_PREFIXES = st.tuples(st.lists(_PATH_TEXT, min_size=1, max_size=25), st.lists(_PATH_TEXT, max_size=6))


def _under_on_spark(spark, cases: Sequence[tuple[list[str], list[str]]]) -> list[dict[str, bool]]:
    """Each case's key -> under_prefixes_column(key, its prefixes), every case in one job."""
    from gc_assets.core.addresses import under_prefixes_column

    frame = spark.createDataFrame(
        [(case, key) for case, (keys, _) in enumerate(cases) for key in keys], "case int, address string"
    )
    under = per_case([under_prefixes_column("address", prefixes) for _, prefixes in cases])
    found: list[dict[str, bool]] = [{} for _ in cases]
    for row in frame.select("case", "address", under.alias("under")).collect():
        found[row["case"]][row["address"]] = row["under"]
    return found


def test_the_protected_prefix_filter_on_spark_agrees_with_the_python_rule(spark):
    """addresses.under_prefixes_column, the candidates' filter, says what uris.under_prefix says."""

    def check(case: tuple[list[str], list[str]], found: dict[str, bool]) -> None:
        keys, prefixes = case
        assert found == {key: under_prefix(key, prefixes) for key in keys}

    check_in_one_job(_KEYS_AND_PREFIXES, lambda cases: _under_on_spark(spark, cases), check)


# Two repositories whose names could run into each other's keys if joined without a separator.
_OWNERS = ("t", "t/x")
_OWNED_KEYS_AND_PREFIXES = st.tuples(
    st.lists(st.tuples(st.sampled_from(_OWNERS), _PATH_TEXT), min_size=1, max_size=25),
    st.lists(_PATH_TEXT, max_size=6),
    st.lists(_PATH_TEXT, max_size=6),
)


def test_each_repository_s_protected_prefixes_cover_its_own_keys_only(spark):
    """addresses.under_owned_prefixes_column, the filter of a set of repositories' candidates: a
    key is protected by its own repository's prefixes, as uris.under_prefix says, never by another's."""
    from gc_assets.core.addresses import under_owned_prefixes_column

    def evaluate(cases: Sequence[tuple[list[tuple[str, str]], list[str], list[str]]]) -> list[dict]:
        frame = spark.createDataFrame(
            [(case, owner, key) for case, (keyed, _, _) in enumerate(cases) for owner, key in keyed],
            "case int, repo string, address string",
        )
        under = per_case(
            [under_owned_prefixes_column("repo", "address", dict(zip(_OWNERS, theirs))) for _, *theirs in cases]
        )
        found: list[dict] = [{} for _ in cases]
        for row in frame.select("case", "repo", "address", under.alias("under")).collect():
            found[row["case"]][(row["repo"], row["address"])] = row["under"]
        return found

    def check(case: tuple[list[tuple[str, str]], list[str], list[str]], found: dict) -> None:
        keyed, *theirs = case
        prefixes = dict(zip(_OWNERS, theirs))
        assert found == {(owner, key): under_prefix(key, prefixes[owner]) for owner, key in keyed}

    check_in_one_job(_OWNED_KEYS_AND_PREFIXES, evaluate, check)
