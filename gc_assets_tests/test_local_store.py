"""The local filesystem store: distributed listing equals a full walk, symlinks are never
followed or deleted, and deletion acts only on the regular files it was given."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

from gc_assets.stores.base import StoreError
from gc_assets.stores.local import LocalStore, discover_slices
from gc_assets.stores.many import delete_many, move_many
from gc_assets_tests.sweep_runs import race_exclusive_writes


def _tree(root: Path) -> None:
    for key in [
        "top.txt",
        "a/x",
        "a/b/y",
        "a/b/c/z",
        "a/b/c/d/deep",
        "e/f/g/h/i/j",
        "unicodé/ñ file",
        "sp ace/ trailing ",
    ]:
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(key)
    (root / "empty-dir" / "nested").mkdir(parents=True)


def _walk(root: Path) -> set[str]:
    """Every regular file below root (the tree has no symlinks)."""
    return {os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files}


def test_listing_over_slices_equals_a_full_walk(tmp_path, spark):
    root = tmp_path / "ns"
    _tree(root)
    slices = discover_slices(str(root), depth=2)
    assert ("a/b", True) in slices and ("a", False) in slices and ("", False) in slices
    rows = LocalStore(root.as_uri()).list(spark).collect()
    assert {r["address"] for r in rows} == _walk(root)
    by_key = {r["address"]: r for r in rows}
    info = os.stat(root / "a/b/c/z")
    assert by_key["a/b/c/z"]["size"] == info.st_size
    assert by_key["a/b/c/z"]["last_modified"].replace(tzinfo=dt.timezone.utc).timestamp() == pytest.approx(
        info.st_mtime, abs=1e-5
    )


def _tree_with_links_out(tmp_path: Path) -> tuple[Path, Path]:
    """The tree plus a directory symlink and a file symlink leading outside the namespace."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("keep me")
    root = tmp_path / "ns"
    _tree(root)
    os.symlink(outside, root / "a" / "escape-dir")
    os.symlink(outside / "secret", root / "link-file")
    return root, outside


def test_symlinks_are_neither_listed_nor_followed(tmp_path, spark):
    root, _ = _tree_with_links_out(tmp_path)
    listed = {r["address"] for r in LocalStore(root.as_uri()).list(spark).collect()}
    assert not any("escape-dir" in k or k == "link-file" for k in listed)


def test_delete_acts_only_on_unchanged_regular_files_inside(tmp_path, spark):
    root, outside = _tree_with_links_out(tmp_path)
    store = LocalStore(root.as_uri())
    inventory = {r["address"]: r for r in store.list(spark).collect()}
    old = dt.datetime(2020, 1, 1)
    (root / "a/x").write_text("rewritten after the inventory")
    os.utime(root / "a/x", (1_700_000_000, 1_700_000_000))
    requests = [
        ("top.txt", inventory["top.txt"]["last_modified"]),
        ("a/x", inventory["a/x"]["last_modified"]),
        ("gone", old),
        ("../outside/secret", old),
        ("a/escape-dir/secret", old),
        ("link-file", old),
        ("/etc/passwd", old),
        ("a/./b/y", old),
    ]
    frame = spark.createDataFrame(requests, "address string, last_modified timestamp")
    actions = {r["address"]: (r["action"], r["error"]) for r in store.delete(spark, frame).collect()}
    assert actions == {
        "top.txt": ("deleted", None),
        "a/x": ("failed", "modified_since_inventory"),
        "gone": ("already_absent", None),
        "../outside/secret": ("failed", "unsafe_key"),
        "a/escape-dir/secret": ("failed", "outside_namespace"),
        "link-file": ("failed", "not_a_regular_file"),
        "/etc/passwd": ("failed", "unsafe_key"),
        "a/./b/y": ("failed", "unsafe_key"),
    }
    assert not (root / "top.txt").exists()
    assert (outside / "secret").read_text() == "keep me" and (root / "link-file").is_symlink()
    assert (root / "a/b/y").exists() and (root / "a/x").exists()


def test_exists_and_unreachable_namespace(tmp_path, spark):
    root = tmp_path / "ns"
    _tree(root)
    store = LocalStore(root.as_uri())
    frame = spark.createDataFrame([("a/x",), ("nope",)], "address string")
    assert {r["address"]: r["exists"] for r in store.exists(spark, frame).collect()} == {"a/x": True, "nope": False}
    with pytest.raises(StoreError, match="not a readable directory"):
        LocalStore((tmp_path / "missing").as_uri()).list(spark)


def test_small_objects_exclusive_create_keys_and_no_partial_reads(tmp_path):
    import threading

    store = LocalStore(tmp_path.as_uri())
    assert store.write_text("_gc/lease/1.json", "first", exclusive=True)
    assert not store.write_text("_gc/lease/1.json", "second", exclusive=True)
    assert store.read_text("_gc/lease/1.json") == "first"
    assert store.keys("_gc/") == ["_gc/lease/1.json"] and store.keys("_gc/none/") == []
    big = "x" * 1_000_000
    seen: set[int] = set()
    stop = threading.Event()

    def read_while_written():
        while not stop.is_set():
            seen.add(len(store.read_text("_gc/lease/1.json")))

    reader = threading.Thread(target=read_while_written)
    reader.start()
    for text in (big, "first") * 20:
        store.write_text("_gc/lease/1.json", text)
    stop.set()
    reader.join()
    assert seen <= {len("first"), len(big)}  # the old text or the new, never a partial file
    assert store.keys("_gc/") == ["_gc/lease/1.json"]  # no temporary file left behind


def test_concurrent_exclusive_writers_have_exactly_one_winner(tmp_path):
    """16 writers released together on one key, 25 times: one is told it won, and its text is stored."""
    store = LocalStore(tmp_path.as_uri())
    for round_ in range(25):
        assert len(race_exclusive_writes(store, f"_gc/lease/{round_:012d}.json", 16)) == 1
    assert not [p for p in (tmp_path / "_gc" / "lease").iterdir() if p.name.endswith(".tmp")]


def test_many_namespaces_act_in_one_job_each_by_its_own_stores_rules(tmp_path, spark):
    """stores.many.delete_many and move_many: one job acts in every namespace, each row in its
    own repository's (the same key in two namespaces is two objects), refusing what Store.delete
    and Store.move refuse: a file changed since the listing, a key leaving the namespace, a
    symlink, a destination that exists."""
    (tmp_path / "one").mkdir()
    one, outside = _tree_with_links_out(tmp_path / "one")
    two = tmp_path / "two"
    _tree(two)
    stores = {"one": LocalStore(one.as_uri()), "two": LocalStore(two.as_uri())}
    listed = {
        (repo, r["address"]): r["last_modified"] for repo, store in stores.items() for r in store.list(spark).collect()
    }
    (one / "a/x").write_text("rewritten after the listing")
    os.utime(one / "a/x", (1_700_000_000, 1_700_000_000))
    old = dt.datetime(2020, 1, 1)
    deletes = [
        ("one", "top.txt", listed[("one", "top.txt")], 7),
        ("one", "a/x", listed[("one", "a/x")], 3),
        ("one", "../outside/secret", old, 7),
        ("one", "link-file", old, 7),
        ("two", "a/x", listed[("two", "a/x")], 3),
        ("two", "gone", old, 1),
    ]
    frame = spark.createDataFrame(deletes, "repo string, address string, last_modified timestamp, size long")
    acted = {(r["repo"], r["address"]): (r["action"], r["error"]) for r in delete_many(spark, stores, frame).collect()}
    assert acted == {
        ("one", "top.txt"): ("deleted", None),
        ("one", "a/x"): ("failed", "modified_since_inventory"),
        ("one", "../outside/secret"): ("failed", "unsafe_key"),
        ("one", "link-file"): ("failed", "not_a_regular_file"),
        ("two", "a/x"): ("deleted", None),
        ("two", "gone"): ("already_absent", None),
    }
    assert not (one / "top.txt").exists() and (two / "top.txt").exists()
    assert (one / "a/x").exists() and not (two / "a/x").exists()
    assert (outside / "secret").read_text() == "keep me" and (one / "link-file").is_symlink()

    (two / "taken").mkdir()
    (two / "taken" / "y").write_text("written since")
    moves = [
        ("one", "a/b/y", "trash/a/b/y", listed[("one", "a/b/y")]),
        ("two", "a/b/y", "taken/y", listed[("two", "a/b/y")]),
    ]
    frame = spark.createDataFrame(moves, "repo string, address string, destination string, last_modified timestamp")
    acted = {(r["repo"], r["address"]): (r["action"], r["error"]) for r in move_many(spark, stores, frame).collect()}
    assert acted == {("one", "a/b/y"): ("moved", None), ("two", "a/b/y"): ("failed", "destination_exists")}
    assert (one / "trash/a/b/y").read_text() == "a/b/y" and not (one / "a/b/y").exists()
    assert (two / "a/b/y").exists() and (two / "taken" / "y").read_text() == "written since"
