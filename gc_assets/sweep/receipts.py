"""Receipts: what the sweep did with each object, one row each, built here only.

A receipt is (address, action, error, run_id, at, size); the journal keeps them without
sizes (JOURNAL_SCHEMA), which join the receipts at the end. Stored as deletion_receipts,
each also names the mark it swept (mark_id), and a file catalog's rows are receipted
beside the objects (row_id).
"""

from __future__ import annotations

import datetime as dt
from typing import Optional

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

JOURNAL_SCHEMA = "address string, action string, error string, run_id string, at timestamp"


def receipts(
    frame: DataFrame,
    run_id: str,
    at: dt.datetime,
    action: Optional[str] = None,
    note: Optional[str] = None,
    *,
    keep: tuple[str, ...] = (),
) -> DataFrame:
    """Receipt rows (address, action, error, run_id, at, size), then the columns in `keep`.

    Without `action`, the frame's own action and error columns are kept; with it, every row
    gets that action and `note` as its error. A frame without sizes gets null sizes.
    """
    return frame.select(
        "address",
        F.col("action") if action is None else F.lit(action).alias("action"),
        F.col("error") if action is None else F.lit(note).cast("string").alias("error"),
        F.lit(run_id).alias("run_id"),
        F.lit(at).alias("at"),
        F.col("size") if "size" in frame.columns else F.lit(None).cast("long").alias("size"),
        *keep,
    )
