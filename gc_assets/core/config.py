"""gc.yaml: loading and validation (docs/design.md §8).

Invalid configuration is refused at load time with a message naming the file, the
repository and the field, because a GC that silently falls back to a default is a
GC that deletes the wrong things.
"""

from __future__ import annotations

import bisect
import datetime as dt
import fnmatch
import os
import re
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gc_assets.core.names import Mode
from gc_assets.core.uris import is_plain_key, namespace_contains, normalize_namespace, real_namespace

CONFIG_ENV_VAR = "GC_ASSETS_CONFIG"
DEFAULT_CONFIG_PATH = "gc.yaml"
# Segments of 1-63 letters, digits, '_', '.', '-' separated by '/' (a discovered table keeps its path).
REPO_NAME_PATTERN = re.compile(r"^(?=.{1,255}$)[A-Za-z0-9][A-Za-z0-9_.-]{0,62}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,62})*$")

Format = Literal["lakefs", "lakefs-export", "delta", "iceberg", "file-catalog"]


class ConfigError(ValueError):
    """gc.yaml is missing or invalid; the message names file, repository and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BranchRule(_Strict):
    branch_id: Optional[str] = None
    pattern: Optional[str] = None
    retention_days: float = Field(ge=0)

    @model_validator(mode="after")
    def _one_selector(self) -> "BranchRule":
        if (self.branch_id is None) == (self.pattern is None):
            raise ValueError("give exactly one of branch_id or pattern")
        return self


class TagRule(_Strict):
    retain: bool = True
    retention_days: Optional[float] = Field(default=None, ge=0)


class Rules(_Strict):
    """The lakeFS GC rules JSON, accepted unchanged, plus pattern and tag extensions."""

    model_config = ConfigDict(extra="ignore", frozen=True)  # lakeFS may add fields

    default_retention_days: Optional[float] = Field(default=None, ge=0)
    branches: tuple[BranchRule, ...] = ()
    tags: TagRule = TagRule()


_REFERENCED: set[str] = set()  # the variables gc.yaml named as credentials in this process
_SAS_SIGNATURE = re.compile(r"(?i)((?:^|[?&/\s])sig=)[^&\s'\"]+")


def redacted(text: str) -> str:
    """`text` (a library's error message) without the value of any credential gc.yaml references
    nor a SAS signature: some libraries quote the URL of a failed request, query and all."""
    for name in _REFERENCED:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, f"${name}")
    return _SAS_SIGNATURE.sub(r"\1REDACTED", text)


class EnvSecret(_Strict):
    """A credential written in gc.yaml as `{env: NAME}`: only the variable's name is kept, so no
    configuration object, repr, log line or pickled task holds the value; `reveal()` reads it
    from the environment of the process that uses it (driver or executor)."""

    env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @model_validator(mode="before")
    @classmethod
    def _reference_only(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError("a credential is given as {env: VARIABLE}, never as the value itself")
        return value

    @model_validator(mode="after")
    def _is_set(self) -> "EnvSecret":
        if not os.environ.get(self.env):
            raise ValueError(f"environment variable {self.env} is not set (or empty)")
        _REFERENCED.add(self.env)
        return self

    def reveal(self) -> str:
        value = os.environ.get(self.env)
        if not value:
            raise ConfigError(f"environment variable {self.env} (a credential named in gc.yaml) is not set here")
        _REFERENCED.add(self.env)  # an executor unpickles settings without validating them
        return value

    def __str__(self) -> str:
        return f"${self.env}"


def revealed(secret: Optional[EnvSecret]) -> Optional[str]:
    return None if secret is None else secret.reveal()


class S3Override(_Strict):
    endpoint_url: Optional[str] = None
    region: Optional[str] = None
    access_key_id: Optional[EnvSecret] = None  # default: the AWS credential chain
    secret_access_key: Optional[EnvSecret] = None
    session_token: Optional[EnvSecret] = None

    @model_validator(mode="after")
    def _key_pair(self) -> "S3Override":
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("give both access_key_id and secret_access_key, or neither")
        if self.session_token is not None and self.access_key_id is None:
            raise ValueError("session_token needs access_key_id and secret_access_key")
        return self


class AzureOverride(_Strict):
    endpoint_url: Optional[str] = None  # the blob service URL: Azurite, a sovereign cloud
    account_key: Optional[EnvSecret] = None  # default: AZURE_STORAGE_CONNECTION_STRING, then DefaultAzureCredential
    sas_token: Optional[EnvSecret] = None
    connection_string: Optional[EnvSecret] = None

    @model_validator(mode="after")
    def _one_credential(self) -> "AzureOverride":
        if sum(c is not None for c in (self.account_key, self.sas_token, self.connection_string)) > 1:
            raise ValueError("give at most one of account_key, sas_token, connection_string")
        return self


class GcsOverride(_Strict):
    endpoint_url: Optional[str] = None  # an emulator (http://, reached anonymously) or a private endpoint
    project: Optional[str] = None
    credentials: Optional[EnvSecret] = None  # a service account key (JSON); default: Application Default Credentials
    token: Optional[EnvSecret] = None  # an OAuth2 access token

    @model_validator(mode="after")
    def _one_credential(self) -> "GcsOverride":
        if self.credentials is not None and self.token is not None:
            raise ValueError("give at most one of credentials, token")
        return self


class InventoryReport(_Strict):
    """An S3 Inventory report that replaces listing the namespace (buckets too large to list)."""

    manifest: str  # s3://destination-bucket/.../<date>/manifest.json, as S3 writes it
    max_age_days: float = Field(default=7, gt=0)  # an older report is refused

    @field_validator("manifest")
    @classmethod
    def _manifest_uri(cls, value: str) -> str:
        if not value.startswith("s3://") or not value.endswith("/manifest.json"):
            raise ValueError("must be the s3:// URI of an inventory report's manifest.json")
        return value


class IcebergCatalog(_Strict):
    """An Iceberg catalog (pyiceberg's load_catalog properties)."""

    type: Literal["sql", "rest"]
    uri: str
    name: str = "default"
    warehouse: Optional[str] = None
    properties: dict[str, str] = {}  # further catalog properties; credentials come from PYICEBERG_CATALOG__* variables

    def load_properties(self) -> dict[str, str]:
        """The properties pyiceberg's load_catalog takes."""
        properties = {"type": self.type, "uri": self.uri, **dict(self.properties)}
        if self.warehouse:
            properties["warehouse"] = self.warehouse
        return properties


class CatalogConfig(IcebergCatalog):
    """Where an Iceberg table is found through a catalog."""

    table: str = Field(pattern=r"^[^.\s]+(\.[^.\s]+)+$")  # namespace.table


class Discovery(_Strict):
    """Where a `discover:` entry finds its tables (docs/design.md §6.6): every directory below
    `under` holding a `_delta_log/`, or every table of a catalog's `namespaces`."""

    format: Literal["delta", "iceberg"]
    under: Optional[str] = None  # delta
    catalog: Optional[IcebergCatalog] = None  # iceberg
    namespaces: tuple[str, ...] = ()  # iceberg

    @field_validator("under")
    @classmethod
    def _under_namespace(cls, value: Optional[str]) -> Optional[str]:
        return None if value is None else normalize_namespace(value)

    @model_validator(mode="after")
    def _one_place(self) -> "Discovery":
        if self.format == "delta" and (self.under is None or self.catalog is not None or self.namespaces):
            raise ValueError("format delta is discovered below `under` (a URI), without catalog or namespaces")
        if self.format == "iceberg" and (self.catalog is None or not self.namespaces or self.under is not None):
            raise ValueError("format iceberg is discovered in a `catalog` and its `namespaces` (a list), without under")
        return self


# Set by discovery for every table; an entry's other keys are settings every table inherits.
DISCOVERED_FIELDS = ("name", "format", "storage_namespace", "source", "catalog")


class DiscoverEntry(_Strict):
    """A gc.yaml `repositories` entry that stands for many tables."""

    discover: Discovery
    settings: dict[str, Any] = {}

    @field_validator("settings")
    @classmethod
    def _inheritable(cls, value: dict[str, Any]) -> dict[str, Any]:
        given = sorted(set(value) & set(DISCOVERED_FIELDS))
        if given:
            raise ValueError(f"{', '.join(given)} cannot be set for discovered tables: discovery sets them per table")
        unknown = sorted(set(value) - set(RepositoryConfig.model_fields) - {"catalog"})
        if unknown:
            raise ValueError(f"unknown setting(s) {', '.join(unknown)}")
        return value

    @model_validator(mode="after")
    def _settings_valid(self) -> "DiscoverEntry":
        """The inherited settings are judged once here, on a stand-in table, not per table found."""
        try:
            self.repository("probe", self.discover.under or "file:///probe", **self.located("probe.probe"))
        except ConfigError as exc:
            raise ValueError(str(exc).split(": ", 1)[1]) from None
        return self

    def located(self, name: str) -> dict[str, Any]:
        """What locates one table besides its namespace: an Iceberg table's catalog entry."""
        catalog = self.discover.catalog
        return {} if catalog is None else {"catalog": {**catalog.model_dump(), "table": name}}

    def repository(self, name: str, storage_namespace: str, **located: Any) -> "RepositoryConfig":
        """The repository of one discovered table, with this entry's settings."""
        fields = {**self.settings, "name": name, "format": self.discover.format, "storage_namespace": storage_namespace}
        try:
            return RepositoryConfig.model_validate({**fields, **located})
        except ValidationError as exc:
            details = "; ".join(_describe(err, {}) for err in exc.errors())
            raise ConfigError(f"discovered table {name!r} ({storage_namespace}): {details}") from None


IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TEMPLATE_FIELD = re.compile(r"\{([^{}]*)\}")


class FileCatalogSettings(_Strict):
    """A database table listing the namespace's files (format file-catalog, docs/design.md §6.5)."""

    url: str  # postgresql+psycopg://user@host:port/db or sqlite:///path (relative) / sqlite:////path
    table: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
    path: str  # key template: {column} placeholders, e.g. "{namespace_id}/{table_id}/{object_store_id}.parquet"
    to_delete: str  # nullable soft-delete time; null = in use
    created_at: Optional[str] = None
    id: str = "id"  # integer primary key: ranges of the parallel read, chunks of the DELETE

    @field_validator("url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        scheme, sep, rest = value.partition("://")
        if not sep or scheme not in ("sqlite", "postgresql", "postgresql+psycopg", "postgres"):
            raise ValueError("must be a postgresql+psycopg://... or sqlite:///... URL")
        if scheme == "sqlite" and not rest.startswith("/"):
            raise ValueError("a SQLite URL is sqlite:///relative/path or sqlite:////absolute/path")
        if scheme != "sqlite" and ":" in rest.split("@", 1)[0] and "@" in rest:
            raise ValueError("must not hold a password: give it in PGPASSWORD or a ~/.pgpass file")
        return value

    @field_validator("id", "to_delete", "created_at")
    @classmethod
    def _column(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not IDENTIFIER.match(value):
            raise ValueError(f"{value!r} is not a plain column name")
        return value

    @field_validator("path")
    @classmethod
    def _template(cls, value: str) -> str:
        names = TEMPLATE_FIELD.findall(value)
        if not names:
            raise ValueError("must name at least one {column}")
        bad = [n for n in names if not IDENTIFIER.match(n)]
        if bad or value.count("{") != len(names) or value.count("}") != len(names):
            raise ValueError(f"{value!r}: placeholders are plain {{column}} names, no format specs or stray braces")
        return value

    @property
    def path_columns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(TEMPLATE_FIELD.findall(self.path)))


def _plain_prefix(key: str) -> bool:
    """A plain relative key without glob characters: a prefix storage may be listed under."""
    return is_plain_key(key) and not any(c in key for c in "*?[]")


class RepositoryConfig(_Strict):
    name: str
    format: Format
    storage_namespace: str
    source: Optional[str] = Field(default=None, validate_default=True)
    refs_dump: Optional[str] = Field(default=None, validate_default=True)  # lakefs: the refs dump's manifest JSON
    refs_dump_max_age_hours: float = Field(default=24, gt=0)  # lakefs: an older dump is refused
    # lakefs, lakefs-export: where lakeFS keeps its own files in the namespace (its committed.block_storage_prefix)
    block_storage_prefix: str = "_lakefs"
    rules: Optional[Rules] = None
    allow_unsafe_min_age: bool = False
    min_object_age_hours: float = 24.0
    allow_unsafe_retention: bool = False
    protected_prefixes: tuple[str, ...] = ()
    max_delete_fraction: float = Field(default=0.5, gt=0, le=1)
    mode: Mode = Mode.DRY_RUN
    trash_retention_days: float = Field(default=7, ge=0)
    confirm_days: Optional[int] = Field(default=None, ge=1)  # deferred deletion: a candidate that many days earlier too
    s3: S3Override = S3Override()
    azure: AzureOverride = AzureOverride()  # abfss:// namespaces
    gcs: GcsOverride = GcsOverride()  # gs:// namespaces
    inventory: Optional[InventoryReport] = None  # s3 namespaces: read this report instead of listing
    catalog: Optional[CatalogConfig] = Field(default=None, validate_default=True)  # iceberg: instead of source
    # file-catalog: the table listing the files, given as `catalog:` in gc.yaml (moved here before validation)
    file_catalog: Optional[FileCatalogSettings] = Field(default=None, validate_default=True)
    row_cutoff_hours: Optional[float] = Field(
        default=None, validate_default=True
    )  # file-catalog: 48, as IOx's PARQUETFILE_CUTOFF
    object_cutoff_hours: Optional[float] = Field(
        default=None, validate_default=True
    )  # file-catalog: 720 (OBJECTSTORE_CUTOFF)
    retention: Optional[Literal["iceberg"]] = None  # iceberg: the table's own expire-snapshots properties
    external_prefixes: tuple[str, ...] = ()  # absolute URI prefixes outside the namespace that references may name
    hold_days: Optional[float] = Field(default=None, gt=0)  # holds placed by restore last until released, or N days
    untracked_min_age_hours: Optional[float] = Field(default=None, ge=0)  # default: the format's own guard
    max_clock_skew_minutes: float = Field(default=5, gt=0)  # storage clock vs driver clock, checked before acting

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not REPO_NAME_PATTERN.match(value):
            raise ValueError(
                "must be 1-63 characters of letters, digits, '_', '.', '-' (it becomes a partition key), "
                "or several such segments separated by '/' (at most 255 characters)"
            )
        return value

    @field_validator("storage_namespace")
    @classmethod
    def _valid_namespace(cls, value: str) -> str:
        return normalize_namespace(value)

    @field_validator("protected_prefixes")
    @classmethod
    def _relative_prefixes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """Plain relative keys: a scheme, '..', '.', an empty segment or a glob would protect nothing."""
        for prefix in value:
            if not _plain_prefix(prefix.rstrip("/")):
                raise ValueError(
                    f"{prefix!r} must be a plain key prefix relative to the namespace "
                    "(no scheme, no leading '/', no '.' or '..' segments, no glob characters)"
                )
        return value

    @field_validator("block_storage_prefix")
    @classmethod
    def _plain_block_storage_prefix(cls, value: str, info: ValidationInfo) -> str:
        """One plain relative key, as lakeFS joins it to the namespace; only lakeFS formats have one."""
        if info.data.get("format") not in ("lakefs", "lakefs-export") and value != "_lakefs":
            raise ValueError("is only for formats lakefs and lakefs-export")
        if not _plain_prefix(value):
            raise ValueError(
                f"{value!r} must be a plain key prefix relative to the namespace, like _lakefs "
                "(no scheme, no leading or trailing '/', no '.' or '..' segments, no glob characters)"
            )
        return value

    @field_validator("min_object_age_hours")
    @classmethod
    def _min_age_floor(cls, value: float, info: ValidationInfo) -> float:
        if value < 0:
            raise ValueError("cannot be negative")
        if value < 1 and not info.data.get("allow_unsafe_min_age"):
            raise ValueError(
                "below 1 hour needs allow_unsafe_min_age: true (objects still being written could be collected)"
            )
        return value

    @model_validator(mode="after")
    def _untracked_floor(self) -> "RepositoryConfig":
        hours = self.untracked_min_age_hours
        if hours is not None and hours < self.min_object_age_hours and not self.allow_unsafe_min_age:
            raise ValueError(
                f"untracked_min_age_hours {hours:g} is below min_object_age_hours {self.min_object_age_hours:g}; "
                "that needs allow_unsafe_min_age: true (files being written could be collected)"
            )
        return self

    @model_validator(mode="after")
    def _table_root_namespace(self) -> "RepositoryConfig":
        """A Delta or Iceberg namespace is the table root: anything wider holds other tables'
        files, which this table's log would call untracked (docs/design.md §10)."""
        if self.format not in ("delta", "iceberg") or self.source is None:
            return self
        location = self.source
        if self.format == "iceberg" and location.endswith(".metadata.json"):
            location = location.rsplit("/", 2)[0] if location.rsplit("/", 2)[1] == "metadata" else location
        try:
            same = namespace_contains(self.storage_namespace, location) == ""
        except ValueError as exc:
            raise ValueError(f"source {self.source!r}: {exc}") from None
        if not same:
            raise ValueError(
                f"source {self.source!r} is not the table root {self.storage_namespace}: a {self.format} "
                "repository's storage_namespace must be its table's root directory (the same real directory or "
                "bucket prefix), with the metadata.json under its metadata/ directory"
            )
        return self

    @field_validator("source")
    @classmethod
    def _source_required(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        if value is None and info.data.get("format") == "lakefs-export":
            raise ValueError("is required for format lakefs-export (the export directory)")
        if value is not None and info.data.get("format") == "lakefs":
            raise ValueError("is not for format lakefs, which reads its storage namespace: give refs_dump instead")
        return value

    @field_validator("row_cutoff_hours", "object_cutoff_hours")
    @classmethod
    def _catalog_cutoffs(cls, value: Optional[float], info: ValidationInfo) -> Optional[float]:
        if info.data.get("format") != "file-catalog":
            if value is not None:
                raise ValueError("is only for format file-catalog")
            return value
        if value is None:
            return 48.0 if info.field_name == "row_cutoff_hours" else 720.0
        if value < 0:
            raise ValueError("cannot be negative")
        if value < 1 and not info.data.get("allow_unsafe_min_age"):
            raise ValueError(
                "below 1 hour needs allow_unsafe_min_age: true (queriers' caches and backups still name the files)"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _file_catalog_block(cls, data: Any) -> Any:
        """A file-catalog's `catalog:` block is a table, not an Iceberg catalog: judged as one."""
        if isinstance(data, dict) and data.get("format") == "file-catalog" and "catalog" in data:
            data = {k: v for k, v in data.items() if k != "catalog"} | {"file_catalog": data["catalog"]}
        return data

    @field_validator("file_catalog")
    @classmethod
    def _file_catalog_required(
        cls, value: Optional[FileCatalogSettings], info: ValidationInfo
    ) -> Optional[FileCatalogSettings]:
        if value is None and info.data.get("format") == "file-catalog":
            raise ValueError("format file-catalog needs a catalog block (url, table, path, to_delete)")
        return value

    @field_validator("refs_dump")
    @classmethod
    def _refs_dump_for_lakefs(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        """The manifest `lakectl refs-dump` prints, saved where the GC can read it."""
        if info.data.get("format") != "lakefs":
            if value is not None:
                raise ValueError("is only for format lakefs")
            return value
        if value is None:
            raise ValueError("is required for format lakefs (the URI of the refs dump's manifest JSON)")
        try:
            return normalize_namespace(value)
        except ValueError as exc:
            raise ValueError(f"{value!r} is not a file, s3, gs or abfss URI: {exc}") from None

    @field_validator("catalog")
    @classmethod
    def _iceberg_location(cls, value: Optional[CatalogConfig], info: ValidationInfo) -> Optional[CatalogConfig]:
        if info.data.get("format") != "iceberg":
            if value is not None:
                raise ValueError("is only for format iceberg")
            return value
        if (value is None) == (info.data.get("source") is None):
            raise ValueError("format iceberg needs exactly one of source (a metadata.json URI) or catalog")
        return value

    @field_validator("retention")
    @classmethod
    def _iceberg_retention(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        if value is not None and info.data.get("format") != "iceberg":
            raise ValueError("retention: iceberg is only for format iceberg")
        if value is not None and info.data.get("rules") is not None:
            raise ValueError("give either rules or retention: iceberg, not both")
        return value

    @field_validator("external_prefixes")
    @classmethod
    def _absolute_prefixes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(normalize_namespace(prefix) for prefix in value)

    @field_validator("inventory")
    @classmethod
    def _inventory_on_s3(cls, value: Optional[InventoryReport], info: ValidationInfo) -> Optional[InventoryReport]:
        if value is not None and not str(info.data.get("storage_namespace", "")).startswith("s3://"):
            raise ValueError("an inventory report replaces listing an s3:// namespace only")
        return value

    @property
    def source_uri(self) -> str:
        """Where the repository's metadata lives; Delta defaults to the namespace."""
        return self.source or self.storage_namespace

    @property
    def min_object_age(self) -> dt.timedelta:
        return dt.timedelta(hours=self.min_object_age_hours)


STATE_SCHEMES = ("s3", "abfss", "gs")  # where state_dir may be besides a path


class GcConfig(_Strict):
    state_dir: str = ".gc_state"
    partitions_start_date: dt.date = dt.date(2024, 1, 1)
    repositories: tuple[RepositoryConfig, ...] = ()
    # The `repositories` entries that stand for many tables; sources.discovery adds their tables.
    discoveries: tuple[DiscoverEntry, ...] = ()
    source_path: Optional[str] = Field(default=None, exclude=True)

    @field_validator("state_dir")
    @classmethod
    def _state_dir_scheme(cls, value: str) -> str:
        """A path (file:// taken as one) or an object store's URI: s3://, abfss://, gs://."""
        scheme, separator, rest = value.partition("://")
        if not separator:
            return value
        if scheme.lower() == "file":
            return rest
        if scheme.lower() not in STATE_SCHEMES:
            raise ValueError(f"state_dir {value!r}: a path, or a URI of {', '.join(s + '://' for s in STATE_SCHEMES)}")
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> "GcConfig":
        seen: set[str] = set()
        for repo in self.repositories:
            if repo.name in seen:
                raise ValueError(f"repository name {repo.name!r} appears twice")
            seen.add(repo.name)
        return self

    @model_validator(mode="after")
    def _distinct_namespaces(self) -> "GcConfig":
        """Two repositories of one namespace would each collect the other's live files."""
        owners = self._owners
        if len(owners) < len(self.repositories):
            repo = next(r for r in self.repositories if owners[real_namespace(r.storage_namespace)] is not r)
            first = owners[real_namespace(repo.storage_namespace)]
            raise ValueError(
                f"repositories {first.name!r} and {repo.name!r} share the storage namespace {first.storage_namespace}"
            )
        return self

    @cached_property
    def _owners(self) -> dict[str, RepositoryConfig]:
        """Each real namespace (resolved once per repository) -> the first repository configured there."""
        owners: dict[str, RepositoryConfig] = {}
        for repo in self.repositories:
            owners.setdefault(real_namespace(repo.storage_namespace), repo)
        return owners

    def with_repositories(self, found: list[RepositoryConfig]) -> "GcConfig":
        """This configuration with `found` (discovered tables) among its repositories, judged
        again as a whole: unique names and disjoint namespaces across all of them."""
        fields = {name: getattr(self, name) for name in ("state_dir", "partitions_start_date", "discoveries")}
        try:
            return GcConfig(**fields, repositories=(*self.repositories, *found), source_path=self.source_path)
        except ValidationError as exc:
            details = "; ".join(err["msg"].removeprefix("Value error, ") for err in exc.errors())
            raise ConfigError(f"{self.source_path}: with the discovered tables: {details}") from None

    @cached_property
    def _by_name(self) -> dict[str, RepositoryConfig]:
        return {repo.name: repo for repo in self.repositories}

    @cached_property
    def _referrers(self) -> dict[str, tuple[RepositoryConfig, ...]]:
        """Repository name -> the other repositories whose external_prefixes reach into its
        namespace (a shallow clone, Iceberg `add_files`): their references are live there.

        Each prefix looks up only its own ancestors and, in the sorted namespaces, the ones
        below it, so thousands of repositories cost no pairwise comparison."""
        owners = {place: repo.name for place, repo in self._owners.items()}
        places = sorted(owners)
        found: dict[str, dict[str, RepositoryConfig]] = {}
        for repo in self.repositories:
            for prefix in repo.external_prefixes:
                place = real_namespace(prefix)
                reached = [place[:cut] for cut in range(len(place)) if place[cut] == "/"] + [place]
                below = bisect.bisect_left(places, place + "/")
                while below < len(places) and places[below].startswith(place + "/"):
                    reached.append(places[below])
                    below += 1
                for owner in (owners[p] for p in reached if p in owners):
                    if owner != repo.name:
                        found.setdefault(owner, {})[repo.name] = repo
        return {owner: tuple(referrers.values()) for owner, referrers in found.items()}

    def referrers(self, name: str) -> tuple[RepositoryConfig, ...]:
        """The repositories whose external_prefixes say their retained versions may need objects
        of `name`'s namespace (mark.reaches adds those found to, declared or not)."""
        return self._referrers.get(name, ())

    def owner_of(self, address: str) -> Optional[RepositoryConfig]:
        """The repository whose namespace holds the canonical absolute `address` (the innermost
        one, where namespaces nest), or None: each ancestor of the address is looked up once."""
        cuts = [cut for cut, char in enumerate(address) if char == "/"]
        for place in reversed([address[:cut] for cut in cuts]):
            owner = self._owners.get(place)
            if owner is not None:
                return owner
        return None

    @cached_property
    def _nested(self) -> dict[str, dict[str, str]]:
        """Repository name -> {key of a namespace inside its own + '/': the repository owning it}.

        Each namespace looks up only its own ancestors (resolved once each), so thousands
        of repositories cost no pairwise comparison."""
        found: dict[str, dict[str, str]] = {}
        for place, inner in self._owners.items():
            for cut in (i for i, char in enumerate(place) if char == "/"):
                outer = self._owners.get(place[:cut])
                if outer is not None:
                    found.setdefault(outer.name, {})[place[cut + 1 :] + "/"] = inner.name
        return found

    def nested_in(self, name: str) -> dict[str, str]:
        """{key prefix: repository} of the namespaces that lie inside `name`'s: their own
        repositories collect them, so `name` never does (it protects them)."""
        return self._nested.get(name, {})

    def repository(self, name: str) -> RepositoryConfig:
        """The repository named `name`: every step of a run of thousands looks one up."""
        found = self._by_name.get(name)
        if found is None:
            raise ConfigError(f"{self.source_path}: no repository named {name!r} (configured: {self._known()})")
        return found

    def has_repository(self, name: str) -> bool:
        return name in self._by_name

    def selected(self, patterns: Sequence[str]) -> list[str]:
        """The repository names `patterns` choose (a name, or a glob such as 'sales/*'), in
        configured order; a pattern that chooses none is refused, naming what is configured."""
        chosen: dict[str, None] = {}
        for pattern in patterns:
            if any(char in pattern for char in "*?["):
                matches = [name for name in self._by_name if fnmatch.fnmatchcase(name, pattern)]
                if not matches:
                    raise ConfigError(
                        f"{self.source_path}: no repository matches {pattern!r} (configured: {self._known()})"
                    )
            else:
                matches = [self.repository(pattern).name]
            chosen.update(dict.fromkeys(matches))
        return list(chosen)

    def _known(self, shown: int = 20) -> str:
        names = [repo.name for repo in self.repositories]
        more = f", … {len(names) - shown} more" if len(names) > shown else ""
        return (", ".join(names[:shown]) + more) or "none"

    @property
    def logs_path(self) -> Path:
        """Where commands write their logs: `logs/` of a local state_dir; on the driver's temporary
        directory when state_dir is an object store's (a log is appended to, an object is not)."""
        if "://" in self.state_dir:
            return Path(tempfile.gettempdir()) / "gc-assets" / "logs"
        return self.state_path / "logs"

    @property
    def state_path(self) -> Path:
        """state_dir, relative paths resolved against the config file's directory."""
        path = Path(self.state_dir).expanduser()
        if not path.is_absolute() and self.source_path:
            path = Path(self.source_path).resolve().parent / path
        return path


def _describe(error: dict[str, Any], raw: dict[str, Any]) -> str:
    location = list(error["loc"])
    repo_label = ""
    if len(location) >= 2 and location[0] == "repositories" and isinstance(location[1], int):
        index = location[1]
        repos = raw.get("repositories") or []
        name = repos[index].get("name") if index < len(repos) and isinstance(repos[index], dict) else None
        repo_label = f"repository {name!r}" if name else f"repository #{index + 1}"
        location = location[2:]
    elif len(location) >= 2 and location[0] == "discoveries" and isinstance(location[1], int):
        location = [part for part in location[2:] if part != "settings"]
        if not location:  # the entry's own rules, which name their fields
            return f"discover entry #{error['loc'][1] + 1}: {error['msg'].removeprefix('Value error, ')}"
        repo_label = f"discover entry #{error['loc'][1] + 1}"
    if location and location[0] == "file_catalog":  # gc.yaml spells it `catalog`
        location[0] = "catalog"
    field = ".".join(str(part) for part in location) or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    where = f"{repo_label}: " if repo_label else ""
    return f"{where}field {field}: {message}"


def parse_config(raw: Any, source_path: str) -> GcConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source_path}: expected a mapping at the top level, got {type(raw).__name__}")
    entries = raw.get("repositories") or []
    if isinstance(entries, list):
        # A `discover:` entry stands for many tables; its other keys are their settings.
        repositories, discoveries = [], []
        for entry in entries:
            if isinstance(entry, dict) and "discover" in entry:
                settings = {k: v for k, v in entry.items() if k != "discover"}
                discoveries.append({"discover": entry["discover"], "settings": settings})
            else:
                repositories.append(entry)
        raw = {**raw, "repositories": repositories}
        if discoveries:
            raw["discoveries"] = discoveries
    try:
        return GcConfig.model_validate({**raw, "source_path": source_path})
    except ValidationError as exc:
        details = "; ".join(_describe(err, raw) for err in exc.errors())
        raise ConfigError(f"{source_path}: invalid configuration: {details}") from None


# libyaml's safe loader parses a gc.yaml of 10,000 repositories about ten times faster.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def config_path(path: Optional[str | os.PathLike[str]] = None) -> Path:
    """Where gc.yaml is: `path`, else $GC_ASSETS_CONFIG, else ./gc.yaml."""
    return Path(path or os.environ.get(CONFIG_ENV_VAR) or DEFAULT_CONFIG_PATH)


def load_config(path: Optional[str | os.PathLike[str]] = None) -> GcConfig:
    """Load gc.yaml from config_path(path)."""
    resolved = config_path(path)
    try:
        text = resolved.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{resolved}: cannot read configuration: {exc.strerror or exc}") from None
    try:
        raw = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{resolved}: not valid YAML: {exc}") from None
    return parse_config(raw or {}, str(resolved))
