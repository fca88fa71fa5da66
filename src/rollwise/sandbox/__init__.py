"""rollwise.sandbox: isolated execution of untrusted, model-written code, and tests of it whose verdict the
untrusted code cannot touch (see docs/sandbox.md)."""

from rollwise.sandbox.calls import CallTest, CallVerdict, HarnessError, run_call_test
from rollwise.sandbox.jail import (
    Jail,
    Sandbox,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    default_sandbox,
    isolation_in_use,
    isolation_status,
    run_python,
)

__all__ = [
    "CallTest",
    "CallVerdict",
    "HarnessError",
    "Jail",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "default_sandbox",
    "isolation_in_use",
    "isolation_status",
    "run_call_test",
    "run_python",
]
