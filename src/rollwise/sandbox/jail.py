"""Run untrusted (model-written) Python in an isolated child process and collect what it printed.

The idea: one short-lived jail per program, built from Linux namespaces by `_launcher.py` (a stdlib-only
script the host starts as a child): private mount namespace with an inode- and size-capped tmpfs root,
read-only system dirs, an empty network namespace (not even loopback is up), its own PID namespace
(killing pid 1 kills all), an IPC namespace with 1 MiB of SysV shared memory and no semaphores or message
queues, a per-sandbox uid with no groups, a fresh session keyring, an empty capability bounding set,
`no_new_privs`, a seccomp deny-list (libseccomp: keyrings, ptrace, bpf, perf, userfaultfd, io_uring, mounts,
namespaces, modules, memfd, SysV and POSIX IPC, socket families no namespace scopes such as AF_VSOCK...),
rlimits, a memory cgroup per sample where the machine offers one, and a scrubbed environment. The host side here enforces wall time and output size, and kills the
launcher, which brings the whole namespace down. Jail failures come back on a status pipe the program never
holds (never inferred from exit codes or from anything the program can print).

Memory is bounded per sample across all of its processes: a memory cgroup per jail where the machine
offers one (`_cgroup.py`), else the per-process limit is cut so that the process limit times it fits the
sample's budget. The default budget comes from the machine: half its memory shared by the jails that may
run at once in this process (`MAX_JAILS`; more wait for a free slot). Nothing of the program is written to
the host's disk (its files reach the jail through the launcher's configuration pipe), so a SIGKILLed scorer
leaves no candidate source behind; the per-process directory it leaves (`/tmp/rollwise-sbx-<pid>`, an empty
mount point) and its cgroups are swept by the next process that starts a jail.

Deliberately left out: CPU accounting (concurrent jails compete for cores) and an allow-list seccomp
policy (the deny-list leaves the rest of the kernel's syscall surface reachable).

Run by root, the program gets its own uid; run by another user, the launcher builds the same jail inside
an unprivileged user namespace (the program keeps the invoking uid, with no capabilities). Isolation is
`required` by default: a machine that cannot build the full jail (namespaces and seccomp) raises
`SandboxUnavailable` with one line. `isolation="auto"` (or $ROLLWISE_SANDBOX=auto) accepts a jail without
seccomp, or no jail at all, with a loud warning; `"off"` never isolates, also loudly. What each sandbox
of this process actually got is `isolation_in_use()`, for a run's card.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import resource
import select
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

from rollwise.sandbox import _cgroup, _launcher

_LAUNCHER = str(Path(__file__).with_name("_launcher.py"))
IsolationMode = Literal["auto", "required", "off"]
DEFAULT_ISOLATION: IsolationMode = "required"
SETUP_HINT = "install libseccomp2 (.ci/setup.d/30-sandbox.sh), or set ROLLWISE_SANDBOX=auto to accept less"


class SandboxUnavailable(RuntimeError):
    """Isolation was required but this machine cannot provide it, or a jail could not be built."""


def _max_jails() -> int:
    raw = os.environ.get("ROLLWISE_SANDBOX_JAILS", "8")
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"ROLLWISE_SANDBOX_JAILS must be a positive integer, got {raw!r}")
    return int(raw)


MAX_JAILS = _max_jails()
"""Jails alive at once in one process ($ROLLWISE_SANDBOX_JAILS, default 8: `score_many`'s default number of
workers); a ninth waits for a free slot. The default per-sample memory budget is shared among them."""
_slots = threading.BoundedSemaphore(MAX_JAILS)
MIN_PROCESS_MB = 32
"""Address space a jailed Python needs to start (measured: 24 MiB); the fallback never cuts a process below it."""


def machine_memory_mb() -> int:
    """The memory this process may use: MemTotal, or its own memory cgroup's limit when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    layout, _ = _cgroup.find()
    if layout is not None:
        name = "memory.limit_in_bytes" if layout.version == 1 else "memory.max"
        try:
            with open(os.path.join(layout.parent, name)) as fh:
                text = fh.read().strip()
            if text.isdigit():
                total = min(total, int(text) >> 20)
        except OSError:
            pass
    return total


def default_sample_memory_mb(max_jails: int | None = None) -> int:
    """Half of the machine's memory shared by the jails that may run at once (at least 256 MiB each).

    24 GiB and 8 jails: 1536 MiB per sample, 12 GiB for all of them; the other half stays for the run itself.
    """
    return max(256, machine_memory_mb() // 2 // (max_jails or MAX_JAILS))


@dataclass(frozen=True)
class SandboxLimits:
    """Resource bounds of one sandboxed program. Validated at construction."""

    wall_s: float = 10.0
    """Wall-clock limit, enforced by the host: past it the whole sandbox is killed."""
    cpu_s: int | None = None
    """CPU-seconds limit (RLIMIT_CPU); None means ceil(wall_s)."""
    memory_mb: int = 1024
    """Address-space limit per process (RLIMIT_AS). Python raises MemoryError past it."""
    sample_memory_mb: int | None = None
    """Memory of the whole sample: all of its processes together, and the kernel memory they cause (pipes,
    page tables, tmpfs files). A memory cgroup enforces it where the machine has one (past it the kernel
    kills a process of the sample: `SandboxResult.memory_limited`); elsewhere each process's RLIMIT_AS is
    cut to `sample_memory_mb // nproc`. None: `default_sample_memory_mb()`, from the machine's memory."""
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
        if self.sample_memory_mb is not None and not self.sample_memory_mb > 0:
            raise ValueError(f"SandboxLimits.sample_memory_mb must be positive, got {self.sample_memory_mb!r}")
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
            "RLIMIT_MSGQUEUE": 0,  # POSIX message queues: kernel memory per uid (mq_open is also denied)
        }

    def memory_plan(self, cgroup: bool, default_sample_mb: int) -> tuple[int, int]:
        """(per-sample bound, per-process RLIMIT_AS) in MiB. Without a cgroup the bound is nproc x RLIMIT_AS.

        Raises ValueError when an explicit `sample_memory_mb` cannot give each of `nproc` processes
        MIN_PROCESS_MB (a default one, on a small machine, gives MIN_PROCESS_MB and reports the larger bound).
        """
        sample = self.sample_memory_mb or default_sample_mb
        if cgroup:
            return sample, self.memory_mb
        per_process = min(self.memory_mb, sample // self.nproc)
        if per_process < MIN_PROCESS_MB and self.sample_memory_mb is None:
            # A budget derived from a small machine: keep Python startable; the bound reported is the real one.
            per_process = min(self.memory_mb, MIN_PROCESS_MB)
        elif per_process < MIN_PROCESS_MB:
            raise ValueError(
                f"SandboxLimits: sample_memory_mb={sample} over nproc={self.nproc} processes leaves "
                f"{sample // self.nproc} MiB per process on a machine without a memory cgroup; a jailed Python "
                f"needs {MIN_PROCESS_MB}: raise sample_memory_mb or lower nproc"
            )
        return per_process * self.nproc, per_process


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
    memory_limited: bool = False
    """The kernel killed a process of the sample for reaching `sample_memory_mb` (memory cgroup only)."""
    peak_memory_mb: float | None = None
    """Most memory the whole sample held at once (memory cgroup only; None without one)."""

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


HOST_DIR_PREFIX = "rollwise-sbx-"
_host_dirs: dict[int, str] = {}
_host_dir_lock = threading.Lock()


def _owner_dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


def sweep_host_dirs(base: str | None = None) -> list[str]:
    """Remove `/tmp/rollwise-sbx-<pid>` directories whose process is dead (a SIGKILLed scorer's). Returns them.

    Also takes the previous format (`rollwise-sbx-<8 random characters>`, which held candidate source) once
    it is an hour old: no jail lives that long.
    """
    base = base or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(HOST_DIR_PREFIX):
            continue
        path = os.path.join(base, name)
        rest = name[len(HOST_DIR_PREFIX):]
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.geteuid():
            continue  # never follow a link or take someone else's directory
        if rest.isdigit():
            stale = int(rest) != os.getpid() and _owner_dead(int(rest))
        else:
            stale = bool(re.fullmatch(r"[a-z0-9_]{8}", rest)) and time.time() - st.st_mtime > 3600
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def host_dir() -> str:
    """This process's `/tmp/rollwise-sbx-<pid>`: `root/` (the jails' mount point, always empty on the host)
    and the unisolated fallback's per-run directories. Made once per process, after sweeping dead ones."""
    pid = os.getpid()
    with _host_dir_lock:
        d = _host_dirs.get(pid)
        if d is None or not os.path.isdir(d):
            base = tempfile.gettempdir()
            sweep_host_dirs(base)
            d = os.path.join(base, f"{HOST_DIR_PREFIX}{pid}")
            if os.path.islink(d):
                os.unlink(d)
            elif os.path.isdir(d):  # left by a dead process that had our pid
                shutil.rmtree(d, ignore_errors=True)
            os.mkdir(d, 0o700)
            os.mkdir(os.path.join(d, "root"), 0o700)
            _host_dirs[pid] = d
            atexit.register(_remove_host_dir, pid, d)
        return d


def _remove_host_dir(pid: int, d: str) -> None:
    if os.getpid() == pid:  # not in a forked child that inherited the handler
        shutil.rmtree(d, ignore_errors=True)


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

    def __init__(self, proc: subprocess.Popen, status_r: int | None, tmp: str | None, isolated: bool,
                 cgroup: _cgroup.SampleCgroup | None = None, slot: threading.BoundedSemaphore | None = None):
        self.proc, self.isolated, self._tmp = proc, isolated, tmp
        self.cgroup = cgroup
        self._slot = slot
        self._status_r = status_r
        self._status = bytearray()
        self._status_done = status_r is None

    def memory(self) -> tuple[float | None, bool]:
        """(peak MiB of the whole sample, whether the kernel killed a process at its limit); cgroup only."""
        if self.cgroup is None:
            return None, False
        peak = self.cgroup.peak_bytes()
        return (None if peak is None else round(peak / (1 << 20), 1)), self.cgroup.oom_kills() > 0

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
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        if self.cgroup is not None:
            self.cgroup.close()
            self.cgroup = None
        if self._slot is not None:
            self._slot.release()
            self._slot = None

    def __del__(self) -> None:
        # A Jail dropped without close() must not hold its slot (or its processes) forever.
        if getattr(self, "_slot", None) is not None:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - best effort at garbage collection
                pass

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
        self.memory_cgroup, self.memory_how = _cgroup.find() if self.isolated else (None, "no jail")
        self.default_sample_memory_mb = default_sample_memory_mb()
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
        if not self.isolated:
            self.memory_cgroup, self.memory_how = None, "no jail"
        self.limits.memory_plan(self.memory_cgroup is not None, self.default_sample_memory_mb)  # refuse a bad plan now
        if not (self.isolated and self.seccomp):
            self.warning = f"code ran with less than the full sandbox (isolation={mode}): {self.how}"
        with _in_use_lock:
            _in_use.setdefault((mode, self.isolated, self.seccomp), self.describe())

    def describe(self) -> dict:
        """The isolation this sandbox applies, as data (see `isolation_in_use`)."""
        return {"mode": self.isolation, "isolated": self.isolated, "seccomp": self.seccomp, "how": self.how,
                "warning": self.warning, "memory": self.memory_bound()}

    def memory_bound(self, limits: SandboxLimits | None = None) -> str:
        """One line: how much memory one sample may hold with `limits` (default: this sandbox's), and how."""
        lim = limits or self.limits
        sample, per_process = lim.memory_plan(self.memory_cgroup is not None, self.default_sample_memory_mb)
        if self.memory_cgroup is not None:
            return (f"{sample} MiB per sample over all its processes (memory cgroup v{self.memory_cgroup.version}), "
                    f"{per_process} MiB address space per process, at most {MAX_JAILS} samples at once")
        if not self.isolated:
            return f"{per_process} MiB address space per process, process count unbounded (no jail)"
        return (f"{sample} MiB per sample = {lim.nproc} processes x {per_process} MiB address space "
                f"(no memory cgroup: {self.memory_how}), at most {MAX_JAILS} samples at once")

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
        """Start `argv` in a new jail with stdin, stdout and stderr pipes; the caller drives and closes it.

        Waits for a free slot when MAX_JAILS jails of this process are alive.
        """
        lim = limits or self.limits
        files = dict(files or {})
        for name in files:
            if "/" in name or "\0" in name or name in ("", ".", ".."):
                raise ValueError(f"sandbox file names must be plain names, got {name!r}")
        sample_mb, process_mb = lim.memory_plan(self.memory_cgroup is not None, self.default_sample_memory_mb)
        rlimits = lim.rlimits()
        rlimits["RLIMIT_AS"] = process_mb << 20
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1"}
        base = host_dir()
        _slots.acquire()
        cgroup: _cgroup.SampleCgroup | None = None
        tmp: str | None = None
        try:
            if not self.isolated:
                # The fallback has no jail to carry the files: a per-run directory, removed at close and swept
                # with this process's directory if the scorer is SIGKILLed.
                tmp = tempfile.mkdtemp(prefix="run-", dir=base)
                for name, text in files.items():
                    Path(tmp, name).write_text(text, encoding="utf-8")
                # NOTE: no RLIMIT_NPROC here: without a uid of its own it would count all of the user's processes.
                rl = {k: v for k, v in rlimits.items() if k != "RLIMIT_NPROC"}
                proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True, env=env, cwd=tmp, preexec_fn=lambda: _set_rlimits(rl),
                )
                return Jail(proc, None, tmp, isolated=False, slot=_slots)
            if self.memory_cgroup is not None:
                cgroup = _cgroup.SampleCgroup(self.memory_cgroup, sample_mb << 20)
            status_r, status_w = os.pipe()
            cfg_r, cfg_w = os.pipe()
            script_fd = os.open(_LAUNCHER, os.O_RDONLY)
            cfg = {
                "parent_pid": os.getpid(), "root": os.path.join(base, "root"), "files": files, "ro_paths": self.ro_paths,
                "tmpfs_mb": lim.tmpfs_mb, "tmpfs_inodes": lim.tmpfs_inodes, "rlimits": rlimits, "argv": argv,
                "env": env, "status_fd": status_w, "script_fd": script_fd, "seccomp": self.seccomp,
                "cgroup_procs": cgroup.procs_file if cgroup is not None else None,
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
                os.close(cfg_w)
                raise
            finally:
                for fd in (status_w, cfg_r, script_fd):
                    os.close(fd)
            try:
                # May exceed a pipe's 64 KiB (the files ride along): the launcher reads it all before anything else.
                view = memoryview(json.dumps(cfg).encode())
                while view:
                    view = view[os.write(cfg_w, view):]
            except OSError:
                pass  # the launcher is gone: its status pipe says so
            finally:
                os.close(cfg_w)
            return Jail(proc, status_r, None, isolated=True, cgroup=cgroup, slot=_slots)
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            if cgroup is not None:
                cgroup.close()
            _slots.release()
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
        peak_mb, memory_limited = jail.memory()
        if not memory_limited and cpu_exhausted(exit_code, output_limited, t0, lim):
            timed_out = True
        return SandboxResult(
            exit_code=exit_code,
            stdout=bufs["stdout"].decode(errors="replace"),
            stderr=bufs["stderr"].decode(errors="replace"),
            wall_s=time.monotonic() - t0,
            timed_out=timed_out,
            output_limited=output_limited,
            isolated=self.isolated,
            memory_limited=memory_limited,
            peak_memory_mb=peak_mb,
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
