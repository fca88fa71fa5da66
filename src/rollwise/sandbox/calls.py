"""Test a jailed candidate from a trusted process: the verdict never comes from the untrusted code.

    scorer ──start──> jail: server.py runs candidate.py, answers calls with plain data (`_serve.py`)
       └──socket───> checker: the task's test code, with the candidate's functions as proxies (`_check.py`)
                     checker <──pipes──> jail (the scorer passes the jail's stdin/stdout over the socket)

The candidate runs alone in the jail; the dataset's test code runs in a separate, unjailed but rlimited
process that never executes a line of the candidate's (a pooled worker, reused only after a clean answer
in time, killed otherwise; a fresh namespace per test). Each call goes over a pipe as data (`_wire.py`:
answers are type-tagged JSON the trusted side rebuilds itself, never pickle) and comes back as builtin
values; comparisons in the test code are type-strict (`_check.py` says the rule). The verdict is the
checker's, read by the scorer from the checker's socket; the jail's exit code and output are never read
as a verdict, and jail failures come from the jail's status pipe (`Jail.jail_error`).

Vocabulary is HumanEval's: `passed`, `failed: <reason>`, `timed out` (total wall limit, per-call limit,
or the jail's CPU limit).

Left out: values that are not plain data (objects, generators, functions) cannot cross, so a task whose
test builds or inspects objects of the candidate's classes cannot be checked this way; such a test
passing a non-data argument is a harness error (the sample is errored, not failed).
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rollwise.sandbox.jail import Sandbox, SandboxLimits, SandboxUnavailable, cpu_exhausted

_HERE = Path(__file__).parent
_CHECK = str(_HERE / "_check.py")
_SERVER_SOURCE: str | None = None
CHECKER_GRACE_S = 1.0
"""Seconds past the total limit before the scorer kills a checker that has not answered."""
# NOTE: _check.py's RLIMIT_CPU is not set: a reused worker's CPU time adds up; the scorer's wall deadline bounds each test.


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


class _Checker:
    """One trusted worker process (`_check.py serve`) and the scorer's end of its socket."""

    def __init__(self, python: str, as_bytes: int):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        limits = json.dumps({"rlimits": {"RLIMIT_AS": as_bytes, "RLIMIT_CORE": 0}})
        try:
            self.proc = subprocess.Popen(
                [python, "-I", "-S", "-B", _CHECK, str(child.fileno()), limits], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(child.fileno(),),
                start_new_session=True, cwd="/", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.sock = parent
        self.jobs = 0

    def send(self, cfg: dict, fds: tuple[int, int]) -> None:
        body = json.dumps(cfg).encode()
        head = len(body).to_bytes(8, "big")
        socket.send_fds(self.sock, [head], list(fds))  # the worker gets its own copies of both fds
        self.sock.sendall(body)
        self.jobs += 1

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.sock.close()


class _CheckerPool:
    """Idle trusted workers, by address-space limit; a worker is reused only after a clean, timely answer."""

    MAX_JOBS = 500
    """Jobs per worker before it is replaced (bounds whatever state tests leave behind)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, int], list[_Checker]] = {}

    def acquire(self, python: str, as_bytes: int) -> _Checker:
        with self._lock:
            idle = self._idle.get((python, as_bytes), [])
            while idle:
                c = idle.pop()
                if c.proc.poll() is None:
                    return c
                c.sock.close()
        return _Checker(python, as_bytes)

    def release(self, c: _Checker, python: str, as_bytes: int) -> None:
        if c.jobs >= self.MAX_JOBS or c.proc.poll() is not None:
            c.kill()
            return
        with self._lock:
            self._idle.setdefault((python, as_bytes), []).append(c)

    def close(self) -> None:
        with self._lock:
            workers = [c for lst in self._idle.values() for c in lst]
            self._idle.clear()
        for c in workers:
            c.kill()


_pool = _CheckerPool()
atexit.register(_pool.close)


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
    as_bytes = max(2048, 2 * limits.memory_mb) << 20
    files = {"server.py": server_source(), "candidate.py": candidate}
    cfg = {"setup": list(spec.setup), "test": spec.test, "proxies": None if spec.proxies is None else list(spec.proxies),
           "per_call_s": per_call, "total_s": total}
    with sandbox.start([sandbox.python, "-I", "-B", "server.py"], limits=limits, files=files) as jail:
        assert jail.proc.stdin is not None and jail.proc.stdout is not None and jail.proc.stderr is not None
        checker = _pool.acquire(sandbox.launcher_python, as_bytes)
        healthy = False
        try:
            checker.send(cfg, (jail.proc.stdout.fileno(), jail.proc.stdin.fileno()))
            # The checker now holds the only other ends: when either side dies, the other sees EOF.
            jail.proc.stdin.close()
            jail.proc.stdout.close()
            out, timed_out, output_limited = _collect(jail, checker.sock, t0 + total + CHECKER_GRACE_S, limits)
            healthy = out.endswith(b"\n") and not timed_out
        except OSError:
            out, timed_out, output_limited = b"", False, False
        finally:
            if healthy:
                _pool.release(checker, sandbox.launcher_python, as_bytes)
            else:
                checker.kill()
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
        result = "failed: the test process ended without a verdict"
    return CallVerdict(result, calls, wall, jail.isolated)


def _collect(jail, sock: socket.socket, deadline: float, limits: SandboxLimits) -> tuple[bytes, bool, bool]:
    """Read the checker's verdict line and the jail's stderr (capped) until the verdict, or the deadline."""
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "verdict")
    sel.register(jail.proc.stderr, selectors.EVENT_READ, "jail_err")
    err_bytes = 0
    verdict = bytearray()
    timed_out = output_limited = False
    try:
        while not verdict.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            events = sel.select(timeout=min(left, 0.5))
            for key, _ in events:
                if key.data == "verdict":
                    chunk = sock.recv(65536)
                    if not chunk:
                        return bytes(verdict), timed_out, output_limited  # the worker died
                    verdict += chunk
                    if len(verdict) > 1 << 20:
                        return b"", timed_out, output_limited
                    continue
                chunk = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                err_bytes += len(chunk)
                if err_bytes > limits.output_bytes and not output_limited:
                    output_limited = True
                    jail.kill()  # the checker then sees EOF and answers at once
    finally:
        sel.close()
    return bytes(verdict), timed_out, output_limited
