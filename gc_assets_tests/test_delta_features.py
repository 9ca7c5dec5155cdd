"""Every Delta table feature is judged: read, implemented, or refused naming it (docs/DELTA_FEATURES.md).

The judgement is a pure function of the protocol, so it is tested feature by feature without
Spark; one comparison with delta-rs full vacuum shows that tables naming `clustering` and
`variantShredding-preview` are collected exactly as delta-rs collects them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gc_assets.sources.delta import TABLE_FEATURES, DeltaSource, check_protocol, table_prefixes
from gc_assets.sources.delta_log import DeltaLogError
from gc_assets_tests import delta_tables
from gc_assets_tests.test_delta_vacuum_oracle import WINDOWS, TableFrames, candidates_by_window

DOC = Path(__file__).resolve().parents[1] / "docs" / "DELTA_FEATURES.md"
LOG = "file:///lake/t/_delta_log"
READ, IMPLEMENTED, REFUSED = "read", "implemented", "refused"
RW, W = "readers and writers", "writers"
# What each feature means for a GC, written down apart from the code that judges it.
EXPECTED = {
    "appendOnly": (W, READ),
    "invariants": (W, READ),
    "checkConstraints": (W, READ),
    "generatedColumns": (W, READ),
    "allowColumnDefaults": (W, READ),
    "identityColumns": (W, READ),
    "changeDataFeed": (W, IMPLEMENTED),
    "columnMapping": (RW, READ),
    "deletionVectors": (RW, IMPLEMENTED),
    "rowTracking": (W, READ),
    "domainMetadata": (W, READ),
    "timestampNtz": (RW, READ),
    "v2Checkpoint": (RW, IMPLEMENTED),
    "icebergCompatV1": (W, IMPLEMENTED),
    "icebergCompatV2": (W, IMPLEMENTED),
    "icebergCompatV3": (W, IMPLEMENTED),
    "icebergWriterCompatV1": (W, READ),
    "icebergWriterCompatV3": (W, READ),
    "clustering": (W, READ),
    "liquid": (W, READ),
    "inCommitTimestamp": (W, IMPLEMENTED),
    "typeWidening": (RW, READ),
    "typeWidening-preview": (RW, READ),
    "variantType": (RW, READ),
    "variantType-preview": (RW, READ),
    "variantShredding": (RW, READ),
    "variantShredding-preview": (RW, READ),
    "collations": (RW, READ),
    "collations-preview": (RW, READ),
    "geospatial": (RW, READ),
    "materializePartitionColumns": (W, READ),
    "checkpointProtection": (W, READ),
    "vacuumProtocolCheck": (RW, IMPLEMENTED),
    "catalogManaged": (RW, REFUSED),
    "catalogOwned-preview": (RW, REFUSED),
    "coordinatedCommits-preview": (W, REFUSED),
    "adaptiveMetadata-preview": (RW, REFUSED),
    "redirectReaderWriter-preview": (RW, REFUSED),
    "redirectWriterOnly-preview": (W, REFUSED),
}


def protocol(*writer: str, reader: tuple[str, ...] = ()) -> dict:
    return {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": list(reader),
        "writerFeatures": list(writer),
    }


def naming(protocol_: dict) -> dict:
    """`protocol_` with each reader-writer feature in readerFeatures too, as the protocol requires."""
    readers = [f for f in protocol_["writerFeatures"] if EXPECTED.get(f, (RW,))[0] == RW]
    return {**protocol_, "readerFeatures": sorted(set(protocol_["readerFeatures"]) | set(readers))}


def refusal(protocol_: dict, configuration: dict | None = None) -> str:
    with pytest.raises(DeltaLogError) as refused:
        check_protocol(LOG, protocol_, configuration or {})
    message = str(refused.value)
    assert message.startswith(f"{LOG}: ") and message.endswith(": refusing to collect"), message
    return message


@pytest.mark.parametrize("feature", sorted(EXPECTED))
def test_each_feature_is_read_implemented_or_refused_naming_it(feature):
    kind, decision = EXPECTED[feature]
    named = naming(protocol(feature))
    assert (feature in named["readerFeatures"]) == (kind == RW)
    if decision == REFUSED:
        assert f"table feature {feature} " in refusal(named)
    else:
        check_protocol(LOG, named, {})
        # Beside the features a Spark-written table names anyway, the judgement is the same.
        check_protocol(LOG, naming(protocol(feature, "appendOnly", "invariants", "domainMetadata")), {})


def test_the_code_and_the_document_judge_the_same_features_alike():
    assert {name: (RW if j.readers else W, j.decision) for name, j in TABLE_FEATURES.items()} == EXPECTED
    rows = re.findall(r"^\| `([^`]+)` \| ([a-z ]+) \| ([a-z]+) \| .+ \|$", DOC.read_text(), re.MULTILINE)
    assert {name: (kind, decision) for name, kind, decision in rows} == EXPECTED
    assert len(rows) == len(EXPECTED)  # each feature in one row


def test_an_unknown_feature_is_refused_naming_it_whatever_else_the_table_names():
    assert "table feature(s) ['futureFeature'] are not supported by gc_assets: " in refusal(protocol("futureFeature"))
    # Only the unknown ones are named, in reader or writer lists alike.
    both = refusal(protocol("clustering", "zFeature", reader=("variantType", "futureFeature")))
    assert "['futureFeature', 'zFeature']" in both and "clustering" not in both
    # A spelling not judged is unknown, even when a neighbour's is known.
    assert "['geospatial-dev']" in refusal(naming(protocol("geospatial-dev")))
    assert "(the table requires vacuumProtocolCheck)" in refusal(
        naming(protocol("vacuumProtocolCheck", "futureFeature"))
    )


@pytest.mark.parametrize(
    "protocol_, configuration, named",
    [
        (naming(protocol("catalogManaged", "clustering")), None, "catalogManaged"),
        (naming(protocol("catalogOwned-preview", "inCommitTimestamp")), None, "catalogOwned-preview"),
        (protocol("coordinatedCommits-preview", "inCommitTimestamp"), None, "coordinatedCommits-preview"),
        (protocol("domainMetadata"), {"delta.coordinatedCommits.commitCoordinator-preview": "dynamodb"}, None),
        (protocol("domainMetadata"), {"delta.catalogManaged": "true"}, None),
        ({"minReaderVersion": 1, "minWriterVersion": 2}, {"delta.catalogManaged": "true"}, None),
        # Refused before any unknown feature is even named.
        (naming(protocol("catalogManaged", "futureFeature")), None, "catalogManaged"),
    ],
)
def test_catalog_managed_and_coordinated_commits_are_refused_naming_them(protocol_, configuration, named):
    message = refusal(protocol_, configuration)
    what = named or next(iter(configuration))
    assert f"table feature {what} keeps commits outside _delta_log/<version>.json" in message
    assert "futureFeature" not in message


@pytest.mark.parametrize(
    "configuration, protected",
    [
        ({}, False),
        ({"delta.universalFormat.enabledFormats": "hudi, iceberg"}, True),
        ({"delta.universalFormat.enabledFormats": "hudi"}, False),
        ({"delta.enableIcebergCompatV1": "true"}, True),
        ({"delta.enableIcebergCompatV2": "TRUE"}, True),
        ({"delta.enableIcebergCompatV3": "true"}, True),
        ({"delta.enableIcebergCompatV2": "false"}, False),
    ],
)
def test_iceberg_metadata_is_protected_while_uniform_or_a_compatibility_is_on(configuration, protected):
    assert table_prefixes(configuration) == ("_delta_log/",) + (("metadata/",) if protected else ())


def append_protocol(path: Path, protocol_: dict) -> None:
    """A new version that only changes the protocol, as enabling a feature later writes it."""
    log = path / "_delta_log"
    version = max(delta_tables.log_lines(path)) + 1
    (log / f"{version:020d}.json").write_text(json.dumps({"protocol": protocol_}) + "\n")


def test_clustered_and_variant_shredded_tables_are_collected_like_delta_rs(spark, tmp_path):
    """The candidates of a liquid-clustered and a variant-shredded table equal delta-rs full vacuum for
    every window; enabling catalog-managed commits or an unknown feature later refuses the table."""
    now = delta_tables.now_utc()
    for build in delta_tables.FEATURE_SHAPES:
        table = build(tmp_path, now)
        written = delta_tables.log_lines(table.path)[0]
        named = next(a["protocol"] for a in written if "protocol" in a)
        assert {"clustering", "variantShredding-preview"} & set(named["writerFeatures"])
        frames = TableFrames(spark, table)
        found = candidates_by_window(spark, table, frames)
        for window, ours in zip(WINDOWS, found):
            assert set(ours) == delta_tables.vacuum_candidates(table, window), f"{table.name}, window {window}"
            for key, reason in ours.items():
                assert reason == ("untracked" if key in table.untracked else "expired"), key
        # Removals fall on both sides of the windows, and old junk is collected: the comparison is not vacuous.
        assert found[0] != found[2] and "stray-writer-crash.parquet" in found[2]
        assert any(reason == "expired" for reason in found[2].values())
    clustered = tmp_path / "clustered"
    append_protocol(clustered, protocol("clustering", "domainMetadata", "futureFeature"))
    with pytest.raises(DeltaLogError, match=r"table feature\(s\) \['futureFeature'\] are not supported"):
        DeltaSource(clustered.as_uri(), clustered.as_uri()).metadata(spark)
    append_protocol(clustered, naming(protocol("clustering", "domainMetadata", "catalogManaged")))
    with pytest.raises(DeltaLogError, match="table feature catalogManaged keeps commits outside"):
        DeltaSource(clustered.as_uri(), clustered.as_uri()).metadata(spark)
