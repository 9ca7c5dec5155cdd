"""Discovery (docs/design.md §6.6): the tables a gc.yaml `discover:` entry stands for.

Delta: every directory below `under` that holds a `_delta_log/`, found one directory level
at a time (a delimiter listing on S3), never descending into a table or a hidden directory
(`_` or `.`, as Delta hides them). Iceberg: every table of the named namespaces of a
pyiceberg catalog. Each table becomes a repository named by its path below `under` or
`namespace.table`, with the entry's settings. Listing costs one request per directory
visited (Delta) or one catalog call per table (Iceberg): linear in the tables.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Optional

from gc_assets.core.config import (
    REPO_NAME_PATTERN,
    ConfigError,
    DiscoverEntry,
    GcConfig,
    RepositoryConfig,
    load_config,
    redacted,
)
from gc_assets.core.uris import local_path
from gc_assets.sources.delta_log import LOG_DIR
from gc_assets.stores.retries import RetryPolicy, call_with_retries
from gc_assets.stores.s3.client import S3_FAILURES, S3Settings, error_code, split_s3_uri

log = logging.getLogger(__name__)
LISTING_THREADS = 16  # directories listed at once on object stores


def load_lake(path: Optional[str | os.PathLike[str]] = None) -> GcConfig:
    """gc.yaml with every discovered table among its repositories."""
    return expand(load_config(path))


def expand(config: GcConfig) -> GcConfig:
    """`config` with the tables of its `discover:` entries added as repositories."""
    if not config.discoveries:
        return config
    return config.with_repositories([repo for entry in config.discoveries for repo in discovered(entry)])


def discovered(entry: DiscoverEntry) -> list[RepositoryConfig]:
    """The repositories of one `discover:` entry, sorted by name."""
    if entry.discover.format == "delta":
        assert entry.discover.under is not None
        under = entry.discover.under.rstrip("/")
        names = named_tables(under, delta_table_paths(under, _settings(entry)))
        return [entry.repository(name, f"{under}/{name}") for name in names]
    return iceberg_repositories(entry)


def named_tables(where: str, paths: Iterable[str]) -> list[str]:
    """The paths that can name a repository (a partition key), sorted; any other is reported."""
    names = []
    for path in sorted(paths):
        if REPO_NAME_PATTERN.match(path):
            names.append(path)
        else:
            log.warning("discovery below %s: table %r skipped, its path cannot name a repository", where, path)
    return names


# --- Delta ------------------------------------------------------------------------------


def delta_table_paths(under: str, settings: S3Settings) -> list[str]:
    """Relative paths of the directories below `under` that hold a `_delta_log/`."""
    if under.startswith("file://"):
        children = _local_children(local_path(under))
    elif under.startswith("s3://"):
        children = _s3_children(under, settings)
    else:
        raise ConfigError(
            f"discovery below {under}: only file:// and s3:// locations can be searched for Delta tables; "
            "list the tables of other stores as repositories"
        )
    return find_tables(children)


def find_tables(children: Callable[[str], tuple[list[str], bool]]) -> list[str]:
    """Breadth first from "" (the root): `children(dir)` gives a directory's subdirectory names
    and whether it holds `_delta_log/`. A table's subdirectories are not searched."""
    tables: list[str] = []
    level = [""]
    with ThreadPoolExecutor(LISTING_THREADS) as pool:
        while level:
            following: list[str] = []
            for directory, (names, is_table) in zip(level, pool.map(children, level)):
                if is_table and directory:
                    tables.append(directory)
                    continue
                following += [f"{directory}/{n}" if directory else n for n in names if not n.startswith(("_", "."))]
            level = following
    return tables


def _local_children(root: str) -> Callable[[str], tuple[list[str], bool]]:
    def children(directory: str) -> tuple[list[str], bool]:
        path = os.path.join(root, directory) if directory else root
        try:
            with os.scandir(path) as entries:
                names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError as exc:
            raise ConfigError(f"discovery below {root}: cannot list {path}: {exc.strerror or exc}") from None
        return [n for n in names if n != LOG_DIR], LOG_DIR in names

    return children


def _s3_children(under: str, settings: S3Settings) -> Callable[[str], tuple[list[str], bool]]:
    bucket, base = split_s3_uri(under)
    client = settings.client()
    policy = RetryPolicy(timeouts=settings.timeouts)

    def children(directory: str) -> tuple[list[str], bool]:
        prefix = f"{base}{directory}/" if directory else base

        def listed() -> list[str]:
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/")
            return [p["Prefix"][len(prefix) :].rstrip("/") for page in pages for p in page.get("CommonPrefixes", [])]

        try:
            names = call_with_retries(f"ListObjectsV2 {prefix}", listed, policy, S3_FAILURES)
        except Exception as exc:
            raise ConfigError(
                f"discovery below {under}: cannot list s3://{bucket}/{prefix}: {error_code(exc)}"
            ) from None
        return [n for n in names if n != LOG_DIR], LOG_DIR in names

    return children


def _settings(entry: DiscoverEntry) -> S3Settings:
    """The S3 endpoint and credentials the entry's tables inherit."""
    assert entry.discover.under is not None
    return S3Settings.of_override(entry.repository("probe", entry.discover.under).s3)


# --- Iceberg ----------------------------------------------------------------------------


def iceberg_repositories(entry: DiscoverEntry) -> list[RepositoryConfig]:
    """A repository per table of the entry's namespaces, at the location its metadata names.
    A table the catalog lists but cannot load is reported and left out; it stops no other."""
    from pyiceberg.catalog import load_catalog

    catalog_spec = entry.discover.catalog
    assert catalog_spec is not None
    try:
        catalog = load_catalog(catalog_spec.name, **catalog_spec.load_properties())
        identifiers = [ident for namespace in entry.discover.namespaces for ident in catalog.list_tables(namespace)]
    except Exception as exc:  # pyiceberg and its drivers raise many kinds
        where = f"catalog {catalog_spec.name!r} ({catalog_spec.type})"
        raise ConfigError(redacted(f"discovery in {where}: {type(exc).__name__}: {exc}")) from None
    repositories = []
    for name in named_tables(f"catalog {catalog_spec.name!r}", (".".join(ident) for ident in identifiers)):
        try:
            location = catalog.load_table(name).metadata.location
        except Exception as exc:
            log.warning("discovery: table %s skipped, the catalog cannot load it: %s", name, redacted(str(exc)))
            continue
        repositories.append(entry.repository(name, location, **entry.located(name)))
    return repositories
