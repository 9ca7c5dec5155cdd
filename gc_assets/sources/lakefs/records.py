"""What lakeFS stores inside its SSTables: the value framing and the protobuf messages.

A graveler value is `varint len(identity), identity, varint len(data), data` with Go's signed
(zigzag) varints; bytes after the data are ignored, as lakeFS ignores them. In a range the key
is an object's logical path and the data a `catalog.Entry`; in a metarange the key is a range's
max key, the identity the range id (ASCII hex) and the data a `committed.RangeData`. A refs
dump (graveler.Dump{Commits,Branches,Tags}) writes commits, branches and tags as ordinary
metaranges and ranges, all of whose properties carry `entity` = commit / branch / tag,
`schema_name` and `schema_definition`: key = commit id (identity = commit id, data =
`CommitData`), branch name (identity = its commit id, data = `BranchData` with id and
commit_id), tag name (identity = its commit id, data = `TagData`).
`_lakefs/retention/gc/rules/config.json` is a binary `GarbageCollectionRules`.

Field numbers are those of lakeFS's pkg/catalog/catalog.proto, pkg/graveler/graveler.proto and
pkg/graveler/committed/committed.proto; the descriptors are built from a table here and parsed
by protobuf's C runtime (ten times the pure-Python speed: a bench lake has a million entries).
Unknown fields are skipped (lakeFS adds fields); malformed bytes raise ValueError. Encoding
writes fields in number order and omits proto3 defaults, as Go's proto.Marshal does.

Identities (pkg/ident, pkg/graveler/sstable/writer.go): an SSTable's id, the name of its file
under `_lakefs/`, is the hex SHA-256 of, for each record, `str(len(key)) key "|"
str(len(value)) value "|"`, followed by the writer's metadata as an ident string map (the
metadata given when the table was opened plus `type`; not min_key, max_key, count or
estimated_size_bytes, which are set after hashing). A metarange's id is computed the same way
over its records; write_lakefs_table writes and names a table so. An Entry's identity is the
SHA-256 of its size, e_tag, metadata and (when set) content_type in ident encoding.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import struct
from dataclasses import dataclass, field
from operator import attrgetter
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Optional, TypeVar, Union

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from google.protobuf.message import DecodeError

from gc_assets.sources.lakefs.sstable import read_sstable, uvarint, uvarint_bytes, write_sstable

_U64 = struct.Struct(">Q")


# --- value framing -------------------------------------------------------------------------


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    try:
        return uvarint(buf, pos, len(buf))
    except ValueError:
        raise ValueError("truncated or overlong varint") from None


def _zigzag_length(value: bytes, pos: int) -> tuple[int, int]:
    """A Go binary.Varint length at pos: (length, position after it)."""
    try:  # one or two bytes nearly always: an identity's length, an Entry's
        byte = value[pos]
        if byte < 0x80:
            encoded, pos = byte, pos + 1
        elif value[pos + 1] < 0x80:
            encoded, pos = (byte & 0x7F) | (value[pos + 1] << 7), pos + 2
        else:
            encoded, pos = _uvarint(value, pos)
    except IndexError:
        raise ValueError("truncated varint") from None
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
    return uvarint_bytes((n << 1) ^ (n >> 63))


def join_value(identity: bytes, data: bytes) -> bytes:
    """The graveler value framing of (identity, data)."""
    return _zigzag(len(identity)) + identity + _zigzag(len(data)) + data


# --- protobuf messages --------------------------------------------------------------------

# lakeFS's messages as (field, number, type); the descriptors are built here, no generated code.
# Enums are read as int32 (the same varint on the wire) so that unknown values are kept.
_STRING, _BYTES, _INT32, _INT64, _UINT64, _BOOL = "string", "bytes", "int32", "int64", "uint64", "bool"
_TIMESTAMP = ".google.protobuf.Timestamp"
_SCHEMA: dict[str, list[tuple[str, int, str]]] = {
    "Entry": [
        ("address", 1, _STRING),
        ("last_modified", 2, _TIMESTAMP),
        ("size", 3, _INT64),
        ("e_tag", 4, _STRING),
        ("metadata", 5, "map<string,string>"),
        ("address_type", 6, _INT32),
        ("content_type", 7, _STRING),
    ],
    "RangeData": [("min_key", 1, _BYTES), ("max_key", 2, _BYTES), ("estimated_size", 3, _UINT64), ("count", 4, _INT64)],
    "CommitData": [
        ("id", 1, _STRING),
        ("committer", 2, _STRING),
        ("message", 3, _STRING),
        ("creation_date", 4, _TIMESTAMP),
        ("meta_range_id", 5, _STRING),
        ("metadata", 6, "map<string,string>"),
        ("parents", 7, "repeated string"),
        ("version", 8, _INT32),
        ("generation", 9, _INT32),
    ],
    "BranchData": [
        ("id", 1, _STRING),
        ("commit_id", 2, _STRING),
        ("staging_token", 3, _STRING),
        ("sealed_tokens", 4, "repeated string"),
        ("hidden", 5, _BOOL),
    ],
    "TagData": [("id", 1, _STRING), ("commit_id", 2, _STRING)],
    "GarbageCollectionRules": [
        ("default_retention_days", 1, _INT32),
        ("branch_retention_days", 2, "map<string,int32>"),
    ],
}


def _message_classes() -> dict[str, Any]:
    F = descriptor_pb2.FieldDescriptorProto
    scalar = {
        _STRING: F.TYPE_STRING,
        _BYTES: F.TYPE_BYTES,
        _INT32: F.TYPE_INT32,
        _INT64: F.TYPE_INT64,
        _UINT64: F.TYPE_UINT64,
        _BOOL: F.TYPE_BOOL,
    }
    file = descriptor_pb2.FileDescriptorProto(
        name="gc_assets/lakefs.proto", package="lakefs", syntax="proto3", dependency=[timestamp_pb2.DESCRIPTOR.name]
    )
    for message, spec in _SCHEMA.items():
        m = file.message_type.add(name=message)
        for name, number, kind in spec:
            f = m.field.add(name=name, number=number, label=F.LABEL_OPTIONAL)
            if kind == _TIMESTAMP:
                f.type, f.type_name = F.TYPE_MESSAGE, _TIMESTAMP
            elif kind.startswith("repeated "):
                f.type, f.label = scalar[kind.split()[1]], F.LABEL_REPEATED
            elif kind.startswith("map<"):
                key, value = kind[4:-1].split(",")
                entry = m.nested_type.add(name="".join(p.title() for p in name.split("_")) + "Entry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, label=F.LABEL_OPTIONAL, type=scalar[key])
                entry.field.add(name="value", number=2, label=F.LABEL_OPTIONAL, type=scalar[value])
                f.type, f.label, f.type_name = F.TYPE_MESSAGE, F.LABEL_REPEATED, f".lakefs.{message}.{entry.name}"
            else:
                f.type = scalar[kind]
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return {
        message: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"lakefs.{message}")) for message in _SCHEMA
    }


_PB = _message_classes()


def _parse(kind: str, data: bytes) -> Any:
    try:
        return _PB[kind].FromString(data)
    except DecodeError as exc:
        raise ValueError(f"malformed {kind}: {exc}") from None


def _serialize(kind: str, /, **values: Any) -> bytes:
    stamps = {
        name: values.pop(name) for name in [n for n, v in values.items() if v is None or isinstance(v, Timestamp)]
    }
    m = _PB[kind](**values)
    for name, stamp in stamps.items():
        if stamp is not None:
            target = getattr(m, name)
            target.SetInParent()  # present even when zero
            target.seconds, target.nanos = stamp.seconds, stamp.nanos
    return m.SerializeToString(deterministic=True)  # maps sorted, as in ids


@dataclass(frozen=True)
class Timestamp:
    """google.protobuf.Timestamp."""

    seconds: int = 0
    nanos: int = 0

    def to_datetime(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.seconds, dt.timezone.utc) + dt.timedelta(microseconds=self.nanos // 1000)

    @classmethod
    def of(cls, when: dt.datetime) -> "Timestamp":
        if when.tzinfo is None:
            raise ValueError("a timestamp needs a time zone")
        delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        return cls(delta.days * 86400 + delta.seconds, delta.microseconds * 1000)


def _timestamp(message: Any, name: str) -> Optional[Timestamp]:
    if not message.HasField(name):
        return None
    value = getattr(message, name)
    return Timestamp(value.seconds, value.nanos)


def _field_reader(name: str, kind: str) -> Callable[[Any], Any]:
    """How to read a parsed field as the dataclasses hold it: maps as dicts, repeated fields as tuples."""
    if kind == _TIMESTAMP:
        return lambda message: _timestamp(message, name)
    if kind.startswith("map<"):
        return lambda message: dict(getattr(message, name))
    if kind.startswith("repeated "):
        return lambda message: tuple(getattr(message, name))
    return attrgetter(name)


_M = TypeVar("_M", bound="_Message")


class _Message:
    """A frozen dataclass named as its message in _SCHEMA, whose fields are the message's, in order."""

    _readers: tuple[Callable[[Any], Any], ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._readers = tuple(_field_reader(name, kind) for name, _, kind in _SCHEMA[cls.__name__])

    @classmethod
    def decode(cls: type[_M], data: bytes) -> _M:
        m = _parse(cls.__name__, data)
        return cls(*[read(m) for read in cls._readers])

    def encode(self) -> bytes:
        kind = type(self).__name__
        return _serialize(kind, **{name: getattr(self, name) for name, _, _ in _SCHEMA[kind]})


class AddressType(enum.IntEnum):
    """catalog.Entry.AddressType: how an entry's address is spelled."""

    BY_PREFIX_DEPRECATED = 0  # relative to the namespace (lakeFS < 0.60)
    RELATIVE = 1  # relative to the storage namespace
    FULL = 2  # an absolute URI, possibly outside the namespace (imports)


@dataclass(frozen=True)
class Entry(_Message):
    """catalog.Entry, the data of a range record."""

    address: str = ""
    last_modified: Optional[Timestamp] = None
    size: int = 0
    e_tag: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    address_type: int = AddressType.BY_PREFIX_DEPRECATED  # an int: unknown enum values are kept
    content_type: str = ""

    def identity(self) -> bytes:
        """lakeFS's entry identity (catalog.EntryToValue): the value's identity in a range.
        Tables written before April 2021 hashed the address first; GC never needs it."""
        h = _IdentHash()
        h.int64(self.size)
        h.string(self.e_tag)
        h.string_map(self.metadata)
        if self.content_type:
            h.string(self.content_type)
        return h.digest()


def entry_location(data: bytes) -> tuple[str, int, int]:
    """(address, address_type, size) of an encoded Entry: all the mark needs, without building
    an Entry (a bench lake has a million)."""
    try:
        m = _ENTRY_FROM(data)
    except DecodeError as exc:
        raise ValueError(f"malformed Entry: {exc}") from None
    return m.address, m.address_type, m.size


_ENTRY_FROM = _PB["Entry"].FromString


@dataclass(frozen=True)
class RangeData(_Message):
    """committed.RangeData, the data of a metarange record (its identity is the range id)."""

    min_key: bytes = b""
    max_key: bytes = b""
    estimated_size: int = 0
    count: int = 0


@dataclass(frozen=True)
class CommitData(_Message):
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


@dataclass(frozen=True)
class BranchData(_Message):
    """graveler.BranchData, a refs dump's branch record (the dump writes id and commit_id)."""

    id: str = ""
    commit_id: str = ""
    staging_token: str = ""
    sealed_tokens: tuple[str, ...] = ()
    hidden: bool = False


@dataclass(frozen=True)
class TagData(_Message):
    """graveler.TagData, a refs dump's tag record."""

    id: str = ""
    commit_id: str = ""


@dataclass(frozen=True)
class GarbageCollectionRules(_Message):
    """graveler.GarbageCollectionRules, the binary protobuf in _lakefs/retention/gc/rules/config.json."""

    default_retention_days: int = 0
    branch_retention_days: Mapping[str, int] = field(default_factory=dict)


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


@dataclass(frozen=True)
class LakeFSTable:
    """A range or metarange as lakeFS writes it under `_lakefs/`."""

    id: str  # lakeFS's identity: the file's name, and the range's identity in a metarange
    data: bytes
    range_data: RangeData  # what a metarange record says of this table


def write_lakefs_table(
    records: Iterable[tuple[bytes, bytes]],
    kind: str,
    metadata: Mapping[str, str] = MappingProxyType({}),
    *,
    two_level_index: bool = False,
) -> LakeFSTable:
    """Records (key, framed value) as lakeFS's DiskWriter writes them: `kind` "ranges" or
    "metaranges" in `type`, the writer's `metadata` (a refs dump adds `entity`, ...), the
    properties set on close, named by range_identity."""
    records = list(records)
    metadata = {**metadata, "type": kind}
    table_id = range_identity(records, metadata)
    data = write_sstable(
        records,
        {name: value.encode("utf-8") for name, value in metadata.items()},
        two_level_index=two_level_index,
        range_properties=True,
    )
    estimated = int(read_sstable(data, table_id).properties["estimated_size_bytes"])
    first, last = (records[0][0], records[-1][0]) if records else (b"", b"")
    return LakeFSTable(table_id, data, RangeData(first, last, estimated, len(records)))
