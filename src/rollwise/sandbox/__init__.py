"""rollwise.sandbox: isolated execution of untrusted, model-written code (see docs/sandbox.md)."""

from rollwise.sandbox.jail import (
    Sandbox,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    default_sandbox,
    isolation_status,
    run_python,
)

__all__ = [
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "default_sandbox",
    "isolation_status",
    "run_python",
]
