"""The linter passes: `ruff check` with the project's configuration (pyproject.toml's [tool.ruff]).

`make test` (CI) runs `make lint` first; this test runs the same check under a plain `pytest`, so a finding
fails the suite wherever it runs. It skips only where ruff (the dev extra) is not installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _ruff() -> str:
    beside = Path(sys.executable).with_name("ruff")  # the venv's own, whatever PATH says
    found = str(beside) if beside.is_file() else shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    return found


def test_ruff_check_passes():
    res = subprocess.run([_ruff(), "check", "--no-cache", "--output-format", "concise", str(REPO)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_ruff_finds_what_it_is_configured_to_find(tmp_path):
    """The configuration is live: an unused import and a mutable default are reported (the check can fail)."""
    bad = tmp_path / "probe.py"
    bad.write_text("import os\n\n\ndef f(x=[]):\n    return x\n")
    res = subprocess.run([_ruff(), "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), "--output-format",
                          "concise", str(bad)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "F401" in res.stdout and "B006" in res.stdout, res.stdout + res.stderr
