"""Pandera models of the five assets (docs/design.md §4): the column names are the contract."""

from __future__ import annotations

import pyspark.sql.types as T
from pandera.pyspark import DataFrameModel, Field
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

LIVE_SOURCES = ["committed", "staged", "metadata"]
CANDIDATE_REASONS = ["expired", "untracked", "unreferenced"]
RECEIPT_ACTIONS = [
    "would_delete",
    "deleted",
    "already_absent",
    "trashed",
    "restored",
    "purged",
    "skipped_revived",
    "failed",
    # a file catalog's rows (gc_assets/sweep/catalog_rows.py)
    "would_delete_row",
    "row_deleted",
    "row_trashed",
    "row_skipped_revived",
]


class SchemaError(ValueError):
    """An asset's output does not match its contract; it is not written."""


class _Partitioned(DataFrameModel):
    repo: T.StringType() = Field(nullable=False)
    gc_date: T.DateType() = Field(nullable=False)

    class Config:
        strict = False


class RetainedCommits(_Partitioned):
    commit_id: T.StringType() = Field(nullable=False)
    created_at: T.TimestampType() = Field(nullable=False)
    retained: T.BooleanType() = Field(nullable=False)
    retained_by: T.StringType() = Field(nullable=True)
    threshold: T.TimestampType() = Field(nullable=True)
    ref_head: T.BooleanType() = Field(nullable=False)


class LiveFiles(_Partitioned):
    address: T.StringType() = Field(nullable=False)
    size: T.LongType() = Field(nullable=True)
    source: T.StringType() = Field(nullable=False, isin=LIVE_SOURCES)
    at_head: T.BooleanType() = Field(nullable=False)
    in_namespace: T.BooleanType() = Field(nullable=False)
    required: T.BooleanType() = Field(nullable=False)  # the key as referenced, not another spelling of it


class ObjectInventory(_Partitioned):
    address: T.StringType() = Field(nullable=False)
    size: T.LongType() = Field(nullable=False)
    last_modified: T.TimestampType() = Field(nullable=False)
    etag: T.StringType() = Field(nullable=True)


class OrphanCandidates(_Partitioned):
    address: T.StringType() = Field(nullable=False)
    size: T.LongType() = Field(nullable=False)
    last_modified: T.TimestampType() = Field(nullable=False)
    reason: T.StringType() = Field(nullable=False, isin=CANDIDATE_REASONS)


class DeletionReceipts(_Partitioned):
    address: T.StringType() = Field(nullable=False)
    size: T.LongType() = Field(nullable=True)
    action: T.StringType() = Field(nullable=False, isin=RECEIPT_ACTIONS)
    error: T.StringType() = Field(nullable=True)
    run_id: T.StringType() = Field(nullable=False)
    mark_id: T.StringType() = Field(nullable=False)
    at: T.TimestampType() = Field(nullable=False)


def check_columns(frame: DataFrame, model: type[DataFrameModel]) -> None:
    """Every column of the model is in `frame` with the model's type, judged on the schema alone.

    Not pandera's validate: even at SCHEMA_ONLY depth it runs a Spark job per non-nullable
    column, and the rows' rules are measured by the write already (row_rules).
    """
    found = {field.name: field.dataType for field in frame.schema.fields}
    errors = {}
    for name, column in model.to_schema().columns.items():
        expected = column.dtype.type
        if name not in found:
            errors[name] = "missing"
        elif found[name] != expected:
            errors[name] = f"{found[name].simpleString()}, not {expected.simpleString()}"
    if errors:
        raise SchemaError(f"{model.__name__} output breaks its schema: {errors}")


def row_rules(model: type[DataFrameModel]) -> dict[str, Column]:
    """The model's nullability and allowed values, as conditions true on a breaking row."""
    rules: dict[str, Column] = {}
    for name, column in model.to_schema().columns.items():
        if not column.nullable:
            rules[f"{name} is null"] = F.col(name).isNull()
        for check in column.checks:
            if check.name == "isin":
                allowed = list(check.statistics["allowed_values"])
                rules[f"{name} not in {allowed}"] = F.col(name).isNotNull() & ~F.col(name).isin(allowed)
    return rules


def refuse_broken_rows(model: type[DataFrameModel], breaking_rows: dict[str, int]) -> None:
    broken = {label: n for label, n in breaking_rows.items() if n}
    if broken:
        raise SchemaError(f"{model.__name__} output breaks its schema: rows where {broken}")


MODELS: dict[str, type[DataFrameModel]] = {
    "retained_commits": RetainedCommits,
    "live_files": LiveFiles,
    "object_inventory": ObjectInventory,
    "orphan_candidates": OrphanCandidates,
    "deletion_receipts": DeletionReceipts,
}
