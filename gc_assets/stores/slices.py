"""Slices of a namespace, listed in parallel by the S3, Azure and GCS stores: the driver
discovers them with delimiter listings a bounded depth down; a prefix with too many children
is cut into contiguous key ranges, so a flat prefix with millions of keys is still listed in
parallel; executors paginate each slice (a row of SLICE_SCHEMA)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from pyspark.sql import types as T

SLICE_DEPTH = 2


MAX_FANOUT = 32  # at most this many slices per discovered prefix


DISCOVERY_PAGE_SIZE = 1000  # a prefix with more children than one page is cut by key ranges


# Where a too-large prefix is cut: before each of these characters after the prefix.
RANGE_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


# A slice as the executors receive it.
SLICE_SCHEMA = T.StructType(
    [
        T.StructField("prefix", T.StringType(), False),
        T.StructField("recursive", T.BooleanType(), False),
        T.StructField("start", T.StringType(), True),
        T.StructField("end", T.StringType(), True),
    ]
)


@dataclass(frozen=True)
class Slice:
    """Keys under `prefix` (only those directly under it unless `recursive`), with start <= key < end."""

    prefix: str
    recursive: bool = True
    start: Optional[str] = None
    end: Optional[str] = None

    @classmethod
    def of_row(cls, row: dict[str, Any]) -> "Slice":
        """The slice of a row of SLICE_SCHEMA (as an executor receives it)."""
        return cls(row["prefix"], bool(row["recursive"]), row["start"], row["end"])

    def row(self) -> tuple[str, bool, Optional[str], Optional[str]]:
        """The slice as a row of SLICE_SCHEMA."""
        return self.prefix, self.recursive, self.start, self.end

    def holds(self, key: str) -> bool:
        if not key.startswith(self.prefix):
            return False
        if not self.recursive and "/" in key[len(self.prefix) :]:
            return False
        return (self.start is None or key >= self.start) and (self.end is None or key < self.end)


def tile(prefix: str, boundaries: Iterable[str]) -> list[Slice]:
    """Contiguous recursive slices that together hold every key under `prefix`, cut at `boundaries`."""
    cuts = sorted(set(b for b in boundaries if b.startswith(prefix) and b != prefix))
    edges: list[Optional[str]] = [None, *cuts, None]
    return [Slice(prefix, True, lo, hi) for lo, hi in zip(edges, edges[1:])]


def alphabet_cuts(prefix: str) -> list[str]:
    return [prefix + c for c in RANGE_ALPHABET]


def grouped_cuts(children: list[str], groups: int) -> list[str]:
    """Cut points that split sorted `children` into at most `groups` runs of similar length."""
    if len(children) <= 1 or groups <= 1:
        return []
    step = -(-len(children) // groups)
    return children[step::step]


@dataclass(frozen=True)
class DelimiterPage:
    children: list[str]  # common prefixes, sorted
    has_objects: bool  # objects directly under the prefix
    truncated: bool


def discover_slices(
    list_page: Callable[[str], DelimiterPage],
    root: str,
    depth: int = SLICE_DEPTH,
    fanout: int = MAX_FANOUT,
) -> list[Slice]:
    """Slices that together hold every key under `root`, each once.

    A prefix whose children fit one delimiter page is descended into until `depth`;
    below that, or when it has more than `fanout` children, its children are grouped
    into at most `fanout` key ranges; a prefix with more children than a page is cut
    by the first character after it.
    """

    def visit(prefix: str, level: int) -> list[Slice]:
        page = list_page(prefix)
        if page.truncated:
            return tile(prefix, alphabet_cuts(prefix))
        if level + 1 >= depth or len(page.children) > fanout:
            return tile(prefix, grouped_cuts(page.children, fanout))
        slices = [Slice(prefix, recursive=False)] if page.has_objects else []
        for child in page.children:
            slices.extend(visit(child, level + 1))
        return slices

    return visit(root, 0)
