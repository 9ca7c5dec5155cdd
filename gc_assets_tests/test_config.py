"""gc.yaml validation: good files load, bad ones name the file, the repository and the field."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Optional

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gc_assets.core.config import ConfigError, load_config, parse_config
from gc_assets.core.uris import namespace_contains

LAKEFS_RULES_JSON = """{"default_retention_days": 14,
 "branches": [{"branch_id": "main", "retention_days": 21},
              {"branch_id": "dev",  "retention_days": 7}]}"""


def _repo(**overrides):
    repo = {
        "name": "example-repo",
        "format": "lakefs-export",
        "storage_namespace": "file:///data/example-repo",
        "source": "file:///data/example-repo/_lakefs/export",
    }
    repo.update(overrides)
    return repo


def _write(tmp_path: Path, document) -> Path:
    path = tmp_path / "gc.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_sample_config_in_the_repo_loads():
    config = load_config(Path(__file__).parents[1] / "gc.example.yaml")
    repo = config.repository("example-repo")
    assert repo.mode == "dry_run" and repo.max_delete_fraction == 0.5
    assert repo.min_object_age == dt.timedelta(hours=24)
    assert config.partitions_start_date == dt.date(2024, 1, 1)


def test_lakefs_rules_json_is_accepted_unchanged(tmp_path):
    path = _write(tmp_path, {"repositories": [_repo(rules=json.loads(LAKEFS_RULES_JSON))]})
    rules = load_config(path).repository("example-repo").rules
    assert rules.default_retention_days == 14
    assert [(b.branch_id, b.retention_days) for b in rules.branches] == [("main", 21), ("dev", 7)]
    assert rules.tags.retain is True and rules.tags.retention_days is None


def test_pattern_and_tag_extensions(tmp_path):
    rules = {"branches": [{"pattern": "feature/*", "retention_days": 3}], "tags": {"retain": False}}
    repo = load_config(_write(tmp_path, {"repositories": [_repo(rules=rules)]})).repository("example-repo")
    assert repo.rules.branches[0].pattern == "feature/*"
    assert repo.rules.default_retention_days is None
    assert repo.rules.tags.retain is False


def test_relative_state_dir_is_relative_to_the_config_file(tmp_path):
    config = load_config(_write(tmp_path, {"state_dir": "state", "repositories": []}))
    assert config.state_path == tmp_path / "state"


@pytest.mark.parametrize(
    "repo_overrides, field, words",
    [
        ({"format": "hudi"}, "format", "lakefs-export"),
        ({"storage_namespace": "hdfs://cluster/x"}, "storage_namespace", "unsupported scheme"),
        ({"storage_namespace": "az://container/x"}, "storage_namespace", "names its account"),
        ({"storage_namespace": "relative/path"}, "storage_namespace", "unsupported scheme"),
        ({"min_object_age_hours": 0.5}, "min_object_age_hours", "allow_unsafe_min_age"),
        ({"max_delete_fraction": 1.5}, "max_delete_fraction", "less than or equal"),
        ({"mode": "yolo"}, "mode", "dry_run"),
        ({"rules": {"branches": [{"retention_days": 3}]}}, "rules.branches.0", "branch_id or pattern"),
        ({"rules": {"default_retention_days": -1}}, "rules.default_retention_days", "greater than or equal"),
        ({"protected_prefixes": ["../etc"]}, "protected_prefixes", "relative"),
        ({"block_storage_prefix": "/_lakefs"}, "block_storage_prefix", "plain key prefix"),
        ({"block_storage_prefix": "meta/"}, "block_storage_prefix", "plain key prefix"),
        ({"block_storage_prefix": "s3://b/_lakefs"}, "block_storage_prefix", "plain key prefix"),
        ({"format": "delta", "source": None, "block_storage_prefix": "meta"}, "block_storage_prefix", "only for"),
        ({"name": "bad name!"}, "name", "partition key"),
        ({"source": None}, "source", "required"),
        ({"unknown_field": 1}, "unknown_field", "Extra inputs"),
    ],
)
def test_bad_config_names_file_repository_and_field(tmp_path, repo_overrides, field, words):
    path = _write(tmp_path, {"repositories": [_repo(**repo_overrides)]})
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert str(path) in message
    name = repo_overrides.get("name", "example-repo")
    assert f"repository {name!r}" in message
    assert f"field {field}" in message
    assert words in message


def test_lakefs_export_without_source_is_refused(tmp_path):
    repo = _repo()
    del repo["source"]
    with pytest.raises(ConfigError, match="repository 'example-repo': field source: is required"):
        load_config(_write(tmp_path, {"repositories": [repo]}))


def test_unsafe_min_age_allowed_when_asked(tmp_path):
    path = _write(tmp_path, {"repositories": [_repo(min_object_age_hours=0.1, allow_unsafe_min_age=True)]})
    assert load_config(path).repository("example-repo").min_object_age_hours == 0.1


def test_duplicate_repository_names_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="appears twice"):
        load_config(_write(tmp_path, {"repositories": [_repo(), _repo()]}))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("repositories: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)
    with pytest.raises(ConfigError, match="mapping at the top level"):
        parse_config(["a list"], "inline.yaml")


def test_unknown_repository_lists_the_configured_ones(tmp_path):
    config = load_config(_write(tmp_path, {"repositories": [_repo()]}))
    with pytest.raises(ConfigError, match="configured: example-repo"):
        config.repository("other")


def _nested_config(namespaces: list[str]) -> dict:
    return {
        "repositories": [
            {"name": f"r{i}", "format": "lakefs-export", "storage_namespace": ns, "source": f"file:///exports/r{i}"}
            for i, ns in enumerate(namespaces)
        ]
    }


def _pairwise_nesting(namespaces: list[str]) -> Optional[dict[str, dict[str, str]]]:
    """Brute force, every ordered pair compared: None when two namespaces are one place, else
    {outer: {key of an inner namespace + '/': inner}}, as DESIGN §10 and docs/design.md read."""
    nested: dict[str, dict[str, str]] = {}
    for i, outer in enumerate(namespaces):
        for j, inner in enumerate(namespaces):
            inside = namespace_contains(outer, inner) if i != j else None
            if inside == "":
                return None
            if inside is not None:
                nested.setdefault(f"r{i}", {})[inside + "/"] = f"r{j}"
    return nested


@settings(max_examples=200, deadline=None)
@given(
    paths=st.lists(st.lists(st.sampled_from(["a", "b", "ab"]), min_size=1, max_size=3), min_size=1, max_size=6),
    schemes=st.lists(st.sampled_from(["s3://Bucket", "s3a://bucket", "s3://other"]), min_size=6, max_size=6),
)
def test_nested_namespaces_agree_with_every_pair_compared(paths, schemes):
    """One namespace twice is refused; a namespace inside another is protected in the outer
    one, naming the repository that collects it."""
    namespaces = [f"{schemes[i]}/" + "/".join(parts) for i, parts in enumerate(paths)]
    expected = _pairwise_nesting(namespaces)
    try:
        config = parse_config(_nested_config(namespaces), "gc.yaml")
    except ConfigError as error:
        assert expected is None and "share the storage namespace" in str(error)
        return
    assert expected is not None
    assert {f"r{i}": config.nested_in(f"r{i}") for i in range(len(namespaces))} == {
        f"r{i}": expected.get(f"r{i}", {}) for i in range(len(namespaces))
    }


def test_overlap_check_resolves_each_parent_directory_once(tmp_path, monkeypatch):
    """Thousands of repositories: a realpath per parent directory and an lstat per namespace,
    not one realpath per pair (was n² calls) nor per namespace (0.43 s of 10,000)."""
    namespaces = [(tmp_path / f"t{i:04d}").as_uri() for i in range(300)]
    calls = []
    real = os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda path, *a, **k: calls.append(path) or real(path, *a, **k))
    parse_config(_nested_config(namespaces), "gc.yaml").nested_in("r0")
    resolved = [c for c in calls if str(c).startswith(str(tmp_path))]
    assert len(resolved) == 1, f"{len(resolved)} path resolutions for {len(namespaces)} namespaces in one directory"


def test_format_lakefs_needs_a_refs_dump_and_no_source(tmp_path):
    native = {"name": "r", "format": "lakefs", "storage_namespace": "s3://bucket/repos/r"}
    with pytest.raises(ConfigError, match="repository 'r': field refs_dump: is required for format lakefs"):
        load_config(_write(tmp_path, {"repositories": [native]}))
    dumped = {**native, "refs_dump": "s3a://bucket/repos/r/_lakefs/refs_manifest.json"}
    repo = load_config(_write(tmp_path, {"repositories": [dumped]})).repository("r")
    assert repo.refs_dump == "s3://bucket/repos/r/_lakefs/refs_manifest.json" and repo.refs_dump_max_age_hours == 24
    assert repo.rules is None  # read from the namespace's own rules file
    with pytest.raises(ConfigError, match="field source: is not for format lakefs"):
        load_config(_write(tmp_path, {"repositories": [{**dumped, "source": "s3://bucket/x"}]}))
    with pytest.raises(ConfigError, match="field refs_dump: is only for format lakefs"):
        load_config(_write(tmp_path, {"repositories": [_repo(refs_dump="s3://bucket/m.json")]}))
    with pytest.raises(ConfigError, match="field refs_dump_max_age_hours"):
        load_config(_write(tmp_path, {"repositories": [{**dumped, "refs_dump_max_age_hours": 0}]}))
