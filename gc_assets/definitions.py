"""The Dagster code location: the Definitions of the gc.yaml in $GC_ASSETS_CONFIG, else ./gc.yaml.

Dagster loads this module; nothing in gc_assets imports it."""

from __future__ import annotations

import os

from dagster import Definitions

from gc_assets.core.config import config_path
from gc_assets.defs.build import build_definitions
from gc_assets.sources.discovery import load_lake


def _configured() -> Definitions:
    path = str(config_path())
    return build_definitions(load_lake(path), path) if os.path.exists(path) else build_definitions()


defs = _configured()
