"""Test a jailed candidate from a trusted process: the verdict never comes from the untrusted code.

    scorer ──start──> jail: server.py runs candidate.py, answers calls with plain data (`_serve.py`)
       └───Popen───> checker: the task's test code, with the candidate's functions as proxies (`_check.py`)
                     checker <──pipes──> jail (the scorer hands the jail's stdin/stdout to the checker)

The candidate runs alone in the jail; the dataset's test code runs in a separate, unjailed but rlimited
process that never executes a line of the candidate's. Each call goes over a pipe as data (`_wire.py`,
JSON with type tags, never pickle) and comes back as builtin values; comparisons in the test code are
type-strict (`_check.py` says the rule). The verdict is the checker's, read by the scorer from the
checker's private stdout; the jail's exit code and output are never read as a verdict, and jail failures
come from the jail's status pipe (`Jail.jail_error`).

Vocabulary is HumanEval's: `passed`, `failed: <reason>`, `timed out` (total wall limit, per-call limit,
or the jail's CPU limit).

Left out: values that are not plain data (objects, generators, functions) cannot cross, so a task whose
test builds or inspects objects of the candidate's classes cannot be checked this way; such a test
passing a non-data argument is a harness error (the sample is errored, not failed).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rollwise.sandbox.jail import Sandbox, SandboxLimits, SandboxUnavailable, _feed, cpu_exhausted

_HERE = Path(__file__).parent
_CHECK = str(_HERE / "_check.py")
_SERVER_SOURCE: str | None = None
CHECKER_GRACE_S = 1.0
"""Seconds past the total limit before the scorer kills a checker that has not answered."""


class HarnessError(RuntimeError):
    """The trusted side could not run the task's test (the task's code or data, not the candidate)."""


@dataclass(frozen=True)
class CallTest:
    """A task's test, for `run_call_test`.

    `setup`: trusted code run first in the checker (HumanEval's prompt for its helpers, MBPP's imports);
    its failure is a `HarnessError`. `test`: the test code; an exception it raises is `failed: str(e)`.
    `proxies`: names bound to the candidate's functions; None means every name the test reads that neither
    the setup nor builtins define, when the candidate defines it.
    """

    test: str
    setup: tuple[str, ...] = ()
    proxies: tuple[str, ...] | None = None


@dataclass
class CallVerdict:
    result: str
    """`passed`, `failed: <reason>` or `timed out`."""
    calls: int
    wall_s: float
    isolated: bool


def server_source() -> str:
    global _SERVER_SOURCE
    if _SERVER_SOURCE is None:
        _SERVER_SOURCE = (_HERE / "_wire.py").read_text() + "\n" + (_HERE / "_serve.py").read_text()
    return _SERVER_SOURCE


def run_call_test(
    candidate: str,
    spec: CallTest,
    sandbox: Sandbox,
    limits: SandboxLimits,
    call_timeout_s: float | None = None,
) -> CallVerdict:
    """Load `candidate` (Python source) in a jail and run `spec`'s test against it from a trusted process.

    Raises `SandboxUnavailable` when the jail could not be built, `HarnessError` when the task's own code failed.
    """
    t0 = time.monotonic()
    total = limits.wall_s
    per_call = min(call_timeout_s or total, total)
    files = {"server.py": server_source(), "candidate.py": candidate}
    with sandbox.start([sandbox.python, "-I", "-B", "server.py"], limits=limits, files=files) as jail:
        assert jail.proc.stdin is not None and jail.proc.stdout is not None and jail.proc.stderr is not None
        to_jail, from_jail = jail.proc.stdin.fileno(), jail.proc.stdout.fileno()
        cfg = {
            "rfd": from_jail, "wfd": to_jail, "setup": list(spec.setup), "test": spec.test,
            "proxies": None if spec.proxies is None else list(spec.proxies), "per_call_s": per_call, "total_s": total,
            "rlimits": {"RLIMIT_CPU": int(total) + 2, "RLIMIT_AS": max(2048, 2 * limits.memory_mb) << 20, "RLIMIT_CORE": 0},
        }
        checker = subprocess.Popen(
            [sandbox.launcher_python, "-I", "-S", "-B", _CHECK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, pass_fds=(to_jail, from_jail), start_new_session=True, cwd="/",
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
        # The checker now holds the only other ends: when either side dies, the other sees EOF.
        jail.proc.stdin.close()
        jail.proc.stdout.close()
        threading.Thread(target=_feed, args=(checker.stdin, json.dumps(cfg).encode()), daemon=True).start()
        try:
            out, timed_out, output_limited = _collect(jail, checker, t0 + total + CHECKER_GRACE_S, limits)
        finally:
            _kill(checker)
            checker.wait()
            for f in (checker.stdout, checker.stderr):
                f.close()  # type: ignore[union-attr]
            jail.kill()
            code = jail.proc.wait()
        err = jail.jail_error()
        if err is not None:
            raise SandboxUnavailable(err)
    jail_code = 128 - code if code < 0 else code
    wall = time.monotonic() - t0
    verdict: dict = {}
    try:
        verdict = json.loads(out.decode()) if out else {}
    except ValueError:
        verdict = {}
    if "error" in verdict:
        raise HarnessError(str(verdict["error"]))
    calls = int(verdict.get("calls", 0)) if isinstance(verdict.get("calls"), int) else 0
    if output_limited:
        result = "failed: output limit exceeded"
    elif timed_out:
        result = "timed out"
    elif isinstance(verdict.get("result"), str):
        result = verdict["result"]
        if verdict.get("fault") and cpu_exhausted(jail_code, False, t0, limits):
            result = "timed out"
    else:  # the trusted process died (e.g. data that blew its memory): no verdict is not a pass
        result = f"failed: the test process ended without a verdict (exit code {checker.returncode})"
    return CallVerdict(result, calls, wall, jail.isolated)


def _collect(jail, checker: subprocess.Popen, deadline: float, limits: SandboxLimits) -> tuple[bytes, bool, bool]:
    """Read the checker's verdict and both processes' stderr (capped) until the checker ends or the deadline."""
    sel = selectors.DefaultSelector()
    sel.register(checker.stdout, selectors.EVENT_READ, "verdict")  # type: ignore[arg-type]
    sel.register(checker.stderr, selectors.EVENT_READ, "checker_err")  # type: ignore[arg-type]
    sel.register(jail.proc.stderr, selectors.EVENT_READ, "jail_err")
    caps = {"verdict": 1 << 20, "checker_err": 1 << 16, "jail_err": limits.output_bytes}
    sizes = dict.fromkeys(caps, 0)
    verdict = bytearray()
    timed_out = output_limited = False
    open_checker = 2
    try:
        while open_checker:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=min(left, 0.5)):
                chunk = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                if not chunk:
                    sel.unregister(key.fileobj)
                    if key.data != "jail_err":
                        open_checker -= 1
                    continue
                sizes[key.data] += len(chunk)
                if key.data == "verdict" and sizes["verdict"] <= caps["verdict"]:
                    verdict += chunk
                if key.data == "jail_err" and sizes["jail_err"] > caps["jail_err"] and not output_limited:
                    output_limited = True
                    jail.kill()  # the checker then sees EOF and finishes at once
    finally:
        sel.close()
    return bytes(verdict), timed_out, output_limited


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
