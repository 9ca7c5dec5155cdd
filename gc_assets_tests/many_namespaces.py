"""The case stores.many's actions are held to on every store that acts beside other namespaces
(a set swept together): two namespaces, `one` and `two`, in one container or bucket."""

from __future__ import annotations

import datetime as dt
from typing import Callable

from gc_assets.stores.base import Store
from gc_assets.stores.many import delete_many, list_many, move_many

KEYS = ["one/a", "one/b", "one/c", "one/d", "one/e", "two/a", "two/b", "two/taken/b"]


def act_on_two_namespaces(
    spark, stores: dict[str, Store], put: Callable[[str, bytes], None], keys: Callable[[], set[str]]
) -> None:
    """With KEYS written, in one job each: a delete removes `one/a` and `two/a` (the same key in
    two namespaces is two objects), spares `one/b` rewritten after the listing, `one/d` listed at
    another size and `one/e` at another time, an unsafe key, and names a missing one; a move
    never overwrites its destination (`put` writes a key, `keys` lists the container)."""
    rows = {(r["repo"], r["address"]): (r["last_modified"], r["size"]) for r in list_many(spark, stores).collect()}
    put("one/b", b"rewritten since the listing")
    deletes = [
        ("one", "a", *rows[("one", "a")]),
        ("one", "b", *rows[("one", "b")]),
        ("one", "d", rows[("one", "d")][0], rows[("one", "d")][1] + 1),
        ("one", "e", rows[("one", "e")][0] - dt.timedelta(seconds=5), rows[("one", "e")][1]),
        ("one", "../two/a", *rows[("two", "a")]),
        ("two", "a", *rows[("two", "a")]),
        ("two", "gone", *rows[("two", "a")]),
    ]
    frame = spark.createDataFrame(deletes, "repo string, address string, last_modified timestamp, size long")
    acted = {(r["repo"], r["address"]): (r["action"], r["error"]) for r in delete_many(spark, stores, frame).collect()}
    changed = ("failed", "modified_since_inventory")
    assert acted == {
        ("one", "a"): ("deleted", None),
        ("one", "b"): changed,
        ("one", "d"): changed,
        ("one", "e"): changed,
        ("one", "../two/a"): ("failed", "unsafe_key"),
        ("two", "a"): ("deleted", None),
        ("two", "gone"): ("already_absent", None),
    }
    assert keys() == set(KEYS) - {"one/a", "two/a"}

    moves = [("one", "c", "trash/c", rows[("one", "c")][0]), ("two", "b", "taken/b", rows[("two", "b")][0])]
    frame = spark.createDataFrame(moves, "repo string, address string, destination string, last_modified timestamp")
    acted = {(r["repo"], r["address"]): (r["action"], r["error"]) for r in move_many(spark, stores, frame).collect()}
    assert acted == {("one", "c"): ("moved", None), ("two", "b"): ("failed", "destination_exists")}
    assert keys() == set(KEYS) - {"one/a", "two/a", "one/c"} | {"one/trash/c"}
