"""A second reader of lakeFS's SSTables: RocksDB itself, through rocksdict, for the independent
witness. It shares no parsing with sstable.py: the table is ingested into a scratch database
(bytewise comparator, as lakeFS's tables declare) and iterated there, so RocksDB checks the
footer, the block checksums and the index. Pebble writes the external-file properties
(`rocksdb.external_sst_file.version`) RocksDB's ingestion asks for, so lakeFS's files are
ingested as they are. A failure of any kind is a SourceError naming the table.

RocksDB cannot ingest a table without records: it aborts the whole process (std::length_error
from the empty key range). lakeFS writes such tables (the metarange of a commit with no
objects), and Pebble always gives them one empty raw data block at offset 0, so a file opening
with exactly that block and its checksum is answered as empty without RocksDB. No other table
starts so: a raw block with entries starts with a 0 then a key length of at least 8, a Snappy
block with its non-zero length."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator, Sequence, Union

import rocksdict

from gc_assets.sources.base import SourceError

# An empty block (no entries; restart array [0], one restart), stored raw (type 0), then the
# masked CRC32C of those nine bytes.
EMPTY_TABLE_HEAD = bytes.fromhex("000000000100000000c0f2a1b0")


# Ingestion syncs the database's files: on a disk that costs ~90 ms a table, in memory ~2 ms.
MEMORY_SCRATCH = "/dev/shm"


def _scratch_dir(table_bytes: int) -> str:
    """A scratch directory in memory when there is room for a few copies of the table (a
    container's /dev/shm may be 64 MiB), else in the temporary directory."""
    try:
        free = os.statvfs(MEMORY_SCRATCH)
        if os.access(MEMORY_SCRATCH, os.W_OK) and free.f_bavail * free.f_frsize > 4 * table_bytes + (64 << 20):
            return tempfile.mkdtemp(prefix="gc-rocksdb-", dir=MEMORY_SCRATCH)
    except OSError:
        pass
    return tempfile.mkdtemp(prefix="gc-rocksdb-")


def read_with_rocksdb(path_or_bytes: Union[str, os.PathLike, bytes], name: str) -> Iterator[tuple[bytes, bytes]]:
    """(user key, value) of every record of one table, in key order, as RocksDB reads them."""
    in_memory = isinstance(path_or_bytes, (bytes, bytearray, memoryview))
    try:
        if in_memory:
            head = bytes(path_or_bytes[: len(EMPTY_TABLE_HEAD)])  # type: ignore[index]
            size = len(path_or_bytes)  # type: ignore[arg-type]
        else:
            with open(path_or_bytes, "rb") as source:  # type: ignore[arg-type]
                head = source.read(len(EMPTY_TABLE_HEAD))
            size = os.path.getsize(path_or_bytes)  # type: ignore[arg-type]
    except OSError as exc:
        raise SourceError(f"SSTable {name}: cannot be read: {exc}") from exc
    if head == EMPTY_TABLE_HEAD:
        return iter(())
    scratch = _scratch_dir(size)
    try:
        if in_memory:
            table = os.path.join(scratch, "table.sst")
            with open(table, "wb") as out:
                out.write(path_or_bytes)  # type: ignore[arg-type]
        else:
            table = os.fspath(path_or_bytes)  # type: ignore[arg-type]
        records = _ingest_and_read(scratch, [table], move=in_memory)  # our own copy is moved in
    except Exception as exc:  # rocksdict raises plain exceptions carrying RocksDB's status
        raise SourceError(f"SSTable {name}: RocksDB refuses it: {exc}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return iter(records)


def read_tables_with_rocksdb(tables: Sequence[tuple[bytes, str]]) -> list[tuple[bytes, bytes]]:
    """(user key, value) of every record of several tables whose keys never overlap (a
    metarange's ranges), ingested together: one scratch database per batch, not per table."""
    filled = [
        (content, name) for content, name in tables if bytes(content[: len(EMPTY_TABLE_HEAD)]) != EMPTY_TABLE_HEAD
    ]
    if not filled:
        return []
    scratch = _scratch_dir(sum(len(content) for content, _ in filled))
    try:
        paths = []
        for number, (content, _) in enumerate(filled):
            paths.append(os.path.join(scratch, f"{number}.sst"))
            with open(paths[-1], "wb") as out:
                out.write(content)
        return _ingest_and_read(scratch, paths, move=True)
    except Exception as exc:  # rocksdict raises plain exceptions carrying RocksDB's status
        names = [name for _, name in filled]
        raise SourceError(
            f"SSTables {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}: RocksDB refuses one: {exc}"
        ) from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _ingest_and_read(scratch: str, paths: list[str], move: bool) -> list[tuple[bytes, bytes]]:
    """Ingest `paths` into a scratch database and read every record back, checksums verified."""
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_paranoid_checks(True)
    db = rocksdict.Rdict(os.path.join(scratch, "db"), options)
    try:
        ingest = rocksdict.IngestExternalFileOptions()
        ingest.set_move_files(move)
        db.ingest_external_file(paths, ingest)
        read = rocksdict.ReadOptions()
        read.set_verify_checksums(True)
        return _all_records(db, read)
    finally:
        db.close()


def _all_records(db: rocksdict.Rdict, read: rocksdict.ReadOptions) -> list[tuple[bytes, bytes]]:
    """Every record, iterated by hand: rocksdict's items() ends quietly where a block fails its
    checksum, so the iterator's status is checked once it stops."""
    records = []
    iterator = db.iter(read)
    iterator.seek_to_first()
    while iterator.valid():
        records.append((iterator.key(), iterator.value()))
        iterator.next()
    iterator.status()  # raises RocksDB's error, if the iteration stopped on one
    return records
