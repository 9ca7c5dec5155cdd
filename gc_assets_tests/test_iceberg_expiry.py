"""Iceberg's own order (docs/design.md §6.3): before a trash or delete run removes a file, the
snapshots the rules expire are expired through the table's catalog, so every snapshot the
committed metadata lists still reads; a dry run commits nothing; a table located by its
metadata.json keeps every snapshot (retained_by not_committed); a commit that conflicts with
another writer is judged again on the new metadata and retried, then refused; a catalog that
refuses the commit stops the sweep with the table's name."""

from __future__ import annotations

import datetime as dt

import pyarrow.parquet as pq
import pytest
from dagster import AssetKey, DagsterInstance
from pyiceberg.catalog.sql import SqlCatalog

from gc_assets.core.config import RepositoryConfig, Rules, parse_config
from gc_assets.core.time import end_of_day
from gc_assets.runner import run_partition
from gc_assets.sources import SourceError, iceberg_expiry, source_for
from gc_assets_tests import iceberg_tables as corpus
from gc_assets_tests.lakes import write_config
from gc_assets_tests.oracles import oracle_key, retained_brute_force
from gc_assets_tests.postgres_server import USER, postgres  # noqa: F401 - the fixture

AS_OF = end_of_day(corpus.GC_DATE)
RULES = {"default_retention_days": 7}


def _repo(lake: corpus.IcebergLake, **options) -> RepositoryConfig:
    return parse_config({"repositories": [lake.repo_config(rules=RULES, **options)]}, "gc.yaml").repositories[0]


def _ids(lake: corpus.IcebergLake, *ages: int) -> set[str]:
    return {str(lake.notes["snapshots"][days]) for days in ages}


def _rows(table) -> dict[str, list]:
    """Each snapshot the table's metadata lists, scanned by pyiceberg."""
    return {
        str(s.snapshot_id): sorted(table.scan(snapshot_id=s.snapshot_id).to_arrow().to_pylist(), key=repr)
        for s in table.metadata.snapshots
    }


def _keys(lake: corpus.IcebergLake, uris: set[str]) -> set[str]:
    return {oracle_key(uri, lake.namespace_uri) for uri in uris}


def _expire(lake: corpus.IcebergLake, expired_at_mark: set[str], **options):
    repo = _repo(lake, **options)
    return source_for(repo).commit_expiry(None, repo, AS_OF, frozenset(expired_at_mark))


def test_a_delete_run_expires_in_the_catalog_first_and_removes_only_what_no_remaining_snapshot_reaches(tmp_path, spark):
    """The 40/30/20/10-day table under 7-day rules: the 40- and 20-day snapshots expire (the
    30-day one is tagged). A dry run changes nothing; the delete run leaves the catalog listing
    the 30- and 10-day snapshots, each reading as before, refs and tags as they were, and
    deletes exactly the files no remaining snapshot reaches, row 3's data file among them."""
    lake = corpus.aged_table(tmp_path, AS_OF)
    table = lake.table()
    commits, refs = corpus.graph_from_metadata(table)
    retained = set(retained_brute_force(commits, refs, Rules.model_validate(RULES), AS_OF))
    assert retained == _ids(lake, 30, 10)
    before, metadata_before, refs_before = lake.files(), table.metadata_location, table.metadata.refs
    rows_before = {s: r for s, r in _rows(table).items() if s in retained}
    unreachable = before - _keys(lake, corpus.expected_live_uris(table, retained))
    expected = {key for key in unreachable if not corpus.is_hidden(key)}
    assert any(key.startswith("data/") for key in expected)  # row 3's file: only the 20-day snapshot reaches it
    repo = lake.repo_config(rules=RULES, max_delete_fraction=0.9)
    config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")

    dry = run_partition(str(config), lake.name, corpus.GC_DATE, mode="dry_run", instance=DagsterInstance.ephemeral())

    assert dry.success, dry.error
    assert dry.summary["receipts"] == {"would_delete": len(expected)}
    assert lake.table().metadata_location == metadata_before and lake.files() == before

    instance = DagsterInstance.ephemeral()
    outcome = run_partition(str(config), lake.name, corpus.GC_DATE, mode="delete", instance=instance)

    assert outcome.success, outcome.error
    assert set(outcome.summary["checks"].values()) == {"passed"}
    table = lake.table()
    assert {str(s.snapshot_id) for s in table.metadata.snapshots} == retained
    assert table.metadata.refs == refs_before
    assert _rows(table) == rows_before  # every snapshot the catalog lists reads its rows
    assert metadata_before in {entry.metadata_file for entry in table.metadata.metadata_log}
    assert before - lake.files() == expected
    assert lake.files() - before == {oracle_key(table.metadata_location, lake.namespace_uri)}
    assert _keys(lake, corpus.expected_live_uris(table, retained)) <= lake.files()
    receipts = pq.read_table(outcome.summary["outputs"]["deletion_receipts"]).to_pylist()
    assert {r["address"] for r in receipts if r["action"] == "deleted"} == expected
    sweep = instance.get_latest_materialization_event(AssetKey("deletion_receipts")).asset_materialization.metadata
    assert sweep["expired_in_metadata"].value == 2 and sweep["expiry_attempts"].value == 1
    assert sweep["repository_changed_since_mark"].value is False  # the sweep expected the committed expiry


def test_a_delete_run_whose_catalog_lost_the_expiry_is_refused_before_anything_moves(tmp_path, monkeypatch, spark):
    """The expiry's own account says both snapshots are gone, but the catalog still lists them: a
    new read of the table finds them, and the sweep is refused with every file in place."""
    lake = corpus.aged_table(tmp_path, AS_OF)
    repo = lake.repo_config(rules=RULES, max_delete_fraction=0.9)
    config = write_config(tmp_path / "gc.yaml", [repo], tmp_path / "state")
    before, snapshots = lake.files(), {s.snapshot_id for s in lake.table().metadata.snapshots}
    monkeypatch.setattr(SqlCatalog, "commit_table", corpus.acknowledged_but_lost)

    outcome = run_partition(str(config), lake.name, corpus.GC_DATE, mode="delete", instance=DagsterInstance.ephemeral())

    assert not outcome.success
    assert "its metadata still lists 2 commit(s) the mark expired after the expiry" in outcome.error
    assert lake.files() == before
    assert {s.snapshot_id for s in lake.table().metadata.snapshots} == snapshots


def test_a_table_located_by_its_metadata_json_keeps_every_snapshot_as_not_committed(tmp_path):
    """No catalog to commit to: what the rules expire is retained (not_committed), in every mode,
    and nothing is committed."""
    lake = corpus.aged_table(tmp_path, AS_OF)
    table = lake.table()
    by_file = {k: v for k, v in lake.repo_config(rules=RULES).items() if k != "catalog"}
    repo = parse_config({"repositories": [{**by_file, "source": table.metadata_location}]}, "gc.yaml").repositories[0]
    source = source_for(repo)
    commits, refs = source.commit_graph(None)
    verdicts = source.evaluate_retention(None, repo, commits, refs, AS_OF)
    assert all(v.retained for v in verdicts.values())
    assert {c for c, v in verdicts.items() if v.retained_by == "not_committed"} == _ids(lake, 40, 20)
    assert source.commit_expiry(None, repo, AS_OF, frozenset(_ids(lake, 40, 20))).expired == frozenset()
    assert lake.table().metadata_location == table.metadata_location


def _tag_the_20_day_snapshot(lake: corpus.IcebergLake) -> None:
    lake.table().manage_snapshots().create_tag(lake.notes["snapshots"][20], "hold").commit()


def _append_a_day_ago(lake: corpus.IcebergLake) -> None:
    with corpus.clock_at(AS_OF - dt.timedelta(days=1)):
        lake.table().append(corpus.rows([5]))


@pytest.mark.parametrize(
    "another_writer, still_expired",
    [(_tag_the_20_day_snapshot, (40,)), (_append_a_day_ago, (40, 20))],
)
def test_a_conflicting_commit_is_judged_again_on_the_new_metadata_and_retried(
    tmp_path, monkeypatch, another_writer, still_expired
):
    """Between the judgment and the commit another writer commits: the commit conflicts, the new
    metadata is judged again and the retry expires what the rules still expire. A tag placed
    meanwhile keeps the 20-day snapshot (committed onto the new metadata unchecked, the removal
    would drop the tag with it); a snapshot appended meanwhile is retained."""
    lake = corpus.aged_table(tmp_path, AS_OF)
    commit_table = SqlCatalog.commit_table
    ours: list[tuple] = []
    racing = False

    def another_writer_first(catalog, table, requirements, updates):
        nonlocal racing
        if not racing:
            ours.append(updates)
            if len(ours) == 1:
                racing = True
                another_writer(lake)
                racing = False
        return commit_table(catalog, table, requirements, updates)

    before = {s.snapshot_id for s in lake.table().metadata.snapshots}
    monkeypatch.setattr(SqlCatalog, "commit_table", another_writer_first)
    expiry = _expire(lake, _ids(lake, 40, 20))

    assert len(ours) == 2 and expiry.attempts == 2
    assert expiry.expired == expiry.gone == frozenset(_ids(lake, *still_expired))
    table = lake.table()
    appended = {str(s.snapshot_id) for s in table.metadata.snapshots} - {str(i) for i in before}
    remaining = _ids(lake, 40, 30, 20, 10) - expiry.expired
    assert {str(s.snapshot_id) for s in table.metadata.snapshots} == remaining | appended
    assert set(_rows(table)) == remaining | appended  # each reads
    if another_writer is _tag_the_20_day_snapshot:
        assert table.metadata.refs["hold"].snapshot_id == lake.notes["snapshots"][20]
        held = table.scan(snapshot_id=lake.notes["snapshots"][20]).to_arrow()
        assert sorted(held.column("id").to_pylist()) == [1, 2, 3]
    else:
        assert {str(table.metadata.refs["main"].snapshot_id)} == appended


def test_a_table_another_writer_keeps_changing_is_refused_after_a_few_attempts(tmp_path, monkeypatch):
    lake = corpus.aged_table(tmp_path, AS_OF)
    metadata_before = lake.table().metadata_location
    commit_table = SqlCatalog.commit_table
    attempts = 0

    def always_another_writer_first(catalog, table, requirements, updates):
        nonlocal attempts
        if any(isinstance(r, iceberg_expiry.JudgedMetadata) for r in requirements):
            attempts += 1
            with lake.table().transaction() as transaction:
                transaction.set_properties({"writer.commits": str(attempts)})
        return commit_table(catalog, table, requirements, updates)

    monkeypatch.setattr(SqlCatalog, "commit_table", always_another_writer_first)
    monkeypatch.setattr(iceberg_expiry, "RETRY_WAIT_SECONDS", 0)
    with pytest.raises(SourceError) as refused:
        _expire(lake, _ids(lake, 40, 20))

    assert attempts == iceberg_expiry.EXPIRY_ATTEMPTS
    message = str(refused.value)
    assert message.startswith("repository 'aged': Iceberg table db.aged: another writer committed during each of 4")
    assert "Nothing was moved or deleted" in message
    table = lake.table()
    assert len(table.metadata.snapshots) == 4 and table.metadata.metadata_log[-1].metadata_file != metadata_before


def test_a_postgresql_catalog_that_refuses_the_commit_is_named_and_one_that_grants_it_expires(
    tmp_path,
    postgres,  # noqa: F811 - the fixture
):
    """A catalog user allowed to read but not to write the catalog: the refusal names the
    repository and the table, and the metadata is unchanged; the owner's commit expires."""
    lake = corpus.aged_table(tmp_path, AS_OF, catalog_uri=postgres.create_database("iceberg_expiry"))
    with postgres.connect("iceberg_expiry") as connection:
        connection.execute("DROP ROLE IF EXISTS reader")
        connection.execute("CREATE ROLE reader LOGIN")
        connection.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader")
    reader_uri = postgres.url("iceberg_expiry").replace(f"//{USER}@", "//reader@")
    metadata_before = lake.table().metadata_location

    with pytest.raises(SourceError) as refused:
        _expire(lake, _ids(lake, 40, 20), catalog={**lake.repo_config()["catalog"], "uri": reader_uri})

    message = str(refused.value)
    assert message.startswith("repository 'aged': Iceberg table db.aged: the catalog did not commit the expiry")
    assert "permission denied" in message and "Nothing was moved or deleted" in message
    assert lake.table().metadata_location == metadata_before

    expiry = _expire(lake, _ids(lake, 40, 20))

    assert expiry.expired == frozenset(_ids(lake, 40, 20)) and expiry.metadata_before == metadata_before
    table = lake.table()
    assert {str(s.snapshot_id) for s in table.metadata.snapshots} == _ids(lake, 30, 10)
    assert set(_rows(table)) == _ids(lake, 30, 10)
