"""Dagster resources: gc.yaml and where its state is stored."""

import datetime as dt
from typing import Any, Optional

from dagster import (
    ConfigurableResource,
)
from pyspark.sql import DataFrame, SparkSession

from gc_assets.core import state
from gc_assets.core.config import (
    GcConfig,
    config_path,
)
from gc_assets.defs.partitions import split_partition_key
from gc_assets.mark.partition import Mark
from gc_assets.sources.discovery import load_lake
from gc_assets.stores.state import StateFiles, state_files

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

    def state(self) -> StateFiles:
        """The state directory of gc.yaml (stores.state)."""
        return state_files(self.load())

    def partition_at(self, asset_name: str, partition_key: Any) -> str:
        """The key of an asset partition in the state directory."""
        date, repo = split_partition_key(partition_key)
        return state.partition_at(asset_name, repo, date)

    def stored(self, spark: SparkSession, asset_name: str, partition_key: Any) -> Optional[DataFrame]:
        """A stored asset partition, or None when it was never materialized."""
        return self.state().read(spark, self.partition_at(asset_name, partition_key))

    def recorded_times(self, asset_name: str, partition_key: Any) -> dict[str, Any]:
        """What a stored partition's record says: run_id and the times, as datetimes."""
        record = self.state().record(self.partition_at(asset_name, partition_key)) or {}
        return {key: value if key == "run_id" else dt.datetime.fromisoformat(value) for key, value in record.items()}


def recorded_mark(gc_config: GcConfigResource, partition_key: Any) -> Optional[tuple[dt.datetime, Mark]]:
    """The as-of of the stored retained_commits partition and the mark of the stored live_files
    partition it led to, or None when either is missing."""
    judged = gc_config.recorded_times("retained_commits", partition_key)
    marked = gc_config.recorded_times("live_files", partition_key)
    if "as_of" not in judged or not {"mark_time", "source_time"} <= set(marked):
        return None
    return judged["as_of"], Mark(marked["run_id"], marked["mark_time"], marked["source_time"])
