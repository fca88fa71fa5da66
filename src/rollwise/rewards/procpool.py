"""Killable calls: a small pool of persistent worker processes with a deadline per call.

Why: some scoring code can run for a very long time on a hostile or unlucky input (sympy evaluating
`9^{9^{9^{9}}}` never returns, and it spends that time inside C big-integer code where no signal handler
runs). A thread cannot be killed, and math-verify's own SIGALRM timeouts work only in the main thread. So
such calls run in a worker process: when a call misses its deadline the worker is killed (SIGKILL) and a
fresh one is started for the next call, and the caller gets `CallTimeout`, never a silent result.

The protocol is one JSON line each way over the worker's stdin and a private copy of its stdout (the worker
points fd 1 at stderr, so stray prints cannot corrupt it): `{"fn": name, "args": [...]}` in,
`{"ok": value}` or `{"error": "Type: message"}` out. Only functions registered in `FUNCTIONS` can be
called, by name; arguments and results are plain JSON data. Each worker also gets an address-space limit,
and before each call its CPU-time limit (RLIMIT_CPU) is set to what it has used plus twice the deadline, so
the kernel ends a runaway call even if this process died and cannot kill it (an idle orphan exits at the
end of its stdin). NOTE: PR_SET_PDEATHSIG is not used: it fires when the *thread* that started the worker
exits, and scoring threads come and go.

Workers start on first use (a start costs about half a second, the imports of the registered module), stay
up between calls, and are shared by all threads: `call` blocks until a worker is idle; the deadline counts
from when the call is sent.

Left out: running arbitrary pickled callables (use the sandbox for untrusted code), and recycling workers
after N calls.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

FUNCTIONS: dict[str, str] = {
    "math_verify_equal": "rollwise.rewards.math:math_verify_local",
}
"""Callable names -> 'module:function', resolved inside the worker."""


class CallTimeout(RuntimeError):
    """The call missed its deadline; its worker was killed."""


class WorkerError(RuntimeError):
    """The worker died or failed to start (not a timeout)."""


class WorkerStartError(WorkerError):
    """No worker could be started (an install or machine problem: no call was made, so no input is to blame)."""


class _Worker:
    def __init__(self, memory_mb: int | None, start_timeout_s: float) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [_src_dir(), env.get("PYTHONPATH", "")] if p)
        cmd = [sys.executable, "-m", "rollwise.rewards.procpool", str(memory_mb or 0)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     close_fds=True)
        self._buf = b""
        try:
            ready = self._read(start_timeout_s)
        except WorkerError as e:  # died while starting: the install's fault, never a scored input's
            self.kill()
            raise WorkerStartError(f"scoring worker failed to start ({e})") from None
        if ready is None or ready.get("ready") is not True:
            self.kill()
            why = "timed out" if ready is None else f"answered {ready!r}"
            raise WorkerStartError(f"scoring worker failed to start ({why}; exit code {self.proc.poll()})")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self, timeout_s: float) -> dict | None:
        """The next JSON line, or None at the deadline. Raises WorkerError when the worker died."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        end = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                code = self.proc.wait()
                raise WorkerError(f"scoring worker died (exit code {code})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def call(self, fn: str, args: list[Any], deadline_s: float) -> Any:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"fn": fn, "args": args, "deadline_s": deadline_s}).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerError(f"scoring worker is gone ({type(e).__name__})") from None
        msg = self._read(deadline_s)
        if msg is None:
            raise CallTimeout(f"{fn} did not finish within {deadline_s:g}s; its worker process was killed")
        if "error" in msg:
            raise WorkerError(f"{fn} failed in the worker: {msg['error']}")
        return msg["ok"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass


def _src_dir() -> str:
    """The directory that holds the `rollwise` package this process imported (so the worker imports the same)."""
    # rollwise/rewards/procpool.py -> the directory holding the rollwise package
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


WARMUPS: tuple[str, ...] = ("rollwise.rewards.math:math_verify_warm",)
"""Called once in each new worker before it reports ready (its start timeout covers them, no call deadline)."""


class WorkerPool:
    """Up to `size` worker processes; `call(name, *args)` runs `FUNCTIONS[name]` in one with a deadline."""

    def __init__(self, size: int = 2, deadline_s: float = 5.0, memory_mb: int | None = 2048,
                 start_timeout_s: float = 60.0) -> None:
        if size < 1:
            raise ValueError(f"WorkerPool size must be >= 1, got {size}")
        if deadline_s <= 0:
            raise ValueError(f"WorkerPool deadline_s must be > 0, got {deadline_s}")
        self.size = size
        self.deadline_s = deadline_s
        self.memory_mb = memory_mb
        self.start_timeout_s = start_timeout_s
        self._cv = threading.Condition()
        self._idle: list[_Worker] = []
        self._busy = 0  # workers out on a call (or starting)
        self._all: set[_Worker] = set()
        self.num_killed = 0  # workers killed at a deadline (for tests and metrics)

    def pids(self) -> list[int]:
        with self._cv:
            return [w.pid for w in self._all]

    def _acquire(self) -> _Worker:
        with self._cv:
            while not self._idle and self._busy + len(self._idle) >= self.size:
                self._cv.wait()
            self._busy += 1
            if self._idle:
                return self._idle.pop()
        try:
            w = _Worker(self.memory_mb, self.start_timeout_s)
        except BaseException:
            with self._cv:
                self._busy -= 1
                self._cv.notify()
            raise
        with self._cv:
            self._all.add(w)
        return w

    def _release(self, w: _Worker, healthy: bool) -> None:
        if not healthy:
            w.kill()
        with self._cv:
            self._busy -= 1
            if healthy:
                self._idle.append(w)
            else:
                self._all.discard(w)
            self._cv.notify()

    def call(self, fn: str, *args: Any, deadline_s: float | None = None) -> Any:
        """Run `FUNCTIONS[fn](*args)` in a worker. Raises CallTimeout (worker killed and replaced on the next
        call) or WorkerError (the function raised, or the worker died)."""
        if fn not in FUNCTIONS:
            raise ValueError(f"unknown worker function {fn!r}; registered: {sorted(FUNCTIONS)}")
        w = self._acquire()
        healthy = False
        try:
            out = w.call(fn, list(args), deadline_s or self.deadline_s)
            healthy = True
            return out
        except CallTimeout:
            self.num_killed += 1
            raise
        except WorkerError as e:
            healthy = w.proc.poll() is None and "failed in the worker" in str(e)
            raise
        finally:
            self._release(w, healthy)

    def close(self) -> None:
        with self._cv:
            workers, self._idle = list(self._all), []
            self._all.clear()
        for w in workers:
            w.kill()


_default: WorkerPool | None = None
_default_lock = threading.Lock()


def default_pool() -> WorkerPool:
    """The process-wide pool (min(4, CPUs) workers, 5 s per call: math-verify's own default parse/verify
    timeouts), started on first use, closed at exit."""
    global _default
    with _default_lock:
        if _default is None:
            _default = WorkerPool(size=max(1, min(4, os.cpu_count() or 1)))
            atexit.register(_default.close)
        return _default


# ---------------------------------------------------------------------------------------------- worker side


def _serve(memory_mb: int) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed by library code goes to stderr, not into the protocol
    sys.stdout = sys.stderr
    import logging
    import math
    import resource

    import warnings

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "Timeout is disabled": the parent kills instead
    warnings.simplefilter("ignore")
    fns = {}
    for name, target in FUNCTIONS.items():
        mod, _, attr = target.partition(":")
        fns[name] = getattr(importlib.import_module(mod), attr)
    for target in WARMUPS:  # first-use costs (imports, grammar builds) are paid before "ready", not in a deadline
        mod, _, attr = target.partition(":")
        getattr(importlib.import_module(mod), attr)()
    if memory_mb > 0:
        lim = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        try:
            req = json.loads(line)
            ru = resource.getrusage(resource.RUSAGE_SELF)
            budget = math.ceil(ru.ru_utime + ru.ru_stime + 2 * float(req.get("deadline_s") or 60)) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (budget, resource.RLIM_INFINITY))  # SIGXCPU ends a runaway
            out: dict[str, Any] = {"ok": fns[req["fn"]](*req["args"])}
        except MemoryError:
            out = {"error": "MemoryError: the call exceeded the worker's memory limit"}
        except Exception as e:  # noqa: BLE001 - reported to the caller as data
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            out = {"error": f"{type(e).__name__}: {msg[:200]}" if msg else type(e).__name__}
        proto.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    _serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
