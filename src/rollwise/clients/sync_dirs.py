"""The folders weight syncs write for a server to read, owned by the run that made them, and swept once it is dead.

A run removes its folder when it ends (a finalizer, at close or at interpreter exit). SIGKILL and the OOM killer
skip both, leaving a model-sized folder per server behind. So every folder carries an owner record
(`rollwise-owner.json`: host, boot id, pid and the process's start time), and a run that starts sweeps the folders
of dead runs from the same parent directory.

A folder is removed only when every one of these holds: its name has rollwise's prefix, it is a real directory
(not a link), its owner record parses, it was made on this host during this boot, and its owner process is gone
(no such pid, or a pid reused by a process that started later). Anything else (another host's run on a shared
filesystem, a folder without a record, a run still alive) is left alone.

Deliberately left out: sweeping other hosts' folders (their processes cannot be seen from here).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

PREFIX = "rollwise-weights-"
OWNER_FILE = "rollwise-owner.json"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None when it does not exist;
    '' where /proc cannot tell (then only its existence is known)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass
        return ""
    fields = stat[stat.rfind(")") + 2:].split()  # after the command name, which may hold spaces
    return fields[19] if len(fields) > 19 else ""


def _owner() -> dict[str, object]:
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid": os.getpid(),
            "start": _start_time(os.getpid()) or ""}


def make_sync_root(base: Path | None) -> Path:
    """A fresh folder for this run's syncs under `base` (None: the system's temporary directory), with its owner
    record; the dead runs' folders there are swept first."""
    sweep_dead(Path(base) if base is not None else Path(tempfile.gettempdir()))
    root = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
    (root / OWNER_FILE).write_text(json.dumps(_owner()))
    return root


def _dead(record: dict[str, object]) -> bool:
    """Whether the run that wrote `record` is certainly gone (same host and boot, its process no longer there)."""
    me = _owner()
    pid, start = record.get("pid"), record.get("start")
    if record.get("host") != me["host"] or record.get("boot_id") != me["boot_id"] or not me["boot_id"]:
        return False
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0 or not isinstance(start, str):
        return False
    now = _start_time(pid)
    return now is None or bool(start and now and now != start)


def sweep_dead(base: Path) -> list[Path]:
    """Remove the sync folders of dead runs directly under `base` (see the module docstring); returns them."""
    removed: list[Path] = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    for d in entries:
        if not d.name.startswith(PREFIX) or d.is_symlink() or not d.is_dir():
            continue
        rec = d / OWNER_FILE
        try:
            if rec.is_symlink() or not rec.is_file() or rec.stat().st_size > 4096:
                continue
            record = json.loads(rec.read_text())
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(record, dict) and _dead(record):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed
