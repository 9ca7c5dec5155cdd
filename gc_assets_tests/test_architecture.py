"""The architecture holds: the import contracts in pyproject.toml (layers, no Dagster below
the wiring, no cycles) and Dagster's own check that the code location loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_import_contracts_are_kept():
    result = subprocess.run([str(BIN / "lint-imports")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "6 kept, 0 broken" in result.stdout


def test_dg_check_defs_loads_the_code_location(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    env.pop("GC_ASSETS_CONFIG", None)  # the location loads without a gc.yaml too
    result = subprocess.run(
        [str(BIN / "dg"), "check", "defs"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "All definitions loaded successfully" in result.stdout + result.stderr
