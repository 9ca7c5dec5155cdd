"""The UI as a person sees it: Chromium, driven by Playwright, on `dagster dev` serving the
demo lake after one GC run. Screenshots go to <state_dir>/screenshots/ of the demo.

Outside CI the test is skipped when Debian's chromium is missing; in CI (`CI` set) a
missing browser fails it, since `.ci/run` installs one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance

from gc_assets.demo.embedded import build_demo
from gc_assets.runner import run_partition
from gc_assets_tests.test_webserver import DAGSTER, PROJECT, _free_port, _stop, _wait_for_definitions

CHROMIUM = Path("/usr/bin/chromium")


def _browser_or_skip() -> None:
    if CHROMIUM.exists():
        return
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing in CI: .ci/run installs Debian's chromium")
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium); CI installs it and runs this test")


@pytest.mark.slow
def test_a_person_opens_the_graph_then_orphan_candidates_and_sees_its_partition_and_checks(tmp_path, monkeypatch):
    _browser_or_skip()
    from playwright.sync_api import expect, sync_playwright

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    config_path, repositories = build_demo(tmp_path / "demo")
    lakefs = repositories[0]
    repo, date = lakefs.config["name"], lakefs.gc_date.isoformat()
    outcome = run_partition(str(config_path), repo, lakefs.gc_date, instance=DagsterInstance.get())
    assert outcome.success, outcome.error
    screenshots = tmp_path / "demo" / ".gc_state" / "screenshots"
    screenshots.mkdir(parents=True)

    env = {
        **os.environ,
        "GC_ASSETS_CONFIG": str(config_path),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    port = _free_port()
    log = open(tmp_path / "dagster_dev.log", "wb")
    server = subprocess.Popen(
        [str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=PROJECT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_for_definitions(port, server)
        base = f"http://127.0.0.1:{port}"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(120_000)

            page.goto(f"{base}/asset-groups", wait_until="networkidle")
            for group in ("mark", "sweep", "questions"):
                expect(page.get_by_text(group, exact=True).first).to_be_visible()
            assert page.get_by_text("Join the Dagster community").count() == 0  # nux is off
            page.screenshot(path=str(screenshots / "1-asset-graph.png"))

            page.goto(
                f"{base}/assets/orphan_candidates?view=partitions&partition={date}%7C{repo}", wait_until="networkidle"
            )
            expect(page.get_by_text(f"{date}|{repo}").first).to_be_visible()
            expect(page.get_by_text("Materialized", exact=True).first).to_be_visible()
            for label in ("reclaimable_bytes", "top_prefixes", "bytes_by_prefix", "by_reason"):
                expect(page.get_by_text(label, exact=True).first).to_be_attached()
            reclaimable = str(outcome.summary["reclaimable_bytes"])
            expect(page.get_by_text(reclaimable, exact=True).first).to_be_attached()
            page.screenshot(path=str(screenshots / "2-orphan-candidates-partition.png"), full_page=True)
            page.get_by_text("by_reason", exact=True).first.scroll_into_view_if_needed()  # the metadata panel scrolls
            page.screenshot(path=str(screenshots / "3-orphan-candidates-tables.png"), full_page=True)

            page.goto(f"{base}/assets/orphan_candidates?view=checks", wait_until="networkidle")
            for check in ("candidates_not_live", "independent_witness", "blast_radius"):
                expect(page.get_by_text(check, exact=True).first).to_be_visible()
            expect(page.get_by_text("blocking").first).to_be_visible()
            assert page.get_by_text("Succeeded", exact=True).count() == 5
            page.screenshot(path=str(screenshots / "4-orphan-candidates-checks.png"), full_page=True)
            browser.close()
        assert sorted(p.name for p in screenshots.iterdir()) == [
            "1-asset-graph.png",
            "2-orphan-candidates-partition.png",
            "3-orphan-candidates-tables.png",
            "4-orphan-candidates-checks.png",
        ]
        print(f"screenshots in {screenshots}")
    finally:
        _stop(server)
        log.close()
        time.sleep(1)
