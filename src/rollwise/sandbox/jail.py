"""Run untrusted (model-written) Python in an isolated child process and collect what it printed.

The idea: one short-lived jail per program, built from Linux namespaces by `_launcher.py` (a stdlib-only
script the host starts as a child): private mount namespace with an inode- and size-capped tmpfs root,
read-only system dirs, an empty network namespace (not even loopback is up), its own PID namespace
(killing pid 1 kills all), an IPC namespace with 1 MiB of SysV shared memory, a per-sandbox uid with no
groups, a fresh session keyring, an empty capability bounding set, `no_new_privs`, a seccomp deny-list
(libseccomp: keyrings, ptrace, bpf, perf, userfaultfd, io_uring, mounts, namespaces, modules, memfd...),
rlimits, and a scrubbed environment. The host side here enforces wall time and output size, and kills the
launcher, which brings the whole namespace down. Jail failures come back on a status pipe the program never
holds (never inferred from exit codes or from anything the program can print).

Deliberately left out: cgroup memory/CPU accounting (rlimits are per process: N processes may each use up
to the memory limit, N bounded by the process limit) and an allow-list seccomp policy (the deny-list
leaves the rest of the kernel's syscall surface reachable).

Run by root, the program gets its own uid; run by another user, the launcher builds the same jail inside
an unprivileged user namespace (the program keeps the invoking uid, with no capabilities). Isolation is
`required` by default: a machine that cannot build the full jail (namespaces and seccomp) raises
`SandboxUnavailable` with one line. `isolation="auto"` (or $ROLLWISE_SANDBOX=auto) accepts a jail without
seccomp, or no jail at all, with a loud warning; `"off"` never isolates, also loudly. What each sandbox
of this process actually got is `isolation_in_use()`, for a run's card.
"""

from __future__ import annotations

import json
import select
import math
import os
import resource
import selectors
import shutil
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

from rollwise.sandbox import _launcher

_LAUNCHER = str(Path(__file__).with_name("_launcher.py"))
IsolationMode = Literal["auto", "required", "off"]
DEFAULT_ISOLATION: IsolationMode = "required"
SETUP_HINT = "install libseccomp2 (.ci/setup.d/30-sandbox.sh), or set ROLLWISE_SANDBOX=auto to accept less"


class SandboxUnavailable(RuntimeError):
    """Isolation was required but this machine cannot provide it, or a jail could not be built."""


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
    tmpfs_inodes: int = 4096
    """Files, directories and links the tmpfs may hold (nr_inodes): bounds kernel memory spent on inodes."""
    output_bytes: int = 1 << 20
    """Bytes of stdout and of stderr kept; past either the program is killed (`output_limited`)."""

    def __post_init__(self) -> None:
        for name in ("wall_s", "memory_mb", "nproc", "nofile", "fsize_mb", "tmpfs_mb", "tmpfs_inodes", "output_bytes"):
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


@dataclass(frozen=True)
class _Capabilities:
    namespaces: bool
    seccomp: bool
    reason: str


_status_lock = threading.Lock()
_status: _Capabilities | None = None


def _capabilities() -> _Capabilities:
    global _status
    with _status_lock:
        if _status is None:
            _status = _probe()
        return _status


def isolation_status() -> tuple[bool, str]:
    """(full jail available, reason), probed once per process by building a real jail around `pass`.

    Full means namespaces *and* the seccomp filter, what `isolation="required"` needs.
    """
    caps = _capabilities()
    return caps.namespaces and caps.seccomp, caps.reason


def _probe() -> _Capabilities:
    if not sys.platform.startswith("linux"):
        return _Capabilities(False, False, f"namespaces need Linux, this is {sys.platform}")
    has_seccomp = _launcher.seccomp_available()
    reason = first_reason = ""
    for seccomp in ([True, False] if has_seccomp else [False]):
        if reason and not first_reason:
            first_reason = reason
        try:
            sb = Sandbox(isolation="required", _skip_check=True)
            sb.seccomp = seccomp
            res = sb.run_python("pass", limits=SandboxLimits(wall_s=20))
        except SandboxUnavailable as e:
            reason = str(e)
            continue
        except Exception as e:  # noqa: BLE001 - any failure means "not available", with its reason
            reason = f"{type(e).__name__}: {e}"
            continue
        if res.exit_code != 0:
            reason = f"the probe program failed in the jail: exit code {res.exit_code} {res.stderr.strip()[-200:]}"
            continue
        who = "per-sandbox uid" if os.geteuid() == 0 else "user namespace, the invoking uid without capabilities"
        how = f"namespaces (mount, pid, net, ipc, uts), chroot, {who}, fresh keyring, no capabilities, rlimits"
        if seccomp:
            return _Capabilities(True, True, how + ", seccomp")
        if has_seccomp:
            return _Capabilities(True, False, f"{how}; NO seccomp: loading the filter failed ({first_reason})")
        return _Capabilities(True, False, f"{how}; NO seccomp: libseccomp is not installed ({SETUP_HINT})")
    return _Capabilities(False, False, reason)


_warned: set[str] = set()


def _warn_loudly(msg: str) -> None:
    if msg in _warned:
        return
    _warned.add(msg)
    print(msg, file=sys.stderr, flush=True)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _warn_unisolated(reason: str) -> None:
    _warn_loudly(
        "ROLLWISE SANDBOX WARNING: code isolation is UNAVAILABLE on this machine "
        f"({reason}). Untrusted code will run as a plain child process with rlimits only: it CAN read "
        "your files and use the network. Run as root (or with CAP_SYS_ADMIN), or leave isolation at "
        "'required' to refuse instead."
    )


_in_use_lock = threading.Lock()
_in_use: dict[tuple, dict] = {}


def isolation_in_use() -> list[dict]:
    """What the sandboxes built in this process got, one dict per distinct setting (for a run's card).

    Keys: `mode` (asked: required / auto / off), `isolated` (namespaces), `seccomp`, `how` (one line), and
    `warning` (None, or the loud line when code ran with less than the full jail).
    """
    with _in_use_lock:
        return [dict(d) for d in _in_use.values()]


class Jail:
    """A started program: its pipes, the jail's status pipe, and its end. Use as a context manager."""

    def __init__(self, proc: subprocess.Popen, status_r: int | None, tmp: str, isolated: bool):
        self.proc, self.isolated, self._tmp = proc, isolated, tmp
        self._status_r = status_r
        self._status = bytearray()
        self._status_done = status_r is None

    def read_status(self, timeout: float) -> bool:
        """Read the status pipe until EOF or `timeout`; True once EOF was seen."""
        deadline = time.monotonic() + timeout
        while not self._status_done:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if not select.select([self._status_r], [], [], left)[0]:
                return False
            chunk = os.read(self._status_r, 4096)  # type: ignore[arg-type]
            if not chunk:
                self._status_done = True
                os.close(self._status_r)  # type: ignore[arg-type]
                self._status_r = None
            elif len(self._status) < 1 << 14:
                self._status += chunk
        return True

    def jail_error(self, timeout: float = 5.0) -> str | None:
        """None when the jail was built and the program started; otherwise the reason, one line.

        Only the launcher and the jail's init write this pipe; the program never holds it.
        """
        if not self.isolated:
            return None
        if not self.read_status(timeout):
            return "the jail's status pipe stayed open (launcher hung)"
        lines = self._status.decode(errors="replace").splitlines()
        failures = [ln for ln in lines if ln != "exec"]
        if failures:
            return failures[-1]
        if lines == ["exec"]:
            return None
        code = self.proc.poll()
        return f"rollwise-sandbox: the launcher ended before starting the program (exit code {code})"

    def kill(self) -> float:
        """SIGKILL the launcher's process group; the jail's pid 1 dies by PDEATHSIG and takes the rest."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return time.monotonic()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        if self._status_r is not None:
            os.close(self._status_r)
            self._status_r = None
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> Jail:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
        mode = isolation or os.environ.get("ROLLWISE_SANDBOX") or DEFAULT_ISOLATION
        if mode not in ("auto", "required", "off"):
            raise ValueError(f"sandbox isolation must be 'auto', 'required' or 'off', got {mode!r}")
        self.isolation: IsolationMode = mode  # type: ignore[assignment]
        default_py, extra_ro = _default_python()
        self.python = python or default_py
        self.ro_paths = _SYSTEM_RO + extra_ro
        # The launcher needs only the stdlib; the system interpreter starts faster than a pyenv/venv one.
        self.launcher_python = default_py if not extra_ro else os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        self.isolated = mode != "off"
        self.seccomp = self.isolated
        self.how = "not checked"
        self.warning: str | None = None
        if _skip_check:
            return
        if mode == "off":
            self.seccomp = False
            self.how = "no isolation (isolation='off' was asked for)"
            _warn_unisolated("isolation='off' was asked for")
        else:
            caps = _capabilities()
            self.how = caps.reason
            if not (caps.namespaces and caps.seccomp):
                if mode == "required":
                    raise SandboxUnavailable(f"sandbox isolation is required but unavailable: {caps.reason}")
                self.isolated, self.seccomp = caps.namespaces, False
                if caps.namespaces:
                    _warn_loudly(f"ROLLWISE SANDBOX WARNING: jail WITHOUT a seccomp filter ({caps.reason}); "
                                 "the program can reach keyrings, ptrace, bpf, io_uring... of the kernel.")
                else:
                    _warn_unisolated(caps.reason)
        if not (self.isolated and self.seccomp):
            self.warning = f"code ran with less than the full sandbox (isolation={mode}): {self.how}"
        with _in_use_lock:
            _in_use.setdefault((mode, self.isolated, self.seccomp), self.describe())

    def describe(self) -> dict:
        """The isolation this sandbox applies, as data (see `isolation_in_use`)."""
        return {"mode": self.isolation, "isolated": self.isolated, "seccomp": self.seccomp, "how": self.how,
                "warning": self.warning}

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
        """Run `argv` (absolute program path first) in /work holding `files`; returns after it ends or is killed.

        Raises `SandboxUnavailable` when the jail could not be built (reported by the jail, out of band).
        """
        lim = limits or self.limits
        with self.start(argv, limits=lim, files=files) as jail:
            return self._collect(jail, stdin, lim)

    def start(self, argv: list[str], *, limits: SandboxLimits | None = None, files: dict[str, str] | None = None) -> Jail:
        """Start `argv` in a new jail with stdin, stdout and stderr pipes; the caller drives and closes it."""
        lim = limits or self.limits
        tmp = tempfile.mkdtemp(prefix="rollwise-sbx-")
        try:
            files_dir = os.path.join(tmp, "files")
            os.mkdir(files_dir, 0o700)
            for name, text in (files or {}).items():
                if "/" in name or name in ("", ".", ".."):
                    raise ValueError(f"sandbox file names must be plain names, got {name!r}")
                Path(files_dir, name).write_text(text, encoding="utf-8")
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
                   "PYTHONDONTWRITEBYTECODE": "1"}
            if not self.isolated:
                # NOTE: no RLIMIT_NPROC here: without a uid of its own it would count all of the user's processes.
                rl = {k: v for k, v in lim.rlimits().items() if k != "RLIMIT_NPROC"}
                proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True, env=env, cwd=files_dir, preexec_fn=lambda: _set_rlimits(rl),
                )
                return Jail(proc, None, tmp, isolated=False)
            root = os.path.join(tmp, "root")
            os.mkdir(root, 0o700)
            status_r, status_w = os.pipe()
            cfg_r, cfg_w = os.pipe()
            script_fd = os.open(_LAUNCHER, os.O_RDONLY)
            cfg = {
                "parent_pid": os.getpid(), "root": root, "files_dir": files_dir, "ro_paths": self.ro_paths,
                "tmpfs_mb": lim.tmpfs_mb, "tmpfs_inodes": lim.tmpfs_inodes, "rlimits": lim.rlimits(), "argv": argv,
                "env": env, "status_fd": status_w, "script_fd": script_fd, "seccomp": self.seccomp,
            }
            # The launcher reads itself from /dev/fd/N and its configuration from a pipe, so the jail's
            # /proc/1/cmdline names no host path.
            cmd = [self.launcher_python, "-I", "-S", "-B", f"/dev/fd/{script_fd}", str(cfg_r)]
            try:
                proc = subprocess.Popen(
                    cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    pass_fds=(status_w, cfg_r, script_fd), start_new_session=True, env={}, cwd="/",
                )
            except BaseException:
                os.close(status_r)
                raise
            finally:
                for fd in (status_w, cfg_r, script_fd):
                    os.close(fd)
            try:
                os.write(cfg_w, json.dumps(cfg).encode())  # far below a pipe's 64 KiB: never blocks
            except OSError:
                pass  # the launcher is gone: its status pipe says so
            finally:
                os.close(cfg_w)
            return Jail(proc, status_r, tmp, isolated=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _collect(self, jail: Jail, stdin: str, lim: SandboxLimits) -> SandboxResult:
        """Feed stdin, read the pipes with caps, enforce wall time, kill everything on the way out."""
        proc = jail.proc
        t0 = time.monotonic()
        deadline = t0 + lim.wall_s
        bufs: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        sel = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
        sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
        sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
        # A writer thread, so a program that never reads a large stdin cannot block us past the deadline.
        threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True).start()
        timed_out = output_limited = False
        killed_at: float | None = None
        try:
            while sel.get_map():
                now = time.monotonic()
                if killed_at is None and now >= deadline:
                    timed_out = True
                    killed_at = jail.kill()
                if killed_at is not None and now - killed_at > 5.0:
                    break  # pipes held open by something we cannot see; stop waiting
                wait = max(0.0, min(deadline - now, 0.25)) if killed_at is None else 0.25
                for key, _ in sel.select(timeout=wait):
                    chunk = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    buf = bufs[key.data]
                    room = lim.output_bytes - len(buf)
                    buf += chunk[: max(room, 0)]
                    if len(chunk) > room and killed_at is None:
                        output_limited = True
                        killed_at = jail.kill()
            remaining = max(0.1, deadline + 5.0 - time.monotonic())
            try:
                code = proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                timed_out = True
                jail.kill()
                code = proc.wait()
        finally:
            sel.close()
        err = jail.jail_error()
        if err is not None:
            raise SandboxUnavailable(err)
        exit_code = 128 - code if code < 0 else code  # Popen reports signals as negative numbers
        if cpu_exhausted(exit_code, output_limited, t0, lim):
            timed_out = True
        return SandboxResult(
            exit_code=exit_code,
            stdout=bufs["stdout"].decode(errors="replace"),
            stderr=bufs["stderr"].decode(errors="replace"),
            wall_s=time.monotonic() - t0,
            timed_out=timed_out,
            output_limited=output_limited,
            isolated=self.isolated,
        )


def cpu_exhausted(exit_code: int, output_limited: bool, t0: float, lim: SandboxLimits) -> bool:
    """SIGXCPU, or a SIGKILL we did not send after at least the CPU limit of wall time (RLIMIT_CPU's hard kill)."""
    if exit_code == 128 + signal.SIGXCPU:
        return True
    return exit_code == 128 + signal.SIGKILL and not output_limited and time.monotonic() - t0 >= (lim.cpu_s or math.ceil(lim.wall_s)) * 0.9


_default: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """A process-wide sandbox with default limits and isolation (checks isolation, and warns, once)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Sandbox()
        return _default


def run_python(code: str, *, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` in the default sandbox."""
    return default_sandbox().run_python(code, stdin=stdin, limits=limits)
