"""The tests' PostgreSQL (bench.postgres_server), one per module."""

from __future__ import annotations

from typing import Iterator

import pytest

from bench.postgres_server import USER, Postgres, postgres_server

__all__ = ["USER", "Postgres", "postgres"]


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with postgres_server() as server:
        yield server
