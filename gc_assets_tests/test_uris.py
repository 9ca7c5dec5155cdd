"""Known answers, written by hand, for the address helpers test_address_table.py does not reach.

Namespaces are refused unless they name one bucket or one directory other than '/'; a key is
compared case-sensitively and may hold ':'; an address is inside only below the namespace,
never the namespace itself; what storage may be asked to act on is a plain relative key.
"""

from __future__ import annotations

import os
import posixpath
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gc_assets.core.uris import (
    UNSUPPORTED,
    azure_parts,
    canonical_address,
    classify_address,
    escapes,
    is_plain_key,
    key_spellings,
    local_path,
    lower_scheme,
    namespace_uri_prefixes,
    normalize_namespace,
    real_namespace,
    under_external_prefix,
    under_prefix,
)


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("/lake", "file:///lake"),
        ("/lake/", "file:///lake"),
        ("file://localhost/lake", "file:///lake"),
        ("FILE:///lake", "file:///lake"),
        ("s3://b", "s3://b"),
        ("s3://b/", "s3://b"),
        ("s3a://b/XY/", "s3://b/XY"),  # a prefix keeps its case and its letters; only slashes go
        ("  s3://b/ns  ", "s3://b/ns"),
        ("gcs://B/ns/", "gs://B/ns"),  # the bucket's case is real_namespace's to lower
        ("wasbs://Lake@Acct.blob.core.windows.net/ns/", "abfss://lake@acct.dfs.core.windows.net/ns"),
        ("abfs://lake@acct.dfs.core.usgovcloudapi.net", "abfss://lake@acct.dfs.core.usgovcloudapi.net"),
        ("abfss://lake@acct.dfs.core.windows.net/XY/", "abfss://lake@acct.dfs.core.windows.net/XY"),
        ("gs://b/", "gs://b"),
        ("gs://b/XY/", "gs://b/XY"),
        ("file:/lake", "file:///lake"),
        ("file:///lake/./x/../data", "file:///lake/data"),
        ("file:///lake%20house", "file:///lake house"),  # a URI's path is percent-decoded
        ("/srv/lake house", "file:///srv/lake house"),  # a bare path is a path
        ("/srv/XY", "file:///srv/XY"),  # only '%', '?' and '#' are refused
        ("fILe:/srv/x", "file:///srv/x"),
    ],
)
def test_namespace_normal_form(uri, expected):
    assert normalize_namespace(uri) == expected


@pytest.mark.parametrize(
    "uri, message",
    [
        ("", "storage namespace is empty"),
        ("   ", "storage namespace is empty"),
        ("file://server/lake", "'file://server/lake': file URIs must be file:///absolute/path"),
        ("file:///", "'file:///': a file namespace must be an absolute directory other than /"),
        ("/", "'/': a file namespace must be an absolute directory other than /"),  # named as given
        ("s3:///prefix", "'s3:///prefix': an S3 namespace needs a bucket"),
        (
            "hdfs://n/x",
            "'hdfs://n/x': unsupported scheme (use file:///path, s3://bucket/prefix, gs://bucket/prefix or abfss://container@account.dfs.core.windows.net/prefix)",
        ),
        ("gs:///x", "'gs:///x': a GCS namespace needs a bucket"),
        (
            "az://lake/ns",
            "'az://lake/ns': an Azure namespace names its account: abfss://container@account.dfs.core.windows.net/prefix",
        ),
        (
            "az:///ns",
            "'az:///ns': an Azure namespace names its account: abfss://container@account.dfs.core.windows.net/prefix",
        ),
        (
            "abfss://@acct.dfs.core.windows.net/ns",
            "'abfss://@acct.dfs.core.windows.net/ns': an Azure URI is abfss://container@account.dfs.<suffix>/path",
        ),
        # A container name holds no '@': the host is what follows the first one.
        (
            "abfss://a@b@acct.dfs.core.windows.net/ns",
            "'abfss://a@b@acct.dfs.core.windows.net/ns': an Azure URI is abfss://container@account.dfs.<suffix>/path",
        ),
        ("file:lake", "'file:lake': file URIs must be file:///absolute/path"),
        ("lake/ns", "'lake/ns': " + UNSUPPORTED),
        ("s3", "'s3': " + UNSUPPORTED),  # no scheme: a word, not an S3 location
        # A local path with '#', '?' or '%' would name another directory once normalized again
        # ('/srv/lake#1' became file:///srv/lake; '/srv/a%2541' became /srv/a%41, then /srv/aA).
        ("/srv/lake#1", "'/srv/lake#1': a file namespace's path may not hold '%', '?' or '#'"),
        ("/srv/lake?x", "'/srv/lake?x': a file namespace's path may not hold '%', '?' or '#'"),
        ("/srv/a%41", "'/srv/a%41': a file namespace's path may not hold '%', '?' or '#'"),
        ("file:///srv/a%2541", "'file:///srv/a%2541': a file namespace's path may not hold '%', '?' or '#'"),
        ("file:///srv/lake%231", "'file:///srv/lake%231': a file namespace's path may not hold '%', '?' or '#'"),
        (
            "abfss://acct.dfs.core.windows.net/ns",
            "'abfss://acct.dfs.core.windows.net/ns': an Azure URI is abfss://container@account.dfs.<suffix>/path",
        ),
        (
            "wasbs://lake@acct.queue.core.windows.net/ns",
            "'wasbs://lake@acct.queue.core.windows.net/ns': an Azure URI is abfss://container@account.dfs.<suffix>/path",
        ),
    ],
)
def test_namespaces_that_name_no_single_place_are_refused(uri, message):
    with pytest.raises(ValueError) as refused:
        normalize_namespace(uri)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "namespace, expected",
    [
        ("s3://B/Data/Set", "s3://b/Data/Set"),  # only the bucket is case-insensitive
        ("s3a://B", "s3://b"),
        ("s3://b/", "s3://b"),
        ("s3://B/odd://name", "s3://b/odd://name"),  # '://' inside the prefix is part of it
        ("gcs://B/Data", "gs://b/Data"),
        ("wasbs://Lake@Acct.blob.core.windows.net/Data", "abfss://lake@acct.dfs.core.windows.net/Data"),
    ],
)
def test_real_s3_namespace_lowers_only_the_bucket(namespace, expected):
    assert real_namespace(namespace) == expected


@pytest.mark.parametrize(
    "address, expected",
    [
        ("s3://b/ns/data/a:b", "s3://b/ns/data/a:b"),  # ':' inside a key is part of the key
        ("s3a://b/ns/x:y:z", "s3://b/ns/x:y:z"),
        ("s3://XB/k", "s3://xb/k"),
        ("s3://B/ns/Data/A", "s3://b/ns/Data/A"),
        ("GS://b/ns/a", "gs://b/ns/a"),
        ("gcs://B/ns/A", "gs://b/ns/A"),
        ("wasb://Lake@Acct.blob.core.windows.net/ns/A", "abfss://lake@acct.dfs.core.windows.net/ns/A"),
        ("az://Lake/ns/A", "az://lake/ns/A"),  # no namespace: the account stays unknown
        ("abfss://nohost/ns/A", "abfss://nohost/ns/A"),  # no Azure object: kept as written
        ("file:///lake/data/", "file:///lake/data"),
        ("file:///lake/data/.", "file:///lake/data"),
        ("file:///lake/data/..", "file:///lake"),
        ("relative/Key", "relative/Key"),
        ("gs://b/ns/a:b", "gs://b/ns/a:b"),
        ("gs://B/Data/Set/A", "gs://b/Data/Set/A"),  # only the bucket, up to the first '/', is lowered
        ("gcs://XB/k", "gs://xb/k"),
        ("abfss://c@acct.dfs.core.windows.net/ns/a:b", "abfss://c@acct.dfs.core.windows.net/ns/a:b"),
        ("az://Lake@Acct/ns/A", "az://Lake@Acct/ns/A"),  # az:// names no account: no Azure object
        ("az:///ns/A", "az:///ns/A"),
        ("abfss://a@b@acct.dfs.core.windows.net/k", "abfss://a@b@acct.dfs.core.windows.net/k"),
        ("abfss://@acct.dfs.core.windows.net/k", "abfss://@acct.dfs.core.windows.net/k"),
        # A local path is taken to its end: '#', '?' and tabs are characters of a file's name.
        ("/lake/data/a#b", "file:///lake/data/a#b"),
        ("file:///lake/data/a?v=1", "file:///lake/data/a?v=1"),
        ("file:/lake/data/a\tb", "file:///lake/data/a\tb"),
        ("file://localhost/lake/a", "file:///lake/a"),
        ("FILE://server/lake/a", "file://server/lake/a"),  # another host: kept, outside
        ("file:lake/a", "file:lake/a"),
    ],
)
def test_canonical_spelling_known_answers(address, expected):
    assert canonical_address(address) == expected


@pytest.mark.parametrize(
    "address, namespace, expected",
    [
        ("s3://b/ns/Data/A:1", "s3://B/ns", "Data/A:1"),
        ("file:///lake/data/..", "file:///lake", None),  # resolves to the namespace itself: no object
        ("file:///lake/data/.", "file:///lake", "data"),
        # The spellings of one Azure container are one namespace; az:// takes the namespace's account.
        ("abfss://lake@acct.dfs.core.windows.net/ns/Data/A", "wasbs://lake@acct.blob.core.windows.net/ns", "Data/A"),
        ("WASBS://LAKE@ACCT.blob.core.windows.net/ns/Data/A", "abfss://lake@acct.dfs.core.windows.net/ns", "Data/A"),
        ("abfs://lake@acct.dfs.core.windows.net/ns/a", "abfss://lake@acct.dfs.core.windows.net/ns", "a"),
        ("az://lake/ns/a", "abfss://lake@acct.dfs.core.windows.net/ns", "a"),
        ("az://lake/ns/a", "gs://lake/ns", None),  # an az:// address is not a GCS object
        ("abfss://lake@other.dfs.core.windows.net/ns/a", "abfss://lake@acct.dfs.core.windows.net/ns", None),
        ("abfss://lake@acct.dfs.core.chinacloudapi.cn/ns/a", "abfss://lake@acct.dfs.core.windows.net/ns", None),
        ("az://other/ns/a", "abfss://lake@acct.dfs.core.windows.net/ns", None),
        ("abfss://lake@acct.dfs.core.windows.net/nsx/a", "abfss://lake@acct.dfs.core.windows.net/ns", None),
        ("abfss://lake@acct.dfs.core.windows.net/ns", "abfss://lake@acct.dfs.core.windows.net/ns", None),
        ("gcs://Bk/ns/a", "gs://bk/ns", "a"),
        ("gs://bk/ns/a", "s3://bk/ns", None),
        ("s3://bk/ns/a", "gs://bk/ns", None),
        ("az://lake/ns/a:b", "abfss://lake@acct.dfs.core.windows.net/ns", "a:b"),
        ("az://lake@acct/ns/a", "abfss://lake@acct.dfs.core.windows.net/ns", None),
        ("abfss://lake@acct.dfs.core.windows.net/a:b", "abfss://lake@acct.dfs.core.windows.net", "a:b"),
        # A live file named 'a#b' protects 'a#b', not 'a' (urlsplit read '#b' as a fragment).
        ("/lake/data/a#b", "file:///lake", "data/a#b"),
        ("file:///lake/data/a?v=1", "file:///lake", "data/a?v=1"),
    ],
)
def test_classification_of_case_colons_and_dot_segments(address, namespace, expected):
    assert classify_address(address, namespace) == expected


@pytest.mark.parametrize(
    "key, expected",
    [
        ("", True),
        (".", True),
        ("..", True),
        ("a/..", True),
        ("a/../..", True),
        ("data/../../a", True),
        ("../a", True),
        ("/etc/passwd", True),
        ("data/a", False),
        ("data/../a", False),
        ("./a", False),
        ("data/./a/", False),
    ],
)
def test_which_keys_escape_the_namespace(key, expected):
    assert escapes(key) is expected


def test_a_percent_encoded_escape_protects_no_decoded_spelling():
    # Decoded, "a/../../b" resolves to "../b": outside, so only the key as written remains.
    assert key_spellings("a%2F..%2F..%2Fb") == ["a%2F..%2F..%2Fb"]
    assert key_spellings("%2Fetc%2Fpasswd") == ["%2Fetc%2Fpasswd"]


@pytest.mark.parametrize(
    "key, expected",
    [
        ("data/a", True),
        ("a", True),
        ("data/a b", True),
        ("", False),
        ("data//a", False),
        ("data/a/", False),
        ("/data/a", False),
        ("./a", False),
        ("data/./a", False),
        ("data/../a", False),
        ("..", False),
        ("data/a\x00b", False),
        ("s3:key", False),  # spelled like a URI: not a relative key
        ("s3://b/k", False),
    ],
)
def test_which_keys_storage_may_act_on(key, expected):
    assert is_plain_key(key) is expected


@pytest.mark.parametrize(
    "address, expected",
    [
        ("S3A://B/Key", "s3a://B/Key"),
        ("File:/x/Y", "file:/x/Y"),
        ("/lake/A", "/lake/A"),
        ("data/A", "data/A"),
    ],
)
def test_lower_scheme_lowers_the_scheme_and_nothing_else(address, expected):
    assert lower_scheme(address) == expected


@pytest.mark.parametrize(
    "namespace, expected",
    [
        ("file:///lake", ["file:///lake/", "file:/lake/", "file://localhost/lake/", "/lake/"]),
        ("s3://b/ns", ["s3://b/ns/", "s3a://b/ns/", "s3n://b/ns/"]),
        ("s3://b/odd://name", ["s3://b/odd://name/", "s3a://b/odd://name/", "s3n://b/odd://name/"]),
        ("gs://b/ns", ["gs://b/ns/", "gcs://b/ns/"]),
        (
            "abfss://c@a.dfs.core.windows.net/ns",
            [
                "abfss://c@a.dfs.core.windows.net/ns/",
                "abfs://c@a.dfs.core.windows.net/ns/",
                "wasbs://c@a.blob.core.windows.net/ns/",
                "wasb://c@a.blob.core.windows.net/ns/",
                "az://c/ns/",
            ],
        ),
        (
            "abfss://c@a.dfs.core.windows.net",
            [
                "abfss://c@a.dfs.core.windows.net/",
                "abfs://c@a.dfs.core.windows.net/",
                "wasbs://c@a.blob.core.windows.net/",
                "wasb://c@a.blob.core.windows.net/",
                "az://c/",
            ],
        ),
        (
            "abfss://c@a.dfs.core.windows.net/Xns",
            [
                "abfss://c@a.dfs.core.windows.net/Xns/",
                "abfs://c@a.dfs.core.windows.net/Xns/",
                "wasbs://c@a.blob.core.windows.net/Xns/",
                "wasb://c@a.blob.core.windows.net/Xns/",
                "az://c/Xns/",
            ],
        ),
    ],
)
def test_every_spelling_of_a_namespace_prefix(namespace, expected):
    assert namespace_uri_prefixes(namespace) == expected


@pytest.mark.parametrize(
    "address, prefixes, expected",
    [
        ("s3a://Imports/raw/x.parquet", ("s3://imports/raw",), True),
        ("s3://imports/raw/x", ("s3://other", "s3://imports/raw/"), True),
        ("file:///imports/a", ("/imports",), True),
        ("s3://imports/rawx/y", ("s3://imports/raw",), False),
        ("s3://imports/raw", ("s3://imports/raw",), False),
        ("s3://imports/raw/x", (), False),
        ("wasbs://imports@acct.blob.core.windows.net/raw/x", ("abfss://imports@acct.dfs.core.windows.net/raw",), True),
        ("gcs://Imports/raw/x", ("gs://imports/raw",), True),
    ],
)
def test_external_prefixes_hold_only_what_lies_below_them(address, prefixes, expected):
    assert under_external_prefix(address, prefixes) is expected


@pytest.mark.parametrize(
    "key, prefixes, expected",
    [
        ("data", ("data/",), True),
        ("data/a", ("data",), True),
        ("data/a", ("data/",), True),
        ("b/x", ("a", "b"), True),
        ("database/a", ("data",), False),
        ("other", ("data",), False),
        ("logs/a", ("logsX/",), False),  # only slashes are trimmed from a prefix
        ("x", (), False),
    ],
)
def test_under_prefix_known_answers(key, prefixes, expected):
    assert under_prefix(key, prefixes) is expected


def test_local_path_of_a_file_namespace_and_refusal_of_any_other():
    assert local_path("file:///lake") == "/lake"
    with pytest.raises(ValueError) as refused:
        local_path("s3://b/ns")
    assert str(refused.value) == "'s3://b/ns' is not a local namespace"


def test_azure_parts_of_a_namespace_and_refusal_of_one_without_an_account():
    assert azure_parts("abfss://c@a.dfs.core.usgovcloudapi.net/Xns/y/") == ("c", "a", "core.usgovcloudapi.net", "Xns/y")
    with pytest.raises(ValueError) as refused:
        azure_parts("az://c/ns")
    assert str(refused.value) == "'az://c/ns': an Azure URI is abfss://container@account.dfs.<suffix>/path"


SEGMENTS = st.lists(
    st.sampled_from(["a", "B", ".", "..", "", "x y", "%", "%25", "%41", "#", "?", "é", "a#b"]), min_size=1, max_size=4
)


@given(segments=SEGMENTS, as_uri=st.booleans())
def test_a_local_namespace_normalized_again_names_the_same_directory(segments, as_uri):
    """Config stores the normal form and real_namespace() normalizes it again: both must name one directory."""
    path = "/srv/" + "/".join(segments)
    given_as = "file://" + quote(path) if as_uri else path
    try:
        normal = normalize_namespace(given_as)
    except ValueError:
        return  # refused: fail closed
    assert normalize_namespace(normal) == normal
    assert local_path(normal) == posixpath.normpath(path)  # the directory meant, by the standard library


def test_real_namespace_resolves_a_symlink_anywhere_in_the_path(tmp_path):
    (tmp_path / "real" / "tables" / "t").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "tables" / "link").symlink_to(tmp_path / "real" / "tables" / "t")
    real = os.path.realpath(tmp_path / "real")
    assert real_namespace((tmp_path / "alias" / "tables" / "t").as_uri()) == f"file://{real}/tables/t"
    assert real_namespace((tmp_path / "real" / "tables" / "link").as_uri()) == f"file://{real}/tables/t"
    assert real_namespace((tmp_path / "alias" / "tables" / "new").as_uri()) == f"file://{real}/tables/new"
