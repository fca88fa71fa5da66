"""OpenMP settings that must be in the environment before torch loads its OpenMP runtime.

`OMP_WAIT_POLICY=PASSIVE`: an OpenMP thread that reaches a barrier sleeps at once instead of spinning. torch runs
hundreds of parallel regions per decode step and per training micro-batch, each ending at a barrier. On a machine
where another process holds one of the cores (the normal case for CPU users: a browser, a build, a second run),
the thread sharing that core is descheduled for whole time slices; a spinning thread keeps its own core busy, so the
scheduler cannot move the late thread there, and every region waits a slice. Measured with a busy process pinned to
one of 2 cores on a machine loaded by other work too (bench/shared_core.py, docs/benchmarks.md): bf16 rollouts at 2
threads took 11.5x as long as at 1 with libgomp's default wait, and 0.30x as long with PASSIVE.

The runtime reads these once, when it loads (with torch), so `rollwise`'s package import sets them when torch is
not loaded yet; a value the user set is kept. A program that imports torch before rollwise sets them itself.
Child processes (trainer ranks, sandboxes, launched servers) inherit them.

Deliberately left out: pinning threads to cores (OMP_PROC_BIND / GOMP_CPU_AFFINITY) or choosing the thread count
from the machine's load: both guess at what the rest of the machine will do.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

__all__ = ["OMP_DEFAULTS", "apply_omp_defaults"]

OMP_DEFAULTS: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}
"""Environment variable -> the value rollwise runs with unless the user set one."""


def apply_omp_defaults(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set each of `OMP_DEFAULTS` the environment lacks; -> what was set. Does nothing once torch is imported (its
    OpenMP runtime has read the environment already, and a changed variable would only mislead)."""
    if "torch" in sys.modules:
        return {}
    env = os.environ if environ is None else environ
    applied = {k: v for k, v in OMP_DEFAULTS.items() if not env.get(k)}
    env.update(applied)
    return applied
