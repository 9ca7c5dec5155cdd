"""Every store's settings for one repository: S3's settings plus the Azure and GCS
endpoint overrides. Metadata readers take this one object, whichever store a file is on."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Optional

from gc_assets.core.config import AzureOverride, GcsOverride, RepositoryConfig
from gc_assets.core.uris import (
    AZURE_SCHEMES,
    GCS_SCHEMES,
    azure_parts,
    canonical_address,
)
from gc_assets.stores.azure import AzureSettings
from gc_assets.stores.blobs import BlobClient, BlobSettings
from gc_assets.stores.gcs import GcsSettings
from gc_assets.stores.s3.client import S3Settings


@dataclass(frozen=True)
class StoreSettings(S3Settings):
    """S3's settings and the timeouts (the base) and the other clouds' endpoints and gc.yaml
    credentials (the names of their variables, never the values)."""

    azure_settings: AzureOverride = AzureOverride()
    gcs_settings: GcsOverride = GcsOverride()

    @property
    def gcs_endpoint(self) -> Optional[str]:
        return self.gcs_settings.endpoint_url

    @property
    def gcs_project(self) -> Optional[str]:
        return self.gcs_settings.project

    @classmethod
    def of_repository(cls, repo: RepositoryConfig) -> "StoreSettings":
        """The repository's gc.yaml overrides (`s3`, `azure`, `gcs`) over each cloud's environment."""
        return cls(**_s3_fields(S3Settings.of_override(repo.s3)), azure_settings=repo.azure, gcs_settings=repo.gcs)

    def azure(self, account: str, suffix: str) -> AzureSettings:
        return AzureSettings.of_override(account, suffix, self.azure_settings, self.timeouts)

    def gcs(self) -> GcsSettings:
        return GcsSettings.of_override(self.gcs_settings, self.timeouts)

    @classmethod
    def of(cls, settings: S3Settings) -> "StoreSettings":
        """`settings` itself, or plain S3Settings (a source built without a repository) with the
        other clouds' environment only."""
        return settings if isinstance(settings, StoreSettings) else cls(**_s3_fields(settings))


def _s3_fields(settings: S3Settings) -> dict:
    return {field.name: getattr(settings, field.name) for field in fields(S3Settings)}


def is_blob_uri(uri: str) -> bool:
    """An Azure or GCS URI (read through the shared blob engine, not pyarrow's S3 filesystem)."""
    return uri.split(":", 1)[0].lower() in AZURE_SCHEMES + GCS_SCHEMES


def blob_location(uri: str, settings: S3Settings) -> tuple[BlobClient, str, str]:
    """(a client of the URI's container or bucket, the key, the URI of the container's root with '/').

    `settings` may be plain S3Settings (a source built without a repository): the other
    clouds then use their environment only.
    """
    every = StoreSettings.of(settings)
    canonical = canonical_address(uri)
    if canonical.startswith("gs://"):
        bucket, _, key = canonical[len("gs://") :].partition("/")
        return _client(every.gcs(), bucket), key, f"gs://{bucket}/"
    if canonical.startswith("abfss://"):
        container, account, suffix, _ = azure_parts(canonical)
        root = f"abfss://{container}@{account}.dfs.{suffix}/"
        return _client(every.azure(account, suffix), container), canonical[len(root) :], root
    raise ValueError(
        f"{uri!r}: an Azure URI must name its account (abfss://container@account.dfs.core.windows.net/path)"
    )


@lru_cache(maxsize=64)
def _client(settings: BlobSettings, container: str) -> BlobClient:
    """One client per container and process: metadata is read file by file."""
    return settings.client(container)
