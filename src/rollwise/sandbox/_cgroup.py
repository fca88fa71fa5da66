"""One memory cgroup per sample: every process of one jail, and the kernel memory they cause, under one limit.

RLIMIT_AS bounds one process; a sample may start `nproc` of them, and pipes, page tables, tmpfs pages and IPC
objects are not address space at all. A memory cgroup counts all of it together, so the host makes one per
jail (`rollwise-sbx-<scorer pid>-<n>`, under the scorer's own cgroup, so it also stays inside whatever limit
the scorer runs under), the launcher joins it before it forks, and the kernel's OOM killer acts inside it
when the sample passes its limit. The host reads the peak and the OOM kills, then removes the cgroup.

Where a machine offers one:
- cgroup v1: the `memory` controller mounted and the scorer's memory cgroup writable (root; this project's
  machines). `memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` (memory + swap) where swap
  accounting exists. Kernel memory is charged to the same counter on current kernels.
- cgroup v2: only where the scorer's own cgroup already hands the `memory` controller to its children
  (`cgroup.subtree_control`); rollwise does not move the scorer between cgroups to make that so.
  `memory.max`, `memory.swap.max` = 0.
Elsewhere `find()` returns None with the reason, and the sandbox falls back to an honest bound: the
per-process limit times the process limit (see `jail.SandboxLimits`).

A scorer killed with SIGKILL cannot remove its cgroups: `sweep` removes those whose owner pid is dead (an
empty cgroup removes with rmdir) at the next start.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from dataclasses import dataclass

PREFIX = "rollwise-sbx-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-\d+$")
_counter = itertools.count()
_leftover: list[SampleCgroup] = []
"""This process's cgroups whose last processes had not exited at removal: retried at the next creation."""
_leftover_lock = threading.Lock()


@dataclass(frozen=True)
class Layout:
    """Where per-sample cgroups are made, and the file names of this cgroup version."""

    version: int
    parent: str
    """The scorer's own memory cgroup directory; per-sample cgroups are its children."""

    @property
    def limit_file(self) -> str:
        return "memory.limit_in_bytes" if self.version == 1 else "memory.max"


def _mounts(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """(root, mount point, fs type, super options) per line of /proc/self/mountinfo."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        f, r = left.split(), right.split()
        if len(f) >= 5 and len(r) >= 3:
            out.append((f[3], f[4].replace("\\040", " "), r[0], r[2]))
    return out


def _join(mount_point: str, mount_root: str, cg_path: str) -> str:
    rel = cg_path
    if mount_root != "/" and (cg_path == mount_root or cg_path.startswith(mount_root + "/")):
        rel = cg_path[len(mount_root):]
    return os.path.normpath(mount_point + "/" + rel.lstrip("/"))


def locate(mountinfo: str, proc_cgroup: str) -> tuple[Layout | None, str]:
    """The scorer's memory cgroup from the text of /proc/self/mountinfo and /proc/self/cgroup (pure: testable)."""
    paths = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in parts[1].split(",") if parts[1] else [""]:
                paths[ctrl] = parts[2]
    mounts = _mounts(mountinfo)
    for root, point, fstype, opts in mounts:
        if fstype == "cgroup" and "memory" in opts.split(",") and "memory" in paths:
            return Layout(1, _join(point, root, paths["memory"])), "cgroup v1 memory controller"
    for root, point, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in paths:
            return Layout(2, _join(point, root, paths[""])), "cgroup v2"
    return None, "no memory cgroup controller is mounted"


def _usable(layout: Layout) -> str | None:
    """None when per-sample cgroups can be made under `layout.parent`; otherwise why not."""
    if layout.version == 2:
        try:
            with open(os.path.join(layout.parent, "cgroup.subtree_control")) as fh:
                if "memory" not in fh.read().split():
                    return f"cgroup v2: {layout.parent} does not hand the memory controller to its children"
        except OSError as e:
            return f"cgroup v2: {e}"
    probe = os.path.join(layout.parent, f"{PREFIX}{os.getpid()}-{next(_counter)}")
    try:
        os.mkdir(probe)
    except OSError as e:
        return f"cannot create a cgroup under {layout.parent}: {e.strerror}"
    try:
        with open(os.path.join(probe, layout.limit_file), "w") as fh:
            fh.write(str(64 << 20))
    except OSError as e:
        return f"cannot set a memory limit under {layout.parent}: {e.strerror}"
    finally:
        try:
            os.rmdir(probe)
        except OSError:
            pass
    return None


_found: list[tuple[Layout | None, str]] = []
_found_lock = threading.Lock()


def find() -> tuple[Layout | None, str]:
    """The layout per-sample memory cgroups are made in, or (None, why not). Probed once per process."""
    with _found_lock:
        if not _found:
            layout, how = None, "memory cgroups need Linux"
            try:
                with open("/proc/self/mountinfo") as fh:
                    mountinfo = fh.read()
                with open("/proc/self/cgroup") as fh:
                    cgroup = fh.read()
                layout, how = locate(mountinfo, cgroup)
            except OSError as e:
                how = f"cannot read the cgroup layout: {e}"
            if layout is not None:
                why_not = _usable(layout)
                if why_not is not None:
                    layout, how = None, why_not
                else:
                    sweep(layout.parent)
            _found.append((layout, how))
        return _found[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def sweep(parent: str) -> list[str]:
    """Remove per-sample cgroups under `parent` whose scorer is dead (a SIGKILLed scorer leaves them). Returns them."""
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        m = _NAME.match(name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            try:
                os.rmdir(os.path.join(parent, name))
                removed.append(name)
            except OSError:
                pass  # still has processes (they die with their jail); the next sweep takes it
    return removed


class SampleCgroup:
    """One jail's memory cgroup: made with its limit, joined by the launcher, read and removed at the end."""

    def __init__(self, layout: Layout, limit_bytes: int):
        self.layout = layout
        with _leftover_lock:
            _leftover[:] = [cg for cg in _leftover if not cg.remove(wait_s=0)]
        self.path = os.path.join(layout.parent, f"{PREFIX}{os.getpid()}-{next(_counter)}")
        os.mkdir(self.path)
        try:
            self._write(layout.limit_file, limit_bytes)
            if layout.version == 1:
                if os.path.exists(os.path.join(self.path, "memory.memsw.limit_in_bytes")):
                    self._write("memory.memsw.limit_in_bytes", limit_bytes)  # memory + swap: no way out through swap
            elif os.path.exists(os.path.join(self.path, "memory.swap.max")):
                self._write("memory.swap.max", 0)
        except BaseException:
            self.remove(wait_s=0)
            raise

    @property
    def procs_file(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def _write(self, name: str, value: int) -> None:
        with open(os.path.join(self.path, name), "w") as fh:
            fh.write(str(value))

    def _read(self, name: str) -> str:
        try:
            with open(os.path.join(self.path, name)) as fh:
                return fh.read()
        except OSError:
            return ""

    def peak_bytes(self) -> int | None:
        """Most memory the sample held at once (None where the kernel does not keep a peak)."""
        text = self._read("memory.max_usage_in_bytes" if self.layout.version == 1 else "memory.peak").strip()
        return int(text) if text.isdigit() else None

    def oom_kills(self) -> int:
        """Processes the kernel killed because the sample reached its limit."""
        text = self._read("memory.oom_control" if self.layout.version == 1 else "memory.events")
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def close(self) -> None:
        """Remove the cgroup, or leave it for the next creation when its last processes have not exited yet."""
        if not self.remove():
            with _leftover_lock:
                _leftover.append(self)

    def remove(self, wait_s: float = 1.0) -> bool:
        """rmdir, retried for `wait_s` while the jail's last processes exit. False when it is still there."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)
