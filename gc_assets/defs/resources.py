"""Dagster resources: gc.yaml, the Spark session and the Parquet IO manager."""

import datetime as dt
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Optional

import pyarrow.parquet as pq
from dagster import (
    ConfigurableIOManager,
    ConfigurableResource,
    InputContext,
    MetadataValue,
    OutputContext,
    ResourceDependency,
    TimestampMetadataValue,
)
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql.types import StructType

from gc_assets.core import state
from gc_assets.core.config import (
    GcConfig,
    config_path,
)
from gc_assets.core.split_parquet import SPARK_SCHEMA_KEY
from gc_assets.core.state import TIMES_FILE, spark_path
from gc_assets.defs.metadata import breaking_rows, measures, output_metadata
from gc_assets.defs.partitions import split_partition_key
from gc_assets.defs.schemas import MODELS, check_columns, refuse_broken_rows, row_rules
from gc_assets.mark.partition import Mark
from gc_assets.sources.discovery import load_lake

# gc.yaml as this process last read it, by path: every run of a process (and a fleet run is
# many runs in one) shares one reading and so one list of discovered tables.
_READINGS: dict[str, tuple[tuple[int, int], GcConfig]] = {}


def share_reading(config: GcConfig) -> None:
    """Make `config`, just read by a launcher, the reading every step of its runs uses."""
    if config.source_path is None:
        return
    path = config_path(config.source_path).absolute()
    stat = path.stat()
    _READINGS[str(path)] = ((stat.st_mtime_ns, stat.st_size), config)


class GcConfigResource(ConfigurableResource):
    """gc.yaml, read when a run starts (empty path: $GC_ASSETS_CONFIG, else ./gc.yaml)."""

    config_path: str = ""

    def load(self) -> GcConfig:
        """gc.yaml, parsed again only when the file changed: a run reads it (and discovers its
        tables) once, and so do the runs a launcher shared its reading with."""
        path = config_path(self.config_path).absolute()
        try:
            stat = path.stat()
        except OSError:
            return load_lake(path)  # the error names the file
        key = (stat.st_mtime_ns, stat.st_size)
        reading = _READINGS.get(str(path))
        if reading is None or reading[0] != key:
            reading = _READINGS[str(path)] = (key, load_lake(path))
        return reading[1]

    def state_location(self, asset_name: str, partition_key: Any, suffix: str = "") -> str:
        """Where an asset partition (or a file beside it) is stored."""
        date, repo = split_partition_key(partition_key)
        return str(state.state_location(self.load().state_path, asset_name, repo, date, suffix))

    def recorded_times(self, asset_name: str, partition_key: Any) -> dict[str, Any]:
        """What TIMES_FILE of a stored partition says: run_id and the times, as datetimes."""
        path = Path(self.state_location(asset_name, partition_key, TIMES_FILE))
        if not path.is_file():
            return {}
        record = json.loads(path.read_text())
        return {key: value if key == "run_id" else dt.datetime.fromisoformat(value) for key, value in record.items()}


class SparkParquetIOManager(ConfigurableIOManager):
    """Stores each asset partition as Parquet at <state_dir>/<asset>/repo=<repo>/date=<date>/.

    Output is written beside its final place and only swapped in once it passed the asset's
    pandera model: the columns on the schema read back, the rows by measures the write
    itself collects (one Spark job writes, counts and validates). A partition on disk is
    always one that passed its schema, and downstream steps read exactly what was validated.
    """

    pyspark: ResourceDependency[LazyPySparkResource]
    gc_config: ResourceDependency[GcConfigResource]

    def handle_output(self, context: OutputContext, obj: DataFrame) -> None:
        asset = context.asset_key.path[-1]
        final = Path(self.gc_config.state_location(asset, context.asset_partition_key))
        # Beside its final place, in a hidden directory that no reader of the asset's partitions
        # lists; its own name is not hidden, or Spark warns that it ignores the path it reads back.
        staging = final.parent / ".staging" / f"{final.name}.{uuid.uuid4().hex}"
        model = MODELS[asset]
        observation = Observation(f"{asset}-{uuid.uuid4().hex}")
        obj.observe(observation, *measures(asset, row_rules(model))).write.parquet(spark_path(staging))
        try:
            written = read_partition(self.pyspark.spark_session, staging)
            check_columns(written, model)
            measured = observation.get
            refuse_broken_rows(model, breaking_rows(measured))
            metadata = output_metadata(asset, measured, written)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        times = {k: v.value for k, v in context.output_metadata.items() if isinstance(v, TimestampMetadataValue)}
        record = {
            "run_id": context.run_id,
            **{k: dt.datetime.fromtimestamp(v, dt.timezone.utc).isoformat() for k, v in times.items()},
        }
        swap_in(staging, final, record)
        context.add_output_metadata({"path": MetadataValue.path(str(final)), **metadata})

    def load_input(self, context: InputContext) -> DataFrame:
        upstream = context.upstream_output
        assert upstream is not None and upstream.asset_key is not None
        path = self.gc_config.state_location(upstream.asset_key.path[-1], context.asset_partition_key)
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"{upstream.asset_key.to_user_string()} partition {context.asset_partition_key} "
                f"has not been materialized (no data at {path})"
            )
        return read_partition(self.pyspark.spark_session, path)


def swap_in(staging: Path, final: Path, times: dict[str, Any]) -> None:
    """Put a validated partition in its place with its TIMES_FILE: a reader finds the old one or
    the new one, never a mix."""
    (staging / TIMES_FILE).write_text(json.dumps(times))
    replaced = final.with_name(f".{final.name}.{uuid.uuid4().hex}.replaced")
    if final.exists():
        final.rename(replaced)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(final)
    shutil.rmtree(replaced, ignore_errors=True)


_NULLABILITY = ("nullable", "containsNull", "valueContainsNull")


def read_partition(spark: SparkSession, path: str | os.PathLike[str]) -> DataFrame:
    """A stored partition, in the schema Spark wrote into its Parquet footer: letting Spark
    infer it costs a job per read, and every step reads its inputs."""
    schema = stored_schema(path)
    reader = spark.read if schema is None else spark.read.schema(schema)
    return reader.parquet(spark_path(path))


def stored_schema(path: str | os.PathLike[str]) -> Optional[StructType]:
    """The Spark schema in the footer of a part file under `path` (None when there is none), every
    field nullable as Spark reads files: a column claimed non-null lets Spark drop null tests."""
    parts = sorted(p for p in Path(path).glob("*.parquet") if not p.name.startswith(("_", ".")))
    if not parts:
        return None
    stored = (pq.read_metadata(parts[0]).metadata or {}).get(SPARK_SCHEMA_KEY)
    return None if stored is None else StructType.fromJson(_nullable(json.loads(stored)))


def _nullable(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: True if k in _NULLABILITY else _nullable(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_nullable(v) for v in node]
    return node


def recorded_mark(gc_config: GcConfigResource, partition_key: Any) -> Optional[tuple[dt.datetime, Mark]]:
    """The as-of of the stored retained_commits partition and the mark of the stored live_files
    partition it led to, or None when either is missing."""
    judged = gc_config.recorded_times("retained_commits", partition_key)
    marked = gc_config.recorded_times("live_files", partition_key)
    if "as_of" not in judged or not {"mark_time", "source_time"} <= set(marked):
        return None
    return judged["as_of"], Mark(marked["run_id"], marked["mark_time"], marked["source_time"])
