"""RUN_DIR hygiene at the start of every run: nothing the run writes or deletes may lie outside RUN_DIR, and
what a crash left half-done is cleaned away.

`check_run_dir(run_dir)` refuses, with one line, a path the run owns (config.yaml, metrics.jsonl, checkpoints/,
rollouts/, quarantine/, sft/, ...) or anything inside its folders that is a symbolic link resolving outside RUN_DIR,
and a file the run appends to or overwrites in place that has another hard link (the write would land in the
other name too). A resume writes config.yaml, appends to metrics.jsonl, renames shards into quarantine/ and
deletes old checkpoints: through such a link each of those would reach a file that is not the run's. Links that
stay inside RUN_DIR are allowed; RUN_DIR itself may be a link (it is resolved first).

`clean_run_dir(run_dir)` removes the temp files and folders crashed writers leave (`.tmp-step-*` checkpoint
folders, `.step-*.parquet.*.tmp` shards, `*.tmp` next to config.yaml, metrics.jsonl and summary.json); they are never complete
data, so deleting them loses nothing.

`set_aside_previous_run(run_dir)`: a fresh (not resumed) run in a used RUN_DIR moves the earlier run's
checkpoints and rollout shards into RUN_DIR/quarantine/previous-<time>/ instead of overwriting them step by step.

`lock_run_dir(run_dir)`: one run per RUN_DIR at a time (`rollwise train` and `rollwise sft` alike). A second run
into a live run's folder would set the live run's checkpoints, shards or SFT stage aside and clean its temp files
under it; it is refused with one line
naming the holder's pid instead. The lock is an flock on RUN_DIR/.lock, so the kernel drops it when the holder
dies however it dies (a SIGKILLed run can be resumed at once), and re-taking it in the process that holds it is a
no-op (a resume inside the same process).

Deliberately left out: guarding against a link created while the run is going (a check at start is what a
resume can promise; the run does not re-check before every write).
"""

from __future__ import annotations

import os
from pathlib import Path

OWNED = ("config.yaml", "metrics.jsonl", "summary.json", "eval_before.json", "report.html", "checkpoints",
         "rollouts", "quarantine", "init_model", "tensorboard", "sft", ".lock")
"""The names a run writes under RUN_DIR (see docs/loop.md)."""
_WRITTEN_IN_PLACE = ("config.yaml", "metrics.jsonl")
_TEMP_FILES = ("metrics.jsonl.tmp", "summary.json.tmp", "eval_before.json.tmp")


class RunDirError(ValueError):
    """A RUN_DIR path that leads outside it; the message is one line naming the path and where it leads."""


LOCK_NAME = ".lock"
_held: dict[str, int] = {}  # resolved RUN_DIR -> the fd holding its lock, in this process


class RunDirLock:
    """This process's hold on one RUN_DIR (`lock_run_dir`); `release()` lets another run in."""

    def __init__(self, key: str) -> None:
        self.key = key

    def release(self) -> None:
        fd = _held.pop(self.key, None)
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock


def lock_run_dir(run_dir: str | os.PathLike[str]) -> RunDirLock:
    """Take RUN_DIR for this process, or raise `RunDirError` (one line) when another live process has it."""
    import errno
    import fcntl

    root = Path(run_dir).resolve()
    key = str(root)
    if key in _held:
        return RunDirLock(key)
    path = root / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        reason = "it is a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise RunDirError(f"cannot lock {path}: {reason}") from None
    if os.fstat(fd).st_nlink > 1:
        os.close(fd)
        raise RunDirError(f"{path} has another hard link; the run rewrites it (remove it: it holds only a pid)")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirError(f"{root} is in use by another rollwise run (pid {holder}): wait for it to end, or give "
                          "another --out") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = fd
    return RunDirLock(key)


def _outside(root: Path, p: Path) -> Path | None:
    """Where the link `p` leads when that is outside `root` (None when it stays inside)."""
    target = p.resolve()
    return None if target == root or root in target.parents else target


def check_run_dir(run_dir: str | os.PathLike[str]) -> None:
    """Raise RunDirError when a path the run owns leads outside RUN_DIR (a symlink) or shares its data with
    another name (a hard link on a file written in place). A missing RUN_DIR passes (nothing to check)."""
    root = Path(run_dir).resolve()
    if not root.is_dir():
        return
    for name in OWNED:
        p = root / name
        if not os.path.lexists(p):
            continue
        if p.is_symlink():
            where = _outside(root, p)
            if where is not None:
                raise RunDirError(f"{p} is a symbolic link to {where}, outside the run directory {root}; refusing to "
                                  "write or delete through it (replace the link with a real folder or file)")
        if name in _WRITTEN_IN_PLACE and p.is_file() and not p.is_symlink() and p.stat().st_nlink > 1:
            raise RunDirError(f"{p} has {p.stat().st_nlink} hard links; the run appends to or rewrites it in place, "
                              "which would change the other name(s) too (copy it to a file of its own)")
        if p.is_dir() and not p.is_symlink():
            for top, dirs, files in os.walk(p):
                for entry in dirs + files:
                    q = Path(top) / entry
                    if q.is_symlink():
                        where = _outside(root, q)
                        if where is not None:
                            raise RunDirError(f"{q} is a symbolic link to {where}, outside the run directory {root}; "
                                              "refusing to write or delete through it")


def clean_run_dir(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Remove what crashed writers left behind; returns the paths removed."""
    from rollwise.store.writer import RolloutStore
    from rollwise.train.checkpoint import clean_stale_temp

    root = Path(run_dir)
    gone = clean_stale_temp(root) + RolloutStore(root).clean_temp_files()
    stale = [root / name for name in _TEMP_FILES] + sorted(root.glob(".config.yaml.*.tmp"))
    for p in stale:
        if p.is_file() and not p.is_symlink():
            p.unlink()
            gone.append(p)
    return gone


def set_aside_previous_run(run_dir: str | os.PathLike[str]) -> Path | None:
    """Move an earlier run's checkpoints (`checkpoints/step-*`) and shards (`rollouts/step-*.parquet`) into
    RUN_DIR/quarantine/previous-<time>/ (renames: nothing is copied or deleted); returns that folder, or None
    when there was nothing to move."""
    import time

    from rollwise.store.writer import SHARD_RE

    root = Path(run_dir)
    found = [p for p in sorted((root / "checkpoints").glob("step-*")) if p.is_dir()] + \
        [p for p in sorted((root / "rollouts").glob("step-*.parquet")) if SHARD_RE.match(p.name)]
    if not found:
        return None
    dest = root / "quarantine" / f"previous-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    for p in found:
        (dest / p.parent.name).mkdir(parents=True, exist_ok=True)
        os.replace(p, dest / p.parent.name / p.name)
    return dest
