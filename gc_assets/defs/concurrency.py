"""Never two GC runs on one repository at once.

Every run of the partitioned GC jobs carries Dagster's own tag of the partition's
`repo` dimension (`dagster/partition/repo`), whoever launched it: the UI, a backfill,
a sensor, a schedule or `gc-assets run`. dagster.yaml limits in-progress runs to one
per value of that tag, so the run queue serializes the runs of a repository. The
queue is the first line; `ensure_sole_run` is the second, checked by the sweep itself
just before it acts, because an instance without the queued coordinator (an
ephemeral one, a misconfigured deployment) would not enforce the limit.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from dagster import DagsterInstance, DagsterRunStatus, Failure, RunsFilter

from gc_assets.defs.partitions import split_partition_key

# Dagster tags every run of a multi-partition with each dimension's key.
REPOSITORY_TAG = "dagster/partition/repo"
# Runs over a partition range (a backfill policy, a ranged launch) carry these instead.
RANGE_TAGS = ("dagster/asset_partition_range_start", "dagster/asset_partition_range_end")
# Started and not finished: the run may be reading or changing the repository's storage.
RUNNING_STATUSES = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


def repository_tags(repo: str) -> dict[str, str]:
    """Run tags that identify the repository a run works on."""
    return {REPOSITORY_TAG: repo}


def repositories_of(tags: Mapping[str, str]) -> set[str]:
    """The repositories a run works on: its partition's, or both ends of a partition range."""
    if REPOSITORY_TAG in tags:
        return {tags[REPOSITORY_TAG]}
    ends = [tags[tag] for tag in RANGE_TAGS if tag in tags]
    return {split_partition_key(end)[1] for end in ends}


def others_in_progress(instance: DagsterInstance, repos: Sequence[str], run_id: str) -> dict[str, list[str]]:
    """Ids of the runs of each repository, other than `run_id`, that have started and not
    finished, from one query of the runs in progress."""
    runs = [run for run in instance.get_runs(filters=RunsFilter(statuses=RUNNING_STATUSES)) if run.run_id != run_id]
    working = [(run.run_id, repositories_of(run.tags)) for run in runs]
    return {repo: sorted(other for other, theirs in working if repo in theirs) for repo in repos}


def not_sole_runs(instance: DagsterInstance, repos: Sequence[str], run_id: str) -> dict[str, str]:
    """Why each repository of `repos` that another run in progress works on must not be swept."""
    return {
        repo: f"sweep refused, storage untouched: repository {repo!r} has other runs in progress "
        f"({', '.join(others)}); two GC runs on one repository must never overlap"
        for repo, others in others_in_progress(instance, repos, run_id).items()
        if others
    }


def ensure_sole_run(instance: DagsterInstance, repo: str, run_id: str) -> None:
    """Refuse to go on while another run of the same repository is in progress."""
    refused = not_sole_runs(instance, [repo], run_id)
    if refused:
        raise Failure(refused[repo])
