"""Asset checks, named as the UI shows them. Each wraps one invariant of gc_assets.core.guards.

Checks that protect deletion are blocking with ERROR severity: when one fails, the
downstream assets of the same run are not materialized.
"""


from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetIn,
    MetadataValue,
    MultiPartitionsDefinition,
    asset_check,
)
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame

from gc_assets.core import guards
from gc_assets.defs.assets.common import (
    candidate_cutoff,
    gc_partition,
    latest_mark,
    untracked_cutoff,
)
from gc_assets.defs.resources import GcConfigResource
from gc_assets.stores import store_for


def _result(verdict: guards.Verdict) -> AssetCheckResult:
    return AssetCheckResult(
        passed=verdict.passed,
        severity=AssetCheckSeverity.WARN if verdict.severity == "WARN" else AssetCheckSeverity.ERROR,
        description=verdict.description,
        metadata={key: MetadataValue.json(value) if isinstance(value, list) else value for key, value in verdict.metadata.items()},
    )


def build_checks(partitions: MultiPartitionsDefinition) -> list:
    @asset_check(
        asset="retained_commits",
        partitions_def=partitions,
        blocking=True,
        description="Every branch head and every tagged commit is retained.",
    )
    def heads_and_tags_retained(retained_commits: DataFrame) -> AssetCheckResult:
        return _result(guards.heads_and_tags_retained(retained_commits))

    @asset_check(
        asset="object_inventory",
        partitions_def=partitions,
        blocking=True,
        additional_ins={"live_files": AssetIn("live_files"), "retained_commits": AssetIn("retained_commits")},
        description=(
            "Every object a branch head, tag or staging area references is in storage (ERROR, blocks the "
            "sweep). Objects only older retained commits reference that are already gone mean history "
            "was truncated earlier: a WARN naming the commits, which does not block."
        ),
    )
    def live_objects_present(
        context: AssetCheckExecutionContext,
        gc_config: GcConfigResource,
        pyspark: LazyPySparkResource,
        object_inventory: DataFrame,
        live_files: DataFrame,
        retained_commits: DataFrame,
    ) -> AssetCheckResult:
        partition = gc_partition(context, gc_config)
        missing = live_files.filter("required").join(object_inventory.select("address"), "address", "left_anti")
        gaps = partition.source.commits_referencing(
            pyspark.spark_session, retained_commits.filter("retained").select("commit_id"), missing
        )
        return _result(guards.live_objects_present(live_files, object_inventory, gaps))

    @asset_check(
        asset="orphan_candidates",
        partitions_def=partitions,
        blocking=True,
        additional_ins={"retained_commits": AssetIn("retained_commits")},
        description=(
            "No candidate is live: the live set is recomputed from the connector's raw entries and "
            "normalized in plain Python, independently of live_files."
        ),
    )
    def candidates_not_live(
        context: AssetCheckExecutionContext,
        gc_config: GcConfigResource,
        pyspark: LazyPySparkResource,
        orphan_candidates: DataFrame,
        retained_commits: DataFrame,
    ) -> AssetCheckResult:
        partition = gc_partition(context, gc_config)
        entries = partition.source.live_entries(
            pyspark.spark_session,
            retained_commits.filter("retained").select("commit_id"),
            retained_commits.filter("ref_head").select("commit_id"),
        )
        return _result(guards.candidates_not_live(orphan_candidates, entries, partition.repo.storage_namespace))

    @asset_check(
        asset="orphan_candidates",
        partitions_def=partitions,
        blocking=True,
        description=(
            "Every candidate was last modified before min(mark time, as-of, source time) minus the minimum "
            "object age; an untracked one also before the format's window for in-flight writers."
        ),
    )
    def candidates_older_than_min_age(
        context: AssetCheckExecutionContext,
        gc_config: GcConfigResource,
        pyspark: LazyPySparkResource,
        orphan_candidates: DataFrame,
    ) -> AssetCheckResult:
        partition = gc_partition(context, gc_config)
        mark = latest_mark(context)
        format_guard = partition.source.untracked_min_age(pyspark.spark_session, partition.repo)
        return _result(
            guards.candidates_older_than_min_age(
                orphan_candidates, candidate_cutoff(partition, mark), untracked_cutoff(partition, mark, format_guard)
            )
        )

    @asset_check(
        asset="orphan_candidates",
        partitions_def=partitions,
        blocking=True,
        additional_ins={"live_files": AssetIn("live_files"), "retained_commits": AssetIn("retained_commits")},
        description=(
            "The independent witness: what each ref head needs, read with the format's own reader "
            "(delta-rs, pyiceberg scan planning, the export's raw rows) and not through the connector, "
            "is live at a head and is no candidate."
        ),
    )
    def independent_witness(
        context: AssetCheckExecutionContext,
        gc_config: GcConfigResource,
        pyspark: LazyPySparkResource,
        orphan_candidates: DataFrame,
        live_files: DataFrame,
        retained_commits: DataFrame,
    ) -> AssetCheckResult:
        partition = gc_partition(context, gc_config)
        witness = partition.source.witness_heads(pyspark.spark_session, guards.head_commits(retained_commits))
        return _result(
            guards.independent_witness(orphan_candidates, witness, live_files, partition.repo.storage_namespace)
        )

    @asset_check(
        asset="orphan_candidates",
        partitions_def=partitions,
        blocking=True,
        description=(
            "Every candidate is a plain key inside the namespace, outside every protected prefix and "
            "protected pattern of its format."
        ),
    )
    def candidates_inside_namespace(
        context: AssetCheckExecutionContext, gc_config: GcConfigResource, orphan_candidates: DataFrame
    ) -> AssetCheckResult:
        partition = gc_partition(context, gc_config)
        source = partition.source
        return _result(
            guards.candidates_inside_namespace(
                orphan_candidates, partition.protected_prefixes(source), source.protected_patterns
            )
        )

    @asset_check(
        asset="orphan_candidates",
        partitions_def=partitions,
        blocking=True,
        additional_ins={"object_inventory": AssetIn("object_inventory")},
        description="Candidates are at most max_delete_fraction of the objects in the namespace.",
    )
    def blast_radius(
        context: AssetCheckExecutionContext,
        gc_config: GcConfigResource,
        orphan_candidates: DataFrame,
        object_inventory: DataFrame,
    ) -> AssetCheckResult:
        partition = gc_partition(context, gc_config)
        return _result(guards.blast_radius(orphan_candidates.count(), object_inventory.count(), partition.repo))

    @asset_check(
        asset="deletion_receipts",
        partitions_def=partitions,
        additional_ins={"orphan_candidates": AssetIn("orphan_candidates")},
        description="Exactly one receipt per candidate, and none for anything else.",
    )
    def receipts_cover_candidates(deletion_receipts: DataFrame, orphan_candidates: DataFrame) -> AssetCheckResult:
        return _result(guards.receipts_cover_candidates(deletion_receipts, orphan_candidates))

    @asset_check(
        asset="deletion_receipts",
        partitions_def=partitions,
        additional_ins={"live_files": AssetIn("live_files"), "object_inventory": AssetIn("object_inventory")},
        description="After the sweep, every live object that was in storage is still there.",
    )
    def live_objects_intact(
        context: AssetCheckExecutionContext,
        gc_config: GcConfigResource,
        pyspark: LazyPySparkResource,
        deletion_receipts: DataFrame,
        live_files: DataFrame,
        object_inventory: DataFrame,
    ) -> AssetCheckResult:
        partition = gc_partition(context, gc_config)
        present_before = live_files.filter("in_namespace").select("address").join(
            object_inventory.select("address"), "address", "left_semi"
        )
        existence = store_for(partition.repo).exists(pyspark.spark_session, present_before)
        return _result(guards.live_objects_intact(existence))

    return [
        heads_and_tags_retained,
        live_objects_present,
        candidates_not_live,
        candidates_older_than_min_age,
        independent_witness,
        candidates_inside_namespace,
        blast_radius,
        receipts_cover_candidates,
        live_objects_intact,
    ]

