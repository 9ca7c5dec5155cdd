"""A real PostgreSQL for the tests and the benchmark: Debian's `postgresql` server (initdb,
pg_ctl) started in a temporary directory on 127.0.0.1 at a free port, trust authentication,
stopped with its context.

initdb refuses to run as root, so as root the server runs as the `postgres` user the
Debian package creates.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil
import yaml

from bench.spark_servers import free_port

USER = "gc"
# The storage docs/CLUSTERS.md configures for Dagster on PostgreSQL.
STORAGE_CLASS = "gc_assets.defs.postgres_instance.PostgresStorage"


def _binary(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"{name} not found: install Debian's postgresql package")
    return found


@dataclass(frozen=True)
class Postgres:
    port: int
    data: Path

    def server_seconds(self) -> float:
        """Core-seconds the server has used since it started: its postmaster's, each running
        backend's, and each ended backend's (counted with the postmaster's children once it
        reaped them). A bench subtracts two readings: the server shares the machine's cores with
        the run it serves but is not in the run's process tree."""
        server = psutil.Process(int((self.data / "postmaster.pid").read_text().split()[0]))
        backends = server.children(recursive=True)
        own = server.cpu_times()
        seconds = own.user + own.system + own.children_user + own.children_system
        for backend in backends:
            try:
                times = backend.cpu_times()
            except psutil.Error:
                continue  # ended since the listing: with the postmaster's children once reaped
            seconds += times.user + times.system
        return seconds

    def url(self, database: str) -> str:
        """The gc.yaml URL of `database` (no password: trust authentication)."""
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres"):
        import psycopg

        return psycopg.connect(f"postgresql://{USER}@127.0.0.1:{self.port}/{database}", autocommit=True)

    def create_database(self, name: str) -> str:
        with self.connect() as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def dagster_home(self, name: str, under: Path) -> Path:
        """A DAGSTER_HOME below `under` whose dagster.yaml keeps everything in a new database `name`.

        The block docs/CLUSTERS.md shows: dagster-postgres's storage, its event log storing a
        batch of check evaluations at once (STORAGE_CLASS). SQLAlchemy 2.1 reads a bare
        `postgresql` scheme as psycopg 3, whose server-side parameters break dagster-postgres's
        NOTIFY: the scheme names psycopg2."""
        self.create_database(name)
        home = under / f"dagster-home-{name}"
        home.mkdir(parents=True, exist_ok=True)
        database = {"hostname": "127.0.0.1", "port": self.port, "username": USER, "password": "", "db_name": name}
        module, _, class_name = STORAGE_CLASS.rpartition(".")
        postgres = {"postgres_db": {**database, "scheme": "postgresql+psycopg2"}}
        storage = {"custom": {"module": module, "class": class_name, "config": postgres}}
        (home / "dagster.yaml").write_text(yaml.safe_dump({"storage": storage}))
        return home


@contextmanager
def postgres_server() -> Iterator[Postgres]:
    root = Path(tempfile.mkdtemp(prefix="gc-pg-"))
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    if as_root:
        shutil.chown(root, "postgres")
    data, port = root / "data", free_port()

    def run(*command: str) -> None:
        subprocess.run([*prefix, *command], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    run(_binary("initdb"), "-D", str(data), "-U", USER, "-A", "trust", "-E", "UTF8", "--no-sync")
    options = f"-h 127.0.0.1 -p {port} -k {root} -c fsync=off -c full_page_writes=off"
    run(_binary("pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "-t", "60", "start")
    try:
        yield Postgres(port, data)
    finally:
        subprocess.run(
            [*prefix, _binary("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)
