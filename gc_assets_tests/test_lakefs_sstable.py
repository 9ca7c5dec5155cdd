"""lakeFS's SSTables: the reader against four tables lakeFS itself wrote (their README's known
answers), the writer against the same files byte for byte, and RocksDB itself (rocksdict) as
the second reader of both."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gc_assets.sources.base import SourceError
from gc_assets.sources.lakefs import rocksdb
from gc_assets.sources.lakefs.records import (
    AddressType,
    BranchData,
    CommitData,
    Entry,
    GarbageCollectionRules,
    RangeData,
    TagData,
    Timestamp,
    entry_location,
    join_value,
    range_identity,
    split_value,
    write_lakefs_table,
)
from gc_assets.sources.lakefs.rocksdb import read_with_rocksdb
from gc_assets.sources.lakefs.sstable import (
    RAW,
    SNAPPY,
    SSTableError,
    masked_crc32c,
    read_sstable,
    write_sstable,
)

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "lakefs"

# The README's table: bytes, sha256 prefix, `type`, records, two-level index, data blocks.
KNOWN = {
    "metarange.sst": (1022, "caa2f483", b"metaranges", 1, False, 1),
    "range.sst": (1182, "5e01c5dc", b"ranges", 2, False, 1),
    "ok1.sst": (10399, "90985338", b"ranges", 105, False, 4),
    "import-13868.sst": (1762451, "ee0096ec", b"ranges", 13868, True, 1306),
}
FIRST_LAST = {
    "metarange.sst": (b"a/b/c/yes", b"a/b/c/yes"),
    "range.sst": (b"a/b/c/no", b"a/b/c/yes"),
    "ok1.sst": (b"first", b"xyzzy"),
    "import-13868.sst": (
        b"common-crawl-hive-analysis/CC-MAIN-2014-23/part-m-01364.gz",
        b"phishing-domains/domains.csv",
    ),
}
# ok1.sst's min_key property (the README's "first key") is not its first record: lakeFS's test
# that wrote it set the property; the records (read alike by RocksDB) start at `first`.
MIN_KEY_PROPERTY = {**{name: first for name, (first, _) in FIRST_LAST.items()}, "ok1.sst": b"+@\xb3l\xa8"}
RANGE_ID = "a83af763ba098c15369d9d6d723731eb9ce18b8dfac4f88c6f1287e772393d0e"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def user_properties(table) -> dict[str, bytes]:
    return {k: v for k, v in table.properties.items() if not k.startswith("rocksdb.")}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_reader_agrees_with_every_known_answer_of_the_fixtures(name):
    size, sha, kind, count, two_level, blocks = KNOWN[name]
    data = fixture(name)
    assert (len(data), hashlib.sha256(data).hexdigest()[:8]) == (size, sha)
    table = read_sstable(data, name)
    records = list(table.records())
    assert len(records) == count
    assert (records[0][0], records[-1][0]) == FIRST_LAST[name]
    assert [k for k, _ in records] == sorted({k for k, _ in records})
    assert table.two_level_index is two_level
    assert len(table.data_blocks) == blocks
    props = table.properties
    assert props["type"] == kind
    assert props["count"] == str(count).encode()
    assert (props["min_key"], props["max_key"]) == (MIN_KEY_PROPERTY[name], FIRST_LAST[name][1])
    assert int(props["estimated_size_bytes"]) > 0
    assert props["rocksdb.comparator"] == b"leveldb.BytewiseComparator"
    assert props["rocksdb.compression"] == b"Snappy"
    # Every value is framed; every range's data is an Entry whose identity is lakeFS's (ok1.sst
    # was written before April 2021, when lakeFS still hashed the address into it).
    for _, value in records:
        identity, payload = split_value(value)
        if kind == b"ranges" and name != "ok1.sst":
            assert Entry.decode(payload).identity() == identity


def test_range_entries_decode_to_the_known_fields():
    records = dict(read_sstable(fixture("range.sst"), "range.sst").records())
    expected = {
        b"a/b/c/no": (
            "b0c968736d8f42a2b1c6284835f08226",
            11,
            (1628163584, 471124555),
            "664c688b4ea9c56730daacfc3d70aeed",
        ),
        b"a/b/c/yes": (
            "fdf87fcf9ec849f98514ddb7e041ad56",
            4,
            (1628163573, 589644914),
            "eb4585ad9fe0426781ed7c49252f8225",
        ),
    }
    assert set(records) == set(expected)
    for key, (address, size, (seconds, nanos), e_tag) in expected.items():
        entry = Entry.decode(split_value(records[key])[1])
        assert entry == Entry(address, Timestamp(seconds, nanos), size, e_tag, {}, AddressType.RELATIVE, "")
        when = entry.last_modified.to_datetime()
        assert when == dt.datetime.fromtimestamp(seconds, dt.timezone.utc).replace(microsecond=nanos // 1000)
        assert Timestamp.of(when) == Timestamp(seconds, nanos // 1000 * 1000)
    with pytest.raises(ValueError, match="time zone"):
        Timestamp.of(dt.datetime(2021, 8, 5))
        assert entry_location(split_value(records[key])[1]) == (address, AddressType.RELATIVE, size)


def test_metarange_names_the_range_by_lakefs_identity():
    ((key, value),) = read_sstable(fixture("metarange.sst"), "metarange.sst").records()
    identity, data = split_value(value)
    assert (key, identity.decode()) == (b"a/b/c/yes", RANGE_ID)
    assert RangeData.decode(data) == RangeData(b"a/b/c/no", b"a/b/c/yes", 1190, 2)
    # range.sst is that range: its id is the SHA-256 lakeFS computes over its records and metadata.
    range_records = list(read_sstable(fixture("range.sst"), "range.sst").records())
    assert range_identity(range_records, {"type": "ranges"}) == RANGE_ID
    assert range_identity(range_records, {"type": "ranges", "entity": "commit"}) != RANGE_ID


def test_ok1_has_deprecated_addresses():
    records = dict(read_sstable(fixture("ok1.sst"), "ok1.sst").records())
    known = {
        b"first": ("4e068d1a46734113abd2218e87aace4c", 2),
        b"run1/a": ("0707eb0e2c6d4eab8ff6fab5a6a4b517", 3),
        b"run2/a": ("35fdf27b2203406286ab93a8963f0172", 2),
    }
    for key, (address, size) in known.items():
        entry = Entry.decode(split_value(records[key])[1])
        assert (entry.address, entry.size, entry.address_type) == (address, size, AddressType.BY_PREFIX_DEPRECATED)
    entries = [Entry.decode(split_value(v)[1]) for v in records.values()]
    assert {e.address_type for e in entries} == {AddressType.BY_PREFIX_DEPRECATED}
    assert all(len(e.address) == 32 and int(e.address, 16) >= 0 for e in entries)


def test_import_has_a_two_level_index_and_full_addresses():
    table = read_sstable(fixture("import-13868.sst"), "import-13868.sst")
    assert table.two_level_index
    assert table.properties["rocksdb.block.based.table.index.type"] == b"\x02\x00\x00\x00"
    records = dict(table.records())
    key = b"common-crawl-hive-analysis/CC-MAIN-2014-23/part-m-01366.gz"
    entry = Entry.decode(split_value(records[key])[1])
    assert entry.address == "s3://oz-repo/datasets/" + key.decode()
    assert (entry.address_type, entry.size, entry.last_modified.seconds, entry.e_tag) == (
        AddressType.FULL,
        3234746,
        1656367125,
        "a2ce82d326be634ed76108570f509f33",
    )
    types = [entry_location(split_value(v)[1])[1] for v in records.values()]
    assert types.count(AddressType.RELATIVE) == 1
    assert types.count(AddressType.FULL) == 13867
    full = [
        a for a, t, _ in map(entry_location, (split_value(v)[1] for v in records.values())) if t == AddressType.FULL
    ]
    assert all(a.startswith("s3://oz-repo/") for a in full)
    assert sum(a.startswith("s3://oz-repo/datasets/") for a in full) == 13461  # the rest: other prefixes of the bucket


def test_raw_and_snappy_data_blocks_are_both_read():
    small = read_sstable(fixture("range.sst"), "range.sst")
    assert small.data_block_compressions() == [RAW]
    assert len(list(small.records())) == 2
    big = read_sstable(fixture("ok1.sst"), "ok1.sst")
    assert big.data_block_compressions() == [SNAPPY] * 4
    assert len(list(big.records())) == 105


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_writer_reproduces_what_lakefs_wrote_byte_for_byte(name):
    data = fixture(name)
    table = read_sstable(data, name)
    written = write_sstable(list(table.records()), user_properties(table), two_level_index=table.two_level_index)
    assert written == data


@pytest.mark.parametrize("name", ["range.sst", "metarange.sst", "import-13868.sst"])
def test_lakefs_tables_are_written_as_lakefs_writes_them(name):
    """From records and `type` alone: the properties lakeFS sets on close (Pebble's size
    estimate among them) and the name it gives the table. ok1.sst is left out: its min_key
    property is not its first key."""
    data = fixture(name)
    table = read_sstable(data, name)
    kind = table.properties["type"].decode()
    written = write_lakefs_table(table.records(), kind, two_level_index=table.two_level_index)
    assert written.data == data
    records = list(table.records())
    assert written.range_data == RangeData(
        records[0][0], records[-1][0], int(table.properties["estimated_size_bytes"]), len(records)
    )
    if name == "range.sst":
        assert written.id == RANGE_ID
    with pytest.raises(ValueError, match="min_key"):
        write_sstable(records, {"min_key": b"a"}, range_properties=True)


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_rocksdb_reads_the_fixtures_as_the_reader_does(name, monkeypatch):
    ours = list(read_sstable(fixture(name), name).records())
    assert list(read_with_rocksdb(FIXTURES / name, name)) == ours
    assert (FIXTURES / name).stat().st_size == KNOWN[name][0]  # copied in, not moved
    assert list(read_with_rocksdb(fixture(name), name)) == ours
    monkeypatch.setattr(rocksdb, "MEMORY_SCRATCH", str(FIXTURES / "no-such-directory"))  # scratch on disk
    assert list(read_with_rocksdb(fixture(name), name)) == ours


def _flip(data: bytes, at: int) -> bytes:
    damaged = bytearray(data)
    damaged[at] ^= 0x40
    return bytes(damaged)


def test_a_corrupt_data_block_is_refused_naming_the_file():
    data = fixture("ok1.sst")
    table = read_sstable(data, "ok1.sst")
    inside = table.data_blocks[2].offset + 100
    damaged = read_sstable(_flip(data, inside), "ranges/ok1.sst")  # footer, index and properties intact
    with pytest.raises(SSTableError, match=r"ranges/ok1\.sst.*data block at \d+: CRC32C checksum mismatch"):
        list(damaged.records())
    with pytest.raises(SourceError, match=r"ranges/ok1\.sst.*checksum mismatch"):
        list(read_with_rocksdb(_flip(data, inside), "ranges/ok1.sst"))


def test_a_corrupt_index_or_properties_block_is_refused_when_opened():
    data = fixture("import-13868.sst")
    table = read_sstable(data, "import-13868.sst")
    first_partition = table.data_blocks[-1].offset + table.data_blocks[-1].size + 5 + 10
    with pytest.raises(SSTableError, match=r"import-13868\.sst: index partition block .*checksum mismatch"):
        read_sstable(_flip(data, first_partition), "import-13868.sst")
    properties = data.index(b"estimated_size_bytes")
    with pytest.raises(SSTableError, match=r"import-13868\.sst: properties block .*checksum mismatch"):
        read_sstable(_flip(data, properties), "import-13868.sst")


@pytest.mark.parametrize("cut", [1, 53, 1000, 881_000, 1_762_450])
def test_a_truncated_file_is_refused_naming_the_file(cut):
    data = fixture("import-13868.sst")[:cut]
    with pytest.raises(SSTableError, match=r"SSTable _lakefs/56569996: .*(shorter than a table footer|truncated)"):
        list(read_sstable(data, "_lakefs/56569996").records())
    with pytest.raises(SourceError, match=r"_lakefs/56569996"):
        list(read_with_rocksdb(data, "_lakefs/56569996"))


@pytest.mark.parametrize("name", ["range.sst", "metarange.sst"])
def test_every_bit_flip_and_every_truncation_is_refused_or_harmless(name):
    """Damage anywhere (footer, index, properties, data, padding) either raises SSTableError
    naming the file or leaves the records exactly as they were: never another exception,
    never different records."""
    data = fixture(name)
    good = list(read_sstable(data, name).records())
    damaged = [_flip_bit(data, at, bit) for at in range(len(data)) for bit in range(8)]
    for candidate in damaged + [data[:cut] for cut in range(len(data))]:
        try:
            records = list(read_sstable(candidate, name).records())
        except SSTableError as exc:
            assert f"SSTable {name}: " in str(exc)
        else:
            assert records == good


def _flip_bit(data: bytes, at: int, bit: int) -> bytes:
    damaged = bytearray(data)
    damaged[at] ^= 1 << bit
    return bytes(damaged)


def _varints(buf: bytes, pos: int, count: int) -> list[int]:
    out = []
    for _ in range(count):
        value = shift = 0
        while True:
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        out.append(value)
    return out


def _forge_property(data: bytes, old: bytes, new: bytes) -> bytes:
    """`old` replaced by `new` (same length) in the properties block, its checksum made good."""
    forged = bytearray(data)
    meta_offset, _ = _varints(forged, len(forged) - 53 + 1, 2)  # footer -> metaindex (raw, one entry)
    name = b"rocksdb.properties"
    offset, size = _varints(forged, forged.index(name, meta_offset) + len(name), 2)
    at = forged.index(old, offset)
    assert at + len(old) <= offset + size
    forged[at : at + len(old)] = new
    forged[offset + size + 1 : offset + size + 5] = masked_crc32c(bytes(forged[offset : offset + size]), RAW).to_bytes(
        4, "little"
    )
    return bytes(forged)


def test_a_table_yielding_fewer_records_than_it_declares_is_refused():
    """A consistent file (every checksum valid) whose properties claim one more record than
    its blocks hold: an index that lost a block looks the same to the reader."""
    records = [(b"k%04d" % i, join_value(b"id", b"data")) for i in range(300)]
    data = write_sstable(records, {"type": b"ranges"})
    assert read_sstable(data, "x").properties["rocksdb.num.entries"] == b"\xac\x02"  # 300 as a varint
    forged = read_sstable(_forge_property(data, b"entries\xac\x02", b"entries\xad\x02"), "forged.sst")
    assert forged.entries == 301
    with pytest.raises(
        SSTableError, match=r"forged\.sst: 300 records read, the table's rocksdb\.num\.entries says 301"
    ):
        list(forged.records())


def test_tables_in_formats_lakefs_does_not_write_are_refused():
    data = write_sstable([(b"a", b"1")], {})
    delta = _forge_property(data, b"delta.encoded\x00", b"delta.encoded\x01")
    with pytest.raises(SSTableError, match=r"SSTable d\.sst: index values are delta-encoded"):
        read_sstable(delta, "d.sst")
    pebble = data[:-8] + (0xF09FAAB3F09FAAB3).to_bytes(8, "little")
    with pytest.raises(SSTableError, match=r"SSTable p\.sst: a Pebble \(format v1 or later\) table"):
        read_sstable(pebble, "p.sst")
    with pytest.raises(SSTableError, match=r"SSTable v\.sst: footer version 3"):
        read_sstable(data[:-12] + (3).to_bytes(4, "little") + data[-8:], "v.sst")
    with pytest.raises(SSTableError, match=r"SSTable c\.sst: checksum type 2"):
        read_sstable(data[:-53] + b"\x02" + data[-52:], "c.sst")


@pytest.mark.parametrize(
    "patch, problem",
    [
        (lambda block: block.replace(b"b\x01", b"a\x01"), r"key b'a' out of order"),  # a repeated key
        (lambda block: block.replace(b"b\x01", b"b\x00"), r"record b'b' is not a SET"),  # a deletion
    ],
)
def test_records_out_of_order_or_not_set_are_refused(patch, problem):
    """Blocks re-checksummed after the edit: only the reader's own checks can see it."""
    data = bytearray(write_sstable([(b"a", b"1"), (b"b", b"2")], {}, compress=False, block_size=1))
    offset, size = read_sstable(bytes(data), "x").data_blocks[1]
    block = patch(bytes(data[offset : offset + size]))
    data[offset : offset + size] = block
    data[offset + size + 1 : offset + size + 5] = masked_crc32c(block, RAW).to_bytes(4, "little")
    with pytest.raises(SSTableError, match=rf"SSTable edited\.sst: data block at {offset}: {problem}"):
        list(read_sstable(bytes(data), "edited.sst").records())


def test_writer_refuses_unordered_keys_and_rocksdb_properties():
    with pytest.raises(ValueError, match="strictly increasing"):
        write_sstable([(b"b", b""), (b"a", b"")], {})
    with pytest.raises(ValueError, match="strictly increasing"):
        write_sstable([(b"a", b""), (b"a", b"")], {})
    with pytest.raises(ValueError, match="rocksdb"):
        write_sstable([], {"rocksdb.comparator": b"x"})


def test_an_empty_table_reads_as_empty_through_both_readers():
    data = write_sstable([], {"type": b"metaranges"})
    table = read_sstable(data, "empty")
    assert (list(table.records()), table.data_block_compressions()) == ([], [RAW])
    assert list(read_with_rocksdb(data, "empty")) == []


keys = st.lists(st.binary(max_size=40), min_size=1, max_size=300, unique=True).map(sorted)
values = st.binary(max_size=300)
properties = st.dictionaries(
    st.text(min_size=1, max_size=20).filter(lambda n: not n.startswith("rocksdb.")), st.binary(max_size=40), max_size=6
)


@settings(max_examples=200)  # each example opens a RocksDB database, about 4 ms
@given(
    keys=keys,
    data=st.data(),
    props=properties,
    compress=st.booleans(),
    two_level=st.booleans(),
    block_size=st.sampled_from([1, 64, 512, 4096]),
)
def test_writer_round_trip_read_by_the_reader_and_by_rocksdb(keys, data, props, compress, two_level, block_size):
    records = [(k, data.draw(values)) for k in keys]
    written = write_sstable(records, props, compress=compress, block_size=block_size, two_level_index=two_level)
    table = read_sstable(written, "generated")
    assert list(table.records()) == records
    assert table.two_level_index is two_level
    assert {k: table.properties[k] for k in props} == props
    assert table.properties["rocksdb.compression"] == (b"Snappy" if compress else b"NoCompression")
    if not compress:
        assert set(table.data_block_compressions()) == {RAW}
    assert list(read_with_rocksdb(written, "generated")) == records


@given(identity=st.binary(max_size=300), data=st.binary(max_size=300), tail=st.binary(max_size=5))
def test_value_framing_round_trips_and_ignores_trailing_bytes(identity, data, tail):
    assert split_value(join_value(identity, data) + tail) == (identity, data)


@pytest.mark.parametrize(
    "value, problem",
    [
        (b"\x01", "negative length"),
        (b"\x08abc", "overruns"),
        (b"\x02a\x0aabc", "overruns"),
        (b"", "varint"),
        (b"\x80", "varint"),
    ],
)
def test_broken_value_framing_is_refused(value, problem):
    with pytest.raises(ValueError, match=problem):
        split_value(value)


def test_message_field_numbers_match_lakefs_protos():
    """Bytes written out by hand from lakeFS's .proto field numbers (tag = number << 3 | wire type)."""
    rules = bytes.fromhex("0807") + bytes.fromhex("1208") + b"\x0a\x04main\x10\x0e"
    assert GarbageCollectionRules.decode(rules) == GarbageCollectionRules(7, {"main": 14})
    assert GarbageCollectionRules(7, {"main": 14}).encode() == rules
    commit = (
        b"\x0a\x02c1"
        + b"\x12\x03bob"
        + b"\x1a\x02hi"
        + b"\x22\x02\x08\x05"
        + b"\x2a\x02mr"
        + b"\x32\x06\x0a\x01k\x12\x01v"
        + b"\x3a\x02p1"
        + b"\x3a\x02p2"
        + b"\x40\x01"
        + b"\x48\x03"
    )
    expected = CommitData("c1", "bob", "hi", Timestamp(5, 0), "mr", {"k": "v"}, ("p1", "p2"), 1, 3)
    assert CommitData.decode(commit) == expected
    assert expected.encode() == commit
    branch = b"\x0a\x04main\x12\x02c1\x1a\x01s\x22\x01t\x28\x01"
    assert BranchData.decode(branch) == BranchData("main", "c1", "s", ("t",), True)
    assert BranchData("main", "c1", "s", ("t",), True).encode() == branch
    assert TagData.decode(b"\x0a\x02v1\x12\x02c1") == TagData("v1", "c1")
    entry = b"\x0a\x01a\x12\x04\x08\x01\x10\x02\x18\x03\x22\x01e\x2a\x06\x0a\x01k\x12\x01v\x30\x02\x3a\x01t"
    expected_entry = Entry("a", Timestamp(1, 2), 3, "e", {"k": "v"}, AddressType.FULL, "t")
    assert Entry.decode(entry) == expected_entry
    assert expected_entry.encode() == entry
    range_data = b"\x0a\x01a\x12\x01z\x18\x90\x03\x20\x02"
    assert RangeData.decode(range_data) == RangeData(b"a", b"z", 400, 2)
    assert RangeData(b"a", b"z", 400, 2).encode() == range_data
    # Unknown fields (a later lakeFS) are skipped; malformed bytes are refused.
    assert TagData.decode(b"\x0a\x02v1\x98\x06\x01\x12\x02c1") == TagData("v1", "c1")
    with pytest.raises(ValueError, match="malformed Entry"):
        Entry.decode(b"\x0a\x05ab")


def test_tables_read_together_by_rocksdb_refuse_a_corrupt_block_and_skip_empty_ones():
    """The witness reads a head's ranges in one batch: a block failing its checksum must refuse
    the batch (rocksdict's items() would end quietly there and drop the rest), and an empty table
    (which RocksDB cannot ingest without aborting the process) reads as nothing."""
    data = fixture("ok1.sst")
    empty = write_sstable([], {"type": b"ranges"})
    assert rocksdb.read_tables_with_rocksdb([(data, "ok1"), (empty, "empty")]) == list(
        read_sstable(data, "ok1").records()
    )
    assert rocksdb.read_tables_with_rocksdb([(empty, "empty")]) == []
    inside = read_sstable(data, "ok1.sst").data_blocks[2].offset + 100
    with pytest.raises(SourceError, match=r"ranges/ok1\.sst.*checksum mismatch"):
        rocksdb.read_tables_with_rocksdb([(empty, "empty"), (_flip(data, inside), "ranges/ok1.sst")])
