"""What lakeFS stores inside its SSTables: the value framing and the protobuf messages.

A graveler value is `varint len(identity), identity, varint len(data), data` with Go's signed
(zigzag) varints; bytes after the data are ignored, as lakeFS ignores them. In a range the key
is an object's logical path and the data a `catalog.Entry`; in a metarange the key is a range's
max key, the identity the range id (ASCII hex) and the data a `committed.RangeData`. A refs
dump writes commits, branches and tags as ordinary metaranges and ranges whose properties say
`entity` = commit / branch / tag: key = commit id (identity = commit id, data = `CommitData`),
branch name (identity = its commit id, data = `BranchData`), tag name (identity = its commit
id, data = `TagData`). `_lakefs/retention/gc/rules/config.json` is a binary
`GarbageCollectionRules`.

Field numbers are those of lakeFS's pkg/catalog/catalog.proto, pkg/graveler/graveler.proto and
pkg/graveler/committed/committed.proto. The decoder is a minimal proto3 wire reader: unknown
fields are skipped (lakeFS adds fields), malformed bytes raise ValueError. Encoders write
fields in number order and omit proto3 defaults, as Go's proto.Marshal does (maps sorted).

Identities (pkg/ident, pkg/graveler/sstable/writer.go): an SSTable's id, the name of its file
under `_lakefs/`, is the hex SHA-256 of, for each record, `str(len(key)) key "|"
str(len(value)) value "|"`, followed by the writer's metadata as an ident string map (the
metadata given when the table was opened plus `type`; not min_key, max_key, count or
estimated_size_bytes, which are set after hashing). A metarange's id is computed the same way
over its records. An Entry's identity is the SHA-256 of its size, e_tag, metadata and
(when set) content_type in ident encoding.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import struct
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, Optional, Union

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_U64 = struct.Struct(">Q")


# --- value framing -------------------------------------------------------------------------


def _zigzag_length(value: bytes, pos: int) -> tuple[int, int]:
    """A Go binary.Varint length at pos: (length, position after it)."""
    byte = value[pos] if pos < len(value) else None
    if byte is not None and byte < 0x80:  # the common case: one byte
        encoded, pos = byte, pos + 1
    else:
        encoded, pos = _uvarint(value, pos)
    if encoded & 1:
        raise ValueError(f"negative length {-(encoded >> 1) - 1}")
    return encoded >> 1, pos


def split_value(value: bytes) -> tuple[bytes, bytes]:
    """(identity, data) of a graveler value; ValueError if the framing is broken."""
    length, pos = _zigzag_length(value, 0)
    end = pos + length
    if end > len(value):
        raise ValueError(f"identity of {length} bytes overruns a {len(value)}-byte value")
    identity = value[pos:end]
    length, pos = _zigzag_length(value, end)
    end = pos + length
    if end > len(value):
        raise ValueError(f"data of {length} bytes overruns a {len(value)}-byte value")
    return identity, value[pos:end]


def _zigzag(n: int) -> bytes:
    return _encode_uvarint((n << 1) ^ (n >> 63))


def join_value(identity: bytes, data: bytes) -> bytes:
    """The graveler value framing of (identity, data)."""
    return _zigzag(len(identity)) + identity + _zigzag(len(data)) + data


# --- protobuf wire format ------------------------------------------------------------------


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    end = len(buf)
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise ValueError("truncated or overlong varint")


def _encode_uvarint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32/int64 are sign-extended to 64 bits
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _signed(value: int, bits: int = 64) -> int:
    value &= (1 << 64) - 1
    if bits == 32:
        value &= 0xFFFFFFFF
        return value - (1 << 32) if value >= 1 << 31 else value
    return value - (1 << 64) if value >= 1 << 63 else value


def fields(buf: bytes) -> Iterator[tuple[int, int, Union[int, bytes]]]:
    """(field number, wire type, value) of a message: ints for VARINT/I64/I32, bytes for LEN."""
    pos = 0
    end = len(buf)
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _uvarint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == _VARINT:
            value, pos = _uvarint(buf, pos)
            yield number, wire, value
        elif wire == _LEN:
            length = buf[pos] if pos < end else 0x80
            if length < 0x80:
                pos += 1
            else:
                length, pos = _uvarint(buf, pos)
            if pos + length > end:
                raise ValueError(f"field {number}: {length} bytes overrun the message")
            yield number, wire, buf[pos : pos + length]
            pos += length
        elif wire == _I64 or wire == _I32:
            width = 8 if wire == _I64 else 4
            if pos + width > end:
                raise ValueError(f"field {number}: fixed value overruns the message")
            yield number, wire, int.from_bytes(buf[pos : pos + width], "little")
            pos += width
        else:
            raise ValueError(f"field {number}: unsupported wire type {wire}")


def _expect(number: int, wire: int, want: int) -> None:
    if wire != want:
        raise ValueError(f"field {number}: wire type {wire}, expected {want}")


def _text(number: int, wire: int, value: Union[int, bytes]) -> str:
    _expect(number, wire, _LEN)
    return value.decode("utf-8")  # type: ignore[union-attr]


def _blob(number: int, wire: int, value: Union[int, bytes]) -> bytes:
    _expect(number, wire, _LEN)
    return bytes(value)  # type: ignore[arg-type]


def _int(number: int, wire: int, value: Union[int, bytes], bits: int = 64) -> int:
    _expect(number, wire, _VARINT)
    return _signed(value, bits)  # type: ignore[arg-type]


def _map_entry(value: bytes) -> tuple[Union[int, bytes], Union[int, bytes]]:
    key: Union[int, bytes] = b""
    item: Union[int, bytes] = b""
    for number, _, part in fields(value):
        if number == 1:
            key = part
        elif number == 2:
            item = part
    return key, item


class _Writer:
    """Fields appended in the order the encoder calls them (field-number order), defaults omitted."""

    def __init__(self) -> None:
        self.out = bytearray()

    def tag(self, number: int, wire: int) -> None:
        self.out += _encode_uvarint(number << 3 | wire)

    def varint(self, number: int, value: int) -> None:
        if value:
            self.tag(number, _VARINT)
            self.out += _encode_uvarint(value)

    def bytes(self, number: int, value: Union[bytes, str], always: bool = False) -> None:
        data = value.encode("utf-8") if isinstance(value, str) else value
        if data or always:
            self.tag(number, _LEN)
            self.out += _encode_uvarint(len(data))
            self.out += data

    def message(self, number: int, data: Optional[bytes]) -> None:
        if data is not None:
            self.bytes(number, data, always=True)

    def string_map(self, number: int, mapping: Mapping[str, str]) -> None:
        for key in sorted(mapping):
            entry = _Writer()
            entry.bytes(1, key)
            entry.bytes(2, mapping[key])
            self.bytes(number, entry.done(), always=True)

    def done(self) -> bytes:
        return bytes(self.out)


# --- messages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timestamp:
    """google.protobuf.Timestamp."""

    seconds: int = 0
    nanos: int = 0

    @classmethod
    def decode(cls, data: bytes) -> "Timestamp":
        seconds = nanos = 0
        for number, wire, value in fields(data):
            if number == 1:
                seconds = _int(number, wire, value)
            elif number == 2:
                nanos = _int(number, wire, value, 32)
        return cls(seconds, nanos)

    def encode(self) -> bytes:
        w = _Writer()
        w.varint(1, self.seconds)
        w.varint(2, self.nanos)
        return w.done()

    def to_datetime(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.seconds, dt.timezone.utc) + dt.timedelta(microseconds=self.nanos // 1000)

    @classmethod
    def of(cls, when: dt.datetime) -> "Timestamp":
        if when.tzinfo is None:
            raise ValueError("a timestamp needs a time zone")
        delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        seconds = delta.days * 86400 + delta.seconds
        return cls(seconds, delta.microseconds * 1000)


class AddressType(enum.IntEnum):
    """catalog.Entry.AddressType: how an entry's address is spelled."""

    BY_PREFIX_DEPRECATED = 0  # relative to the namespace (lakeFS < 0.60)
    RELATIVE = 1  # relative to the storage namespace
    FULL = 2  # an absolute URI, possibly outside the namespace (imports)


@dataclass(frozen=True)
class Entry:
    """catalog.Entry, the data of a range record."""

    address: str = ""
    last_modified: Optional[Timestamp] = None
    size: int = 0
    e_tag: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    address_type: int = AddressType.BY_PREFIX_DEPRECATED  # an int: unknown enum values are kept
    content_type: str = ""

    @classmethod
    def decode(cls, data: bytes) -> "Entry":
        address = e_tag = content_type = ""
        last_modified = None
        size = address_type = 0
        metadata: dict[str, str] = {}
        for number, wire, value in fields(data):
            if number == 1:
                address = _text(number, wire, value)
            elif number == 2:
                last_modified = Timestamp.decode(_blob(number, wire, value))
            elif number == 3:
                size = _int(number, wire, value)
            elif number == 4:
                e_tag = _text(number, wire, value)
            elif number == 5:
                key, item = _map_entry(_blob(number, wire, value))
                metadata[bytes(key).decode()] = bytes(item).decode()  # type: ignore[arg-type]
            elif number == 6:
                address_type = _int(number, wire, value, 32)
            elif number == 7:
                content_type = _text(number, wire, value)
        return cls(address, last_modified, size, e_tag, metadata, address_type, content_type)

    def encode(self) -> bytes:
        w = _Writer()
        w.bytes(1, self.address)
        w.message(2, None if self.last_modified is None else self.last_modified.encode())
        w.varint(3, self.size)
        w.bytes(4, self.e_tag)
        w.string_map(5, self.metadata)
        w.varint(6, int(self.address_type))
        w.bytes(7, self.content_type)
        return w.done()

    def identity(self) -> bytes:
        """lakeFS's entry identity (catalog.EntryToValue): the value's identity in a range."""
        h = _IdentHash()
        h.int64(self.size)
        h.string(self.e_tag)
        h.string_map(self.metadata)
        if self.content_type:
            h.string(self.content_type)
        return h.digest()


@dataclass(frozen=True)
class RangeData:
    """committed.RangeData, the data of a metarange record (its identity is the range id)."""

    min_key: bytes = b""
    max_key: bytes = b""
    estimated_size: int = 0
    count: int = 0

    @classmethod
    def decode(cls, data: bytes) -> "RangeData":
        min_key = max_key = b""
        estimated_size = count = 0
        for number, wire, value in fields(data):
            if number == 1:
                min_key = _blob(number, wire, value)
            elif number == 2:
                max_key = _blob(number, wire, value)
            elif number == 3:
                _expect(number, wire, _VARINT)
                estimated_size = value  # type: ignore[assignment]
            elif number == 4:
                count = _int(number, wire, value)
        return cls(min_key, max_key, estimated_size, count)

    def encode(self) -> bytes:
        w = _Writer()
        w.bytes(1, self.min_key)
        w.bytes(2, self.max_key)
        w.varint(3, self.estimated_size)
        w.varint(4, self.count)
        return w.done()


@dataclass(frozen=True)
class CommitData:
    """graveler.CommitData, a refs dump's commit record. `version` 0 is pre-1.0 parent order."""

    id: str = ""
    committer: str = ""
    message: str = ""
    creation_date: Optional[Timestamp] = None
    meta_range_id: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    parents: tuple[str, ...] = ()
    version: int = 0
    generation: int = 0

    @classmethod
    def decode(cls, data: bytes) -> "CommitData":
        values: dict[str, object] = {}
        metadata: dict[str, str] = {}
        parents: list[str] = []
        for number, wire, value in fields(data):
            if number == 1:
                values["id"] = _text(number, wire, value)
            elif number == 2:
                values["committer"] = _text(number, wire, value)
            elif number == 3:
                values["message"] = _text(number, wire, value)
            elif number == 4:
                values["creation_date"] = Timestamp.decode(_blob(number, wire, value))
            elif number == 5:
                values["meta_range_id"] = _text(number, wire, value)
            elif number == 6:
                key, item = _map_entry(_blob(number, wire, value))
                metadata[bytes(key).decode()] = bytes(item).decode()  # type: ignore[arg-type]
            elif number == 7:
                parents.append(_text(number, wire, value))
            elif number == 8:
                values["version"] = _int(number, wire, value, 32)
            elif number == 9:
                values["generation"] = _int(number, wire, value, 32)
        return cls(metadata=metadata, parents=tuple(parents), **values)  # type: ignore[arg-type]

    def encode(self) -> bytes:
        w = _Writer()
        w.bytes(1, self.id)
        w.bytes(2, self.committer)
        w.bytes(3, self.message)
        w.message(4, None if self.creation_date is None else self.creation_date.encode())
        w.bytes(5, self.meta_range_id)
        w.string_map(6, self.metadata)
        for parent in self.parents:
            w.bytes(7, parent, always=True)
        w.varint(8, self.version)
        w.varint(9, self.generation)
        return w.done()


@dataclass(frozen=True)
class BranchData:
    """graveler.BranchData, a refs dump's branch record (the dump writes id and commit_id)."""

    id: str = ""
    commit_id: str = ""
    staging_token: str = ""
    sealed_tokens: tuple[str, ...] = ()
    hidden: bool = False

    @classmethod
    def decode(cls, data: bytes) -> "BranchData":
        id_ = commit_id = staging_token = ""
        sealed: list[str] = []
        hidden = False
        for number, wire, value in fields(data):
            if number == 1:
                id_ = _text(number, wire, value)
            elif number == 2:
                commit_id = _text(number, wire, value)
            elif number == 3:
                staging_token = _text(number, wire, value)
            elif number == 4:
                sealed.append(_text(number, wire, value))
            elif number == 5:
                hidden = bool(_int(number, wire, value))
        return cls(id_, commit_id, staging_token, tuple(sealed), hidden)

    def encode(self) -> bytes:
        w = _Writer()
        w.bytes(1, self.id)
        w.bytes(2, self.commit_id)
        w.bytes(3, self.staging_token)
        for token in self.sealed_tokens:
            w.bytes(4, token, always=True)
        w.varint(5, int(self.hidden))
        return w.done()


@dataclass(frozen=True)
class TagData:
    """graveler.TagData, a refs dump's tag record."""

    id: str = ""
    commit_id: str = ""

    @classmethod
    def decode(cls, data: bytes) -> "TagData":
        id_ = commit_id = ""
        for number, wire, value in fields(data):
            if number == 1:
                id_ = _text(number, wire, value)
            elif number == 2:
                commit_id = _text(number, wire, value)
        return cls(id_, commit_id)

    def encode(self) -> bytes:
        w = _Writer()
        w.bytes(1, self.id)
        w.bytes(2, self.commit_id)
        return w.done()


@dataclass(frozen=True)
class GarbageCollectionRules:
    """graveler.GarbageCollectionRules, the binary protobuf in _lakefs/retention/gc/rules/config.json."""

    default_retention_days: int = 0
    branch_retention_days: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def decode(cls, data: bytes) -> "GarbageCollectionRules":
        default = 0
        branches: dict[str, int] = {}
        for number, wire, value in fields(data):
            if number == 1:
                default = _int(number, wire, value, 32)
            elif number == 2:
                key, item = _map_entry(_blob(number, wire, value))
                branches[bytes(key).decode()] = _signed(item if isinstance(item, int) else 0, 32)  # type: ignore[arg-type]
        return cls(default, branches)

    def encode(self) -> bytes:
        w = _Writer()
        w.varint(1, self.default_retention_days)
        for branch in sorted(self.branch_retention_days):
            entry = _Writer()
            entry.bytes(1, branch)
            entry.varint(2, self.branch_retention_days[branch])
            w.bytes(2, entry.done(), always=True)
        return w.done()


# --- identities ----------------------------------------------------------------------------


class _IdentHash:
    """pkg/ident's typed SHA-256 encoding."""

    _BYTES, _STRING, _INT64, _STRING_SLICE, _STRING_MAP = 0, 1, 2, 3, 4

    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def int64(self, value: int) -> None:
        self.h.update(bytes((self._INT64, 8)) + _U64.pack(value & ((1 << 64) - 1)))

    def string(self, value: Union[str, bytes]) -> None:
        data = value.encode("utf-8") if isinstance(value, str) else value
        self.h.update(bytes((self._STRING,)))
        self.int64(len(data))
        self.h.update(data)

    def string_map(self, mapping: Mapping[str, str]) -> None:
        self.h.update(bytes((self._STRING_MAP,)))
        self.int64(len(mapping))
        for key in sorted(mapping, key=lambda k: k.encode("utf-8")):  # Go sorts strings bytewise
            self.string(key)
            self.string(mapping[key])

    def digest(self) -> bytes:
        return self.h.digest()


def range_identity(records: Iterable[tuple[bytes, bytes]], metadata: Mapping[str, str]) -> str:
    """The id lakeFS gives an SSTable (range or metarange) of `records` (key, framed value),
    written with `metadata` (e.g. {"type": "ranges"}; a dump's tables add `entity`, ...)."""
    h = _IdentHash()
    for key, value in records:
        h.h.update(b"%d%s|%d%s|" % (len(key), key, len(value), value))
    h.string_map(metadata)
    return h.h.hexdigest()
