"""Sandbox fixture: skip the isolation tests (with the reason) where the jail cannot be built."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def sandbox():
    from rollwise.sandbox import Sandbox, isolation_status

    ok, reason = isolation_status()
    if not ok:
        pytest.skip(f"sandbox isolation unavailable here: {reason}")
    return Sandbox(isolation="required")

