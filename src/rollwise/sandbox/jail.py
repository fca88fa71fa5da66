"""Run untrusted (model-written) Python in an isolated child process and collect what it printed.

The idea: one short-lived jail per program, built from Linux namespaces by `_launcher.py` (a stdlib-only
script the host starts as a child): private mount namespace with a tmpfs root, read-only system dirs, no
network namespace devices (not even loopback is up), its own PID namespace (killing pid 1 kills all),
a per-sandbox uid with no groups, `no_new_privs`, rlimits, and a scrubbed environment. The host side
here enforces wall time and output size, and kills the launcher, which brings the whole namespace down.

Deliberately left out: seccomp syscall filtering, cgroup memory/CPU accounting (rlimits are per process:
N processes may each use up to the memory limit, N bounded by the process limit), and any protection of
the *reward* from a program that forges its own result inside its process (see docs/sandbox.md).

Run by root, the program gets its own uid; run by another user, the launcher builds the same jail inside
an unprivileged user namespace (the program keeps the invoking uid, with no capabilities). When neither
works, `isolation="auto"` falls back to a plain child with rlimits and a scrubbed environment and warns
loudly once; `isolation="required"` (or $ROLLWISE_SANDBOX=required) refuses.
"""

from __future__ import annotations

import json
import math
import os
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


_LAUNCHER = str(Path(__file__).with_name("_launcher.py"))
_JAIL_FAILED = 125
IsolationMode = Literal["auto", "required", "off"]


class SandboxUnavailable(RuntimeError):
    """Isolation was required but this machine cannot provide it (see `isolation_status()`)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource bounds of one sandboxed program. Validated at construction."""

    wall_s: float = 10.0
    """Wall-clock limit, enforced by the host: past it the whole sandbox is killed."""
    cpu_s: int | None = None
    """CPU-seconds limit (RLIMIT_CPU); None means ceil(wall_s)."""
    memory_mb: int = 1024
    """Address-space limit per process (RLIMIT_AS). Python raises MemoryError past it."""
    nproc: int = 32
    """Processes + threads the sandbox uid may own at once (RLIMIT_NPROC); stops fork bombs."""
    nofile: int = 64
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    fsize_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE)."""
    tmpfs_mb: int = 64
    """Size of the writable tmpfs (/work and /tmp together)."""
    output_bytes: int = 1 << 20
    """Bytes of stdout and of stderr kept; past either the program is killed (`output_limited`)."""

    def __post_init__(self) -> None:
        for name in ("wall_s", "memory_mb", "nproc", "nofile", "fsize_mb", "tmpfs_mb", "output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")
        if self.cpu_s is not None and self.cpu_s < 1:
            raise ValueError(f"SandboxLimits.cpu_s must be >= 1 second, got {self.cpu_s!r}")

    def rlimits(self) -> dict[str, int]:
        mb = 1 << 20
        return {
            "RLIMIT_CPU": int(self.cpu_s or math.ceil(self.wall_s)),
            "RLIMIT_AS": self.memory_mb * mb,
            "RLIMIT_NPROC": self.nproc,
            "RLIMIT_NOFILE": self.nofile,
            "RLIMIT_FSIZE": self.fsize_mb * mb,
            "RLIMIT_CORE": 0,
        }


@dataclass
class SandboxResult:
    """What happened to one program. `exit_code` is 128+N when it died of signal N."""

    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool = False
    """Killed at the wall-time limit, or by the CPU-time limit (SIGXCPU / SIGKILL at RLIMIT_CPU)."""
    output_limited: bool = False
    """Killed for printing more than `output_bytes` on stdout or stderr."""
    isolated: bool = True
    """False when it ran without namespaces (the loud fallback)."""
    side_channel: str = ""
    """What the program wrote to the fd named by $ROLLWISE_RESULT_FD (a harness's verdict)."""
    info: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_limited


def _feed(pipe, data: bytes) -> None:
    try:
        if data:
            pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


def _set_rlimits(limits: dict[str, int]) -> None:
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def _default_python() -> tuple[str, list[str]]:
    """The interpreter used inside the jail and the extra read-only paths it needs.

    Prefer the system's /usr/bin/python3 (already under the read-only /usr). Otherwise expose only the
    running interpreter's install prefix (read-only), even when it lives under $HOME (pyenv).
    """
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(cand, os.X_OK):
            return cand, []
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    return exe, [os.path.realpath(sys.base_prefix)]


_SYSTEM_RO = ["/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin", "/etc/ld.so.cache", "/etc/localtime"]

_status_lock = threading.Lock()
_status: tuple[bool, str] | None = None


def isolation_status() -> tuple[bool, str]:
    """(available, reason), probed once per process by building a real jail around `pass`."""
    global _status
    with _status_lock:
        if _status is None:
            _status = _probe()
        return _status


def _probe() -> tuple[bool, str]:
    if not sys.platform.startswith("linux"):
        return False, f"namespaces need Linux, this is {sys.platform}"
    try:
        res = Sandbox(isolation="required", _skip_check=True).run_python("pass", limits=SandboxLimits(wall_s=20))
    except Exception as e:  # noqa: BLE001 - any failure means "not available", with its reason
        return False, f"{type(e).__name__}: {e}"
    if res.exit_code == 0:
        if os.geteuid() == 0:
            return True, "namespaces (mount, pid, net, ipc, uts), chroot, per-sandbox uid, rlimits"
        return True, "user namespace + (mount, pid, net, ipc, uts), chroot, no capabilities, rlimits; runs as the invoking uid"
    reason = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit code {res.exit_code}"
    return False, reason


_warned = False


def _warn_unisolated(reason: str) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    msg = (
        "ROLLWISE SANDBOX WARNING: code isolation is UNAVAILABLE on this machine "
        f"({reason}). Untrusted code will run as a plain child process with rlimits only: it CAN read "
        "your files and use the network. Run as root (or with CAP_SYS_ADMIN), or set isolation='required' "
        "to refuse instead."
    )
    print(msg, file=sys.stderr, flush=True)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


class Sandbox:
    """Runs programs in jails. Thread-safe: each `run` builds and tears down its own jail."""

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        isolation: IsolationMode | None = None,
        python: str | None = None,
        _skip_check: bool = False,
    ) -> None:
        self.limits = limits or SandboxLimits()
        mode = isolation or os.environ.get("ROLLWISE_SANDBOX", "auto")
        if mode not in ("auto", "required", "off"):
            raise ValueError(f"sandbox isolation must be 'auto', 'required' or 'off', got {mode!r}")
        self.isolation: IsolationMode = mode  # type: ignore[assignment]
        default_py, extra_ro = _default_python()
        self.python = python or default_py
        self.ro_paths = _SYSTEM_RO + extra_ro
        # The launcher needs only the stdlib; the system interpreter starts faster than a pyenv/venv one.
        self.launcher_python = default_py if not extra_ro else os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        self.isolated = mode != "off"
        if mode != "off" and not _skip_check:
            ok, reason = isolation_status()
            if not ok:
                if mode == "required":
                    raise SandboxUnavailable(f"sandbox isolation is required but unavailable: {reason}")
                _warn_unisolated(reason)
                self.isolated = False
        elif mode == "off" and not _skip_check:
            _warn_unisolated("isolation='off' was asked for")

    def run_python(
        self, code: str, *, stdin: str = "", limits: SandboxLimits | None = None, files: dict[str, str] | None = None
    ) -> SandboxResult:
        """Run `code` as /work/main.py with the jail's interpreter (isolated mode: `-I`)."""
        files = dict(files or {})
        files["main.py"] = code
        return self.run([self.python, "-I", "-B", "main.py"], stdin=stdin, limits=limits, files=files)

    def run(
        self, argv: list[str], *, stdin: str = "", limits: SandboxLimits | None = None, files: dict[str, str] | None = None
    ) -> SandboxResult:
        """Run `argv` (absolute program path first) in /work holding `files`; returns after it ends or is killed."""
        lim = limits or self.limits
        with tempfile.TemporaryDirectory(prefix="rollwise-sbx-") as tmp:
            files_dir = os.path.join(tmp, "files")
            os.mkdir(files_dir, 0o700)
            for name, text in (files or {}).items():
                if "/" in name or name in ("", ".", ".."):
                    raise ValueError(f"sandbox file names must be plain names, got {name!r}")
                Path(files_dir, name).write_text(text, encoding="utf-8")
            result_r, result_w = os.pipe()
            env = {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": "/work",
                "TMPDIR": "/tmp",
                "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1",
                "ROLLWISE_RESULT_FD": str(result_w),
            }
            try:
                if self.isolated:
                    root = os.path.join(tmp, "root")
                    os.mkdir(root, 0o700)
                    cfg = {
                        "parent_pid": os.getpid(),
                        "root": root,
                        "files_dir": files_dir,
                        "ro_paths": self.ro_paths,
                        "tmpfs_mb": lim.tmpfs_mb,
                        "rlimits": lim.rlimits(),
                        "argv": argv,
                        "env": env,
                    }
                    cmd = [self.launcher_python, "-I", "-S", "-B", _LAUNCHER, json.dumps(cfg)]
                    proc = subprocess.Popen(
                        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        pass_fds=(result_w,), start_new_session=True, env={}, cwd="/",
                    )
                else:
                    # NOTE: no RLIMIT_NPROC here: without a uid of its own it would count all of the user's processes.
                    rl = {k: v for k, v in lim.rlimits().items() if k != "RLIMIT_NPROC"}
                    proc = subprocess.Popen(
                        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        pass_fds=(result_w,), start_new_session=True, env=env, cwd=files_dir,
                        preexec_fn=lambda: _set_rlimits(rl),
                    )
            finally:
                os.close(result_w)
            return self._collect(proc, result_r, stdin, lim)

    def _collect(self, proc: subprocess.Popen, result_r: int, stdin: str, lim: SandboxLimits) -> SandboxResult:
        """Feed stdin, read the three pipes with caps, enforce wall time, kill everything on the way out."""
        t0 = time.monotonic()
        deadline = t0 + lim.wall_s
        bufs: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray(), "result": bytearray()}
        sel = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
        sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
        sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
        result_file = os.fdopen(result_r, "rb", buffering=0)
        sel.register(result_file, selectors.EVENT_READ, "result")
        # A writer thread, so a program that never reads a large stdin cannot block us past the deadline.
        threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True).start()
        timed_out = output_limited = False
        killed_at: float | None = None
        try:
            while sel.get_map():
                now = time.monotonic()
                if killed_at is None and now >= deadline:
                    timed_out = True
                    killed_at = self._kill(proc)
                if killed_at is not None and now - killed_at > 5.0:
                    break  # pipes held open by something we cannot see; stop waiting
                wait = max(0.0, min(deadline - now, 0.25)) if killed_at is None else 0.25
                for key, _ in sel.select(timeout=wait):
                    chunk = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    buf = bufs[key.data]
                    cap = lim.output_bytes if key.data != "result" else 1 << 16
                    room = cap - len(buf)
                    buf += chunk[: max(room, 0)]
                    if len(chunk) > room and killed_at is None:
                        output_limited = True
                        killed_at = self._kill(proc)
            remaining = max(0.1, deadline + 5.0 - time.monotonic())
            try:
                code = proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                timed_out = True
                self._kill(proc)
                code = proc.wait()
        finally:
            sel.close()
            result_file.close()
            for f in (proc.stdout, proc.stderr):
                f.close()
            if proc.poll() is None:
                self._kill(proc)
                proc.wait()
        exit_code = 128 - code if code < 0 else code  # Popen reports signals as negative numbers
        if exit_code in (128 + signal.SIGXCPU,) or (exit_code == 128 + signal.SIGKILL and not output_limited and self._cpu_exhausted(t0, lim)):
            timed_out = True
        stderr = bufs["stderr"].decode(errors="replace")
        if exit_code == _JAIL_FAILED and "rollwise-sandbox:" in stderr:
            raise SandboxUnavailable(stderr.strip().splitlines()[-1])
        return SandboxResult(
            exit_code=exit_code,
            stdout=bufs["stdout"].decode(errors="replace"),
            stderr=stderr,
            wall_s=time.monotonic() - t0,
            timed_out=timed_out,
            output_limited=output_limited,
            isolated=self.isolated,
            side_channel=bufs["result"].decode(errors="replace"),
        )

    @staticmethod
    def _cpu_exhausted(t0: float, lim: SandboxLimits) -> bool:
        """A SIGKILL we did not send after at least the CPU limit of wall time is RLIMIT_CPU's hard kill."""
        return time.monotonic() - t0 >= (lim.cpu_s or math.ceil(lim.wall_s)) * 0.9

    @staticmethod
    def _kill(proc: subprocess.Popen) -> float:
        """SIGKILL the launcher's process group; the jail's pid 1 dies by PDEATHSIG and takes the rest."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return time.monotonic()


_default: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """A process-wide sandbox with default limits (checks isolation, and warns, once)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Sandbox()
        return _default


def run_python(code: str, *, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` in the default sandbox."""
    return default_sandbox().run_python(code, stdin=stdin, limits=limits)

