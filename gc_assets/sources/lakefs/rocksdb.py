"""A second reader of lakeFS's SSTables: RocksDB itself, through rocksdict, for the independent
witness. It shares no parsing with sstable.py: the table is ingested into a scratch database
(bytewise comparator, as lakeFS's tables declare) and iterated there, so RocksDB checks the
footer, the block checksums and the index. Pebble writes the external-file properties
(`rocksdb.external_sst_file.version`) RocksDB's ingestion asks for, so lakeFS's files are
ingested as they are. A failure of any kind is a SourceError naming the table."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator, Union

import rocksdict

from gc_assets.sources.base import SourceError


def read_with_rocksdb(path_or_bytes: Union[str, os.PathLike, bytes], name: str) -> Iterator[tuple[bytes, bytes]]:
    """(user key, value) of every record of one table, in key order, as RocksDB reads them."""
    scratch = tempfile.mkdtemp(prefix="gc-rocksdb-")
    try:
        if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            table = os.path.join(scratch, "table.sst")
            with open(table, "wb") as out:
                out.write(path_or_bytes)
        else:
            table = os.fspath(path_or_bytes)
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_paranoid_checks(True)
        db = rocksdict.Rdict(os.path.join(scratch, "db"), options)
        try:
            ingest = rocksdict.IngestExternalFileOptions()
            ingest.set_move_files(False)  # the caller's file stays where it is
            db.ingest_external_file([table], ingest)
            read = rocksdict.ReadOptions()
            read.set_verify_checksums(True)
            records = list(db.items(read_opt=read))
        finally:
            db.close()
    except Exception as exc:  # rocksdict raises plain exceptions carrying RocksDB's status
        raise SourceError(f"SSTable {name}: RocksDB refuses it: {exc}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return iter(records)
