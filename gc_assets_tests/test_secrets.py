"""No credential leaks: sentinel secrets (unique random strings) sit in the environment, in each
cloud's standard variables, and behind gc.yaml's `{env: NAME}` references for S3 (moto), Azure
(Azurite, keyed with a sentinel account key) and GCS (fake-gcs-server, a sentinel token). One CLI
process runs the graph on every repository, each in its configured mode (delete on each cloud, a
dry run with a SAS), and fails on wrong credentials and an unreachable endpoint; the CLI refuses
bad configuration. No sentinel may appear in anything a person or a script can read: its
stdout, stderr and JSON summary, the log files and every file under state_dir (Parquet read back
as rows), the Dagster instance (run tags, event log, stored files), the Spark event log, and the
Dagster UI's answers for the run, asset and check pages.

Each detector proves it sees what it scans: a planted string (not a secret) is carried by the
same runs into every place (it names the repositories, the state directory, the namespaces and
one orphan object), and each scan must find it where it finds no secret.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import http.server
import json
import logging
import os
import pickle
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import unquote

import boto3
import pyarrow.parquet as pq
import pytest
import yaml

from gc_assets.core.config import EnvSecret
from gc_assets.core.time import AS_OF_TAG
from gc_assets.demo.lakegen import DOCS_RULES
from gc_assets_tests.blob_servers import AZURITE_ACCOUNT, _free_port, azurite_server, fake_gcs_server
from gc_assets_tests.cli_runs import run_cli
from gc_assets_tests.lakes import lake_on_disk
from gc_assets_tests.test_webserver import PROJECT, _graphql, _stop

PLANTED = "planted" + secrets.token_hex(8)  # not a secret: proves each detector reads its place
CONTAINER = "gc-secrets"


def sentinel() -> str:
    return "sntl" + secrets.token_hex(16)


@dataclass
class Cloud:
    """One store holding the test lake, and the variables that reach it."""

    name: str  # the repository's name prefix
    prefix: str  # the lake's key prefix in the container or bucket
    namespace: str
    section: dict[str, Any]  # the repository's gc.yaml store settings (`s3`, `azure`, `gcs`)
    variables: dict[str, str]  # the CLI's environment: standard chain and `{env:}` targets
    put: Callable[[str, bytes], None]  # key relative to the container or bucket
    keys: Callable[[], set[str]]

    @property
    def repo(self) -> str:
        return f"{self.name}-{PLANTED}"


@dataclass
class Scan:
    """Every text a run left readable, by place."""

    places: dict[str, str] = field(default_factory=dict)

    def add(self, place: str, text: str) -> None:
        self.places[place] = self.places.get(place, "") + "\n" + text

    def holding(self, needle: str) -> set[str]:
        return {place for place, text in self.places.items() if needle in text}


def _s3(endpoint: str, prefix: str) -> Cloud:
    ours = {"GC_TEST_S3_KEY_ID": sentinel(), "GC_TEST_S3_SECRET": sentinel(), "GC_TEST_S3_TOKEN": sentinel()}
    chain = {"AWS_ACCESS_KEY_ID": sentinel(), "AWS_SECRET_ACCESS_KEY": sentinel(), "AWS_SESSION_TOKEN": sentinel()}
    client = boto3.session.Session(aws_access_key_id="setup", aws_secret_access_key="setup").client(
        "s3", endpoint_url=endpoint, region_name="us-east-1"
    )
    client.create_bucket(Bucket=CONTAINER)
    section = {
        "endpoint_url": endpoint,
        "region": "us-east-1",
        "access_key_id": {"env": "GC_TEST_S3_KEY_ID"},
        "secret_access_key": {"env": "GC_TEST_S3_SECRET"},
        "session_token": {"env": "GC_TEST_S3_TOKEN"},
    }

    def keys() -> set[str]:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=CONTAINER)
        return {item["Key"] for page in pages for item in page.get("Contents", [])}

    return Cloud(
        "s3",
        prefix,
        f"s3://{CONTAINER}/{prefix}",
        {"s3": section},
        {**ours, **chain},
        lambda key, data: client.put_object(Bucket=CONTAINER, Key=key, Body=data),
        keys,
    )


def _azure(endpoint: str, key: str, prefix: str) -> Cloud:
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient(endpoint, credential={"account_name": AZURITE_ACCOUNT, "account_key": key})
    service.create_container(CONTAINER)
    container = service.get_container_client(CONTAINER)
    connection = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};BlobEndpoint={endpoint};"
    )
    return Cloud(
        "azure",
        prefix,
        f"abfss://{CONTAINER}@{AZURITE_ACCOUNT}.dfs.core.windows.net/{prefix}",
        {"azure": {"endpoint_url": endpoint, "account_key": {"env": "GC_TEST_AZURE_KEY"}}},
        {"GC_TEST_AZURE_KEY": key, "AZURE_STORAGE_CONNECTION_STRING": connection, "AZURE_CLIENT_SECRET": sentinel()},
        lambda name, data: container.upload_blob(name, data, overwrite=True),
        lambda: {blob.name for blob in container.list_blobs()},
    )


def _azure_sas(keyed: Cloud, key: str, prefix: str) -> Cloud:
    """The Azure container again, reached with a container SAS (read, list, write, delete)."""
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    permissions = ContainerSasPermissions(read=True, list=True, write=True, add=True, create=True, delete=True)
    expiry = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    sas = generate_container_sas(AZURITE_ACCOUNT, CONTAINER, account_key=key, permission=permissions, expiry=expiry)
    endpoint = keyed.section["azure"]["endpoint_url"]
    return Cloud(
        "azure-sas",
        prefix,
        f"abfss://{CONTAINER}@{AZURITE_ACCOUNT}.dfs.core.windows.net/{prefix}",
        {"azure": {"endpoint_url": endpoint, "sas_token": {"env": "GC_TEST_AZURE_SAS_OK"}}},
        {"GC_TEST_AZURE_SAS_OK": sas, "GC_TEST_AZURE_SAS_SIG": unquote(sas.split("sig=")[1].split("&")[0])},
        keyed.put,
        keyed.keys,
    )


def _gcs(endpoint: str, prefix: str) -> Cloud:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    service = storage.Client(
        project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint}
    )
    bucket = service.create_bucket(CONTAINER)
    return Cloud(
        "gcs",
        prefix,
        f"gs://{CONTAINER}/{prefix}",
        {"gcs": {"endpoint_url": endpoint, "project": "test", "token": {"env": "GC_TEST_GCS_TOKEN"}}},
        {"GC_TEST_GCS_TOKEN": sentinel(), "CLOUDSDK_AUTH_ACCESS_TOKEN": sentinel()},
        lambda key, data: bucket.blob(key).upload_from_string(data),
        lambda: {blob.name for blob in service.list_blobs(CONTAINER)},
    )


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str, str, str]]:
    """(moto's endpoint, Azurite's endpoint, Azurite's sentinel account key, fake-gcs-server's endpoint)."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    key = base64.b64encode(b"sntl" + secrets.token_bytes(44)).decode()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    try:
        with azurite_server(key) as azure, fake_gcs_server() as gcs:
            yield f"http://{host}:{port}", azure, key, gcs
    finally:
        moto.stop()


@dataclass
class Runs:
    root: Path
    state: Path
    home: Path
    event_logs: Path
    config: Path
    env: dict[str, str]
    clouds: list[Cloud]  # the clouds deleted on, then the SAS repository (dry run)
    secrets: dict[str, str]  # variable -> value: every sentinel of the environment
    process: subprocess.CompletedProcess  # the CLI process that ran every repository
    printed: dict[str, str]  # label -> its repository's lines of the output
    summaries: dict[str, dict[str, Any]]  # label -> its repository's JSON summary


def _collect(
    config: Path, env: dict[str, str], as_of: dt.datetime, labels: dict[str, str], failing: set[str]
) -> tuple[subprocess.CompletedProcess, dict[str, str], dict[str, dict[str, Any]]]:
    """One `gc-assets run` over several repositories (`labels`: repository -> label), each in its
    configured mode, as scripts run it: the process, each label's lines of its output and its JSON
    summary (the last lines, one per repository). Exactly the `failing` repositories failed, as
    its exit status (1 if any failed), its error lines and each repository's printed summary tell."""
    args = ["run", "--config", str(config), "--as-of", as_of.isoformat(), "--json"]
    args += [word for repo in labels for word in ("--repo", repo)]
    done = subprocess.run(
        [sys.executable, "-m", "gc_assets.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=env["GC_TEST_CWD"],
    )
    if done.returncode != (1 if failing else 0) or _said_failed(done) != failing:
        pytest.fail(f"not exactly {sorted(failing)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    lines = done.stdout.strip().splitlines()
    summaries = {labels[summary["repo"]]: summary for summary in map(json.loads, lines[-len(labels) :])}
    printed = dict.fromkeys(labels.values(), "")
    label = None
    for line in lines[: -len(labels)]:
        heading = re.match(r"repository (\S+)(?:$|  partition )", line)  # its progress, or its summary
        if heading:
            label = labels[heading[1]]
        if label is not None:
            printed[label] += line + "\n"
    for repo, label in labels.items():
        outcome = "FAILED" if repo in failing else "succeeded"
        assert f"  run {summaries[label]['run_id']} {outcome} in " in printed[label], printed[label][-3000:]
    return done, printed, summaries


def _said_failed(done: subprocess.CompletedProcess) -> set[str]:
    """The repositories the CLI reported failed, one line each on stderr."""
    return set(re.findall(r"^gc-assets: repository (\S+) failed: ", done.stderr, re.MULTILINE))


def _unreachable() -> str:
    return f"http://127.0.0.1:{_free_port()}"


def _orphan(cloud: Cloud) -> str:
    """The key of the object planted in `cloud`'s lake that no commit names."""
    return f"{cloud.prefix}/data/{PLANTED}.orphan"


@pytest.fixture(scope="module")
def runs(servers, tmp_path_factory) -> Runs:
    """The lake on each cloud collected by the CLI as scripts run it, in one process (one JVM):
    it deletes on each cloud, dry-runs the SAS repository (a SAS is sent in the query of every
    request, reads and lists included) and fails on the error paths, each repository in the mode
    gc.yaml gives it."""
    moto, azure, azure_key, gcs = servers
    root = tmp_path_factory.mktemp("secrets")
    prefix = f"{PLANTED}/repo"
    clouds = [_s3(moto, prefix), _azure(azure, azure_key, prefix), _gcs(gcs, prefix)]
    sas_prefix = f"{PLANTED}/sas"
    sas_cloud = _azure_sas(clouds[1], azure_key, sas_prefix)
    lake = lake_on_disk(root / "local", fmt="jsonl", churn=8)
    files = [p for p in sorted(lake.namespace.rglob("*")) if p.is_file()]
    uploads = [
        (cloud, f"{cloud.prefix}/{path.relative_to(lake.namespace).as_posix()}", path.read_bytes())
        for cloud in clouds + [sas_cloud]
        for path in files
    ] + [(cloud, _orphan(cloud), b"an object no commit names") for cloud in clouds + [sas_cloud]]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda upload: upload[0].put(*upload[1:]), uploads))

    wrong_key = base64.b64encode(b"sntl" + secrets.token_bytes(44)).decode()
    sas = f"sv=2021-08-06&ss=b&srt=sco&sp=rwdl&se=2099-01-01T00:00:00Z&sig={sentinel()}"
    errors = {
        "GC_TEST_AZURE_WRONG_KEY": wrong_key,  # Azurite refuses it: AuthenticationFailed
        "GC_TEST_AZURE_SAS": sas,  # a SAS is sent in every URL: to an endpoint nobody listens on
    }
    variables = {name: value for cloud in clouds + [sas_cloud] for name, value in cloud.variables.items()} | errors
    common = {
        "format": "lakefs-export",
        "rules": DOCS_RULES,
        "min_object_age_hours": 0,
        "allow_unsafe_min_age": True,
        "max_delete_fraction": 0.95,
        "mode": "delete",
    }
    repos = [
        {
            **common,
            "name": c.repo,
            "storage_namespace": c.namespace,
            "source": f"{c.namespace}/_lakefs/export",
            **c.section,
        }
        for c in clouds
    ]
    repos.append(
        {
            **common,
            "mode": "dry_run",
            "name": sas_cloud.repo,
            "storage_namespace": sas_cloud.namespace,
            "source": f"{sas_cloud.namespace}/_lakefs/export",
            **sas_cloud.section,
        }
    )
    failing = {
        f"azure-wrong-key-{PLANTED}": (
            f"abfss://{CONTAINER}@{AZURITE_ACCOUNT}.dfs.core.windows.net/{PLANTED}/wrong",
            {"azure": {"endpoint_url": azure, "account_key": {"env": "GC_TEST_AZURE_WRONG_KEY"}}},
        ),
        f"azure-sas-down-{PLANTED}": (
            f"abfss://{CONTAINER}@{AZURITE_ACCOUNT}.dfs.core.windows.net/{PLANTED}/down",
            {
                "azure": {
                    "endpoint_url": f"{_unreachable()}/{AZURITE_ACCOUNT}",
                    "sas_token": {"env": "GC_TEST_AZURE_SAS"},
                }
            },
        ),
    }
    repos += [
        {**common, "name": name, "storage_namespace": namespace, "source": f"{namespace}/_lakefs/export", **section}
        for name, (namespace, section) in failing.items()
    ]
    state = root / f"state-{PLANTED}"
    config = root / "gc.yaml"
    config.write_text(
        yaml.safe_dump({"state_dir": str(state), "partitions_start_date": "2022-01-01", "repositories": repos})
    )

    home = root / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT / "dagster.yaml", home / "dagster.yaml")
    event_logs = root / "spark-events"
    event_logs.mkdir()
    spark_conf = (
        f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir={event_logs.as_uri()} "
        "--conf spark.eventLog.compress=false"
    )
    env = {
        **os.environ,
        **variables,
        "DAGSTER_HOME": str(home),
        "GC_ASSETS_SHUFFLE_PARTITIONS": "2",
        "PYSPARK_SUBMIT_ARGS": f"{spark_conf} pyspark-shell",
        "GC_TEST_CWD": str(root),
    }
    for name in ("AWS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT"):
        env.pop(name, None)

    manifest = json.loads((lake.namespace / "_lakefs" / "export" / "_manifest.json").read_text())
    time.sleep(1.1)  # storage times are whole seconds: every upload strictly before as_of
    as_of = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    for cloud in clouds + [sas_cloud]:
        cloud.put(
            f"{cloud.prefix}/_lakefs/export/_manifest.json",
            json.dumps({**manifest, "exported_at": as_of.isoformat()}).encode(),
        )
    labels = {cloud.repo: cloud.name for cloud in clouds + [sas_cloud]} | {name: name for name in failing}
    process, printed, summaries = _collect(config, env, as_of, labels, set(failing))
    return Runs(
        root, state, home, event_logs, config, env, clouds + [sas_cloud], variables, process, printed, summaries
    )


# -- gc.yaml's references, without servers


def _repo(**stores: Any) -> dict[str, Any]:
    return {"name": "prod", "format": "delta", "storage_namespace": "s3://bucket/table", **stores}


def test_a_credential_is_a_reference_and_a_missing_or_plain_one_is_refused_by_name(tmp_path, monkeypatch):
    from gc_assets.core.config import ConfigError, load_config

    value = sentinel()
    config = tmp_path / "gc.yaml"
    refs = {"access_key_id": {"env": "GC_T_ID"}, "secret_access_key": {"env": "GC_T_SECRET"}}
    config.write_text(yaml.safe_dump({"repositories": [_repo(s3=refs)]}))
    monkeypatch.setenv("GC_T_ID", "id-" + value)
    monkeypatch.delenv("GC_T_SECRET", raising=False)
    with pytest.raises(ConfigError) as missing:
        load_config(config)
    assert str(missing.value) == (
        f"{config}: invalid configuration: repository 'prod': field s3.secret_access_key: "
        "environment variable GC_T_SECRET is not set (or empty)"
    )
    assert value not in str(missing.value)

    config.write_text(yaml.safe_dump({"repositories": [_repo(s3={**refs, "secret_access_key": value})]}))
    with pytest.raises(ConfigError) as plain:
        load_config(config)
    assert "field s3.secret_access_key: a credential is given as {env: VARIABLE}" in str(plain.value)
    assert value not in str(plain.value)

    monkeypatch.setenv("GC_T_SECRET", value)
    config.write_text(yaml.safe_dump({"repositories": [_repo(s3=refs)]}))
    loaded = load_config(config)
    repo = loaded.repositories[0]
    assert repo.s3.secret_access_key.reveal() == value
    from gc_assets.stores.settings import StoreSettings

    settings = StoreSettings.of_repository(repo)
    # What travels (pickled closures) and what is printed holds the variable's name only.
    for shown in (repr(loaded), str(loaded), loaded.model_dump_json(), repr(settings), str(pickle.dumps(settings))):
        assert value not in shown and "GC_T_SECRET" in shown
    assert settings.credentials()["aws_secret_access_key"] == value


def test_the_cli_refuses_a_plain_or_missing_credential_with_status_2_quoting_neither(tmp_path, capfd, monkeypatch):
    value = sentinel()
    config = tmp_path / "gc.yaml"
    repo = {
        **_repo(),
        "storage_namespace": "abfss://c@acct.dfs.core.windows.net/t",
        "azure": {"sas_token": f"sv=1&sig={value}"},
    }
    config.write_text(yaml.safe_dump({"repositories": [repo]}))
    monkeypatch.setenv("GC_T_HELD", value)
    plain = run_cli(capfd, "run", "--config", str(config), "--repo", "prod")
    assert plain.returncode == 2 and "field azure.sas_token: a credential is given as {env: VARIABLE}" in plain.stderr
    config.write_text(yaml.safe_dump({"repositories": [{**repo, "azure": {"sas_token": {"env": "GC_T_UNSET"}}}]}))
    missing = run_cli(capfd, "run", "--config", str(config), "--repo", "prod", "--json")
    assert missing.returncode == 2 and "environment variable GC_T_UNSET is not set" in missing.stderr
    for done in (plain, missing):
        assert value not in done.stdout + done.stderr


def test_each_store_uses_the_configured_credentials_over_its_chain(monkeypatch):
    from gc_assets.core.config import AzureOverride, GcsOverride, S3Override
    from gc_assets.sources.delta import delta_rs_storage_options
    from gc_assets.stores.azure import AzureSettings
    from gc_assets.stores.gcs import GcsSettings
    from gc_assets.stores.s3.client import S3Settings

    values = {name: sentinel() for name in ("ID", "SECRET", "TOKEN", "AZ_KEY", "GCS_TOKEN")}
    for name, value in values.items():
        monkeypatch.setenv(f"GC_T_{name}", value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-the-chain")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=acct;AccountKey=from-the-chain")

    s3 = S3Settings.of_override(
        S3Override(
            access_key_id=EnvSecret(env="GC_T_ID"),
            secret_access_key=EnvSecret(env="GC_T_SECRET"),
            session_token=EnvSecret(env="GC_T_TOKEN"),
        )
    )
    signed = s3.client()._request_signer._credentials
    assert (signed.access_key, signed.secret_key, signed.token) == (values["ID"], values["SECRET"], values["TOKEN"])
    options = delta_rs_storage_options("s3://bucket/table", s3)
    assert (options["AWS_ACCESS_KEY_ID"], options["AWS_SECRET_ACCESS_KEY"], options["AWS_SESSION_TOKEN"]) == (
        values["ID"],
        values["SECRET"],
        values["TOKEN"],
    )

    azure = AzureSettings.of_override(
        "acct", "core.windows.net", AzureOverride(account_key=EnvSecret(env="GC_T_AZ_KEY"))
    )
    assert azure.resolve() == ("https://acct.blob.core.windows.net", {"account_key": values["AZ_KEY"]})
    assert AzureSettings("acct").resolve()[1] == {"account_key": "from-the-chain"}  # nothing configured: the chain

    gcs = GcsSettings.of_override(GcsOverride(endpoint_url="http://127.0.0.1:1", token=EnvSecret(env="GC_T_GCS_TOKEN")))
    assert gcs.service()._credentials.token == values["GCS_TOKEN"]  # not anonymous, although http://
    monkeypatch.setenv("GC_T_GCS_TOKEN", "{not json " + values["GCS_TOKEN"])
    from gc_assets.core.config import ConfigError

    with pytest.raises(ConfigError) as broken:
        GcsSettings(credentials=EnvSecret(env="GC_T_GCS_TOKEN")).service()
    assert values["GCS_TOKEN"] not in str(broken.value) and "$GC_T_GCS_TOKEN" in str(broken.value)


@contextlib.contextmanager
def _refusing_endpoint() -> Iterator[str]:
    """An HTTP endpoint on 127.0.0.1 answering 403 to every request, as Azure answers a SAS it
    does not accept: at once (no retry), where an unreachable one costs the client its retries."""

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the handler's name http.server calls
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_iceberg_table_on_azure_refusing_a_sas_fails_without_quoting_it(monkeypatch):
    """pyarrow's Azure filesystem (pyiceberg's FileIO) quotes the request URL, SAS and all, in its
    errors: the SourceError the run reports must not carry it, nor chain the original error."""
    from gc_assets.core.config import RepositoryConfig
    from gc_assets.sources.base import SourceError
    from gc_assets.sources.iceberg import IcebergSource

    signature = sentinel()
    monkeypatch.setenv("GC_T_SAS", f"sv=2021-08-06&ss=b&srt=sco&sp=rl&se=2099-01-01T00:00:00Z&sig={signature}")
    namespace = f"abfss://lake@{AZURITE_ACCOUNT}.dfs.core.windows.net/table"
    with _refusing_endpoint() as endpoint, pytest.raises(SourceError) as failed:
        repo = RepositoryConfig(
            name="ice",
            format="iceberg",
            storage_namespace=namespace,
            source=f"{namespace}/metadata/00001-a.metadata.json",
            azure={"endpoint_url": f"{endpoint}/{AZURITE_ACCOUNT}", "sas_token": {"env": "GC_T_SAS"}},
        )
        IcebergSource(repo).table  # noqa: B018 - loading is what fails
    assert "cannot load the Iceberg table" in str(failed.value)
    chain, error = [], failed.value
    while error is not None:  # the chain as Python's and Dagster's tracebacks show it
        chain.append(str(error))
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    assert signature not in "\n".join(chain), chain
    assert "$GC_T_SAS" in chain[0] and "403" in chain[0]  # the refusal, the request's URL naming the variable instead


# -- the detectors


def _file_text(path: Path) -> str:
    """A file as a person would read it: Parquet as its rows and footer, anything else as bytes."""
    raw = path.read_bytes().decode("utf-8", errors="replace")
    if path.suffix != ".parquet":
        return raw
    table = pq.read_table(path)
    return raw + json.dumps(table.to_pylist(), default=str) + str(table.schema.metadata)


def files_scan(root: Path, label: str) -> Scan:
    """Every file under `root`, by its path relative to `root` (the path itself counts)."""
    scan = Scan()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        scan.add(f"{label}: {path.relative_to(root)}", str(path) + "\n" + _file_text(path))
    return scan


def cli_scan(runs: Runs) -> Scan:
    scan = Scan()
    scan.add("stdout", runs.process.stdout)
    scan.add("stderr", runs.process.stderr)
    for label, summary in runs.summaries.items():
        scan.add(f"{label}: JSON summary", json.dumps(summary))
    return scan


def instance_scan(runs: Runs) -> Scan:
    """Run tags and every event the Dagster instance recorded (materialization metadata, check
    evaluations, step failures with their errors), through Dagster's own API."""
    from dagster import DagsterInstance
    from dagster._serdes import serialize_value

    scan = Scan()
    previous = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(runs.home)
    try:
        with DagsterInstance.get() as instance:
            for run in instance.get_runs():
                scan.add(f"run {run.run_id}: tags", json.dumps(dict(run.tags)))
                for entry in instance.all_logs(run.run_id):
                    scan.add(f"run {run.run_id}: events", serialize_value(entry))
    finally:
        if previous is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = previous
    return scan


def _assert_clean(scan: Scan, runs: Runs) -> None:
    leaks = {name: sorted(scan.holding(value)) for name, value in runs.secrets.items() if scan.holding(value)}
    assert not leaks, f"secrets leaked (variable: places): {leaks}"
    assert scan.holding(PLANTED), "the detector saw nothing the runs wrote: it would miss a leak too"


@pytest.mark.slow
def test_the_runs_used_the_configured_credentials_and_failed_where_they_must(runs):
    *deleted_on, sas = runs.clouds
    for cloud in deleted_on:
        summary = runs.summaries[cloud.name]
        assert summary["mode"] == "delete" and set(summary["checks"].values()) == {"passed"}
        assert summary["receipts"].get("deleted", 0) == summary["orphan_candidates"] > 0, summary
        assert _orphan(cloud) not in cloud.keys()  # the planted orphan was collected
    # The SAS, sent in the query of every request, reached Azurite: the dry run read and listed the lake.
    dry = runs.summaries[sas.name]
    assert dry["mode"] == "dry_run" and set(dry["checks"].values()) == {"passed"}
    assert dry["receipts"].get("would_delete", 0) == dry["orphan_candidates"] > 0, dry
    assert _orphan(sas) in sas.keys()  # a dry run deletes nothing
    # Azurite knows only the sentinel key: the wrong one configured in gc.yaml won over the
    # right one in AZURE_STORAGE_CONNECTION_STRING, so the configured credential is the one used.
    wrong = runs.printed[f"azure-wrong-key-{PLANTED}"]
    assert "AuthorizationFailure" in wrong and "failed to authenticate" in wrong, wrong[-2000:]


@pytest.mark.slow
def test_no_secret_in_the_cli_output_summary_or_error_messages(runs):
    scan = cli_scan(runs)
    _assert_clean(scan, runs)
    # Every output names the planted repositories or state directory.
    read = {"stdout", "stderr"} | {f"{label}: JSON summary" for label in runs.summaries}
    assert read <= scan.holding(PLANTED), read - scan.holding(PLANTED)


@pytest.mark.slow
def test_no_secret_in_log_files_receipts_or_any_parquet_under_state_dir(runs):
    scan = files_scan(runs.state, "state_dir")
    _assert_clean(scan, runs)
    assert any("logs" in place for place in scan.holding(PLANTED))
    assert any(
        "deletion_receipts" in place and place.endswith(".parquet") for place in scan.holding(PLANTED + ".orphan")
    )
    assert any("object_inventory" in place for place in scan.holding(PLANTED + ".orphan"))


@pytest.mark.slow
def test_no_secret_in_run_tags_metadata_events_or_the_instance_files(runs):
    scan = instance_scan(runs)
    _assert_clean(scan, runs)
    assert any(place.endswith(": tags") for place in scan.holding(AS_OF_TAG))  # the runs' tags were read
    assert any(place.endswith(": events") for place in scan.holding(PLANTED + ".orphan")) or any(
        place.endswith(": events") for place in scan.holding(PLANTED)
    )
    _assert_clean(files_scan(runs.home, "DAGSTER_HOME"), runs)


@pytest.mark.slow
def test_no_secret_in_the_spark_event_log(runs):
    scan = files_scan(runs.event_logs, "spark event log")
    applications = {place for place in scan.places if "/events_" in place}
    assert len(applications) == 1, sorted(scan.places)  # the CLI process's application
    assert scan.holding("spark.eventLog.enabled")  # Spark wrote its properties there
    _assert_clean(scan, runs)


@pytest.mark.slow
def test_a_planted_secret_is_found_by_every_detector(runs, tmp_path):
    """The detectors against the same outputs with one secret planted in each place they read."""
    planted = {"GC_TEST_PLANTED": sentinel()}
    probe = Runs(**{**runs.__dict__, "secrets": planted})
    value = planted["GC_TEST_PLANTED"]
    copy = tmp_path / "state"
    shutil.copytree(runs.state, copy)
    receipts = next(p for p in copy.rglob("*.parquet") if "deletion_receipts" in str(p))
    table = pq.read_table(receipts)
    pq.write_table(table.set_column(0, table.field(0), [[value] * table.num_rows]), receipts, compression="snappy")
    with pytest.raises(AssertionError, match="GC_TEST_PLANTED"):
        _assert_clean(files_scan(copy, "state_dir"), probe)
    probe.process = subprocess.CompletedProcess([], 1, "", f"Error: {value}")
    probe.summaries = {"x": {}}
    with pytest.raises(AssertionError, match="GC_TEST_PLANTED"):
        _assert_clean(cli_scan(probe), probe)


RUN_QUERY = """
query Run($runId: ID!) {
  runOrError(runId: $runId) { __typename ... on Run { runId status tags { key value } runConfigYaml } }
  logsForRun(runId: $runId) {
    __typename
    ... on EventConnection {
      events {
        __typename
        ... on MessageEvent { message stepKey }
        ... on ExecutionStepFailureEvent { error { message stack causes { message stack } } }
        ... on RunFailureEvent { error { message stack } }
        ... on MaterializationEvent { metadataEntries { label description ...Entry } }
        ... on AssetCheckEvaluationEvent {
          evaluation { checkName success metadataEntries { label description ...Entry } }
        }
      }
    }
  }
}
fragment Entry on MetadataEntry {
  ... on TextMetadataEntry { text }
  ... on PathMetadataEntry { path }
  ... on JsonMetadataEntry { jsonString }
  ... on MarkdownMetadataEntry { mdStr }
  ... on IntMetadataEntry { intValue }
}
"""


def _webserver(runs: Runs, log: Path) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    env = {**runs.env, "GC_ASSETS_CONFIG": str(runs.config)}
    server = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("dagster-webserver")),
            "-w",
            "workspace.yaml",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=PROJECT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 480
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
                return server, port
        except OSError:
            time.sleep(0.2)
    _stop(server)
    raise AssertionError("the webserver did not answer within 480 s")


@pytest.mark.slow
def test_no_secret_in_the_dagster_ui(runs, tmp_path):
    """What the run, asset and check pages show, as the UI's GraphQL answers it; in a browser
    (Chromium, as test_webserver.py) the pages' text and HTML as well."""
    run_ids = sorted({summary["run_id"] for summary in runs.summaries.values()})  # a set's repositories share one
    server, port = _webserver(runs, tmp_path / "webserver.log")
    scan = Scan()
    try:
        for run_id in run_ids:
            answer = _graphql(port, RUN_QUERY, {"runId": run_id})
            assert answer["runOrError"]["__typename"] == "Run", answer["runOrError"]
            scan.add(f"graphql run {run_id}", json.dumps(answer))
        failed = [s["run_id"] for label, s in runs.summaries.items() if label.startswith("azure-sas-down")]
        events = json.loads(scan.places[f"graphql run {failed[0]}"])
        assert any(e["__typename"] == "ExecutionStepFailureEvent" for e in events["logsForRun"]["events"])
        _browser_pages(runs, port, scan, tmp_path)
    finally:
        _stop(server)
    scan.add("webserver log", (tmp_path / "webserver.log").read_text(errors="replace"))
    _assert_clean(scan, runs)
    assert all(scan.holding(PLANTED) & {f"graphql run {run_id}"} for run_id in run_ids)


def _browser_pages(runs: Runs, port: int, scan: Scan, tmp_path: Path) -> None:
    from gc_assets_tests.test_ui_browser import CHROMIUM

    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing in CI: .ci/run installs Debian's chromium")
        return  # GraphQL above carries what the pages show; CI runs the browser too
    from playwright.sync_api import sync_playwright

    base = f"http://127.0.0.1:{port}"
    deleted = runs.summaries["azure"]
    failed = runs.summaries[f"azure-sas-down-{PLANTED}"]
    partition = f"{deleted['date']}%7C{runs.clouds[1].repo}"
    pages = {  # each page, and what it shows once it has loaded its run or partition
        "run page": (f"{base}/runs/{deleted['run_id']}", runs.clouds[1].repo),
        "failed run page": (f"{base}/runs/{failed['run_id']}", None),
        "asset page": (f"{base}/assets/orphan_candidates?view=partitions&partition={partition}", runs.clouds[1].repo),
        "receipts page": (f"{base}/assets/deletion_receipts?view=partitions&partition={partition}", None),
        "check page": (f"{base}/assets/orphan_candidates?view=checks", None),
    }
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(120_000)
        for name, (url, loaded) in pages.items():
            page.goto(url, wait_until="networkidle")
            scan.add(f"browser {name}", _settled_text(page, loaded) + page.content())
        browser.close()
    assert {"browser run page", "browser asset page"} <= scan.holding(PLANTED)


def _settled_text(page: Any, loaded: str | None = None) -> str:
    """The page's text once it has stopped rendering: two reads 250 ms apart agree (or 10 s passed).
    A page still fetching its run holds a steady spinner, so it first waits (up to 60 s) for `loaded`."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    if loaded is not None:
        with contextlib.suppress(PlaywrightTimeout):
            page.wait_for_function("text => document.body.innerText.includes(text)", arg=loaded, timeout=60_000)
    text = page.inner_text("body")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        page.wait_for_timeout(250)
        text, previous = page.inner_text("body"), text
        if text == previous:
            break
    return text
