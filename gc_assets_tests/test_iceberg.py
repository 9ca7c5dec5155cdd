"""The Iceberg connector on a corpus of real tables written by pyiceberg (SQLite catalog).

For every table the live set equals an independent computation from pyiceberg's own
scan planning and metadata of every retained snapshot; one real delete run then
leaves every retained snapshot and ref readable by pyiceberg.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance

from gc_assets.core.addresses import with_relative_keys
from gc_assets.core.config import RepositoryConfig, Rules, parse_config
from gc_assets.core.time import end_of_day
from gc_assets.mark.candidates import orphans
from gc_assets.mark.live import deduplicated
from gc_assets.runner import run_partition
from gc_assets.sources import LIVE_ENTRY_SCHEMA, SourceError, iceberg, source_for
from gc_assets.sources.iceberg import (
    IcebergPolicy,
    IcebergSource,
    RefPolicy,
    canonical_uri,
)
from gc_assets.stores.local import LocalStore
from gc_assets_tests import iceberg_tables as corpus
from gc_assets_tests.lakes import write_config
from gc_assets_tests.live_sets import refuse_unlisted_outside
from gc_assets_tests.oracles import oracle_key, retained_brute_force

AS_OF = end_of_day(corpus.GC_DATE)
CUTOFF = AS_OF - dt.timedelta(hours=24)
RULES = {
    "default_retention_days": 2,
    "branches": [{"branch_id": "main", "retention_days": 4}, {"branch_id": "dev", "retention_days": 2.5}],
}
GC_OWN = ("_gc/", "_gc_trash/")
DAY_MS = 24 * 3600 * 1000


def _repo(lake: corpus.IcebergLake, **options) -> RepositoryConfig:
    return parse_config({"repositories": [lake.repo_config(**options)]}, "gc.yaml").repositories[0]


@dataclass
class Marked:
    repo: RepositoryConfig
    source: IcebergSource
    retained: set[str]
    heads: set[str]
    live: dict[str, dict]  # relative key (or outside URI) -> live_files row


def _mark(spark, lake: corpus.IcebergLake, **options) -> Marked:
    repo = _repo(lake, **options)
    source = source_for(repo)
    commits, refs = source.commit_graph(spark)
    verdicts = source.evaluate_retention(spark, repo, commits, refs, AS_OF)
    retained = {commit_id for commit_id, verdict in verdicts.items() if verdict.retained}
    heads = {ref.commit_id for ref in refs}
    retained_frame = spark.createDataFrame([(c,) for c in sorted(retained)], "commit_id string")
    entries = source.live_entries(
        spark, retained_frame, spark.createDataFrame([(c,) for c in sorted(heads)], "commit_id string")
    )
    keyed = with_relative_keys(entries, repo.storage_namespace, repo.external_prefixes)
    refuse_unlisted_outside(spark, source, repo, keyed, retained_frame)  # as the mark refuses for every format
    live = {row["address"]: row.asDict() for row in deduplicated(keyed).collect()}
    return Marked(repo, source, retained, heads, live)


def _keys(uris: set[str], namespace: str) -> set[str]:
    keys = {oracle_key(uri, namespace) for uri in uris}
    assert None not in keys
    return keys  # type: ignore[return-value]


@pytest.fixture(scope="module")
def tables(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("corpus")
    return {
        build.__name__: build(root)
        for build in (corpus.evolving_table, corpus.branching_table, corpus.maintained_table)
    }


@pytest.fixture(scope="module")
def marked(tables, spark):
    return {name: _mark(spark, lake, rules=RULES) for name, lake in tables.items()}


@pytest.mark.parametrize("name", ["evolving_table", "branching_table", "maintained_table"])
def test_live_set_equals_pyiceberg_scan_planning_and_metadata(tables, marked, name):
    lake, mark = tables[name], marked[name]
    table = lake.table()
    commits, refs = corpus.graph_from_metadata(table)
    graph_commits, graph_refs = mark.source.commit_graph(None)
    assert set(graph_commits) == set(commits) and set(graph_refs) == set(refs)
    expected_retained = set(retained_brute_force(commits, refs, Rules.model_validate(RULES), AS_OF))
    assert mark.retained == expected_retained
    assert {r.commit_id for r in refs if r.kind == "tag"} <= mark.retained  # tagged snapshots survive
    assert len(mark.retained) < len(commits)  # something expires, so the comparison has teeth

    assert set(mark.live) == _keys(corpus.expected_live_uris(table, mark.retained), lake.namespace_uri)
    at_head = {key for key, row in mark.live.items() if row["at_head"]}
    history_only = _keys({entry.metadata_file for entry in table.metadata.metadata_log}, lake.namespace_uri)
    assert _keys(corpus.expected_live_uris(table, mark.heads), lake.namespace_uri) - history_only <= at_head
    assert all(row["in_namespace"] for row in mark.live.values())
    sources = {row["source"] for key, row in mark.live.items() if key.startswith("data/")}
    assert sources == {"committed"}
    assert {row["source"] for key, row in mark.live.items() if key.startswith("metadata/")} == {"metadata"}


COUNTING_IO = """
from pyiceberg.io.pyarrow import PyArrowFileIO


class CountingFileIO(PyArrowFileIO):
    \"\"\"Appends every path opened for reading to the file named by `counting.log`.\"\"\"

    def new_input(self, location):
        with open(self.properties["counting.log"], "a") as log:
            log.write(location + "\\n")
        return super().new_input(location)
"""


def test_each_manifest_is_read_once_though_snapshots_share_it(tables, marked, spark, tmp_path, monkeypatch):
    """The executors' own file reads, counted by a FileIO shipped to them: every manifest
    the snapshots list is opened exactly once, though snapshots share manifests."""
    module = tmp_path / "counting_io_for_manifests.py"
    module.write_text(COUNTING_IO)
    spark.sparkContext.addPyFile(str(module))
    log = tmp_path / "reads.log"
    source = marked["evolving_table"].source
    counting = {
        **source._io_properties,
        "py-io-impl": "counting_io_for_manifests.CountingFileIO",
        "counting.log": str(log),
    }
    monkeypatch.setattr(type(source), "_io_properties", property(lambda _: counting))
    snapshots = source._snapshots(spark, None, set())
    readers = source.readers
    listed = [r["manifest_path"] for r in iceberg._manifests(snapshots, readers).select("manifest_path").collect()]
    assert len(listed) > len(set(listed))  # manifests are shared between snapshots
    log.write_text("")
    files = iceberg._files(spark, iceberg._manifests(snapshots, readers), readers).collect()
    reads = Counter(canonical_uri(line) for line in log.read_text().splitlines())
    manifests = {canonical_uri(m) for m in listed}
    assert {path: reads[path] for path in manifests} == {path: 1 for path in manifests}
    assert files and {canonical_uri(r["manifest_path"]) for r in files} <= manifests


def test_branch_tags_statistics_and_deleted_branch(tables, marked):
    lake, mark = tables["branching_table"], marked["branching_table"]
    table = lake.table()
    for note in ("statistics", "partition_statistics"):
        assert oracle_key(lake.notes[note], lake.namespace_uri) in mark.live
    dangling = str(lake.notes["feature_head"])  # head of the removed branch, older than the default 2 days
    assert dangling not in mark.retained
    own_files = {oracle_key(f["file_path"], lake.namespace_uri) for f in table.inspect.files(int(dangling)).to_pylist()}
    assert own_files - set(mark.live)  # the removed branch's own append is no longer live
    dev = table.metadata.snapshot_by_name("dev")
    equality_deletes = [f["file_path"] for f in table.inspect.delete_files(dev.snapshot_id).to_pylist()]
    assert equality_deletes and all(mark.live[oracle_key(p, lake.namespace_uri)]["at_head"] for p in equality_deletes)


def test_candidates_of_a_maintained_table(tables, marked, spark):
    """Junk and files of snapshots pyiceberg already expired are untracked, files of snapshots the
    rules expire are expired, metadata.json files beyond the metadata log go, hidden paths stay."""
    lake, mark = tables["maintained_table"], marked["maintained_table"]
    namespace = lake.namespace_uri
    inventory = LocalStore(namespace).list(spark)
    live = spark.createDataFrame(
        [(key, row["in_namespace"]) for key, row in mark.live.items()], "address string, in_namespace boolean"
    )
    committed = with_relative_keys(mark.source.committed_addresses(spark), namespace)
    candidates = {
        r["address"]: r["reason"]
        for r in orphans(inventory, live, committed, CUTOFF, GC_OWN, mark.source.protected_patterns).collect()
    }
    commits, refs = corpus.graph_from_metadata(lake.table())
    retained = set(retained_brute_force(commits, refs, Rules.model_validate(RULES), AS_OF))
    live = _keys(corpus.expected_live_uris(lake.table(), retained), namespace)  # pyiceberg's reading, not the mark's
    expected = {key for key in lake.files() if key not in live and not corpus.is_hidden(key)}
    assert set(candidates) == expected
    visible_junk = {key for key in lake.notes["junk"] if not corpus.is_hidden(key)}
    assert visible_junk == {
        "data/junk-from-a-failed-write.parquet",
        "metadata/abandoned-m0.avro",
        "notes/readme.txt",
        "data/_region=x/kept.parquet",  # a partition directory is not hidden
    }
    assert all(candidates[key] == "untracked" for key in visible_junk)
    assert any(key.endswith(".metadata.json") and reason == "untracked" for key, reason in candidates.items())
    assert "expired" in candidates.values()
    table = lake.table()
    expired_by_rules = set(c.commit_id for c in corpus.graph_from_metadata(table)[0]) - mark.retained
    assert expired_by_rules  # the rules expire something beyond what pyiceberg already removed


def test_live_file_outside_the_namespace_is_refused_unless_configured(tmp_path, spark):
    lake = corpus.outside_file_table(tmp_path, tmp_path / "elsewhere")
    outside = lake.notes["outside"]
    with pytest.raises(SourceError, match="outside the storage namespace") as error:
        _mark(spark, lake)
    assert outside in str(error.value)
    mark = _mark(spark, lake, external_prefixes=[(tmp_path / "elsewhere").as_uri()])
    assert mark.live[outside]["in_namespace"] is False
    escaping = f"{lake.namespace_uri}/../elsewhere/imported.parquet"  # a prefix match that leaves the namespace
    entries = spark.createDataFrame([(escaping, 1, "committed", True)], LIVE_ENTRY_SCHEMA)
    keyed = with_relative_keys(entries, mark.repo.storage_namespace, mark.repo.external_prefixes)
    retained = spark.createDataFrame([("c",)], "commit_id string")
    with pytest.raises(SourceError, match="outside the storage namespace"):
        refuse_unlisted_outside(spark, mark.source, mark.repo, keyed, retained)


def test_metadata_json_source_location_and_staleness(tables, spark):
    lake = tables["branching_table"]
    table = lake.table()
    catalog_source = source_for(_repo(lake))
    by_file = {k: v for k, v in lake.repo_config().items() if k != "catalog"}
    file_source = source_for(
        parse_config({"repositories": [{**by_file, "source": table.metadata_location}]}, "gc.yaml").repositories[0]
    )
    assert file_source.commit_graph(None) == catalog_source.commit_graph(None)
    assert file_source.fingerprint() == catalog_source.fingerprint()
    older = table.metadata.metadata_log[-1].metadata_file
    stale = source_for(parse_config({"repositories": [{**by_file, "source": older}]}, "gc.yaml").repositories[0])
    with pytest.raises(SourceError, match="is not the table's newest"):
        stale.commit_graph(None)
    parent = source_for(_repo(lake).model_copy(update={"storage_namespace": lake.namespace.parent.as_uri()}))
    with pytest.raises(SourceError, match="is not the storage namespace"):
        parent.commit_graph(None)


def _serve_rest_catalog(tables: dict[str, str]) -> ThreadingHTTPServer:
    """The two REST catalog endpoints pyiceberg needs to load a table: config and load-table.

    `tables` maps "namespace/table" to a metadata.json URI, served as the catalog's current metadata.
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            load = re.fullmatch(r"/v1/namespaces/([^/]+)/tables/([^/]+)", path)
            if path == "/v1/config":
                body = {"defaults": {}, "overrides": {}}
            elif load and f"{load[1]}/{load[2]}" in tables:
                location = tables[f"{load[1]}/{load[2]}"]
                metadata = json.loads(Path(location.removeprefix("file://")).read_text())
                body = {"metadata-location": location, "metadata": metadata, "config": {}}
            else:
                self.send_error(404, "no such table")
                return
            payload = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_rest_catalog_loads_the_same_table(tables):
    lake = tables["branching_table"]
    table = lake.table()
    server = _serve_rest_catalog({"db/branching": table.metadata_location})
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        rest = source_for(
            _repo(lake).model_copy(
                update={"catalog": _repo(lake).catalog.model_copy(update={"type": "rest", "uri": uri})}
            )
        )
        sql = source_for(_repo(lake))
        assert rest.commit_graph(None) == sql.commit_graph(None)
        assert rest.fingerprint() == sql.fingerprint()
        missing = source_for(
            _repo(lake).model_copy(
                update={
                    "catalog": _repo(lake).catalog.model_copy(update={"type": "rest", "uri": uri, "table": "db.nope"})
                }
            )
        )
        with pytest.raises(SourceError, match="cannot load the Iceberg table: NoSuchTableError"):
            missing.commit_graph(None)
    finally:
        server.shutdown()
        server.server_close()


def _read_everything(table, snapshot_ids: set[str]) -> dict[str, list]:
    """Rows of each snapshot as pyiceberg reads them; where pyiceberg cannot plan (equality deletes),
    every data and delete file the snapshot lists, read with pyarrow."""
    contents = {}
    for snapshot_id in sorted(snapshot_ids):
        try:
            rows = table.scan(snapshot_id=int(snapshot_id)).to_arrow().to_pylist()
        except ValueError:
            files = table.inspect.files(snapshot_id=int(snapshot_id)).to_pylist()
            rows = [pq.read_table(f["file_path"].removeprefix("file://")).num_rows for f in files]
        contents[snapshot_id] = sorted(rows, key=repr)
    return contents


def test_retention_iceberg_reads_table_and_ref_properties(tmp_path):
    lake = corpus.maintained_table(tmp_path)
    table = lake.table()
    first = table.metadata.snapshots[0].snapshot_id
    table.manage_snapshots().create_branch(first, "audit", max_ref_age_ms=DAY_MS).commit()
    table.manage_snapshots().create_tag(first, "fresh-tag").commit()
    with table.transaction() as transaction:
        transaction.set_properties(
            {"history.expire.max-snapshot-age-ms": str(3 * DAY_MS), "history.expire.min-snapshots-to-keep": "2"}
        )
    source = source_for(_repo(lake, retention="iceberg"))
    assert source.retention_rules(None, source.repo) is None
    commits, refs = source.commit_graph(None)
    verdicts = source.evaluate_retention(None, source.repo, commits, refs, AS_OF)
    policy = IcebergPolicy(
        max_snapshot_age_ms=3 * DAY_MS, min_snapshots_to_keep=2, refs={"audit": RefPolicy(max_ref_age_ms=DAY_MS)}
    )
    expected = corpus.iceberg_retained_oracle(*corpus.graph_from_metadata(lake.table()), policy, AS_OF)
    assert {c for c, v in verdicts.items() if v.retained} == expected
    assert verdicts[str(first)].retained_by == "audit"  # aged out: its own snapshot only
    assert len(expected) < len(commits)


def test_delete_run_with_iceberg_retention_keeps_every_retained_snapshot_and_ref_readable(tmp_path, spark):
    """The whole graph in delete mode, under the table's own retention (mark and sweep evaluate it alike)."""
    lake = corpus.branching_table(tmp_path)
    table = lake.table()
    with table.transaction() as transaction:
        transaction.set_properties({"history.expire.max-snapshot-age-ms": str(3 * DAY_MS)})
    lake.age_files()
    table = lake.table()
    commits, refs = corpus.graph_from_metadata(table)
    policy = IcebergPolicy(max_snapshot_age_ms=3 * DAY_MS)
    retained = corpus.iceberg_retained_oracle(commits, refs, policy, AS_OF)
    assert {r.commit_id for r in refs} <= retained < {c.commit_id for c in commits}
    live = _keys(corpus.expected_live_uris(table, retained), lake.namespace_uri)
    before = lake.files()
    expected = {key for key in before if key not in live and not corpus.is_hidden(key)}
    readable_before = _read_everything(table, retained)

    config = write_config(
        tmp_path / "gc.yaml", [lake.repo_config(retention="iceberg", max_delete_fraction=0.9)], tmp_path / "state"
    )
    outcome = run_partition(str(config), lake.name, corpus.GC_DATE, mode="delete", instance=DagsterInstance.ephemeral())
    assert outcome.success, outcome.error
    assert set(outcome.summary["checks"].values()) == {"passed"}
    assert outcome.summary["receipts"] == {"deleted": len(expected)}
    assert before - lake.files() == expected
    assert outcome.summary["retained_commits"] == len(retained)

    table = lake.table()
    assert lake.files() - before == {oracle_key(table.metadata_location, lake.namespace_uri)}  # the expiry's commit
    assert {str(s.snapshot_id) for s in table.metadata.snapshots} == retained  # expired through the catalog first
    assert _read_everything(table, retained) == readable_before
    for name, ref in table.metadata.refs.items():
        if name != "dev":  # dev's head has an equality delete, which pyiceberg cannot plan (read file by file above)
            assert table.scan(snapshot_id=ref.snapshot_id).to_arrow().num_rows > 0
