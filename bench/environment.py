"""Variables set for a while in an environment (this process's, or the one Spark gives its
Python workers), then put back as they were."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Mapping, MutableMapping


@contextmanager
def environment(variables: Mapping[str, str], where: MutableMapping[str, str] = os.environ) -> Iterator[None]:
    """`variables` set in `where` while the block runs; each then restored, or removed if it was unset."""
    saved = {name: where.get(name) for name in variables}
    where.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                where.pop(name, None)
            else:
                where[name] = value
