"""Many tables collected in one run, the repository a column (docs/design.md §9): every
table's mark (mark.sets: Delta and Iceberg in one set of Spark jobs, each lakeFS repository and
file catalog by its own connector), every namespace's listing (stores.many.list_many), each table's candidates
by its own rules and each table's guards (core.guards' `_each` forms; the witness read by each
format's own reader), in one set of Spark jobs; then each table's
receipts in its own mode: a would_delete receipt per candidate in dry run (and a
would_delete_row receipt per row a file catalog's cleanup would remove), and in trash or
delete mode one sweep of all of them (sweep.set_sweep: each table's expiry committed first
where its format wants it, each file catalog's rows cleaned first, its lease, journal rows,
re-validation and holds, as its own run would sweep it, in one set of Spark jobs). Or, for the
new-commit sensor's runs, only the mark (mark_job's two assets and its guard); or the mark and
the candidates without receipts; or one repository's sweep of the frames an earlier run's mark
stored (sweep_stored, a set of one).

Each asset is stored once for all tables by `store`, which hands back what it stored; the
guards judge what was stored. A table whose mark, listing, candidates, stored rows or sweep
are refused stops there, alone and named.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial, reduce
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gc_assets.core import guards
from gc_assets.core.config import GcConfig, RepositoryConfig
from gc_assets.core.guards import Verdict
from gc_assets.core.names import ASSETS, REPO, Mode
from gc_assets.core.spark import local_frame, one_of, task_error
from gc_assets.core.state import HOLDS_PREFIX
from gc_assets.core.time import refuse_future_as_of, untracked_guard
from gc_assets.mark import connectors, delta_tables, iceberg_tables
from gc_assets.mark.candidates import Judgement
from gc_assets.mark.partition import GcPartition, Mark
from gc_assets.mark.sets import Marks, SetMark, candidates_of, raw_entries, witness_heads
from gc_assets.mark.shared import Referrers
from gc_assets.sources import source_for
from gc_assets.sources.base import CommittedExpiry
from gc_assets.stores import store_for
from gc_assets.stores.base import Store as ObjectStore
from gc_assets.stores.base import with_listed_versions, with_version_id
from gc_assets.stores.many import FLEET_INVENTORY_SCHEMA, exists_many, list_many, listed_under
from gc_assets.sweep import catalog_rows
from gc_assets.sweep.expiry import EXPIRES_FIRST, expired_first
from gc_assets.sweep.guard_table import GUARDS
from gc_assets.sweep.holds import held_addresses
from gc_assets.sweep.receipts import receipts
from gc_assets.sweep.set_sweep import LEASES_AT_ONCE, SetSweep
from gc_assets.sweep.sweeper import state_fingerprint

log = logging.getLogger(__name__)

# What a stored partition's materialization says besides its rows: times go to its TIMES_FILE too.
Notes = dict[str, Any]


class Store(Protocol):
    """Where a set's assets go (defs.set_records)."""

    def __call__(
        self, asset: str, frame: DataFrame, notes: dict[str, Notes]
    ) -> tuple[DataFrame, dict[str, str], dict[str, int]]:
        """Store the partitions of `asset` of the repositories `notes` names (each with its notes)
        from `frame` (with `repo`): (the rows as stored, repository -> refusal, repository ->
        rows stored). Each may be put in place after this returns, by `settle` at the latest."""

    def settle(self) -> None:
        """Return once every partition stored so far is in place; raise the failure of any that is not."""


# Each repository's verdicts of a batch of guards, handed over as soon as they are judged.
Judged = Callable[[dict[str, list[Verdict]]], None]
BLOCKING = {guard.name for guard in GUARDS if guard.blocking}
# Each format's mark of many tables at once (mark.sets).
SET_MARKS = {
    "delta": delta_tables.mark_tables,
    "iceberg": iceberg_tables.mark_tables,
    "lakefs": connectors.mark_tables,
    "lakefs-export": connectors.mark_tables,
    "file-catalog": connectors.mark_tables,
}
LIVE, CANDIDATES, RECEIPTS = "live_files", "orphan_candidates", "deletion_receipts"  # where a run may stop
RECEIPT_COLUMNS = ("address", "size", "action", "error", "run_id", "mark_id", "at", "version_id")


@dataclass(frozen=True)
class Acting:
    """What a run that may touch storage tells the tables it collects: each one's mode, where
    its sweep logs, and why any of them must not be swept because another run is at work on it
    (the caller's claim, from its run queue: defs.concurrency.not_sole_runs)."""

    mode_of: Callable[[str], Mode]
    log: Any
    claim: Callable[[Sequence[str]], dict[str, str]]


def readers_of(lake: GcConfig, repos: Sequence[RepositoryConfig]) -> list[RepositoryConfig]:
    """The repositories outside `repos` whose retained versions may need objects in a namespace
    of theirs (mark.shared.referrers_of: declared, or found by a mark): a run of `repos` marks
    them with `repos` for what they need there (collect's `readers`)."""
    names = {repo.name for repo in repos}
    referrers = Referrers.read(lake)
    found: dict[str, RepositoryConfig] = {}
    for repo in repos:
        for referrer in referrers.of(repo.name):
            if referrer.name not in names:
                found.setdefault(referrer.name, referrer)
    return list(found.values())


@dataclass
class Collected:
    """What became of each repository: its guards' verdicts, or the asset and message of its refusal."""

    judgements: dict[str, Judgement] = field(default_factory=dict)  # each table's cutoffs and protected keys
    verdicts: dict[str, list[Verdict]] = field(default_factory=dict)
    refused: dict[str, tuple[str, str]] = field(default_factory=dict)  # repository -> (asset, message)
    readers: frozenset[str] = frozenset()  # marked only for what they need in the others' namespaces
    rows: dict[str, dict[str, int]] = field(default_factory=dict)  # asset -> each stored partition's rows

    def refuse(self, asset: str, refusals: dict[str, str]) -> None:
        for repo, message in refusals.items():
            if repo not in self.readers:  # a reader's own refusal is told by the tables it reaches into
                self.refused.setdefault(repo, (asset, message))

    def going_on(self, names: Sequence[str]) -> list[str]:
        return [name for name in names if name not in self.refused]

    def stop_blocked(self, asset: str, names: Sequence[str]) -> None:
        """Refuse `asset` and every asset after it to each of `names` a blocking guard failed."""
        self.refuse(asset, {name: self.blocked(name) for name in self.going_on(names) if self.blocked(name)})

    def judging(self, judged: Judged) -> Callable[[Sequence[dict[str, Verdict]]], None]:
        """Hand batches of verdicts to `judged`, each repository's kept here too."""

        def judge(batches: Sequence[dict[str, Verdict]]) -> None:
            verdicts: dict[str, list[Verdict]] = {}
            for batch in batches:
                for name, verdict in batch.items():
                    verdicts.setdefault(name, []).append(verdict)
            for name, theirs in verdicts.items():
                self.verdicts.setdefault(name, []).extend(theirs)
            judged(verdicts)

        return judge

    def storing(
        self, store: Store, names: Sequence[str], date: dt.date
    ) -> Callable[[str, DataFrame, Callable[[str], Notes]], DataFrame]:
        """Store an asset's partitions of those of `names` still going on, each with its notes;
        a partition refused by its write refuses its repository."""

        def stored(asset: str, frame: DataFrame, notes: Callable[[str], Notes]) -> DataFrame:
            going_on = self.going_on(names)
            written, refusals, self.rows[asset] = store(
                asset, with_date(frame, date), {name: notes(name) for name in going_on}
            )
            self.refuse(asset, refusals)
            return written

        return stored

    def blocked(self, name: str) -> str:
        """Why a failed blocking guard stops this repository's sweep, or ''."""
        failed = [
            v for v in self.verdicts.get(name, []) if v.name in BLOCKING and not v.passed and v.severity == "ERROR"
        ]
        return "checks not passed: " + ", ".join(v.name for v in failed) if failed else ""


def collect(
    spark: SparkSession,
    lake: GcConfig,
    repos: Sequence[RepositoryConfig],
    date: dt.date,
    as_of: dt.datetime,
    run_id: str,
    store: Store,
    clock: Callable[[], dt.datetime],
    judged: Judged,
    through: str = RECEIPTS,
    acting: Optional[Acting] = None,
    readers: Sequence[RepositoryConfig] = (),
) -> Collected:
    """The assets of (date, repo) for every repository of `repos` up to `through` (live_files: the
    mark alone, as mark_job, and storage is not listed; orphan_candidates: without receipts; or all
    five), as of `as_of`, each judged by its guards. Every verdict goes to `judged` as soon as it is
    known (the engine records it while Spark goes on) and into the outcome.
    Without `acting` every table is dry-run; with it, each in its mode (sweep_set).

    `readers` (readers_of `repos`) are marked with them, only for what they need in the
    namespaces of `repos` (one live set, the witness): nothing of theirs is stored, listed,
    judged or swept, and one whose mark fails refuses the tables it reaches into."""
    mark_only = through == LIVE
    mark_time = clock()
    sweeping = [repo for repo in repos if acting and acting.mode_of(repo.name) is not Mode.DRY_RUN]
    fingerprints = _fingerprints(spark, lake, sweeping) if through == RECEIPTS else {}
    fleet = mark_set(spark, [*repos, *readers], as_of)
    outcome = Collected(readers=frozenset(repo.name for repo in readers))
    outcome.refuse("retained_commits", fleet.refused)
    judge = outcome.judging(judged)
    marked = fleet.repos
    names = [name for name in marked if name not in outcome.readers]
    stored = outcome.storing(store, names, date)

    retained = stored("retained_commits", fleet.retained, lambda name: {"as_of": as_of, **fleet.counters(name)})
    # Each guard is judged as soon as what it reads is stored, so that its verdicts are recorded
    # while Spark works on the next phase. A failed blocking one stops its table there, as a
    # blocking check stops the assets after its own in a run of one partition: every asset after
    # retained_commits waits for it (the listing too).
    judge([guards.heads_and_tags_retained_each(retained, outcome.going_on(names))])
    outcome.stop_blocked("live_files", names)
    listed = {name: store_for(marked[name]) for name in outcome.going_on(names)}
    if mark_only:  # the candidates below are never computed: nothing is listed
        inventory = local_frame(spark, [], FLEET_INVENTORY_SCHEMA)
    else:
        listed_at = clock()
        reported = [name for name in listed if marked[name].inventory is not None]
        listing, unlisted, reports = _listing(spark, listed, reported)
        outcome.refuse("object_inventory", unlisted)
        inventory = stored("object_inventory", listing, lambda name: {"listed_at": listed_at, **reports.get(name, {})})
        outcome.refuse("orphan_candidates", fleet.inventory_refusals(spark, inventory))
    decided = candidates_of(
        spark, lake, fleet, as_of, mark_time, inventory, _held(spark, fleet, listed, inventory, clock()), names
    )
    outcome.refuse("live_files", decided.refused)
    outcome.judgements = decided.judgements
    # The witness reads the heads this mark retained (after it recorded whom each table reaches):
    # read now, on the cores the next two phases leave idle between their jobs, and judged with
    # the other guards.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="witness") as ahead:
        going = outcome.going_on(names)
        witnessing = (
            None if mark_only else ahead.submit(lambda: _witness_keys(spark, Referrers.read(lake), fleet, going))
        )
        live = stored(
            "live_files",
            decided.live,
            lambda name: {"mark_time": mark_time, "source_time": decided.source_times[name]},
        )
        if mark_only:
            return outcome
        judge([_live_objects_present(fleet, outcome.going_on(names), retained, live, inventory)])
        outcome.stop_blocked("orphan_candidates", names)
        candidates = stored(
            "orphan_candidates",
            decided.frame,
            lambda name: {
                "cutoff": decided.judgements[name].cutoff,
                "untracked_cutoff": decided.judgements[name].untracked_cutoff,
                "protected_prefixes": list(decided.judgements[name].protected),
            },
        )
        sweep_started = time.monotonic()  # the receipts' phase, re-validation and acting included
        checked = outcome.going_on(names)
        # The minimum-age guard's own bounds, by the rule from the mark's times, never the cutoffs the
        # candidates were decided by: a wrong cutoff there is caught here.
        bounds = {
            name: _own_cutoffs(
                marked[name], as_of, mark_time, decided.source_times[name], decided.untracked_windows[name]
            )
            for name in checked
        }
        protected = {name: (outcome.judgements[name].protected, outcome.judgements[name].patterns) for name in checked}
        judging = _guards(
            spark, lake, fleet, checked, retained, live, inventory, candidates, bounds, protected, witnessing
        )
        for verdicts in judging:
            judge([verdicts])
    if through != RECEIPTS:
        return outcome
    outcome.stop_blocked(RECEIPTS, checked)
    frames = {
        "retained_commits": retained,
        "live_files": live,
        "object_inventory": inventory,
        "orphan_candidates": candidates,
    }
    receipted = outcome.going_on(checked)
    partitions = {name: GcPartition(lake, marked[name], date, as_of) for name in receipted}
    passed = {name: sorted(v.name for v in outcome.verdicts.get(name, []) if v.passed) for name in receipted}
    sweep = Receipting(spark, lake, partitions, listed, frames, run_id, acting, clock, fingerprints)
    if sweeping:  # nothing is trashed or deleted before every partition of its mark is in place
        store.settle()
    counted = outcome.rows[CANDIDATES]
    sweep.receipt(outcome, stored, judge, sweep_started, passed, lambda going: sum(counted.get(n, 0) for n in going))
    return outcome


@dataclass
class Receipting:
    """The receipts' phase of a set on the frames stored for it (with `repo`): each repository in
    its mode (dry run without `acting`), those that trash or delete swept as one set (sweep_set),
    then the guards that judge what the sweep did. `mark_id`: an earlier run's mark of the one
    repository of `partitions` (its sweep alone), else this run's."""

    spark: SparkSession
    lake: GcConfig
    partitions: dict[str, GcPartition]
    stores: dict[str, ObjectStore]
    frames: dict[str, DataFrame]
    run_id: str
    acting: Optional[Acting]
    clock: Callable[[], dt.datetime]
    fingerprints: dict[str, str] = field(default_factory=dict)
    mark_id: Optional[str] = None

    def receipt(
        self,
        outcome: Collected,
        stored: Callable[[str, DataFrame, Callable[[str], Notes]], DataFrame],
        judge: Callable[[Sequence[dict[str, Verdict]]], None],
        started: float,
        reused: dict[str, list[str]],
        handled: Callable[[list[str]], int],
    ) -> None:
        """Receipt every repository, store the receipts (each with its sweep's metadata and the
        guards it took over from this run, `reused`) and judge them; a refused one is named in
        `outcome`. `started`: when the phase began; `handled`: the candidates of those receipted
        (the set's throughput)."""
        acting, names = self.acting, list(self.partitions)
        modes = {name: acting.mode_of(name) if acting else Mode.DRY_RUN for name in names}
        dry = {name: self.partitions[name].repo for name in names if modes[name] is Mode.DRY_RUN}
        acted, refusals = dry_run_receipts(
            self.spark, dry, self.stores, self.frames, self.run_id, self.clock(), self.mark_id
        )
        outcome.refuse(RECEIPTS, refusals)
        to_sweep = [name for name in names if acting is not None and modes[name] is not Mode.DRY_RUN]
        swept: dict[str, Notes] = {}
        if to_sweep:
            assert acting is not None
            frames_swept, metadata, refusals = sweep_set(
                self.spark,
                self.lake,
                {name: self.partitions[name] for name in to_sweep},
                modes,
                self.run_id,
                self.fingerprints,
                self.frames,
                acting,
                self.clock,
                self.mark_id,
            )
            outcome.refuse(RECEIPTS, refusals)
            swept = metadata
            acted += frames_swept
        # The set's throughput, candidates handled per second of this phase: every table's shares it.
        throughput = round(handled(outcome.going_on(names)) / max(time.monotonic() - started, 1e-3), 1)
        written = stored(
            RECEIPTS,
            reduce(partial(DataFrame.unionByName, allowMissingColumns=True), acted),
            lambda name: {
                "mode": modes[name].value,
                "mark_id": self.mark_id or self.run_id,
                "files_per_second": throughput,
                "guards_reused": reused.get(name, []),
                **swept.get(name, {}),
            },
        )
        receipted = outcome.going_on(names)
        mine = one_of(REPO, receipted)
        live, inventory, candidates = (self.frames[asset] for asset in ("live_files", "object_inventory", CANDIDATES))
        present_before = (
            live.filter(mine & F.col("in_namespace"))
            .select(REPO, "address")
            .join(inventory.select(REPO, "address"), [REPO, "address"], "left_semi")
        )
        existence = exists_many({name: self.stores[name] for name in receipted}, present_before)
        judge(
            [
                guards.receipts_cover_candidates_each(written.filter(mine), candidates.filter(mine), receipted),
                guards.live_objects_intact_each(existence, receipted),
            ]
        )


def mark_set(spark: SparkSession, repos: Sequence[RepositoryConfig], as_of: dt.datetime) -> SetMark:
    """Every table of `repos` marked with the others of its format, in one set of Spark jobs each."""
    parts = [
        mark(spark, [repo for repo in repos if repo.format == name], as_of)
        for name, mark in SET_MARKS.items()
        if any(repo.format == name for repo in repos)
    ]
    return parts[0] if len(parts) == 1 else Marks(parts)


def sweep_set(
    spark: SparkSession,
    lake: GcConfig,
    partitions: dict[str, GcPartition],
    modes: dict[str, Mode],
    run_id: str,
    fingerprints: dict[str, str],
    frames: dict[str, DataFrame],
    acting: Acting,
    clock: Callable[[], dt.datetime],
    mark_id: Optional[str] = None,
) -> tuple[list[DataFrame], dict[str, Notes], dict[str, str]]:
    """The trash or delete sweep of every repository of `partitions` on what this run stored for
    them (frames with `repo`), as one set (sweep.set_sweep): no other run at work on any of them,
    and an as-of later than now refused for all, as in every sweep that touches storage. The
    receipts (repo, RECEIPT_COLUMNS) of those swept, each receipt without a size taking its
    candidate's; each one's sweep metadata; each refused one's reason. `mark_id`: an earlier
    run's mark of the one repository of `partitions` (its sweep alone), else this run's."""
    names = list(partitions)
    try:
        refuse_future_as_of(False, partitions[names[0]].as_of, clock())
    except Exception as exc:  # noqa: BLE001 - every repository of the set, named
        return [], {}, {name: str(exc) for name in names}
    refused = acting.claim(names)
    going = {name: partition for name, partition in partitions.items() if name not in refused}
    expiries = _expired_first(spark, going, frames["retained_commits"], acting.log, refused)
    going = {name: partition for name, partition in going.items() if name not in refused}
    if not going:
        return [], {}, refused
    stores = {name: store_for(partition.repo) for name, partition in going.items()}
    sweep = SetSweep(spark, lake, going, stores, modes, run_id, acting.log, clock, fingerprints, mark_id)
    gone = [(name, commit) for name, expiry in expiries.items() for commit in expiry.gone]
    expected = frames["retained_commits"]  # each table's state after its expiry
    if gone:
        gone_frame = F.broadcast(local_frame(spark, gone, f"{REPO} string, commit_id string"))
        expected = expected.join(gone_frame, [REPO, "commit_id"], "left_anti")
    done = sweep.run(expected, frames["orphan_candidates"], frames["object_inventory"], frames["live_files"])
    sizes = frames["orphan_candidates"].select(REPO, "address", F.col("size").alias("candidate_size"))
    sized = done.receipts.join(sizes, [REPO, "address"], "left").withColumn(
        "size", F.coalesce("size", "candidate_size")
    )
    rows = ["row_id"] if "row_id" in sized.columns else []  # a file catalog's row receipts
    marked_by = F.lit(mark_id or run_id).alias("mark_id")
    receipted = sized.select(REPO, *RECEIPT_COLUMNS[:5], marked_by, "at", "version_id", *rows)
    metadata = {
        name: {
            "expired_in_metadata": len(expiries.get(name, CommittedExpiry()).expired),
            "expiry_attempts": expiries.get(name, CommittedExpiry()).attempts,
            **notes,
        }
        for name, notes in done.metadata.items()
    }
    return [receipted], metadata, {**refused, **done.refused}


def _expired_first(
    spark: SparkSession, partitions: dict[str, GcPartition], retained: DataFrame, log: Any, refused: dict[str, str]
) -> dict[str, CommittedExpiry]:
    """What each table of an EXPIRES_FIRST format expired in its own metadata before anything of
    it is moved or deleted (the commits its mark expired, judged again on its metadata now), as
    its own sweep does (sweep.expiry.expired_first, checked there); one whose metadata refuses is
    refused alone, with the message its own sweep gives. One table after another: their catalogs
    may be one database."""
    expiring = [name for name, partition in partitions.items() if partition.repo.format in EXPIRES_FIRST]
    if not expiring:
        return {}
    expired: dict[str, set[str]] = {name: set() for name in expiring}
    rows = retained.filter(one_of(REPO, expiring) & ~F.col("retained")).select(REPO, "commit_id").collect()
    for row in rows:
        expired[row[REPO]].add(row["commit_id"])
    done = {}
    for name in expiring:
        partition = partitions[name]
        try:
            done[name] = expired_first(spark, partition, frozenset(expired[name]))
        except Exception as exc:  # noqa: BLE001 - that table's refusal alone, storage untouched
            refused[name] = str(exc)
            continue
        expiry = done[name]
        if expiry.metadata_before is not None:
            log.info(
                f"{name}: expired {len(expiry.expired)} commits in its metadata (before: {expiry.metadata_before})"
            )
    return done


def dry_run_receipts(
    spark: SparkSession,
    repos: dict[str, RepositoryConfig],
    stores: dict[str, ObjectStore],
    frames: dict[str, DataFrame],
    run_id: str,
    now: dt.datetime,
    mark_id: Optional[str] = None,
) -> tuple[list[DataFrame], dict[str, str]]:
    """The receipts (repo, RECEIPT_COLUMNS, and row_id for a file catalog's) of a dry run of each
    repository of `repos` on the frames stored for them (with `repo`): a would_delete receipt per
    candidate, naming the version it was listed as, and each file catalog's would_delete_row
    receipts (_rows_would_go); why each one whose rows cannot be read is refused. `mark_id`: an
    earlier run's mark (a sweep alone), else this run's."""
    mine = one_of(REPO, list(repos))
    would_go = with_listed_versions(
        frames["orphan_candidates"].filter(mine), frames["object_inventory"], (REPO, "address")
    )
    would_delete = receipts(with_version_id(would_go), run_id, now, "would_delete", keep=(REPO, "version_id"))
    marked_by = mark_id or run_id
    acted = [would_delete.select(REPO, *RECEIPT_COLUMNS[:5], F.lit(marked_by).alias("mark_id"), "at", "version_id")]
    rows, refused = _rows_would_go(spark, repos, stores, frames["retained_commits"], run_id, now, marked_by)
    return acted + rows, refused


def _rows_would_go(
    spark: SparkSession,
    repos: dict[str, RepositoryConfig],
    stores: dict[str, ObjectStore],
    retained: DataFrame,
    run_id: str,
    now: dt.datetime,
    mark_id: str,
) -> tuple[list[DataFrame], dict[str, str]]:
    """The would_delete_row receipts (repo, RECEIPT_COLUMNS, row_id) of each dry-run file catalog of
    `repos`: the rows its cleanup would remove (sweep.catalog_rows, as its own dry run), and why
    each one whose rows cannot be read is refused."""
    catalogs = {name: repo for name, repo in repos.items() if repo.format == "file-catalog"}
    if not catalogs:
        return [], {}
    dry = {name: Mode.DRY_RUN for name in catalogs}
    cleanups, refused = catalog_rows.cleanups(retained, catalogs, stores, dry, lambda name: None)
    rows, stopped = catalog_rows.sweep_rows_together(spark, cleanups, run_id, now)
    refused |= {name: f"catalog cleanup: {task_error(why)}" for name, why in stopped.items()}
    told = rows.select(
        REPO,
        *RECEIPT_COLUMNS[:5],
        F.lit(mark_id).alias("mark_id"),
        "at",
        F.lit(None).cast("string").alias("version_id"),
        "row_id",
    )
    return [told], refused


def _fingerprints(spark: SparkSession, lake: GcConfig, repos: Sequence[RepositoryConfig]) -> dict[str, str]:
    """Each table's sweeper.state_fingerprint, taken before the mark reads it, for a table whose
    fingerprint only grows (RepositorySource.fingerprint_only_grows), so that the same one at the
    sweep means no commit since. Only for a table no other repository reaches into (a
    referrer's fingerprint may come back to an earlier one after the mark read another), and
    one whose fingerprint can be taken: any other (a lakeFS repository among them) is re-read
    before its sweep acts, as in its own run."""

    referrers = Referrers.read(lake)

    def taken(repo: RepositoryConfig) -> Optional[str]:
        try:
            if referrers.of(repo.name) or not source_for(repo).fingerprint_only_grows:
                return None
            return state_fingerprint(spark, lake, repo)
        except Exception:  # noqa: BLE001 - the mark reports what is wrong with the table
            return None

    with ThreadPoolExecutor(LEASES_AT_ONCE, thread_name_prefix="set-fingerprints") as pool:
        found = dict(zip((repo.name for repo in repos), pool.map(taken, repos)))
    return {name: fingerprint for name, fingerprint in found.items() if fingerprint is not None}


def with_date(frame: DataFrame, date: dt.date) -> DataFrame:
    """An asset's partition columns first, as GcPartition.with_partition_columns puts them."""
    return frame.select(REPO, F.lit(date).alias("gc_date"), *[c for c in frame.columns if c != REPO])


def _listing(
    spark: SparkSession, stores: dict[str, ObjectStore], reported: Sequence[str]
) -> tuple[DataFrame, dict[str, str], dict[str, Notes]]:
    """Every namespace listed (_listed_together), except those of `reported`: each of these is
    read from its newest S3 Inventory report (a job of its own; a stale or foreign report refuses
    its table alone), its rows' `inventory_date` set and the report noted, as its own run notes it.
    Its rows name their listed `version_id` when any bucket of the set keeps versions."""
    listed, refused = _listed_together(spark, {name: store for name, store in stores.items() if name not in reported})
    frames, notes = [listed], {}
    for name in reported:
        store = stores[name]
        try:
            frames.append(store.list(spark).withColumn(REPO, F.lit(name)).localCheckpoint())
        except Exception as exc:  # noqa: BLE001 - this table's refusal alone
            refused[name] = f"{store.namespace}: {task_error(exc)}"
            continue
        report = store.listed_from_report
        assert report is not None, f"{store.namespace} was listed from its report"
        notes[name] = {"inventory_date": report.created_at, "inventory_manifest": report.manifest}
    listing = reduce(partial(DataFrame.unionByName, allowMissingColumns=True), frames)
    if listing.filter(F.col("version_id").isNotNull()).isEmpty():  # kept with the executors: cheap to ask
        listing = listing.drop("version_id")  # no bucket keeps versions: stored as a table's own run stores it
    return listing, refused, notes


def _listed_together(spark: SparkSession, stores: dict[str, ObjectStore]) -> tuple[DataFrame, dict[str, str]]:
    """Every namespace listed in one job, kept with the executors; when that job fails, each
    namespace alone, and one that cannot be listed (or whose store cannot list it beside others)
    is refused, named: the others go on."""
    try:
        return list_many(spark, stores).localCheckpoint(), {}
    except Exception:  # noqa: BLE001 - find the namespace(s) at fault
        frames, refused = [], {}
        for name, store in stores.items():
            try:
                frames.append(list_many(spark, {name: store}).localCheckpoint())
            except Exception as exc:  # noqa: BLE001 - this table's refusal alone
                refused[name] = f"{store.namespace}: cannot be listed: {task_error(exc)}"
        return reduce(DataFrame.unionByName, frames, local_frame(spark, [], FLEET_INVENTORY_SCHEMA)), refused


def _held(
    spark: SparkSession, fleet: SetMark, stores: dict[str, ObjectStore], inventory: DataFrame, now: dt.datetime
) -> DataFrame:
    """(repo, address) held by a restore (sweep.holds), read only in the namespaces that hold records."""
    repos = fleet.repos
    held = [
        (name, address)
        for name, keys in listed_under(inventory, HOLDS_PREFIX).items()
        for address in held_addresses(stores[name], keys, now, repos[name].hold_days)
    ]
    return local_frame(spark, sorted(held), "repo string, address string")


def _live_objects_present(
    fleet: SetMark, names: list[str], retained: DataFrame, live: DataFrame, inventory: DataFrame
) -> dict[str, Verdict]:
    """object_inventory's guard, judged before any candidate is stored: a table whose live objects
    are missing gets none."""
    mine = one_of(REPO, names)
    return guards.live_objects_present_each(
        live.filter(mine),
        inventory.filter(mine),
        names,
        lambda missing: fleet.commits_referencing(retained, missing),
    )


def _own_cutoffs(
    repo: RepositoryConfig, as_of: dt.datetime, mark_time: dt.datetime, source_time: dt.datetime, window: dt.timedelta
) -> tuple[dt.datetime, dt.datetime]:
    """(cutoff, untracked cutoff) of a table by docs/design.md §2 itself: nothing modified after
    what the mark could know, min(mark_time, as_of, source_time), less the minimum object age (for
    an untracked object, its format's window or the configured override) is a candidate."""
    knowledge = min(mark_time, as_of, source_time)
    return knowledge - repo.min_object_age, knowledge - untracked_guard(repo, window)


def _guards(
    spark: SparkSession,
    lake: GcConfig,
    fleet: SetMark,
    names: list[str],
    retained: DataFrame,
    live: DataFrame,
    inventory: DataFrame,
    candidates: DataFrame,
    bounds: dict[str, tuple[dt.datetime, dt.datetime]],
    protected: dict[str, tuple[tuple[str, ...], tuple[str, ...]]],
    ahead: Optional[Future[DataFrame]] = None,
) -> Iterator[dict[str, Verdict]]:
    """The verdicts of the guards judged before a sweep on the stored candidates (those of the
    retained commits and the listing are judged as each is stored), in GUARDS' order, for every
    table of `names`, the minimum age by `bounds` (_own_cutoffs), the keys never collected by
    `protected` (prefixes, patterns), the witness's keys read `ahead` (_witness_keys of `names`
    or more): each guard's as soon as it is judged."""
    marked = fleet.repos
    repos = {name: marked[name] for name in names}
    namespaces = {name: repo.storage_namespace for name, repo in repos.items()}
    mine = one_of(REPO, names)
    live, inventory, candidates = (f.filter(mine) for f in (live, inventory, candidates))
    referrers = Referrers.read(lake)  # read again, not the candidates' own

    yield guards.candidates_not_live_each(candidates, raw_entries(spark, referrers, fleet).filter(mine), namespaces)
    yield guards.candidates_older_than_min_age_each(candidates, {name: bounds[name] for name in names})
    needed = _witnessed(ahead, spark, referrers, fleet, names).filter(mine)
    yield guards.witnessed_each(candidates, needed, live, names)
    yield guards.candidates_inside_namespace_each(candidates, {name: protected[name] for name in names})
    yield guards.blast_radius_each(candidates, inventory, repos)


def _witnessed(
    ahead: Optional[Future[DataFrame]],
    spark: SparkSession,
    referrers: Referrers,
    fleet: SetMark,
    names: Sequence[str],
) -> DataFrame:
    """The witness's keys read ahead, or read now for `names` when there are none or that read
    failed: it read the tables then going on, and one stopped since by a blocking check (its
    objects missing) may be one whose heads cannot be read; a failure reading `names` is theirs."""
    if ahead is not None:
        try:
            return ahead.result()
        except Exception as exc:  # noqa: BLE001 - read again below, for the tables judged now
            log.warning("the witness read ahead failed (%s); read again for the %d tables judged", exc, len(names))
    return _witness_keys(spark, referrers, fleet, names)


def _witness_keys(spark: SparkSession, referrers: Referrers, fleet: SetMark, names: Sequence[str]) -> DataFrame:
    """The keys the heads of each table of `names`, and of every table of `referrers` reaching into
    its namespace, need, by their formats' own readers (guards.witness_keys): the guards'
    independent witness, its referrers read again, not the candidates' own."""
    namespaces = {name: fleet.repos[name].storage_namespace for name in names}
    return guards.witness_keys(witness_heads(spark, referrers, fleet, names), namespaces)


def sweep_stored(
    spark: SparkSession,
    lake: GcConfig,
    partition: GcPartition,
    mark: Mark,
    frames: dict[str, DataFrame],
    run_id: str,
    store: Store,
    judged: Judged,
    acting: Acting,
    clock: Callable[[], dt.datetime],
) -> Collected:
    """The receipts of one repository's sweep alone (a set of one) on the four frames an earlier
    run's `mark` stored for it, once every guard a sweep must pass judged them again
    (judged_again): in dry run a receipt per candidate, else its sweep (expiry first where its
    format wants it, its lease, journal, re-validation and holds), judged as any other. A guard
    that fails refuses it, storage untouched."""
    name = partition.repo.name
    outcome = Collected()
    mine = {asset: frame.withColumn(REPO, F.lit(name)) for asset, frame in frames.items()}
    failed = [
        v for v in judged_again(spark, lake, partition, mark, mine, clock()) if v.severity == "ERROR" and not v.passed
    ]
    if failed:
        why = "; ".join(f"{v.name}: {v.description}" for v in failed)
        outcome.refuse(RECEIPTS, {name: f"sweep refused, storage untouched: {why}"})
        return outcome
    started = time.monotonic()
    stores = {name: store_for(partition.repo)}
    sweep = Receipting(spark, lake, {name: partition}, stores, mine, run_id, acting, clock, mark_id=mark.run_id)
    stored, judge = outcome.storing(store, [name], partition.date), outcome.judging(judged)
    sweep.receipt(outcome, stored, judge, started, {}, lambda going: mine[CANDIDATES].count() if going else 0)
    return outcome


def judged_again(
    spark: SparkSession,
    lake: GcConfig,
    partition: GcPartition,
    mark: Mark,
    frames: dict[str, DataFrame],
    now: dt.datetime,
) -> list[Verdict]:
    """The verdicts a sweep of the frames (with `repo`) an earlier run's `mark` stored for one
    repository must pass (GUARDS' `before_sweep`), judged again as the set judges them, on
    the mark as stored (its verdicts, its heads and its retained commits' raw entries and
    witness, read again by its connector: connectors.stored_mark) and the repositories reaching
    into it marked now, the minimum age by the rule from `mark`'s times, and no candidate held by
    a restore since. What cannot be read again is a failed verdict of its own: the sweep is refused."""
    repo, name = partition.repo, partition.repo.name
    readers = readers_of(lake, [repo])
    retained, live, inventory, candidates = (frames[asset] for asset in ASSETS[:4])
    try:
        own = connectors.stored_mark(spark, repo, retained)
        fleet = Marks([own, mark_set(spark, readers, partition.as_of)]) if readers else own
    except Exception as exc:  # noqa: BLE001 - what the guards would read is unknown: fail closed
        return [_unjudged(f"the stored mark cannot be read again: {task_error(exc)}")]
    if fleet.refused:
        return [_unjudged("; ".join(f"{other}: {why}" for other, why in fleet.refused.items()))]
    rules = fleet.rules(spark, name)
    bounds = {name: _own_cutoffs(repo, partition.as_of, mark.mark_time, mark.source_time, rules.untracked_min_age)}
    protected = {name: (partition.protected_prefixes(rules.format_prefixes), rules.patterns)}
    held = _held(spark, fleet, {name: store_for(repo)}, inventory, now)
    judged = _guards(spark, lake, fleet, [name], retained, live, inventory, candidates, bounds, protected)
    return [
        guards.heads_and_tags_retained_each(retained, [name])[name],
        _live_objects_present(fleet, [name], retained, live, inventory)[name],
        *(verdicts[name] for verdicts in judged),
        guards.candidates_not_held(candidates, held),
    ]


def _unjudged(why: str) -> Verdict:
    return Verdict("guards_judged_again", False, f"the guards cannot be judged again: {why}")
