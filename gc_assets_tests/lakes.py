"""Test lakes on disk: a generated lakeFS repository, its gc.yaml, and the expected candidates."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from gc_assets.core.config import Rules
from gc_assets.core.time import end_of_day
from gc_assets.demo.lakegen import DOCS_RULES, Lake, add_churn, docs_example, write_lake, write_native_lake

GC_DATE = dt.date(2022, 3, 31)
AS_OF = end_of_day(GC_DATE)


@dataclass
class LakeOnDisk:
    lake: Lake
    namespace: Path
    config_path: Path
    rules: Optional[Rules]

    @property
    def namespace_uri(self) -> str:
        return self.namespace.as_uri()

    def files(self) -> set[str]:
        return {str(p.relative_to(self.namespace)) for p in self.namespace.rglob("*") if p.is_file()}


def export_entry(name: str, namespace: str) -> dict[str, Any]:
    """The gc.yaml entry of a lakeFS graph export uploaded to `namespace`, every object old
    enough at once (uploads are dated now)."""
    return {
        "name": name,
        "format": "lakefs-export",
        "storage_namespace": namespace,
        "source": f"{namespace}/_lakefs/export",
        "rules": DOCS_RULES,
        "min_object_age_hours": 0,
        "allow_unsafe_min_age": True,
        "max_delete_fraction": 0.95,
    }


def write_config(path: Path, repos: list[dict[str, Any]], state_dir: Path | str) -> Path:
    path.write_text(
        yaml.safe_dump({"state_dir": str(state_dir), "partitions_start_date": "2022-01-01", "repositories": repos})
    )
    return path


def lake_on_disk(
    root: Path,
    name: str = "repo",
    churn: int = 60,
    rules: Optional[dict] = None,
    fmt: str = "parquet",
    seed: int = 7,
    **repo_options: Any,
) -> LakeOnDisk:
    lake = docs_example(name)
    lake.rng.seed(seed)
    add_churn(
        lake, churn, dt.datetime(2022, 2, 1, tzinfo=dt.timezone.utc), dt.datetime(2022, 3, 29, tzinfo=dt.timezone.utc)
    )
    namespace = root / "lake" / name
    export_dir = write_lake(lake, namespace, fmt)
    rules = DOCS_RULES if rules is None else rules
    repo = {
        "name": name,
        "format": "lakefs-export",
        "storage_namespace": namespace.as_uri(),
        "source": export_dir.as_uri(),
        "rules": rules,
        **repo_options,
    }
    config_path = write_config(root / "gc.yaml", [repo], root / "state")
    return LakeOnDisk(lake, namespace, config_path, Rules.model_validate(rules) if rules else None)


def native_lake_on_disk(
    root: Path,
    name: str = "repo",
    churn: int = 60,
    rules: Optional[dict] = None,
    seed: int = 7,
    rules_in_namespace: bool = False,
    legacy_commits: int = 0,
    deprecated_addresses: bool = False,
    **repo_options: Any,
) -> LakeOnDisk:
    """The same random lake in lakeFS's own layout (`format: lakefs`): its rules in gc.yaml, or
    only in the namespace's binary rules file; the `legacy_commits` oldest merges written as
    lakeFS before 1.0 wrote them (the main parent last)."""
    lake = docs_example(name)
    lake.rng.seed(seed)
    add_churn(
        lake, churn, dt.datetime(2022, 2, 1, tzinfo=dt.timezone.utc), dt.datetime(2022, 3, 29, tzinfo=dt.timezone.utc)
    )
    namespace = root / "lake" / name
    rules = DOCS_RULES if rules is None else rules
    merges = sorted((c for c in lake.commits.values() if len(c.parents) > 1), key=lambda c: c.created_at)
    manifest = write_native_lake(
        lake,
        namespace,
        rules=rules,
        legacy_commits=frozenset(c.commit_id for c in merges[:legacy_commits]),
        deprecated_addresses=deprecated_addresses,
    )
    repo = {
        "name": name,
        "format": "lakefs",
        "storage_namespace": namespace.as_uri(),
        "refs_dump": manifest.as_uri(),
        **repo_options,
    }
    if not rules_in_namespace:
        repo["rules"] = rules
    config_path = write_config(root / "gc.yaml", [repo], root / "state")
    return LakeOnDisk(lake, namespace, config_path, Rules.model_validate(rules) if rules else None)
