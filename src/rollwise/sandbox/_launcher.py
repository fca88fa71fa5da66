"""Sandbox launcher: runs as its own process (stdlib only, `python -I -S`), builds the jail, execs the program.

Process tree (host view):

    scorer (any thread) ──Popen──> launcher ──fork──> init (pid 1 of a new PID namespace) ──fork──> program

- launcher: sets PDEATHSIG so it dies with the scorer, joins the sample's memory cgroup (where the host made
  one), unshares the namespaces, forks init, relays its status.
- init: pid 1 of the new PID namespace, root in a private mount namespace with no network. It mounts a
  size- and inode-capped tmpfs as the new root, bind-mounts the system directories read-only (nosuid,
  nodev), mounts a fresh /proc, caps SysV IPC in its IPC namespace, clears the capability
  bounding set, chroots into the root, then forks the program. When init exits (or is killed), the kernel
  SIGKILLs every process left in the namespace: nothing the program started can outlive it.
- program: inherits init's root; joins a fresh anonymous session keyring, drops every group and to a
  per-sandbox uid, no_new_privs, rlimits, a seccomp filter (libseccomp, see `_seccomp.py`), a scrubbed
  environment, exec. Its only writable places are /work and /tmp, both inside the tmpfs.

Run by root, the program gets a per-sandbox uid; run by anyone else, the launcher first creates a user
namespace (where unprivileged user namespaces are allowed) and the program keeps the invoking user's uid,
with no capabilities.

How it is started, and why: `python -I -S -B /dev/fd/S C` where S is an fd open on this file and C an fd
carrying the JSON configuration. So init's command line (`/proc/1/cmdline`, readable in the jail) holds no
host path. The configuration names a *status fd*: every failure to build the jail is written there (one
line starting `rollwise-sandbox:`); the program's process writes `exec` just before execve, and the fd is
close-on-exec, so the host reads exactly `exec` then EOF when the jail was built and the program started.
The program never holds that fd: its exit code and its output mean nothing about the jail.

NOTE: the per-sandbox uid (root mode) is 100000 + launcher pid, unique among live sandboxes, so RLIMIT_NPROC (counted
per real uid) bounds each sandbox on its own and concurrent sandboxes cannot signal each other.
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
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
KEYCTL_JOIN_SESSION_KEYRING = 1

USERNS_UID = 1000
SHM_BYTES = 1 << 20
"""SysV shared memory the whole jail may hold (its IPC namespace's shmall/shmmax): 1 MiB."""

_libc = ctypes.CDLL(None, use_errno=True)

# -- seccomp (libseccomp through ctypes: the maintained library compiles the BPF, we only list rules) ------
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_NE, SCMP_CMP_MASKED_EQ = 1, 7
INT_MASK = 0xFFFFFFFF
"""`int` arguments are compared on their low 32 bits, the bits the kernel reads: set high bits cannot dodge a rule."""
EPERM, ENOSYS = 1, 38

DENIED_SYSCALLS = (
    # keyrings: the kernel's keys are shared by uid / session, not by namespace
    "add_key", "request_key", "keyctl",
    # debugging and introspection of other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # kernel attack surface an untrusted program never needs
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "memfd_secret", "lookup_dcookie", "fanotify_init", "open_by_handle_at", "name_to_handle_at",
    # file systems and namespaces
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsconfig", "fsmount",
    "fspick", "move_mount", "open_tree", "mount_setattr", "quotactl", "quotactl_fd", "swapon", "swapoff",
    # kernel modules, kexec, reboot, clocks, host names, accounting, logs, ports
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
    "acct", "syslog", "iopl", "ioperm", "personality", "vhangup", "nfsservctl",
    # memory outside RLIMIT_AS: an anonymous file in page cache; SysV shared memory, semaphore sets and
    # message queues, and POSIX message queues, all kernel memory held by the IPC namespace, not a process
    "memfd_create", "shmget", "semget", "semop", "semtimedop", "semctl", "msgget", "msgsnd", "msgrcv", "msgctl",
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
)
"""System calls that fail with EPERM in the program (and everything it starts)."""

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
NETLINK_ROUTE = 0
ALLOWED_SOCKET_FAMILIES = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)
"""Socket families the program may create (socket, socketpair); every other one below 64 fails with EPERM.

Each allowed one is scoped by the jail's own namespaces: AF_UNIX by its file system (and its network
namespace for abstract names), AF_INET/AF_INET6 by the empty network namespace (not even loopback is up),
AF_NETLINK for NETLINK_ROUTE only (the namespace's own, empty interface list; glibc's getaddrinfo asks it).
Families that are not network-namespaced (AF_VSOCK reaches the hypervisor's host on a VM, AF_BLUETOOTH,
AF_ALG's kernel crypto, AF_RDS, AF_KCM, ...) and raw ones (AF_PACKET) are denied. The kernel itself refuses
families at or above its AF_MAX (46 on 6.x) with EAFNOSUPPORT."""
SOCKET_FAMILY_LIMIT = 64
"""Families 0..63 outside the allowed list are denied; the margin over AF_MAX covers families new kernels add."""

CLONE_NS_FLAGS = (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
                  CLONE_NEWNET, CLONE_NEWTIME)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


_SECCOMP_LIB: list = []


def _seccomp_lib():
    """libseccomp, or None when it is not installed (see .ci/setup.d/30-sandbox.sh). Loaded once."""
    if _SECCOMP_LIB:
        return _SECCOMP_LIB[0]
    lib = None
    # NOTE: the soname first; find_library runs `ldconfig -p` (tens of milliseconds) and is the fallback.
    for name in ("libseccomp.so.2", None):
        try:
            if name is None:
                from ctypes import util  # imports subprocess, shutil...: only when the soname is not found

                name = util.find_library("seccomp") or "libseccomp.so"
            lib = ctypes.CDLL(name, use_errno=True)
            break
        except OSError:
            continue
    if lib is not None:
        _init_seccomp_lib(lib)
    _SECCOMP_LIB.append(lib)
    return lib


def _init_seccomp_lib(lib) -> None:
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]


def seccomp_available() -> bool:
    return _seccomp_lib() is not None


def _errno_action(err: int) -> int:
    return 0x00050000 | (err & 0xFFFF)


def install_seccomp() -> None:
    """Load the deny-list filter into this process (needs no_new_privs first). Raises OSError on failure."""
    lib = _seccomp_lib()
    if lib is None:
        raise OSError(ENOSYS, "libseccomp (libseccomp.so.2) is not installed")
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)  # other architectures' calls (int 0x80, x32) are killed by default
    if not ctx:
        raise OSError(ENOSYS, "seccomp_init failed")
    try:
        for name in DENIED_SYSCALLS:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                continue  # not a system call on this architecture
            rc = lib.seccomp_rule_add_array(ctx, _errno_action(EPERM), nr, 0, None)
            if rc < 0:
                raise OSError(-rc, f"seccomp rule for {name}: {os.strerror(-rc)}")
        # clone with a namespace flag: one rule per flag (a rule matches when all of its comparisons do)
        clone = lib.seccomp_syscall_resolve_name(b"clone")
        for flag in CLONE_NS_FLAGS:
            cmp = _ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag)
            rc = lib.seccomp_rule_add_array(ctx, _errno_action(EPERM), clone, 1, ctypes.byref(cmp))
            if rc < 0:
                raise OSError(-rc, f"seccomp rule for clone: {os.strerror(-rc)}")
        # socket families: deny by family number (never "allow unless"), on the int's 32 bits
        for call in (b"socket", b"socketpair"):
            nr = lib.seccomp_syscall_resolve_name(call)
            for fam in range(SOCKET_FAMILY_LIMIT):
                if fam in ALLOWED_SOCKET_FAMILIES:
                    continue
                cmp = _ArgCmp(0, SCMP_CMP_MASKED_EQ, INT_MASK, fam)
                rc = lib.seccomp_rule_add_array(ctx, _errno_action(EPERM), nr, 1, ctypes.byref(cmp))
                if rc < 0:
                    raise OSError(-rc, f"seccomp rule for {call.decode()}: {os.strerror(-rc)}")
            # netlink: the route family only (any other protocol, or high bits set, is denied)
            cmps = (_ArgCmp * 2)(_ArgCmp(0, SCMP_CMP_MASKED_EQ, INT_MASK, AF_NETLINK), _ArgCmp(2, SCMP_CMP_NE, NETLINK_ROUTE, 0))
            rc = lib.seccomp_rule_add_array(ctx, _errno_action(EPERM), nr, 2, cmps)
            if rc < 0:
                raise OSError(-rc, f"seccomp rule for {call.decode()} (netlink): {os.strerror(-rc)}")
        # clone3 passes its flags in memory a filter cannot read: say it does not exist, libc falls back to clone
        clone3 = lib.seccomp_syscall_resolve_name(b"clone3")
        if clone3 >= 0:
            rc = lib.seccomp_rule_add_array(ctx, _errno_action(ENOSYS), clone3, 0, None)
            if rc < 0:
                raise OSError(-rc, f"seccomp rule for clone3: {os.strerror(-rc)}")
        rc = lib.seccomp_load(ctx)
        if rc < 0:
            raise OSError(-rc, f"seccomp_load: {os.strerror(-rc)}")
    finally:
        lib.seccomp_release(ctx)


def _keyctl_nr() -> int:
    lib = _seccomp_lib()
    if lib is not None:
        nr = lib.seccomp_syscall_resolve_name(b"keyctl")
        if nr >= 0:
            return nr
    return {"x86_64": 250, "aarch64": 219}.get(os.uname().machine, -1)


# -- the jail ---------------------------------------------------------------------------------------------
_status_fd = -1


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {dst}")


def _prctl(option: int, arg: int, arg2: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(arg2), 0, 0), f"prctl {option}")


def _fail(msg: str) -> None:
    """Report a jail failure on the status fd (out of band: the program never holds it) and leave."""
    try:
        os.write(_status_fd, f"rollwise-sandbox: {msg}\n".encode())
    except OSError:
        os.write(2, f"rollwise-sandbox: {msg}\n".encode())
    os._exit(1)


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
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmpfs_mb']}m,nr_inodes={cfg['tmpfs_inodes']},mode=755")
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
    # The program's files come in the configuration (a pipe), never from the host's disk: nothing of the
    # candidate is left in the host's /tmp even when the scorer is SIGKILLed.
    for name, text in cfg["files"].items():
        dst = f"{root}/work/{name}"
        with open(dst, "wb") as fout:
            fout.write(text.encode("utf-8", "surrogatepass"))  # a lone surrogate is the program's bug, not the jail's
        os.chown(dst, uid, uid)
    # SysV IPC objects outlive detaching and are not address space: cap them in this IPC namespace (seccomp
    # also denies shmget, semget, msgget, mq_open). In a user namespace whose uid 0 is unmapped these files
    # are read-only to us (seccomp alone then holds, and the memory cgroup where there is one).
    pages = max(1, SHM_BYTES // os.sysconf("SC_PAGE_SIZE"))
    caps = (("kernel/shmmax", SHM_BYTES), ("kernel/shmall", pages), ("kernel/shmmni", 16), ("kernel/msgmni", 0),
            ("kernel/sem", "0 0 0 0"), ("fs/mqueue/queues_max", 0))
    for name, value in caps:
        try:
            with open(f"{root}/proc/sys/{name}", "w") as fh:  # this namespace's own values
                fh.write(str(value))
        except PermissionError:
            if not cfg["userns"]:
                raise
    try:
        _libc.sethostname(b"sandbox", 7)
    except Exception:  # noqa: BLE001 - cosmetic only
        pass


def _clear_capability_bounding_set() -> None:
    with open("/proc/sys/kernel/cap_last_cap") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)


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
    """Runs in the program's process: fresh keyring, drop privileges, rlimits, seccomp, exec. Never returns."""
    uid = cfg["uid"]
    os.chdir("/work")  # init already chrooted; the program inherits its root
    # A fresh anonymous session keyring: the host session's keys are out of reach even before seccomp.
    nr = _keyctl_nr()
    if nr < 0 or _libc.syscall(nr, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        raise OSError(ctypes.get_errno(), "cannot join a fresh session keyring")
    for name, value in cfg["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    if not cfg["userns"]:  # in a user namespace we already are the only mapped, unprivileged uid
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.umask(0o077)
    if cfg["seccomp"]:
        install_seccomp()
    # "exec" then EOF (the fd is close-on-exec) means the jail is built and the program started; a failed
    # execve returns, and `_fail` adds its reason after "exec".
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; exec would pass that on
        signal.signal(sig, signal.SIG_DFL)
    os.write(_status_fd, b"exec\n")
    os.set_inheritable(_status_fd, False)
    os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])


def _init(cfg: dict) -> None:
    """pid 1 of the sandbox's PID namespace. Never returns."""
    try:
        _build_root(cfg)
        # NOTE: init enters the jail too, so even /proc/1/root (were it readable) leads only into the jail.
        os.chroot(cfg["root"])
        os.chdir("/")
        _clear_capability_bounding_set()  # inherited by the program; its own capabilities go at setresuid
    except OSError as e:
        _fail(f"cannot build the sandbox root: {e}")
    pid = os.fork()
    if pid == 0:
        try:
            _exec_program(cfg)
        except BaseException as e:  # noqa: BLE001 - report and leave
            _fail(f"cannot start the program: {e}")
    os.close(_status_fd)
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


def _read_config(fd: int) -> dict:
    chunks = []
    while True:
        b = os.read(fd, 1 << 16)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    return json.loads(b"".join(chunks))


def main() -> None:
    global _status_fd
    cfg = _read_config(int(sys.argv[1]))
    _status_fd = cfg["status_fd"]
    os.set_inheritable(_status_fd, True)  # init and the program's setup need it; the program's exec closes it
    if cfg.get("script_fd") is not None:
        os.close(cfg["script_fd"])
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    _seccomp_lib()  # load libseccomp once here; init and the program inherit it with the fork
    if os.getppid() != cfg["parent_pid"]:  # the scorer died before PDEATHSIG was armed
        os._exit(137)
    if cfg.get("cgroup_procs"):
        # Join the sample's memory cgroup before anything forks: init, the program and all it starts are
        # counted together (user memory, page tables, tmpfs pages, pipes, IPC objects), whatever their number.
        try:
            with open(cfg["cgroup_procs"], "w") as fh:
                fh.write(str(os.getpid()))
        except OSError as e:
            _fail(f"cannot join the sample's memory cgroup {cfg['cgroup_procs']}: {e}")
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
        os.close(alive_r)
        _init(cfg)
    os.close(alive_r)
    os.close(_status_fd)
    _, status = os.waitpid(pid, 0)
    os._exit(_exit_code(status))


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # noqa: BLE001 - any launcher bug is a jail failure, reported out of band
        if isinstance(e, SystemExit) and not e.code:
            raise
        _fail(f"launcher error: {type(e).__name__}: {e}")
