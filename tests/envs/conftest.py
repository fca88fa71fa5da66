"""Environment test fixture: the real datasets in ../shared/data beside the repository (skipped if missing)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_data() -> Path:
    repo = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
    data = repo.parent / "shared" / "data"
    if not data.is_dir():
        pytest.skip(f"real datasets not found at {data} (expected ../shared/data beside the repository)")
    return data
