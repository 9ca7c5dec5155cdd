"""The Dagster code location: the Definitions of the gc.yaml in $GC_ASSETS_CONFIG, else ./gc.yaml.

Dagster loads this module; nothing in gc_assets imports it."""

from __future__ import annotations

import os

from dagster import Definitions

from gc_assets.core.config import config_path, load_config
from gc_assets.defs.build import build_definitions


def _configured() -> Definitions:
    path = str(config_path())
    return build_definitions(load_config(path), path) if os.path.exists(path) else build_definitions()


defs = _configured()
