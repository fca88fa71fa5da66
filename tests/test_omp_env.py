"""rollwise's OpenMP defaults reach torch's OpenMP runtime: `import rollwise` before torch sets OMP_WAIT_POLICY=PASSIVE
(threads sleep at barriers, so 2 threads hold up when another process takes a core), a user's own value is kept,
and nothing is changed once torch is loaded."""

from __future__ import annotations

import os
import subprocess
import sys

from rollwise.omp_env import OMP_DEFAULTS, apply_omp_defaults


def _spin_count(code: str, **env: str) -> int:
    """How long torch's OpenMP runtime (libgomp) spins at a barrier before sleeping, as it reports at load
    (OMP_DISPLAY_ENV=VERBOSE) in a fresh interpreter running `code`: 0 under PASSIVE, 300,000 by default."""
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    r = subprocess.run([sys.executable, "-c", code], env={**base, "OMP_DISPLAY_ENV": "VERBOSE", **env},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip().startswith("GOMP_SPINCOUNT")]
    assert lines, "the OpenMP runtime did not display its environment"
    return int(lines[0].split("=", 1)[1].strip().strip("'"))


def test_import_rollwise_before_torch_makes_openmp_threads_passive():
    assert OMP_DEFAULTS["OMP_WAIT_POLICY"] == "PASSIVE"
    assert _spin_count("import rollwise, torch; torch.ones(8).sum()") == 0
    assert _spin_count("import rollwise.cli.main, torch") == 0  # the `rollwise` command's import


def test_the_users_own_setting_and_a_torch_loaded_first_are_left_alone():
    assert _spin_count("import rollwise, torch", OMP_WAIT_POLICY="ACTIVE") > 10**9
    assert _spin_count("import torch, rollwise") > 0  # too late: the runtime has read its environment
    import torch  # noqa: F401 - loaded in this process: nothing may change any more

    env: dict[str, str] = {}
    assert apply_omp_defaults(env) == {} and env == {}
