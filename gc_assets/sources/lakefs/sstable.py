"""RocksDB block-based tables as Pebble writes them for lakeFS metaranges and ranges.

A table is a run of blocks and a 53-byte footer (format version 2: checksum type, the
metaindex and index block handles, padding, version, magic). Every block is followed by a
5-byte trailer: its compression (0 raw, 1 Snappy) and the masked CRC32C of the stored block
and that byte. Blocks hold prefix-compressed entries (shared, unshared and value lengths as
varints) closed by restart offsets. Data blocks map internal keys (user key + 8-byte trailer:
sequence << 8 | kind) to values; the index maps a separator key to each data block's handle,
or, in a two-level index (index type 2), to index partitions that do. The metaindex names the
properties block: RocksDB's `rocksdb.*` properties and lakeFS's own (`type`, `min_key`,
`max_key`, `count`, `estimated_size_bytes`, `entity`, ...).

The reader checks the checksum of every block it reads and that the records it yields are
strictly ordered and as many as the table says it holds: a damaged range must refuse the
mark, never shrink the live set. The writer mirrors what lakeFS writes (Pebble's table format
RocksDBv2, Snappy where it saves an eighth, 4 KiB blocks, Pebble's separators, block cuts and
properties): from their records and properties it rewrites the tables lakeFS wrote byte for
byte, and RocksDB itself reads what it writes.
"""

from __future__ import annotations

import struct
from typing import Iterable, Iterator, Mapping, NamedTuple, NoReturn

import cramjam
import google_crc32c

from gc_assets.sources.base import SourceError

MAGIC = 0x88E241B785F4CFF7
OTHER_MAGICS = {0xF09FAAB3F09FAAB3: "Pebble (format v1 or later)", 0xDB4775248B80FB57: "LevelDB"}
FORMAT_VERSION = 2
FOOTER_LEN = 53  # checksum type, two handles padded to 40 bytes, version, magic
TRAILER_LEN = 5
RAW, SNAPPY = 0, 1
CHECKSUM_CRC32C = 1
INDEX_ONE_LEVEL, INDEX_TWO_LEVEL = 0, 2  # rocksdb.block.based.table.index.type
KIND_SET = 1
KIND_SEPARATOR = 17  # the kind Pebble and RocksDB give a shortened index separator
SEQ_MAX = (1 << 56) - 1
SET_TRAILER = KIND_SET.to_bytes(8, "little")  # sequence 0, kind SET: what Pebble writes
SEPARATOR_TRAILER = ((SEQ_MAX << 8) | KIND_SEPARATOR).to_bytes(8, "little")
EMPTY_TABLE_INDEX_KEY = b"\xff" + bytes(7)  # no user key, Pebble's kind Invalid (255), sequence 0
DATA_RESTART_INTERVAL = 16
PROPERTIES_RESTART_INTERVAL = 2**31 - 1  # Pebble never restarts the properties block
PROPERTIES_BLOCK = "rocksdb.properties"
RANGE_PROPERTIES = ("min_key", "max_key", "count", "estimated_size_bytes")  # lakeFS's, set on close
INDEX_TYPE = "rocksdb.block.based.table.index.type"
NUM_ENTRIES = "rocksdb.num.entries"
DELTA_ENCODED_INDEX = "rocksdb.index.value.is.delta.encoded"
_CRC_MASK_DELTA = 0xA282EAD8
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class SSTableError(SourceError):
    """A table is malformed, truncated or fails a checksum; the message names the file."""


class BlockHandle(NamedTuple):
    offset: int
    size: int  # without the trailer


def masked_crc32c(data: bytes, kind: int) -> int:
    """RocksDB's stored checksum: CRC32C of the block and its compression byte, rotated and offset."""
    crc = google_crc32c.extend(google_crc32c.value(data), bytes((kind,)))
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def uvarint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """An unsigned LEB128 varint in buf[pos:end]: (value, position after it); ValueError if broken."""
    result = shift = 0
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise ValueError("bad varint")


def _put_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _handle_of(value: bytes) -> BlockHandle:
    """A block handle (varint offset, varint size); Pebble may append block properties after it."""
    offset, pos = uvarint(value, 0, len(value))
    size, _ = uvarint(value, pos, len(value))
    return BlockHandle(offset, size)


def _entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The (key, value) entries of a block, prefix compression undone (index and meta blocks)."""
    limit = _entries_end(block)
    key = b""
    pos = 0
    while pos < limit:
        shared, pos = uvarint(block, pos, limit)
        unshared, pos = uvarint(block, pos, limit)
        length, pos = uvarint(block, pos, limit)
        key_end = pos + unshared
        end = key_end + length
        if end > limit or shared > len(key):
            raise ValueError("entry runs past its block")
        key = key[:shared] + block[pos:key_end]
        yield key, block[key_end:end]
        pos = end


def _entries_end(block: bytes) -> int:
    """Where a block's entries end and its restart array begins."""
    if len(block) < 4:
        raise ValueError("block shorter than its restart count")
    restarts = _U32.unpack_from(block, len(block) - 4)[0]
    limit = len(block) - 4 - 4 * restarts
    if restarts == 0 or limit < 0:
        raise ValueError(f"bad restart count {restarts}")
    return limit


class SSTable:
    """One table: its properties, its data blocks found through the index, its records on demand."""

    def __init__(self, data: bytes, name: str) -> None:
        self.name = name
        self._data = data
        if len(data) < FOOTER_LEN:
            self._fail(f"{len(data)} bytes, shorter than a table footer (truncated?)")
        footer = len(data) - FOOTER_LEN
        magic = _U64.unpack_from(data, len(data) - 8)[0]
        if magic in OTHER_MAGICS:
            self._fail(f"a {OTHER_MAGICS[magic]} table, not the RocksDB format lakeFS writes")
        if magic != MAGIC:
            self._fail(f"magic {magic:#018x} is not a RocksDB block-based table's (truncated?)")
        version = _U32.unpack_from(data, len(data) - 12)[0]
        if version != FORMAT_VERSION:
            self._fail(f"footer version {version}, only {FORMAT_VERSION} (what lakeFS writes) is read")
        if data[footer] != CHECKSUM_CRC32C:
            self._fail(f"checksum type {data[footer]}, only CRC32C ({CHECKSUM_CRC32C}) is read")
        self._body_end = footer
        try:
            offset, pos = uvarint(data, footer + 1, len(data) - 12)
            size, pos = uvarint(data, pos, len(data) - 12)
            metaindex = BlockHandle(offset, size)
            offset, pos = uvarint(data, pos, len(data) - 12)
            size, pos = uvarint(data, pos, len(data) - 12)
            index = BlockHandle(offset, size)
        except ValueError:
            self._fail("footer block handles are malformed")
        self.properties: dict[str, bytes] = self._properties(metaindex)
        if NUM_ENTRIES not in self.properties:
            self._fail(f"no {NUM_ENTRIES} property: cannot check that every record is read")
        self.entries = self._property_uvarint(NUM_ENTRIES)
        index_type = self.properties.get(INDEX_TYPE, bytes(4))
        if index_type not in (_U32.pack(INDEX_ONE_LEVEL), _U32.pack(INDEX_TWO_LEVEL)):
            self._fail(f"index type {index_type.hex()} is neither one-level (0) nor two-level (2)")
        self.two_level_index = index_type == _U32.pack(INDEX_TWO_LEVEL)
        if self.properties.get(DELTA_ENCODED_INDEX, b"\x00") != b"\x00":
            self._fail("index values are delta-encoded (RocksDB format 4+), which lakeFS never writes")
        if self.two_level_index:
            partitions = [self._handles(h, "index partition") for h in self._handles(index, "top-level index")]
            self.data_blocks: tuple[BlockHandle, ...] = tuple(h for part in partitions for h in part)
        else:
            self.data_blocks = tuple(self._handles(index, "index"))

    def _fail(self, message: str) -> NoReturn:
        raise SSTableError(f"SSTable {self.name}: {message}")

    def _block(self, handle: BlockHandle, what: str) -> bytes:
        """A block's contents, its checksum verified and Snappy undone."""
        offset, size = handle
        end = offset + size
        if end + TRAILER_LEN > self._body_end:
            self._fail(f"{what} block at {offset} (+{size} bytes) runs past the table's end (truncated?)")
        stored = self._data[offset:end]
        kind = self._data[end]
        if masked_crc32c(stored, kind) != _U32.unpack_from(self._data, end + 1)[0]:
            self._fail(f"{what} block at {offset}: CRC32C checksum mismatch (corrupt file)")
        if kind == RAW:
            return stored
        if kind == SNAPPY:
            try:
                return bytes(cramjam.snappy.decompress_raw(stored))
            except Exception as exc:  # cramjam raises its own DecompressionError
                self._fail(f"{what} block at {offset}: Snappy data does not decompress ({exc})")
        self._fail(f"{what} block at {offset}: compression type {kind} (only raw and Snappy are read)")

    def _handles(self, handle: BlockHandle, what: str) -> list[BlockHandle]:
        block = self._block(handle, what)
        try:
            return [_handle_of(value) for _, value in _entries(block)]
        except ValueError as exc:
            self._fail(f"{what} block at {handle.offset}: {exc}")

    def _properties(self, metaindex: BlockHandle) -> dict[str, bytes]:
        try:
            meta = dict(_entries(self._block(metaindex, "metaindex")))
            if PROPERTIES_BLOCK.encode() not in meta:
                self._fail("the metaindex names no properties block")
            handle = _handle_of(meta[PROPERTIES_BLOCK.encode()])
            return {k.decode(): v for k, v in _entries(self._block(handle, "properties"))}
        except (ValueError, UnicodeDecodeError) as exc:
            self._fail(f"metaindex or properties block malformed: {exc}")

    def _property_uvarint(self, name: str) -> int:
        value = self.properties[name]
        try:
            return uvarint(value, 0, len(value))[0]
        except ValueError:
            self._fail(f"property {name} is not a varint")

    def data_block_compressions(self) -> list[int]:
        """Each data block's stored compression (RAW or SNAPPY), from its trailer."""
        return [
            self._data[offset + size] if offset + size < self._body_end else -1 for offset, size in self.data_blocks
        ]

    def records(self) -> Iterator[tuple[bytes, bytes]]:
        """(user key, value) of every record, in key order; raises SSTableError on any damage."""
        count = 0
        previous = None
        for handle in self.data_blocks:
            block = self._block(handle, "data")
            try:
                limit = _entries_end(block)
            except ValueError as exc:
                self._fail(f"data block at {handle.offset}: {exc}")
            key = b""
            pos = 0
            # The loop inlines one-byte varints: shared and unshared lengths nearly always are.
            while pos < limit:
                shared = block[pos]
                if shared < 0x80:
                    pos += 1
                else:
                    shared, pos = self._varint_at(block, pos, limit, handle)
                unshared = block[pos] if pos < limit else 0x80
                if unshared < 0x80:
                    pos += 1
                else:
                    unshared, pos = self._varint_at(block, pos, limit, handle)
                length = block[pos] if pos < limit else 0x80
                if length < 0x80:
                    pos += 1
                else:
                    length, pos = self._varint_at(block, pos, limit, handle)
                key_end = pos + unshared
                end = key_end + length
                if end > limit or shared > len(key):
                    self._fail(f"data block at {handle.offset}: entry at {pos} runs past its block")
                key = key[:shared] + block[pos:key_end]
                if len(key) < 8 or key[-8] != KIND_SET:
                    self._fail(f"data block at {handle.offset}: record {key[:-8]!r} is not a SET")
                user_key = key[:-8]
                if previous is not None and user_key <= previous:
                    self._fail(f"data block at {handle.offset}: key {user_key!r} out of order")
                previous = user_key
                count += 1
                yield user_key, block[key_end:end]
                pos = end
        if count != self.entries:
            self._fail(f"{count} records read, the table's {NUM_ENTRIES} says {self.entries}")

    def _varint_at(self, block: bytes, pos: int, limit: int, handle: BlockHandle) -> tuple[int, int]:
        try:
            return uvarint(block, pos, limit)
        except ValueError:
            self._fail(f"data block at {handle.offset}: bad varint at {pos}")


def read_sstable(data: bytes, name: str) -> SSTable:
    """Open a table held in memory: footer, properties and index are read and checked now,
    data blocks as records() reaches them."""
    return SSTable(bytes(data), name)


def _shared_prefix(a: bytes, b: bytes) -> int:
    """Length of the common prefix, without a per-byte loop: the highest differing bit of the two
    prefixes read as big-endian integers."""
    n = min(len(a), len(b))
    diff = int.from_bytes(a[:n], "big") ^ int.from_bytes(b[:n], "big")
    return n - (diff.bit_length() + 7) // 8


def _separator(a: bytes, b: bytes) -> bytes:
    """Pebble's bytewise Separator: a short key k with a <= k < b."""
    i = _shared_prefix(a, b)
    if i >= min(len(a), len(b)) or a[i] >= b[i]:
        return a
    if i < len(b) - 1 or a[i] + 1 < b[i]:
        return a[:i] + bytes((a[i] + 1,))
    for j in range(i + 1, len(a)):
        if a[j] != 0xFF:
            return a[:j] + bytes((a[j] + 1,))
    return a


def _successor(a: bytes) -> bytes:
    """Pebble's bytewise Successor: a short key k >= a."""
    for i, byte in enumerate(a):
        if byte != 0xFF:
            return a[:i] + bytes((byte + 1,))
    return a


def _index_key(last: bytes, following: bytes | None) -> bytes:
    """The internal key an index entry carries for a block whose last user key is `last`:
    a shortened separator gets the maximum sequence and the separator kind, as Pebble does."""
    short = _successor(last) if following is None else _separator(last, following)
    if len(short) <= len(last) and last < short:
        return short + SEPARATOR_TRAILER
    return last + SET_TRAILER


class _BlockBuilder:
    def __init__(self, restart_interval: int) -> None:
        self.restart_interval = restart_interval
        self.buf = bytearray()
        self.restarts = [0]
        self.in_restart = 0
        self.last = b""
        self.count = 0

    def add(self, key: bytes, value: bytes) -> None:
        if self.in_restart == self.restart_interval:
            self.restarts.append(len(self.buf))
            self.in_restart = 0
        shared = _shared_prefix(self.last, key) if self.in_restart else 0
        buf = self.buf
        _put_uvarint(buf, shared)
        _put_uvarint(buf, len(key) - shared)
        _put_uvarint(buf, len(value))
        buf += key[shared:]
        buf += value
        self.last = key
        self.in_restart += 1
        self.count += 1

    def size(self) -> int:
        return len(self.buf) + 4 * len(self.restarts) + 4

    def finish(self) -> bytes:
        out = self.buf + b"".join(_U32.pack(r) for r in self.restarts) + _U32.pack(len(self.restarts))
        self.__init__(self.restart_interval)  # type: ignore[misc]
        return bytes(out)


def _should_flush(block: _BlockBuilder, key_len: int, value_len: int, block_size: int) -> bool:
    """Pebble's rule: close a block once it reaches the target size, or once it is past 90 % of
    it and the next entry would carry it over."""
    size = block.size()
    if size >= block_size:
        return True
    if size <= (block_size * 90 + 99) // 100:
        return False
    grown = size + key_len + value_len + 4 + len(uvarint_bytes(key_len)) + len(uvarint_bytes(value_len))
    if block.count % block.restart_interval == 0:
        grown += 4
    return grown > block_size


def _open_index_size(index: list[tuple[bytes, bytes]], block_size: int, two_level: bool) -> int:
    """Pebble's estimated size of the index block still open after `index` (two-level: of the
    partition the entries would still be filling)."""
    block = _BlockBuilder(1)
    for key, handle in index:
        if two_level and block.count and _should_flush(block, len(key), len(handle), block_size):
            block = _BlockBuilder(1)
        block.add(key, handle)
    return block.size() if block.count else 4  # Pebble counts no restart in an empty block


def _encode_handle(handle: BlockHandle) -> bytes:
    out = bytearray()
    _put_uvarint(out, handle.offset)
    _put_uvarint(out, handle.size)
    return bytes(out)


def uvarint_bytes(value: int) -> bytes:
    """The unsigned LEB128 varint of value."""
    out = bytearray()
    _put_uvarint(out, value)
    return bytes(out)


class _TableWriter:
    def __init__(self, compress: bool) -> None:
        self.out = bytearray()
        self.compress = compress

    def block(self, contents: bytes, compress: bool) -> BlockHandle:
        """Append a block and its trailer; Snappy only where it saves an eighth, as Pebble decides."""
        kind = RAW
        if compress and self.compress:
            packed = bytes(cramjam.snappy.compress_raw(contents))
            if len(packed) < len(contents) - len(contents) // 8:
                contents, kind = packed, SNAPPY
        handle = BlockHandle(len(self.out), len(contents))
        self.out += contents
        self.out.append(kind)
        self.out += _U32.pack(masked_crc32c(contents, kind))
        return handle


COMPRESSION_OPTIONS = b"window_bits=-14; level=32767; strategy=0; max_dict_bytes=0; zstd_max_train_bytes=0; enabled=0; "


class _DataWritten(NamedTuple):
    """What writing the data blocks leaves for the index and the properties."""

    index: list[tuple[bytes, bytes]]  # (separator internal key, encoded handle)
    first: bytes | None
    last: bytes | None
    entries: int
    raw_key_size: int
    raw_value_size: int
    estimated_size: int  # Pebble's EstimatedSize when lakeFS closes the table


class _IndexWritten(NamedTuple):
    handle: BlockHandle
    size: int  # as Pebble counts rocksdb.index.size
    partitions: int
    top_size: int


def _check_user_properties(properties: Mapping[str, bytes], range_properties: bool) -> None:
    for name in properties:
        if name.startswith("rocksdb.") or (range_properties and name in RANGE_PROPERTIES):
            raise ValueError(f"property {name!r} is the writer's own")


def _write_data(
    table: _TableWriter, records: Iterable[tuple[bytes, bytes]], block_size: int, two_level_index: bool
) -> _DataWritten:
    """Write the data blocks of `records`: Pebble's block cuts, sequence 0 SET keys."""
    data = _BlockBuilder(DATA_RESTART_INTERVAL)
    index: list[tuple[bytes, bytes]] = []
    first: bytes | None = None
    previous: bytes | None = None
    entries = raw_key_size = raw_value_size = 0
    for key, value in records:
        key, value = bytes(key), bytes(value)
        if previous is None:
            first = key
        elif key <= previous:
            raise ValueError(f"keys must be strictly increasing: {key!r} after {previous!r}")
        if data.count and _should_flush(data, len(key) + 8, len(value), block_size):
            handle = table.block(data.finish(), True)
            index.append((_index_key(previous, key), _encode_handle(handle)))
        data.add(key + SET_TRAILER, value)
        previous = key
        entries += 1
        raw_key_size += len(key) + 8
        raw_value_size += len(value)
    # Pebble's EstimatedSize when lakeFS closes the table: blocks written, the open data block,
    # the open index block (two-level: partition).
    estimated_size = (
        len(table.out) + (data.size() if data.count else 4) + _open_index_size(index, block_size, two_level_index)
    )
    if previous is not None:
        index.append((_index_key(previous, None), _encode_handle(table.block(data.finish(), True))))
    else:  # Pebble gives an empty table one empty data block, indexed by an empty key of kind Invalid
        index.append((EMPTY_TABLE_INDEX_KEY, _encode_handle(table.block(data.finish(), True))))
    return _DataWritten(index, first, previous, entries, raw_key_size, raw_value_size, estimated_size)


def _with_range_properties(properties: Mapping[str, bytes], written: _DataWritten) -> Mapping[str, bytes]:
    """The user properties plus those lakeFS's writer sets when it closes a table."""
    return {
        **properties,
        "min_key": written.first or b"",
        "max_key": written.last or b"",
        "count": b"%d" % written.entries,
        "estimated_size_bytes": b"%d" % written.estimated_size,
    }


def _write_one_level_index(table: _TableWriter, index: list[tuple[bytes, bytes]]) -> _IndexWritten:
    builder = _BlockBuilder(1)
    for key, handle in index:
        builder.add(key, handle)
    contents = builder.finish()
    return _IndexWritten(table.block(contents, True), len(contents) + TRAILER_LEN, 0, 0)


def _write_two_level_index(table: _TableWriter, index: list[tuple[bytes, bytes]], block_size: int) -> _IndexWritten:
    """Index partitions cut as data blocks are, then the top level mapping each partition's
    last key to its handle."""
    builder = _BlockBuilder(1)
    top = _BlockBuilder(1)
    last = b""
    index_size = partitions = 0

    def close_partition() -> None:
        nonlocal index_size, partitions
        contents = builder.finish()
        index_size += len(contents)
        top.add(last, _encode_handle(table.block(contents, True)))
        partitions += 1

    for key, handle in index:
        if builder.count and _should_flush(builder, len(key), len(handle), block_size):
            close_partition()
        builder.add(key, handle)
        last = key
    if builder.count:
        close_partition()
    contents = top.finish()
    top_size = len(contents)  # Pebble counts the partitions and the top level, one trailer
    index_size += top_size + TRAILER_LEN
    return _IndexWritten(table.block(contents, True), index_size, partitions, top_size)


def _rocksdb_properties(
    written: _DataWritten, index: _IndexWritten, data_size: int, compress: bool, two_level_index: bool
) -> dict[str, bytes]:
    """The `rocksdb.*` properties Pebble writes, with what RocksDB's external-file ingestion reads."""
    props: dict[str, bytes] = {
        INDEX_TYPE: _U32.pack(INDEX_TWO_LEVEL if two_level_index else INDEX_ONE_LEVEL),
        "rocksdb.block.based.table.prefix.filtering": b"0",
        "rocksdb.block.based.table.whole.key.filtering": b"0",
        "rocksdb.column.family.id": uvarint_bytes(0x7FFFFFFF),  # no column family
        "rocksdb.comparator": b"leveldb.BytewiseComparator",
        "rocksdb.compression": b"Snappy" if compress else b"NoCompression",
        "rocksdb.compression_options": COMPRESSION_OPTIONS,
        "rocksdb.creation.time": b"\x00",
        "rocksdb.data.size": uvarint_bytes(data_size),
        "rocksdb.deleted.keys": b"\x00",
        "rocksdb.external_sst_file.global_seqno": bytes(8),
        "rocksdb.external_sst_file.version": _U32.pack(2),
        "rocksdb.filter.size": b"\x00",
        "rocksdb.fixed.key.length": b"\x00",
        "rocksdb.format.version": b"\x00",
        "rocksdb.index.key.is.user.key": b"\x00",
        "rocksdb.index.size": uvarint_bytes(index.size),
        "rocksdb.index.value.is.delta.encoded": b"\x00",
        "rocksdb.merge.operands": b"\x00",
        "rocksdb.merge.operator": b"pebble.concatenate",
        "rocksdb.num.data.blocks": uvarint_bytes(len(written.index)),
        NUM_ENTRIES: uvarint_bytes(written.entries),
        "rocksdb.num.range-deletions": b"\x00",
        "rocksdb.oldest.key.time": b"\x00",
        "rocksdb.prefix.extractor.name": b"nullptr",
        "rocksdb.property.collectors": b"[static]",
        "rocksdb.raw.key.size": uvarint_bytes(written.raw_key_size),
        "rocksdb.raw.value.size": uvarint_bytes(written.raw_value_size),
    }
    if two_level_index:
        props["rocksdb.index.partitions"] = uvarint_bytes(index.partitions)
        props["rocksdb.top-level.index.size"] = uvarint_bytes(index.top_size)
    return props


def _write_meta_and_footer(table: _TableWriter, props: Mapping[str, bytes], index_handle: BlockHandle) -> None:
    """The properties block, the metaindex naming it, and the footer."""
    block = _BlockBuilder(PROPERTIES_RESTART_INTERVAL)
    for name in sorted(props, key=str.encode):
        block.add(name.encode(), props[name])
    properties_handle = table.block(block.finish(), False)
    meta = _BlockBuilder(1)
    meta.add(PROPERTIES_BLOCK.encode(), _encode_handle(properties_handle))
    metaindex_handle = table.block(meta.finish(), False)

    handles = _encode_handle(metaindex_handle) + _encode_handle(index_handle)
    footer = bytes((CHECKSUM_CRC32C,)) + handles.ljust(40, b"\x00")
    table.out += footer + _U32.pack(FORMAT_VERSION) + _U64.pack(MAGIC)


def write_sstable(
    records: Iterable[tuple[bytes, bytes]],
    properties: Mapping[str, bytes],
    *,
    compress: bool = True,
    block_size: int = 4096,
    two_level_index: bool = False,
    range_properties: bool = False,
) -> bytes:
    """A table of `records` (user keys strictly increasing) with the user `properties`, laid out
    as Pebble lays out a lakeFS range: sequence 0 SET keys, Snappy where it pays, Pebble's
    separators and properties, the external-file properties RocksDB's ingestion reads.
    `range_properties` adds what lakeFS's writer sets when it closes a table: `min_key`,
    `max_key`, `count` and `estimated_size_bytes` (Pebble's size estimate at that moment)."""
    _check_user_properties(properties, range_properties)
    table = _TableWriter(compress)
    written = _write_data(table, records, block_size, two_level_index)
    if range_properties:
        properties = _with_range_properties(properties, written)
    data_size = len(table.out)
    if two_level_index:
        index = _write_two_level_index(table, written.index, block_size)
    else:
        index = _write_one_level_index(table, written.index)
    props = _rocksdb_properties(written, index, data_size, compress, two_level_index)
    props.update({name: bytes(value) for name, value in properties.items()})
    _write_meta_and_footer(table, props, index.handle)
    return bytes(table.out)
