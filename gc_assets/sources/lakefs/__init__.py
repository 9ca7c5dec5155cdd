"""lakeFS's own storage-namespace formats: the SSTables Pebble writes for metaranges and ranges
(sstable), the values and protobuf messages inside them (records), and a second reader of the
same tables through RocksDB itself (rocksdb), used only as an independent witness."""
