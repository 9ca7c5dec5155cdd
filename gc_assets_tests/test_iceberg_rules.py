"""Iceberg without Spark: the gc.yaml fields, URI spellings, and `retention: iceberg` against a
literal reading of Iceberg's expire-snapshots rules."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gc_assets.core.config import ConfigError, parse_config
from gc_assets.core.retention import DANGLING, Commit, Ref
from gc_assets.sources.iceberg import (
    HIDDEN_PATH_PATTERN,
    IcebergPolicy,
    RefPolicy,
    canonical_uri,
    iceberg_retention,
)
from gc_assets_tests.iceberg_tables import iceberg_retained_oracle

NAMESPACE = "file:///lake/t"


def _repo(**overrides):
    return {"name": "t", "format": "iceberg", "storage_namespace": NAMESPACE, **overrides}


def _load(**overrides):
    return parse_config({"repositories": [_repo(**overrides)]}, "gc.yaml").repository("t")


CATALOG = {"type": "sql", "uri": "sqlite:///catalog.db", "table": "db.t"}


def test_catalog_block_and_retention_switch_load():
    repo = _load(catalog=CATALOG, retention="iceberg", external_prefixes=["s3a://imports/raw/"])
    assert repo.catalog.type == "sql" and repo.catalog.table == "db.t" and repo.catalog.name == "default"
    assert repo.retention == "iceberg" and repo.rules is None
    assert repo.external_prefixes == ("s3://imports/raw",)
    assert _load(source="file:///lake/t/metadata/00003-x.metadata.json").catalog is None


@pytest.mark.parametrize(
    "overrides, field, message",
    [
        ({}, "catalog", "exactly one of source"),
        (
            {"catalog": CATALOG, "source": "file:///lake/t/metadata/v1.metadata.json"},
            "catalog",
            "exactly one of source",
        ),
        ({"catalog": {**CATALOG, "table": "t"}}, "catalog.table", "should match pattern"),
        ({"catalog": {**CATALOG, "type": "hive"}}, "catalog.type", "'sql' or 'rest'"),
        ({"catalog": {**CATALOG, "password": "x"}}, "catalog.password", "Extra inputs are not permitted"),
        ({"catalog": CATALOG, "retention": "iceberg", "rules": {"default_retention_days": 3}}, "retention", "not both"),
        ({"catalog": CATALOG, "retention": "lakefs"}, "retention", "'iceberg'"),
        ({"catalog": CATALOG, "external_prefixes": ["relative/dir"]}, "external_prefixes", "unsupported scheme"),
    ],
)
def test_invalid_iceberg_fields_name_file_repository_and_field(overrides, field, message):
    with pytest.raises(ConfigError) as error:
        _load(**overrides)
    text = str(error.value)
    assert text.startswith("gc.yaml: invalid configuration: repository 't': ")
    assert f"field {field}:" in text and message in text


def test_iceberg_fields_are_refused_on_other_formats():
    lakefs = {"format": "lakefs-export", "source": "file:///lake/t/_lakefs/export"}
    with pytest.raises(ConfigError, match="field catalog: is only for format iceberg"):
        _load(**lakefs, catalog=CATALOG)
    with pytest.raises(ConfigError, match="field retention: retention: iceberg is only for format iceberg"):
        _load(**lakefs, retention="iceberg")


@pytest.mark.parametrize(
    "uri, canonical",
    [
        ("s3a://bucket/t/data/x.parquet", "s3://bucket/t/data/x.parquet"),
        ("S3N://bucket/t/data/x.parquet", "s3://bucket/t/data/x.parquet"),
        ("s3://bucket/t/data/x.parquet", "s3://bucket/t/data/x.parquet"),
        ("file:/lake/t/data/x.parquet", "file:///lake/t/data/x.parquet"),
        ("file:///lake/t/data/x.parquet", "file:///lake/t/data/x.parquet"),
        ("file://localhost/lake/t/data/x.parquet", "file:///lake/t/data/x.parquet"),
        ("/lake/t/data/x.parquet", "file:///lake/t/data/x.parquet"),
        ("file://otherhost/lake/t/x", "file://otherhost/lake/t/x"),  # another host: left alone, so outside
        ("GS://bucket/x", "gs://bucket/x"),
    ],
)
def test_canonical_uri(uri, canonical):
    assert canonical_uri(uri) == canonical


@pytest.mark.parametrize(
    "key, hidden",
    [
        ("data/.part-0.parquet.crc", True),
        ("_staging/tmp-0.parquet", True),
        ("data/_region=x/kept.parquet", False),  # a partition directory, as in Iceberg's rule
        ("data/region=_x/kept.parquet", False),
        ("data/00000-0-a.parquet", False),
        ("metadata/.00001-a.metadata.json.crc", True),
    ],
)
def test_hidden_paths_follow_icebergs_orphan_file_rule(key, hidden):
    assert bool(re.search(HIDDEN_PATH_PATTERN, key)) is hidden


# ---------------------------------------------------------------- retention: iceberg

AS_OF = dt.datetime(2024, 3, 10, tzinfo=dt.timezone.utc)
HOUR_MS = 3600 * 1000


@st.composite
def iceberg_histories(draw):
    """Random snapshot trees (one parent each, some parents already expired), refs and settings."""
    count = draw(st.integers(1, 14))
    commits: list[Commit] = []
    for index in range(count):
        parent = draw(st.one_of(st.none(), st.integers(0, index - 1))) if index else None
        hours = draw(st.integers(0, 24 * 12))
        commits.append(
            Commit(
                f"s{index}",
                (f"s{parent}",) if parent is not None else (),
                AS_OF - dt.timedelta(hours=hours),
            )
        )
    ids = [c.commit_id for c in commits]
    refs = [Ref("main", "branch", draw(st.sampled_from(ids)))]
    for name in draw(st.lists(st.sampled_from(["dev", "audit", "v1", "v2"]), unique=True, max_size=4)):
        refs.append(Ref(name, "tag" if name.startswith("v") else "branch", draw(st.sampled_from(ids))))
    ages = st.one_of(st.none(), st.integers(1, 24 * 10).map(lambda h: h * HOUR_MS))
    policies = {
        ref.name: RefPolicy(
            draw(ages) if ref.kind == "branch" else None,
            draw(st.one_of(st.none(), st.integers(1, 4))) if ref.kind == "branch" else None,
            draw(ages),
        )
        for ref in refs
    }
    policy = IcebergPolicy(
        max_snapshot_age_ms=draw(st.integers(1, 24 * 10)) * HOUR_MS,
        min_snapshots_to_keep=draw(st.integers(1, 3)),
        max_ref_age_ms=draw(ages),
        refs=policies,
    )
    return commits, refs, policy


@given(iceberg_histories())
def test_iceberg_retention_equals_the_literal_expire_snapshots_rules(history):
    commits, refs, policy = history
    verdicts = iceberg_retention(commits, refs, policy, AS_OF)
    retained = {commit_id for commit_id, verdict in verdicts.items() if verdict.retained}
    assert retained == iceberg_retained_oracle(commits, refs, policy, AS_OF)
    assert {ref.commit_id for ref in refs} <= retained  # a ref never loses its own snapshot


def test_iceberg_retention_worked_example():
    """main keeps 2 snapshots or 3 days; an aged-out branch keeps only its head; a tag its snapshot;
    an unreferenced snapshot is kept while younger than the table's max age."""

    def at(days):
        return AS_OF - dt.timedelta(days=days)

    commits = [
        Commit("m1", (), at(9)),
        Commit("m2", ("m1",), at(8)),
        Commit("m3", ("m2",), at(7)),  # kept only by min-snapshots-to-keep = 2
        Commit("m4", ("m3",), at(6)),  # main head
        Commit("old-dev-1", ("m1",), at(8.5)),
        Commit("old-dev-2", ("old-dev-1",), at(8)),  # head of 'stale', older than its max-ref-age
        Commit("lost", ("m2",), at(1)),  # unreferenced and young
        Commit("lost-old", ("m2",), at(4)),  # unreferenced and old
    ]
    refs = [Ref("main", "branch", "m4"), Ref("stale", "branch", "old-dev-2"), Ref("v1", "tag", "m1")]
    policy = IcebergPolicy(
        max_snapshot_age_ms=3 * 24 * HOUR_MS,
        min_snapshots_to_keep=2,
        refs={"stale": RefPolicy(max_ref_age_ms=2 * 24 * HOUR_MS)},
    )
    verdicts = iceberg_retention(commits, refs, policy, AS_OF)
    retained = {commit_id: v.retained_by for commit_id, v in verdicts.items() if v.retained}
    assert retained == {"m1": "v1", "m3": "main", "m4": "main", "old-dev-2": "stale", "lost": DANGLING}
