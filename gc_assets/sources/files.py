"""Listing the part files of a metadata dataset, wherever it is stored."""

from __future__ import annotations

import os

from gc_assets.sources.base import SourceError
from gc_assets.uris import local_path


def list_files(location: str) -> list[str]:
    """URIs of the regular files directly under `location`, sorted; empty when it does not exist."""
    if location.startswith("file://"):
        directory = local_path(location)
        if not os.path.isdir(directory):
            return []
        return sorted(
            f"file://{os.path.join(directory, name)}"
            for name in os.listdir(directory)
            if os.path.isfile(os.path.join(directory, name))
        )
    raise SourceError(f"cannot read metadata from {location!r}: unsupported scheme")
