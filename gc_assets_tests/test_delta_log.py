"""Reading `_delta_log`: deletion vectors, checkpoints of every kind, commit times,
retention defaults, hidden paths, and bad input that must stop the GC.

The expected live sets come from `replay_json`, a plain-Python replay of the JSON
commits that shares no code with the connector.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import uuid
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from pyspark.sql import functions as F

from gc_assets.core.addresses import with_relative_keys
from gc_assets.core.config import RepositoryConfig
from gc_assets.mark.live import deduplicated
from gc_assets.sources.base import RETAINED_SCHEMA, SourceError
from gc_assets.sources.delta import DeltaSource, hidden_path_patterns, interval_days
from gc_assets.sources.delta_log import (
    _actions_batch,
    classify,
    parse_actions,
    z85_uuid,
    z85_uuid_column,
)
from gc_assets_tests.delta_tables import log_lines

LOG = "_delta_log"
# ZeroMQ RFC 32, the alphabet the Delta protocol names for deletion vector ids.
Z85_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
# The Delta protocol's own example: `ab^-aqEH.-t@S}K{vb[*k^` is prefix `ab` and this id.
PROTOCOL_EXAMPLE = ("^-aqEH.-t@S}K{vb[*k^", uuid.UUID("d2c639aa-8816-431a-aaf6-d3fe2512ff61"))


def z85_encode(value: uuid.UUID) -> str:
    """Z85 as the Delta protocol defines it, written independently of the decoder under test."""
    data = value.bytes
    out = []
    for start in range(0, 16, 4):
        number = int.from_bytes(data[start : start + 4], "big")
        chunk = []
        for _ in range(5):
            number, digit = divmod(number, 85)
            chunk.append(Z85_ALPHABET[digit])
        out.extend(reversed(chunk))
    return "".join(out)


def dv_file(dv: dict) -> str | None:
    if dv["storageType"] == "u":
        stored = dv["pathOrInlineDv"]
        prefix, encoded = stored[:-20], stored[-20:]
        name = f"deletion_vector_{uuid.UUID(bytes=_z85_bytes(encoded))}.bin"
        return f"{prefix}/{name}" if prefix else name
    if dv["storageType"] == "p":
        return unquote(dv["pathOrInlineDv"])
    return None


def _z85_bytes(encoded: str) -> bytes:
    out = b""
    for start in range(0, 20, 5):
        number = 0
        for char in encoded[start : start + 5]:
            number = number * 85 + Z85_ALPHABET.index(char)
        out += number.to_bytes(4, "big")
    return out


def replay_json(path: Path, v0: int) -> set[str]:
    """Physical files of snapshot(v0) plus every file added after v0, by replaying JSON commits."""
    present: dict[tuple[str, str], dict] = {}
    live: set[str] = set()
    for version, actions in sorted(log_lines(path).items()):
        for action in actions:
            for kind in ("remove", "add"):
                if kind in action:
                    entry = action[kind]
                    key = (entry["path"], json.dumps(entry.get("deletionVector"), sort_keys=True))
                    if kind == "add":
                        present[key] = entry
                        if version > v0:
                            live.update(_physical(entry))
                    else:
                        present.pop(key, None)
            if "cdc" in action and version > v0:
                live.add(unquote(action["cdc"]["path"]))
        if version == v0:
            live.update(f for entry in present.values() for f in _physical(entry))
    inside = path.as_uri() + "/"  # absolute URIs inside the table are keys like any other
    return {f[len(inside) :] if f.startswith(inside) else f for f in live}


def _physical(entry: dict) -> set[str]:
    files = {unquote(entry["path"])}
    if entry.get("deletionVector"):
        extra = dv_file(entry["deletionVector"])
        if extra:
            files.add(extra)
    return files


def append_commit(path: Path, version: int, actions: list[dict]) -> None:
    log = path / LOG / f"{version:020d}.json"
    log.write_text("".join(json.dumps(a) + "\n" for a in actions))


def simple_table(path: Path, versions: int = 4, configuration: dict | None = None) -> Path:
    for i in range(versions):
        batch = pa.table({"id": [i * 10, i * 10 + 1], "value": ["a", "b"]})
        write_deltalake(path, batch, mode="append" if i else "error", configuration=configuration if i == 0 else None)
    return path


def live_keys(spark, path: Path, v0: int, source: DeltaSource | None = None, commits: list | None = None) -> set[str]:
    """`commits`: the source's commit graph when the caller already read it (each reading costs Spark jobs)."""
    source = source or DeltaSource(path.as_uri(), path.as_uri())
    head = source.listing().head
    # The threshold at v0's own time: the state there is v0's, as retention would find it.
    at = {c.commit_id: c.created_at for c in commits or source.commit_graph(spark)[0]}[f"{v0:020d}"]
    retained = spark.createDataFrame([(f"{v:020d}", at) for v in range(v0, head + 1)], RETAINED_SCHEMA)
    heads = spark.createDataFrame([(f"{head:020d}",)], "commit_id string")
    live = deduplicated(with_relative_keys(source.live_entries(spark, retained, heads), path.as_uri()))
    return {r["address"] for r in live.collect()}


def data_files(path: Path, version: int) -> list[str]:
    return [a["add"]["path"] for a in log_lines(path)[version] if "add" in a]


# --------------------------------------------------------------------------- pure functions


def test_z85_uuid_decoding_agrees_with_the_protocol_example_in_spark_and_python(spark):
    assert z85_encode(PROTOCOL_EXAMPLE[1]) == PROTOCOL_EXAMPLE[0]  # the test's encoder is the protocol's
    values = [
        PROTOCOL_EXAMPLE[1],
        uuid.UUID(int=0),
        uuid.UUID(int=(1 << 128) - 1),
        uuid.uuid5(uuid.NAMESPACE_URL, "delta"),
    ]
    values += [uuid.UUID(int=(i * 0x9E3779B97F4A7C15_F39CC0605CEDC834) % (1 << 128)) for i in range(1, 20)]
    encoded = [z85_encode(v) for v in values]
    assert encoded[0] == PROTOCOL_EXAMPLE[0]
    assert [z85_uuid(e) for e in encoded] == [str(v) for v in values]
    frame = spark.createDataFrame([(e,) for e in encoded], "e string")
    decoded = [r[0] for r in frame.select(z85_uuid_column(F.col("e"))).collect()]
    assert decoded == [str(v) for v in values]


def test_interval_parsing_follows_delta_units():
    assert interval_days("interval 7 days") == 7
    assert interval_days("interval 1 weeks") == 7
    assert interval_days("interval 36 hours") == 1.5
    assert interval_days("INTERVAL 1 day 12 hours") == 1.5
    assert interval_days("interval 30 minutes") == pytest.approx(1 / 48)
    for bad in ("7 fortnights", "interval", "interval 1 month", "seven days"):
        with pytest.raises(SourceError, match="deletedFileRetentionDuration"):
            interval_days(bad)


def test_hidden_path_rule_is_the_same_in_java_and_python(spark):
    patterns = hidden_path_patterns(["_p", "dt"])
    keys = {
        "_delta_log/00.json": True,
        "_tmp/x.parquet": True,
        ".hidden": True,
        "dt=1/_SUCCESS": True,
        "dt=1/.x.crc": True,
        "a/b/_c/d": True,
        "_change_data/c.parquet": False,
        "_delta_index/i.bin": False,
        "_p=1/x.parquet": False,
        "_q=1/x.parquet": True,
        "dt=1/part-0.parquet": False,
        "x_y/.z": True,
        "x_y/z_": False,
        "deletion_vector_1.bin": False,
    }
    python = {key: any(re.search(p, key) for p in patterns) for key in keys}
    frame = spark.createDataFrame([(k,) for k in keys], "address string")
    condition = F.lit(False)
    for pattern in patterns:
        condition = condition | F.col("address").rlike(pattern)
    java = {r["address"]: r["hidden"] for r in frame.select("address", condition.alias("hidden")).collect()}
    assert python == java == keys


def test_log_listing_plans_replay_and_refuses_gaps():
    base = "file:///t/_delta_log"
    names = [f"{v:020d}.json" for v in range(0, 6)]
    assert classify(base, [f"{base}/{n}" for n in names]).start == 0
    truncated = [f"{v:020d}.json" for v in range(3, 9)] + [
        "00000000000000000004.checkpoint.0000000001.0000000002.parquet",
        "00000000000000000004.checkpoint.0000000002.0000000002.parquet",
        "00000000000000000006.checkpoint.0000000001.0000000002.parquet",  # incomplete: ignored
    ]
    listing = classify(base, [f"{base}/{n}" for n in truncated])
    assert (listing.start, listing.head, sorted(listing.checkpoints)) == (4, 8, [4])
    assert len(listing.checkpoints[4].files) == 2
    with pytest.raises(SourceError, match="version 2 is missing .*00000000000000000002.json"):
        classify(base, [f"{base}/{n}" for n in names if not n.startswith("00000000000000000002")])
    with pytest.raises(SourceError, match="version 7 is missing"):
        classify(base, [f"{base}/{n}" for n in truncated if "0007" not in n])


# --------------------------------------------------------------------------- live sets


def test_deletion_vector_files_of_all_storage_types(spark, tmp_path):
    """u: prefix + Z85 UUID names a relative file; p: an absolute URI; i: inline, no file."""
    path = simple_table(tmp_path / "dv", versions=3)
    p0, p1, p2 = data_files(path, 0)[0], data_files(path, 1)[0], data_files(path, 2)[0]
    first, second = uuid.uuid4(), uuid.uuid4()
    absolute = f"{path.as_uri()}/dv%20dir/abs%20vector.bin"
    dv_u1 = {
        "storageType": "u",
        "pathOrInlineDv": "ab" + z85_encode(first),
        "offset": 1,
        "sizeInBytes": 34,
        "cardinality": 1,
    }
    dv_u2 = {"storageType": "u", "pathOrInlineDv": z85_encode(second), "offset": 1, "sizeInBytes": 34, "cardinality": 2}
    dv_p = {"storageType": "p", "pathOrInlineDv": absolute, "offset": 1, "sizeInBytes": 34, "cardinality": 1}
    dv_i = {
        "storageType": "i",
        "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
        "sizeInBytes": 40,
        "cardinality": 6,
    }
    now = 1_700_000_000_000

    def swap(p: str, old: dict | None, new: dict) -> list[dict]:
        return [
            {"remove": {"path": p, "deletionTimestamp": now, "dataChange": True, "deletionVector": old}},
            {"add": {"path": p, "size": 1, "modificationTime": now, "dataChange": True, "deletionVector": new}},
        ]

    append_commit(
        path,
        3,
        [{"commitInfo": {"timestamp": now}}] + swap(p0, None, dv_u1) + swap(p1, None, dv_p) + swap(p2, None, dv_i),
    )
    append_commit(path, 4, [{"commitInfo": {"timestamp": now + 1}}] + swap(p0, dv_u1, dv_u2))
    source = DeltaSource(path.as_uri(), path.as_uri())
    commits, _ = source.commit_graph(spark)
    found = {v0: live_keys(spark, path, v0, source, commits) for v0 in (2, 3, 4)}
    assert found == {v0: replay_json(path, v0) for v0 in (2, 3, 4)}
    expected_head = {unquote(p) for p in (p0, p1, p2)} | {f"deletion_vector_{second}.bin", "dv dir/abs vector.bin"}
    assert found[4] == expected_head
    assert f"ab/deletion_vector_{first}.bin" in found[3]


def test_multipart_and_v2_checkpoints_replay_like_the_json_log(spark, tmp_path):
    """A truncated log must be rebuilt from a multi-part checkpoint or a v2 checkpoint with sidecars."""
    from deltalake import DeltaTable

    original = simple_table(tmp_path / "source", versions=6)
    DeltaTable(original).delete("id = 1")
    DeltaTable(original, version=4).create_checkpoint()
    expected = {v0: replay_json(original, v0) for v0 in (4, 5, 6)}
    checkpoint = pq.read_table(original / LOG / "00000000000000000004.checkpoint.parquet")

    multipart = tmp_path / "multipart"
    shutil.copytree(original, multipart)
    os.remove(multipart / LOG / "00000000000000000004.checkpoint.parquet")
    half = checkpoint.num_rows // 2
    for part, rows in ((1, checkpoint.slice(0, half)), (2, checkpoint.slice(half))):
        pq.write_table(rows, multipart / LOG / f"00000000000000000004.checkpoint.{part:010d}.0000000002.parquet")
    (multipart / LOG / "_last_checkpoint").write_text(
        json.dumps({"version": 4, "size": checkpoint.num_rows, "parts": 2})
    )

    v2 = tmp_path / "v2"
    shutil.copytree(original, v2)
    os.remove(v2 / LOG / "00000000000000000004.checkpoint.parquet")
    (v2 / LOG / "_sidecars").mkdir()
    file_rows = checkpoint.filter(pc.or_(pc.is_valid(checkpoint["add"]), pc.is_valid(checkpoint["remove"])))
    sidecars = []
    for index, rows in enumerate((file_rows.slice(0, 1), file_rows.slice(1))):
        name = f"{uuid.uuid4()}.parquet"
        pq.write_table(rows.select(["add", "remove"]), v2 / LOG / "_sidecars" / name)
        sidecars.append({"sidecar": {"path": name, "sizeInBytes": 1, "modificationTime": 1}})
    table_actions = [a for a in log_lines(original)[0] if "protocol" in a or "metaData" in a]
    top = [{"checkpointMetadata": {"version": 4}}, *table_actions, *sidecars]
    (v2 / LOG / f"00000000000000000004.checkpoint.{uuid.uuid4()}.json").write_text(
        "".join(json.dumps(a) + "\n" for a in top)
    )
    (v2 / LOG / "_last_checkpoint").write_text(json.dumps({"version": 4, "size": len(top)}))

    for table in (multipart, v2):
        for version in range(0, 5):  # the log before the checkpoint is cleaned up
            os.remove(table / LOG / f"{version:020d}.json")
        source = DeltaSource(table.as_uri(), table.as_uri())
        commits, _ = source.commit_graph(spark)
        assert [c.commit_id for c in commits] == [f"{v:020d}" for v in range(4, 7)]
        assert commits[0].parents == ()
        for v0, files in expected.items():
            assert live_keys(spark, table, v0, source, commits) == files, (table.name, v0)


def test_shallow_clone_files_outside_the_table_stay_absolute(spark, tmp_path):
    path = simple_table(tmp_path / "clone", versions=1)
    outside = (tmp_path / "elsewhere" / "part-0.parquet").as_uri()
    append_commit(
        path,
        1,
        [
            {"commitInfo": {"timestamp": 1}},
            {"add": {"path": outside, "size": 5, "modificationTime": 1, "dataChange": True}},
        ],
    )
    keys = live_keys(spark, path, 1)
    assert outside in keys and all(not k.startswith("file:") for k in keys - {outside})


# --------------------------------------------------------------------------- commits and rules


def test_created_at_prefers_in_commit_timestamp_then_commit_info_then_file_time(spark, tmp_path):
    path = simple_table(tmp_path / "times", versions=3)
    lines = log_lines(path)
    lines[0] = [{"commitInfo": {"timestamp": 1_000_000, "inCommitTimestamp": 2_000_000}}] + [
        a for a in lines[0] if "commitInfo" not in a
    ]
    lines[1] = [{"commitInfo": {"timestamp": 3_000_000}}] + [a for a in lines[1] if "commitInfo" not in a]
    lines[2] = [a for a in lines[2] if "commitInfo" not in a]
    for version, actions in lines.items():
        append_commit(path, version, actions)
    os.utime(path / LOG / "00000000000000000002.json", (4_000, 4_000))
    commits, refs = DeltaSource(path.as_uri()).commit_graph(spark)
    assert [c.created_at.timestamp() for c in commits] == [2_000, 3_000, 4_000]
    assert [c.parents for c in commits] == [(), ("00000000000000000000",), ("00000000000000000001",)]
    assert [(r.name, r.kind, r.commit_id) for r in refs] == [("main", "branch", "00000000000000000002")]


def test_default_retention_is_the_table_property_and_shorter_rules_are_refused(spark, tmp_path):
    plain = simple_table(tmp_path / "plain", versions=1)
    custom = simple_table(
        tmp_path / "custom", versions=1, configuration={"delta.deletedFileRetentionDuration": "interval 36 hours"}
    )

    def repo(path: Path, **options) -> RepositoryConfig:
        return RepositoryConfig(name="t", format="delta", storage_namespace=path.as_uri(), **options)

    assert DeltaSource(plain.as_uri()).retention_rules(spark, repo(plain)).default_retention_days == 7
    assert DeltaSource(custom.as_uri()).retention_rules(spark, repo(custom)).default_retention_days == 1.5
    with pytest.raises(SourceError, match="shorter than the table's delta.deletedFileRetentionDuration"):
        DeltaSource(plain.as_uri()).retention_rules(spark, repo(plain, rules={"default_retention_days": 3}))
    with pytest.raises(SourceError, match="allow_unsafe_retention"):
        DeltaSource(plain.as_uri()).retention_rules(
            spark, repo(plain, rules={"branches": [{"branch_id": "main", "retention_days": 1}]})
        )
    unsafe = repo(plain, rules={"default_retention_days": 3}, allow_unsafe_retention=True)
    assert DeltaSource(plain.as_uri()).retention_rules(spark, unsafe).default_retention_days == 3
    longer = repo(custom, rules={"default_retention_days": 2})
    assert DeltaSource(custom.as_uri()).retention_rules(spark, longer).default_retention_days == 2


# --------------------------------------------------------------------------- bad input


def test_a_json_line_that_does_not_parse_is_named_by_file_and_line(spark, tmp_path):
    path = simple_table(tmp_path / "bad_line", versions=3)
    log_file = path / LOG / "00000000000000000001.json"
    lines = log_file.read_text().splitlines()
    lines.insert(1, '{"add": {"path": "x.parquet", "size": 1')
    log_file.write_text("\n".join(lines) + "\n")
    with pytest.raises(SourceError, match=r"00000000000000000001\.json line 2: not a valid Delta action"):
        DeltaSource(path.as_uri()).commit_graph(spark)


def test_parsing_numbers_lines_as_written_and_names_every_line_that_is_not_an_action():
    """Blank lines keep their number; a non-object, a file action without a string path (even a
    null one) or a value of the wrong type is an error, never a silently empty action."""
    good = '{"add": {"path": "a%20b.parquet", "size": 3, "deletionVector": null}}'
    text = "\n".join(
        [good, "", "  ", "[1, 2]", '{"remove": null}', '{"cdc": {"size": 1}}', '{"commitInfo": {"timestamp": 7}}', "\r"]
    )
    numbers, actions, errors = parse_actions(text)
    assert numbers == [1, 4, 5, 6, 7, 8]
    assert [e is None for e in errors] == [True, False, False, False, True, False]
    assert actions[0]["add"]["path"] == "a%20b.parquet" and actions[1] is None
    batch = _actions_batch(
        "file:///t/_delta_log/00000000000000000012.json",
        (good + '\n{"add": {"path": "x", "size": "big"}}\n').encode(),
        dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    ).to_pydict()
    assert batch["version"] == [12, 12] and batch["line_no"] == [1, 2]
    assert batch["add"][0]["path"] == "a%20b.parquet" and batch["add"][0]["size"] == 3 and batch["error"][0] is None
    assert batch["add"][1] is None and "not a valid Delta action" in batch["error"][1]


def test_a_malformed_path_escape_is_refused(spark, tmp_path):
    path = simple_table(tmp_path / "bad_escape", versions=1)
    append_commit(
        path,
        1,
        [
            {"commitInfo": {"timestamp": 1}},
            {"add": {"path": "x%zz.parquet", "size": 1, "modificationTime": 1, "dataChange": True}},
        ],
    )
    with pytest.raises(SourceError, match=r"00000000000000000001\.json line 2"):
        DeltaSource(path.as_uri()).commit_graph(spark)


def test_an_unreadable_checkpoint_is_named(spark, tmp_path):
    from deltalake import DeltaTable

    path = simple_table(tmp_path / "bad_checkpoint", versions=3)
    DeltaTable(path).create_checkpoint()
    (path / LOG / "00000000000000000002.checkpoint.parquet").write_bytes(b"not parquet at all")
    source = DeltaSource(path.as_uri())
    retained = spark.createDataFrame([("00000000000000000002",)], "commit_id string")
    with pytest.raises(SourceError, match=r"checkpoint .*00000000000000000002\.checkpoint\.parquet is unreadable"):
        source.live_entries(spark, retained, retained)


def test_a_last_checkpoint_naming_a_missing_checkpoint_is_refused(spark, tmp_path):
    path = simple_table(tmp_path / "bad_pointer", versions=2)
    (path / LOG / "_last_checkpoint").write_text(json.dumps({"version": 1, "size": 3}))
    with pytest.raises(SourceError, match="names checkpoint 1, which is missing"):
        DeltaSource(path.as_uri()).committed_addresses(spark)


def test_fingerprint_changes_with_each_commit_and_only_then(tmp_path):
    """The new-commit sensor's digest: stable while the log is unchanged, new after a write."""
    table = tmp_path / "table"
    write_deltalake(str(table), pa.table({"x": [1]}))
    source = DeltaSource(table.as_uri())
    first = source.fingerprint()
    assert DeltaSource(table.as_uri()).fingerprint() == first
    write_deltalake(str(table), pa.table({"x": [2]}), mode="append")
    assert DeltaSource(table.as_uri()).fingerprint() != first


# --------------------------------------------------------------------------- parsing once


def test_the_log_is_parsed_once_per_process_until_a_file_is_written_again(spark, tmp_path, monkeypatch):
    """Each step builds its own connector; the second one reuses the parse. A table dropped and
    written again at the same path (same file names, new content) is parsed afresh: its live
    set is the new table's, never the old one's."""
    from deltalake import DeltaTable

    from gc_assets.sources import delta_log

    parses = []
    real = delta_log.map_files
    monkeypatch.setattr(
        delta_log, "map_files", lambda spark, files, *rest: parses.append(files) or real(spark, files, *rest)
    )
    path = simple_table(tmp_path / "recreated", versions=3)
    first = live_keys(spark, path, 0)
    assert live_keys(spark, path, 0) == first and DeltaSource(path.as_uri()).commit_graph(spark)
    assert len(parses) == 1

    shutil.rmtree(path)
    simple_table(path, versions=3)  # the same three commit file names
    again = live_keys(spark, path, 0)
    assert len(parses) == 2
    assert again == {
        Path(unquote(u.removeprefix("file://"))).relative_to(path).as_posix() for u in DeltaTable(path).file_uris()
    }
    assert again.isdisjoint(first)


def test_parsed_files_keep_the_most_recent_and_unpersist_the_rest(spark):
    from gc_assets.sources.files import ParsedFiles

    memo = ParsedFiles(capacity=2)
    frames = {key: spark.range(3).cache() for key in "abc"}
    for key in "abab":
        assert memo.get(spark, key, lambda: frames[key]) is frames["a" if key == "a" else "b"]
    assert memo.get(spark, "c", lambda: frames["c"]) is frames["c"]
    assert not frames["a"].is_cached and frames["b"].is_cached and frames["c"].is_cached
    rebuilt = spark.range(3).cache()
    assert memo.get(spark, "a", lambda: rebuilt) is rebuilt  # evicted: parsed again
    assert not frames["b"].is_cached
