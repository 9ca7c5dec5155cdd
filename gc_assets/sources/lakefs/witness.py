"""The independent witness for `format: lakefs`: what each ref head needs, read by a second
implementation of lakeFS's formats, sharing no code with the mark's reader.

Tables are read by RocksDB itself (gc_assets.sources.lakefs.rocksdb, rocksdict), values are
split by their own small varint reader, and messages are decoded by Google's protobuf runtime
from descriptors declared here with lakeFS's field numbers, not by gc_assets.sources.lakefs.records.
The refs dump is read the same way on each executor task. Addresses are returned as lakeFS
wrote them (relative keys or full URIs); the witness check turns them into keys itself.

RocksDB ingests a head's ranges in one call into one scratch database (a metarange's ranges
never share a key): a database per table costs a tenth of a second, per head about as much.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Callable

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from gc_assets.sources.base import SourceError
from gc_assets.sources.files import read_small_file
from gc_assets.sources.lakefs.rocksdb import read_with_rocksdb
from gc_assets.stores.endpoints import StoreSettings

_FIELD = descriptor_pb2.FieldDescriptorProto
# (message, [(field name, number, type, repeated)]) with lakeFS's numbers (catalog.proto, graveler.proto).
_MESSAGES = {
    "Entry": [("address", 1, _FIELD.TYPE_STRING, False), ("size", 3, _FIELD.TYPE_INT64, False), ("address_type", 6, _FIELD.TYPE_INT32, False)],
    "CommitData": [("id", 1, _FIELD.TYPE_STRING, False), ("meta_range_id", 5, _FIELD.TYPE_STRING, False)],
    "BranchData": [("id", 1, _FIELD.TYPE_STRING, False), ("commit_id", 2, _FIELD.TYPE_STRING, False)],
    "TagData": [("id", 1, _FIELD.TYPE_STRING, False), ("commit_id", 2, _FIELD.TYPE_STRING, False)],
}


def _message_classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    proto = descriptor_pb2.FileDescriptorProto(name="gc_assets_lakefs_witness.proto", package="witness", syntax="proto3")
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field_name, number, kind, repeated in fields:
            label = _FIELD.LABEL_REPEATED if repeated else _FIELD.LABEL_OPTIONAL
            message.field.add(name=field_name, number=number, type=kind, label=label)
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"witness.{name}")) for name in _MESSAGES}


def _signed_length(value: bytes, pos: int) -> tuple[int, int]:
    """A Go zigzag varint at `pos`: (value, next position)."""
    shift = result = 0
    while True:
        if pos >= len(value) or shift > 63:
            raise ValueError("truncated length")
        byte = value[pos]
        result |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            break
        shift += 7
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

    def __init__(self, namespace: str, refs_dump: str, settings: StoreSettings):
        self.namespace, self.settings = namespace, settings
        self.messages = _message_classes()
        manifest = json.loads(read_small_file(refs_dump, settings))
        self.metarange_of: dict[str, str] = {}
        for _, value in self._entity_records(manifest["commits_meta_range_id"]):
            commit = self._decode("CommitData", value)
            self.metarange_of[commit.id] = commit.meta_range_id

    def _uri(self, table_id: str) -> str:
        return f"{self.namespace}/_lakefs/{table_id}"

    def _records(self, table_id: str) -> list[tuple[bytes, bytes]]:
        return list(read_with_rocksdb(read_small_file(self._uri(table_id), self.settings), self._uri(table_id)))

    def _entity_records(self, metarange_id: str) -> list[tuple[bytes, bytes]]:
        records = []
        for _, value in self._records(metarange_id) if metarange_id else []:
            records.extend(self._records(_identity_and_data(value)[0].decode("ascii")))
        return records

    def _decode(self, name: str, value: bytes) -> Any:
        message = self.messages[name]()
        message.ParseFromString(_identity_and_data(value)[1])
        return message

    def addresses(self, head: str) -> list[str]:
        if head not in self.metarange_of:
            raise SourceError(f"witness: head commit {head} is not in the refs dump")
        metarange = self.metarange_of[head]
        range_ids = [_identity_and_data(v)[0].decode("ascii") for _, v in self._records(metarange)] if metarange else []
        tables = [(read_small_file(self._uri(r), self.settings), self._uri(r)) for r in range_ids]
        return [self._decode("Entry", value).address for _, value in _ingested(tables)]


def _ingested(tables: list[tuple[bytes, str]]) -> list[tuple[bytes, bytes]]:
    """Every record of `tables` (keys disjoint), ingested by RocksDB into one scratch database."""
    if not tables:
        return []
    import rocksdict

    scratch = tempfile.mkdtemp(prefix="gc-witness-")
    try:
        paths = []
        for number, (content, _) in enumerate(tables):
            paths.append(os.path.join(scratch, f"{number}.sst"))
            with open(paths[-1], "wb") as out:
                out.write(content)
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_paranoid_checks(True)
        db = rocksdict.Rdict(os.path.join(scratch, "db"), options)
        try:
            db.ingest_external_file(paths, rocksdict.IngestExternalFileOptions())
            read = rocksdict.ReadOptions()
            read.set_verify_checksums(True)
            records = list(db.items(read_opt=read))
        finally:
            db.close()
    except Exception as exc:  # rocksdict raises plain exceptions carrying RocksDB's status
        raise SourceError(f"witness: RocksDB refuses one of {[name for _, name in tables][:3]}...: {exc}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return records


def head_reader(namespace: str, refs_dump: str, settings: StoreSettings) -> Callable[[], Callable[[str], list[str]]]:
    """witness_on_executors' opener: each task reads the dump once, then each head's ranges."""

    def open_reader() -> Callable[[str], list[str]]:
        return _Reader(namespace, refs_dump, settings).addresses

    return open_reader
