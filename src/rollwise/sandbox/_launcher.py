"""Sandbox launcher: runs as its own process (stdlib only, `python -I -S`), builds the jail, execs the program.

Process tree (host view):

    scorer (any thread) ──Popen──> launcher ──fork──> init (pid 1 of a new PID namespace) ──fork──> program

- launcher: sets PDEATHSIG so it dies with the scorer, unshares the namespaces, forks init, relays its status.
- init: pid 1 of the new PID namespace, root in a private mount namespace with no network. It mounts a
  size-capped tmpfs as the new root, bind-mounts the system directories read-only (nosuid, nodev), mounts
  a fresh /proc, chroots into it, then forks the program. When init exits (or is killed), the kernel SIGKILLs every process
  left in the namespace: nothing the program started can outlive it.
- program: inherits init's root; drops every group and to a per-sandbox uid, no_new_privs, rlimits, a
  scrubbed environment, exec. Its only writable places are /work and /tmp, both inside the tmpfs.

Run by root, the program gets a per-sandbox uid; run by anyone else, the launcher first creates a user
namespace (where unprivileged user namespaces are allowed) and the program keeps the invoking user's uid,
with no capabilities.

NOTE: the per-sandbox uid (root mode) is 100000 + launcher pid, unique among live sandboxes, so RLIMIT_NPROC (counted
per real uid) bounds each sandbox on its own and concurrent sandboxes cannot signal each other.

Exit status: the program's exit code, 128 + signal if it was killed, or 125 with a line on stderr starting
with `rollwise-sandbox:` if the jail itself could not be built.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

JAIL_FAILED = 125
USERNS_UID = 1000

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {dst}")


def _prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


def _fail(msg: str) -> None:
    os.write(2, f"rollwise-sandbox: {msg}\n".encode())
    os._exit(JAIL_FAILED)


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _bind_ro(src: str, dst: str) -> None:
    _mount(src, dst, None, MS_BIND | MS_REC)
    _mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _build_root(cfg: dict) -> None:
    """Runs in init: a tmpfs root holding read-only system dirs, /proc, a few /dev nodes and writable /work."""
    root = cfg["root"]
    uid = cfg["uid"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmpfs_mb']}m,mode=755")
    for src in cfg["ro_paths"]:
        dst = root + src
        if os.path.islink(src) and os.path.dirname(src) == "/":  # merged-/usr symlinks like /lib -> usr/lib
            os.symlink(os.readlink(src), dst)
            continue
        if not os.path.exists(src):
            continue
        if os.path.isdir(src):
            os.makedirs(dst, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            open(dst, "w").close()
        _bind_ro(src, dst)
    os.makedirs(root + "/dev", exist_ok=True)
    for node in ("null", "zero", "random", "urandom"):
        open(f"{root}/dev/{node}", "w").close()
        _mount(f"/dev/{node}", f"{root}/dev/{node}", None, MS_BIND)
    os.makedirs(root + "/proc", exist_ok=True)
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for d, mode in (("/work", 0o700), ("/tmp", 0o700)):
        os.makedirs(root + d, mode=mode, exist_ok=True)
        os.chown(root + d, uid, uid)
    src_dir = cfg["files_dir"]
    for name in os.listdir(src_dir):
        dst = f"{root}/work/{name}"
        with open(os.path.join(src_dir, name), "rb") as fin, open(dst, "wb") as fout:
            fout.write(fin.read())
        os.chown(dst, uid, uid)
    try:
        _libc.sethostname(b"sandbox", 7)
    except Exception:  # noqa: BLE001 - cosmetic only
        pass


def _count_procs_of(uid: int) -> int:
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def _exec_program(cfg: dict) -> None:
    """Runs in the program's process: chroot, drop privileges, rlimits, exec. Never returns."""
    uid = cfg["uid"]
    os.chdir("/work")  # init already chrooted; the program inherits its root
    for name, value in cfg["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    if not cfg["userns"]:  # in a user namespace we already are the only mapped, unprivileged uid
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.umask(0o077)
    os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])


def _init(cfg: dict) -> None:
    """pid 1 of the sandbox's PID namespace. Never returns."""
    try:
        _build_root(cfg)
        # NOTE: init enters the jail too, so even /proc/1/root (were it readable) leads only into the jail.
        os.chroot(cfg["root"])
        os.chdir("/")
    except OSError as e:
        _fail(f"cannot build the sandbox root: {e}")
    pid = os.fork()
    if pid == 0:
        try:
            _exec_program(cfg)
        except BaseException as e:  # noqa: BLE001 - report and leave
            _fail(f"cannot start the program: {e}")
    status = 0
    while True:  # NOTE: as pid 1 we reap every orphan; we leave when the program itself ends.
        try:
            done, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if done == pid:
            status = st
            break
    os._exit(_exit_code(status))


def main() -> None:
    cfg = json.loads(sys.argv[1])
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != cfg["parent_pid"]:  # the scorer died before PDEATHSIG was armed
        os._exit(137)
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    euid, egid = os.geteuid(), os.getegid()
    cfg["userns"] = euid != 0
    if cfg["userns"]:
        # Unprivileged: a user namespace gives us the capabilities to build the jail; the program then runs
        # as the invoking user (mapped to USERNS_UID inside) and loses every capability at execve.
        flags |= CLONE_NEWUSER
        cfg["uid"] = USERNS_UID
        # RLIMIT_NPROC counts all of this user's processes, so the limit is on top of what already runs.
        cfg["rlimits"]["RLIMIT_NPROC"] += _count_procs_of(euid)
    else:
        cfg["uid"] = 100000 + os.getpid()
    try:
        _check(_libc.unshare(flags), "unshare")
    except OSError as e:
        _fail(f"cannot create namespaces (needs root, CAP_SYS_ADMIN or unprivileged user namespaces): {e}")
    if cfg["userns"]:
        try:
            for name, text in (("setgroups", "deny"), ("uid_map", f"{USERNS_UID} {euid} 1"), ("gid_map", f"{USERNS_UID} {egid} 1")):
                with open(f"/proc/self/{name}", "w") as fh:
                    fh.write(text)
        except OSError as e:
            _fail(f"cannot map the user namespace: {e}")
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # If the launcher died between fork and prctl, its end of the pipe is closed: leave at once.
        if select.select([alive_r], [], [], 0)[0]:
            os._exit(137)
        _init(cfg)
    os.close(alive_r)
    _, status = os.waitpid(pid, 0)
    os._exit(_exit_code(status))


if __name__ == "__main__":
    main()
