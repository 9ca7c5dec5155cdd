"""The independent witness for `format: lakefs`: what each ref head needs, read by a second
implementation of lakeFS's formats, sharing no code with the mark's reader.

Tables are read by RocksDB itself (gc_assets.sources.lakefs.rocksdb, rocksdict), values are
split and the few message fields it needs read by a small protobuf wire reader of its own,
not by gc_assets.sources.lakefs.records (which decodes with Google's protobuf runtime).
The refs dump is read the same way on each executor task. Addresses are returned as lakeFS
wrote them (relative keys or full URIs); the witness check turns them into keys itself.

RocksDB ingests a head's ranges in one call into one scratch database (a metarange's ranges
never share a key): a database per table costs a tenth of a second, per head about as much.
"""

from __future__ import annotations

import json
from typing import Callable

from gc_assets.sources.base import SourceError
from gc_assets.sources.files import read_small_file
from gc_assets.sources.lakefs.rocksdb import read_tables_with_rocksdb, read_with_rocksdb
from gc_assets.stores.settings import StoreSettings

# The string fields the witness needs, by lakeFS's numbers (catalog.proto, graveler.proto).
ADDRESS, COMMIT_ID, META_RANGE_ID = 1, 1, 5


def _strings(message: bytes, wanted: tuple[int, ...]) -> dict[int, str]:
    """The `wanted` length-delimited fields of a protobuf message (the first of each number), as
    text; other fields are skipped."""
    found: dict[int, str] = {}
    pos = 0
    while pos < len(message):
        tag, pos = _varint(message, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, pos = _varint(message, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _varint(message, pos)
            if pos + length > len(message):
                raise ValueError("a field overruns the message")
            if number in wanted and number not in found:
                found[number] = message[pos : pos + length].decode("utf-8")
            pos += length
        else:
            raise ValueError(f"wire type {wire} is not read here")
    return found


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        result |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return result, pos
        shift += 7


def _signed_length(value: bytes, pos: int) -> tuple[int, int]:
    """A Go zigzag varint at `pos`: (value, next position)."""
    result, pos = _varint(value, pos)
    return (result >> 1) ^ -(result & 1), pos


def _identity_and_data(value: bytes) -> tuple[bytes, bytes]:
    length, pos = _signed_length(value, 0)
    identity, pos = value[pos : pos + length], pos + length
    length, pos = _signed_length(value, pos)
    if length < 0 or pos + length > len(value):
        raise ValueError("data overruns the value")
    return identity, value[pos : pos + length]


class _Reader:
    """One executor task's view of the repository: the dump's commits and refs, then ranges on demand."""

    def __init__(self, namespace: str, tables: str, refs_dump: str, settings: StoreSettings):
        self.namespace, self.tables, self.settings = namespace, tables, settings
        manifest = json.loads(read_small_file(refs_dump, settings))
        self.metarange_of: dict[str, str] = {}
        for _, value in self._entity_records(manifest["commits_meta_range_id"]):
            commit = _strings(_identity_and_data(value)[1], (COMMIT_ID, META_RANGE_ID))
            self.metarange_of[commit[COMMIT_ID]] = commit.get(META_RANGE_ID, "")

    def _uri(self, table_id: str) -> str:
        return f"{self.namespace}/{self.tables}/{table_id}"

    def _records(self, table_id: str) -> list[tuple[bytes, bytes]]:
        return list(read_with_rocksdb(read_small_file(self._uri(table_id), self.settings), self._uri(table_id)))

    def _entity_records(self, metarange_id: str) -> list[tuple[bytes, bytes]]:
        records = []
        for _, value in self._records(metarange_id) if metarange_id else []:
            records.extend(self._records(_identity_and_data(value)[0].decode("ascii")))
        return records

    def addresses(self, head: str) -> list[str]:
        if head not in self.metarange_of:
            raise SourceError(f"witness: head commit {head} is not in the refs dump")
        metarange = self.metarange_of[head]
        range_ids = [_identity_and_data(v)[0].decode("ascii") for _, v in self._records(metarange)] if metarange else []
        tables = [(read_small_file(self._uri(r), self.settings), self._uri(r)) for r in range_ids]
        return [
            _strings(_identity_and_data(value)[1], (ADDRESS,)).get(ADDRESS, "")
            for _, value in read_tables_with_rocksdb(tables)
        ]


def head_reader(
    namespace: str, tables: str, refs_dump: str, settings: StoreSettings
) -> Callable[[], Callable[[str], list[str]]]:
    """witness_on_executors' opener: each task reads the dump once, then each head's ranges
    (under `tables`, the repository's block storage prefix)."""

    def open_reader() -> Callable[[str], list[str]]:
        return _Reader(namespace, tables, refs_dump, settings).addresses

    return open_reader
