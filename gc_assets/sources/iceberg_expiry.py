"""Iceberg's own order before a sweep (docs/design.md §6.3): the snapshots the rules expire are
expired through the table's catalog first, by id, in a commit that lands only on the metadata
it was judged on. A conflict reloads the table, judges it again and retries; after
EXPIRY_ATTEMPTS conflicts, or when the catalog refuses the commit, the sweep is refused.

Imported only when a trash or delete sweep of a catalog table starts: pyiceberg's table
classes are slow to import, and nothing else needs them.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from pydantic import PrivateAttr
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import AssertRefSnapshotId, AssertTableUUID
from pyiceberg.table.update.snapshot import ExpireSnapshots

from gc_assets.core.config import redacted
from gc_assets.sources.base import CommittedExpiry, SourceError

EXPIRY_ATTEMPTS = 4
RETRY_WAIT_SECONDS = 0.1  # times the attempt number: another writer's commit needs a moment


class JudgedMetadata(AssertTableUUID):
    """The table's UUID and, wherever pyiceberg validates requirements itself (the SQL catalog
    validates them against the metadata it loads for its compare-and-swap), the very metadata
    the expiry was judged on. A snapshot, ref or property another writer committed meanwhile
    is then a conflict, to judge again, and not something removed on an old judgment:
    pyiceberg's remove-snapshots also drops every ref naming a removed snapshot, so a tag
    placed meanwhile would vanish with it. A REST catalog receives the plain UUID assertion
    (private attributes are never serialized) and judges the per-ref assertions sent along."""

    _judged: Optional[TableMetadata] = PrivateAttr(default=None)

    @classmethod
    def of(cls, metadata: TableMetadata) -> "JudgedMetadata":
        pin = cls(uuid=metadata.table_uuid)
        pin._judged = metadata
        return pin

    def validate(self, base_metadata: Optional[TableMetadata]) -> None:
        super().validate(base_metadata)
        if base_metadata != self._judged:
            raise CommitFailedException("the table's metadata changed after the expiry was judged")


class JudgedExpiry(ExpireSnapshots):
    """pyiceberg's ExpireSnapshots (by id; it refuses branch heads and tagged snapshots),
    committed only onto the metadata it was judged on: every ref where it was, and the rest
    as JudgedMetadata says."""

    def __init__(self, table: Table):
        super().__init__(Transaction(table, autocommit=True))
        metadata = table.metadata
        refs = sorted(metadata.refs.items())
        self._requirements = (
            JudgedMetadata.of(metadata),
            *(AssertRefSnapshotId(ref=name, snapshot_id=ref.snapshot_id) for name, ref in refs),
        )


def commit_expiry(
    load: Callable[[], Any],
    expiring: Callable[[TableMetadata], set[str]],
    expired_at_mark: frozenset[str],
    table_name: str,
) -> CommittedExpiry:
    """Expire `expiring(metadata)` (snapshot ids) of the table `load()` returns now, retried on
    conflict with a new load and a new judgment. `table_name` opens every refusal."""
    conflict: Optional[CommitFailedException] = None
    for attempt in range(1, EXPIRY_ATTEMPTS + 1):
        ids: set[str] = set()
        try:
            table = load()
            before = table.metadata_location
            ids = expiring(table.metadata)
            if ids:
                JudgedExpiry(table).by_ids(sorted(int(snapshot_id) for snapshot_id in ids)).commit()
        except CommitFailedException as error:
            conflict = error
            time.sleep(RETRY_WAIT_SECONDS * attempt)
            continue
        except SourceError:
            raise
        except Exception as error:  # a catalog refuses in many ways: 403, a read-only database role, ...
            raise SourceError(
                redacted(
                    f"{table_name}: the catalog did not commit the expiry of snapshots {sorted(ids)}: "
                    f"{type(error).__name__}: {error}. Nothing was moved or deleted; the sweep needs the "
                    "right to commit to the table"
                )
            ) from None
        listed = {str(snapshot.snapshot_id) for snapshot in table.metadata.snapshots}
        tried = attempt if ids else attempt - 1
        return CommittedExpiry(frozenset(ids), expired_at_mark - listed, tried, before if ids else None)
    raise SourceError(
        f"{table_name}: another writer committed during each of {EXPIRY_ATTEMPTS} attempts to expire snapshots "
        f"({conflict}). Nothing was moved or deleted; run again when the table is quieter"
    )
