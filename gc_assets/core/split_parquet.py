"""One frame written as one Parquet file per value of a column, by pyarrow on the executors, each
file as Spark writes it: INT96 times, non-null columns required, Spark's schema in the footer.
Spark's own partitioned write spends about 7 ms per value in its commit protocol, this about 1
(docs/design.md §6.7: a fleet run writes five files per table). Nothing here imports more than
pyarrow: the executors' Python workers import this module.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"
PART = "part-00000.snappy.parquet"  # each value's one part file


def write_split(spark: SparkSession, frame: DataFrame, by: str, root: Path) -> pa.Schema:
    """The rows of `frame` with each value v of the int column `by` as root/<by>=<v>/PART (without
    `by`); the files' schema. A retried task writes the same files again, each replaced whole."""
    columns = [c for c in frame.columns if c != by]
    spark_schema = frame.select(*columns).schema
    footer = {SPARK_SCHEMA_KEY: spark_schema.json().encode(), b"org.apache.spark.version": spark.version.encode()}
    schema = to_arrow_schema(spark_schema, timezone="UTC").with_metadata(footer)
    directory = str(root)

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        written: list[int] = []
        writer, temporary = None, ""
        for value, run in value_runs(batches, by):
            if not written or written[-1] != value:
                _close(writer, temporary)
                written.append(value)
                os.makedirs(f"{directory}/{by}={value}", exist_ok=True)
                temporary = f"{directory}/{by}={value}/.{PART}.{uuid.uuid4().hex}"
                writer = pq.ParquetWriter(temporary, schema, use_deprecated_int96_timestamps=True)
            rows = pa.Table.from_batches([run]).select(columns)
            writer.write_table(rows.cast(schema))  # type: ignore[union-attr]
        _close(writer, temporary)
        yield pa.RecordBatch.from_pydict({by: written}, pa.schema([(by, pa.int32())]))

    frame.repartition(by).sortWithinPartitions(by).mapInArrow(write, f"{by} int").collect()
    return schema


def value_runs(batches: Iterator[pa.RecordBatch], by: str) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Each batch's rows as runs of one value of the int column `by`, in order: batches sorted by
    `by` give each value's rows as consecutive runs."""
    for batch in batches:
        values = batch.column(by).to_numpy()
        starts = [0, *(np.flatnonzero(np.diff(values)) + 1)] if len(values) else []
        for start, end in zip(starts, [*starts[1:], len(values)]):
            yield int(values[start]), batch.slice(start, end - start)


def write_empty(schema: pa.Schema, directory: Path) -> None:
    """A part file of no rows in `schema`, for a value without rows."""
    pq.write_table(schema.empty_table(), directory / PART, use_deprecated_int96_timestamps=True)


def _close(writer: Any, temporary: str) -> None:
    """Finish one value's part file and put it in its place whole."""
    if writer is not None:
        writer.close()
        os.replace(temporary, os.path.join(os.path.dirname(temporary), PART))
