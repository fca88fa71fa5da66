"""Attacks on the sandbox's resource bounds (issue 19): each one held more than its limit before.

Before: one sample held 500 MB of SysV semaphores and message queues under a 128 MB limit; many processes
each at the per-process limit added up to 1.2 GB under 320 MB; AF_VSOCK sockets (not network-namespaced)
could be created in the jail; a SIGKILLed scorer left the candidate's source in /tmp/rollwise-sbx-*.
Each test also shows the attack code does what it claims where that is cheap, so it cannot pass because
the attack was broken.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from rollwise.sandbox import Sandbox, SandboxLimits, _cgroup, jail

SRC = Path(__file__).resolve().parents[2] / "src"

# -- SysV semaphores and message queues -------------------------------------------------------------------
SYSV_HOG = textwrap.dedent("""
    import ctypes, json, sys
    libc = ctypes.CDLL(None, use_errno=True)
    target = int(sys.argv[1]) << 20 if len(sys.argv) > 1 else TARGET
    held, errs = 0, {}
    SEM_BYTES = 64          # struct sem: one cache line per semaphore, kernel memory of the IPC namespace
    while held < target // 2:
        if libc.semget(0, 32000, 0o600) < 0:
            errs['semget'] = ctypes.get_errno(); break
        held += 32000 * SEM_BYTES
    msg = ctypes.create_string_buffer(8 + 8192)
    ctypes.c_long.from_buffer(msg).value = 1
    while held < target:
        q = libc.msgget(0, 0o600)
        if q < 0:
            errs['msgget'] = ctypes.get_errno(); break
        for _ in range(2):  # 2 x 8 KiB = the default msgmnb of one queue
            if libc.msgsnd(q, msg, 8192, 0o4000) < 0:  # IPC_NOWAIT
                errs['msgsnd'] = ctypes.get_errno(); break
            held += 8192
        else:
            continue
        break
    print(json.dumps({'held_mb': held >> 20, 'errs': errs}))
""")


def test_sysv_semaphores_and_message_queues_cannot_hold_memory(sandbox):
    """500 MB of SysV objects under a 128 MB sample limit: every allocation is refused."""
    code = SYSV_HOG.replace("TARGET", str(500 << 20))
    res = sandbox.run_python(code, limits=SandboxLimits(wall_s=20.0, memory_mb=128, sample_memory_mb=128))
    out = json.loads(res.stdout)
    assert out == {"held_mb": 0, "errs": {"semget": errno.EPERM, "msgget": errno.EPERM}}, res.stdout + res.stderr
    if os.geteuid() == 0:  # the IPC namespace's own caps hold without the filter too (root mode sets them)
        bare = Sandbox(isolation="required")
        bare.seccomp = False
        out = json.loads(bare.run_python(code, limits=SandboxLimits(wall_s=20.0, memory_mb=128, sample_memory_mb=128)).stdout)
        assert out["held_mb"] == 0 and set(out["errs"]) == {"semget", "msgget"}, out
    if shutil.which("unshare") and os.geteuid() == 0:
        # The same code on the host, in a throw-away IPC namespace, does hold kernel memory (16 MiB asked).
        host = subprocess.run(["unshare", "--ipc", sys.executable, "-c", code, "16"], capture_output=True, text=True, timeout=30)
        assert json.loads(host.stdout) == {"held_mb": 16, "errs": {}}, host.stdout + host.stderr


# -- socket families that no namespace scopes ------------------------------------------------------------
AF = {"AF_VSOCK": 40, "AF_ALG": 38, "AF_PACKET": 17, "AF_BLUETOOTH": 31, "AF_RDS": 21, "AF_TIPC": 30, "AF_KCM": 41,
      "AF_XDP": 44, "AF_CAN": 29, "AF_LLC": 26, "AF_SMC": 43, "AF_QIPCRTR": 42}
SOCKET_PROBE = textwrap.dedent(f"""
    import ctypes, json, socket
    libc = ctypes.CDLL(None, use_errno=True)
    NR_SOCKET = {{'x86_64': 41, 'aarch64': 198}}[__import__('os').uname().machine]
    out = {{}}
    def probe(name, family, type_, proto=0):
        fd = libc.syscall(NR_SOCKET, ctypes.c_long(family), ctypes.c_long(type_), ctypes.c_long(proto))
        out[name] = 0 if fd >= 0 else ctypes.get_errno()
    for name, fam in {AF!r}.items():
        for type_ in (1, 2, 5, 3):  # stream, dgram, seqpacket, raw: whichever the family supports
            probe(name, fam, type_)
            if out[name] in (0, {errno.EPERM}):
                break
    probe('AF_VSOCK high bits', (1 << 32) | 40, 1)           # the kernel reads only the int's 32 bits
    probe('NETLINK_AUDIT', 16, 3, 9)
    probe('NETLINK_KOBJECT_UEVENT', 16, 2, 15)
    probe('NETLINK_ROUTE', 16, 3, 0)                         # allowed: the namespace's own (empty) links
    probe('AF_UNIX', 1, 1)
    probe('AF_INET', 2, 1)
    try:
        a, b = socket.socketpair()
        a.sendall(b'ok'); out['socketpair'] = b.recv(2).decode()
    except OSError as e:
        out['socketpair'] = e.errno
    print(json.dumps(out))
""")


def test_vsock_and_other_unscoped_socket_families_are_denied(sandbox):
    res = sandbox.run_python(SOCKET_PROBE, limits=SandboxLimits(wall_s=10.0))
    out = json.loads(res.stdout)
    denied = [*AF, "AF_VSOCK high bits", "NETLINK_AUDIT", "NETLINK_KOBJECT_UEVENT"]
    assert {k: out[k] for k in denied} == {k: errno.EPERM for k in denied}, out
    assert out["NETLINK_ROUTE"] == out["AF_UNIX"] == out["AF_INET"] == 0 and out["socketpair"] == "ok", out
    # Without the filter the same probe reaches the kernel's families (it gets other answers than EPERM),
    # and AF_VSOCK, which no namespace scopes, is created in a jail exactly when the host can create one.
    bare = Sandbox(isolation="required")
    bare.seccomp = False
    raw = json.loads(bare.run_python(SOCKET_PROBE, limits=SandboxLimits(wall_s=10.0)).stdout)
    assert sum(raw[k] != errno.EPERM for k in AF) >= 6, raw
    host = json.loads(subprocess.run([sys.executable, "-c", SOCKET_PROBE], capture_output=True, text=True, timeout=30).stdout)
    assert (raw["AF_VSOCK"] == 0) == (host["AF_VSOCK"] == 0), (raw, host)


# -- memory over all of a sample's processes ------------------------------------------------------------
MANY_PROCESSES = textwrap.dedent("""
    import os, select, sys, time
    CHILDREN, MB = 8, 100
    r, w = os.pipe()
    pids = []
    for _ in range(CHILDREN):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                block = b'x' * (MB << 20)  # written, so every page is resident
                os.write(w, b'1')
            except MemoryError:
                os._exit(3)
            time.sleep(60)
            os._exit(0)
        pids.append(pid)
    os.close(w)
    dead = set()
    def reap():
        for p in pids:
            if p not in dead and os.waitpid(p, os.WNOHANG)[0]:
                dead.add(p)
    reported, deadline = 0, time.monotonic() + 8
    while reported < CHILDREN and time.monotonic() < deadline:
        if select.select([r], [], [], 0.2)[0]:
            got = os.read(r, 64)
            if not got:
                break
            reported += len(got)
        reap()
        if len(dead) == CHILDREN:
            break
    time.sleep(0.5)
    reap()
    alive = CHILDREN - len(dead)
    print(reported, alive, flush=True)
""")


def _holders(res) -> int:
    """Children that wrote their 100 MB and are still alive at the end (holding it)."""
    reported, alive = map(int, res.stdout.split())
    return min(reported, alive)


@pytest.mark.parametrize("bound", ["cgroup", "process cap"])
def test_many_processes_cannot_add_up_past_the_sample_limit(sandbox, bound):
    """8 processes x 100 MB, each under its 160 MB address-space limit, in a sample limited to 320 MB."""
    sb = Sandbox(isolation="required")
    if bound == "cgroup":
        if sb.memory_cgroup is None:
            pytest.skip(f"no memory cgroup on this machine: {sb.memory_how}")
    else:
        sb.memory_cgroup = None  # the fallback: 320 MB over 10 processes is 32 MB of address space each
    lim = SandboxLimits(wall_s=20.0, memory_mb=160, nproc=10, sample_memory_mb=320)
    res = sb.run_python(MANY_PROCESSES, limits=lim)
    assert res.exit_code == 0, res.stdout + res.stderr
    held = _holders(res)
    assert held * 100 <= 320, (res.stdout, res.peak_memory_mb)
    if bound == "cgroup":
        assert res.memory_limited and res.peak_memory_mb is not None and res.peak_memory_mb <= 320, res
        assert "memory cgroup v" in sb.memory_bound(lim)
    else:
        assert held == 0 and res.peak_memory_mb is None and "10 processes x 32 MiB" in sb.memory_bound(lim)
    # With room for all of them the same program holds 800 MB: the attack is real, the bound stopped it.
    roomy = sb.run_python(MANY_PROCESSES, limits=SandboxLimits(wall_s=20.0, memory_mb=160, nproc=10, sample_memory_mb=1600))
    assert _holders(roomy) == 8 and not roomy.memory_limited, roomy.stdout + roomy.stderr


def test_a_sample_past_its_memory_is_not_a_timeout():
    sb = Sandbox(isolation="required")
    if sb.memory_cgroup is None:
        pytest.skip(f"no memory cgroup on this machine: {sb.memory_how}")
    res = sb.run_python("b = b'x' * (400 << 20)", limits=SandboxLimits(wall_s=10.0, memory_mb=1024, sample_memory_mb=200))
    assert res.exit_code == 137 and res.memory_limited and not res.timed_out and not res.ok


def test_default_memory_fits_the_machine_and_concurrency_is_capped(monkeypatch):
    """Defaults: half the machine shared by the jails that may run at once, and no more jails than that."""
    machine = jail.machine_memory_mb()
    per_sample = jail.default_sample_memory_mb()
    assert per_sample * jail.MAX_JAILS <= max(machine // 2, 256 * jail.MAX_JAILS)
    from rollwise.rewards.code import DEFAULT_CODE_LIMITS

    sb = Sandbox(isolation="auto")
    sample, per_process = DEFAULT_CODE_LIMITS.memory_plan(sb.memory_cgroup is not None, sb.default_sample_memory_mb)
    assert sample * jail.MAX_JAILS <= max(machine // 2, 256 * jail.MAX_JAILS)  # was 16 GiB per sample, 8 at once on 24 GiB
    if sb.memory_cgroup is None:
        assert per_process * DEFAULT_CODE_LIMITS.nproc <= sample
    # A ninth jail waits for a slot: two slots here, the third start blocks until one jail closes.
    monkeypatch.setattr(jail, "_slots", threading.BoundedSemaphore(2))
    lim = SandboxLimits(wall_s=10.0)
    first, second = sb.start([sb.python, "-c", "import time; time.sleep(10)"], limits=lim), sb.start([sb.python, "-c", "pass"], limits=lim)
    started = threading.Event()
    t = threading.Thread(target=lambda: (sb.start([sb.python, "-c", "pass"], limits=lim).close(), started.set()))
    t.start()
    try:
        assert not started.wait(0.5)
        first.close()
        assert started.wait(10)
    finally:
        first.close()
        second.close()
        t.join(10)


def test_a_plan_that_cannot_start_python_is_refused():
    sb = Sandbox(isolation="required", _skip_check=True)
    sb.memory_cgroup = None
    with pytest.raises(ValueError, match="sample_memory_mb=320 over nproc=32 processes leaves 10 MiB"):
        sb.run_python("pass", limits=SandboxLimits(sample_memory_mb=320, nproc=32))
    with pytest.raises(ValueError, match="sample_memory_mb must be positive"):
        SandboxLimits(sample_memory_mb=0)


def test_cgroup_layouts_are_found_from_proc_text():
    v1 = _cgroup.locate(
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
        "4:memory:/process_api/abc\n0::/\n",
    )
    assert v1[0] == _cgroup.Layout(1, "/sys/fs/cgroup/memory/process_api/abc")
    v2 = _cgroup.locate("30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "0::/user.slice/run\n")
    assert v2[0] == _cgroup.Layout(2, "/sys/fs/cgroup/user.slice/run") and v2[0].limit_file == "memory.max"
    nested = _cgroup.locate("30 23 0:26 /ctr /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "0::/ctr/job\n")
    assert nested[0] == _cgroup.Layout(2, "/sys/fs/cgroup/job")
    assert _cgroup.locate("1 0 0:1 / / rw - ext4 /dev/vda rw\n", "0::/\n") == (None, "no memory cgroup controller is mounted")


# -- temporary files when the scorer is SIGKILLed --------------------------------------------------------
def _files_with(marker: str) -> list[str]:
    hits = []
    for d in Path("/tmp").glob("rollwise-sbx-*"):
        for p in d.rglob("*"):
            try:
                if p.is_file() and not p.is_symlink() and marker.encode() in p.read_bytes():
                    hits.append(str(p))
            except OSError:
                continue
    return hits


def _scorer(tmp_path: Path, marker: str, isolation: str) -> subprocess.Popen:
    script = tmp_path / f"scorer_{isolation}.py"
    script.write_text(textwrap.dedent(f"""
        import sys, warnings
        sys.path.insert(0, {str(SRC)!r})
        warnings.simplefilter("ignore")
        from rollwise.sandbox import Sandbox, SandboxLimits
        sb = Sandbox(isolation={isolation!r})
        jail = sb.start([sb.python, "-I", "candidate.py"], limits=SandboxLimits(wall_s=60),
                        files={{"candidate.py": "import time\\nprint('up', flush=True)\\ntime.sleep(60)  # {marker}"}})
        assert jail.proc.stdout.readline() == b"up\\n"
        print(jail.cgroup.path if jail.cgroup else "-", flush=True)
        jail.proc.wait()
    """))
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def test_a_sigkilled_scorer_leaves_no_candidate_source(sandbox, tmp_path):
    marker = f"candidate-secret-{uuid.uuid4().hex}"
    proc = _scorer(tmp_path, marker, "required")
    cgroup_path = proc.stdout.readline().strip()
    assert cgroup_path, "the scorer did not start its jail"
    assert _files_with(marker) == []  # never on the host's disk, not even while the jail runs
    proc.kill()
    proc.wait()
    assert _files_with(marker) == []
    stale = Path(f"/tmp/rollwise-sbx-{proc.pid}")
    assert stale.is_dir()  # its (empty) directory is left: SIGKILL runs no clean-up ...
    assert str(stale) in jail.sweep_host_dirs()  # ... and the next start removes it (its owner is dead)
    assert not stale.exists()
    if cgroup_path != "-":  # the dead scorer's memory cgroup goes with the next sweep too
        deadline = time.monotonic() + 5
        while Path(cgroup_path).exists() and time.monotonic() < deadline:
            _cgroup.sweep(str(Path(cgroup_path).parent))
            time.sleep(0.05)
        assert not Path(cgroup_path).exists()


def test_the_unisolated_fallback_is_swept_after_a_sigkill(tmp_path):
    """Without a jail the files must be on disk: a SIGKILLed scorer's are removed at the next start."""
    marker = f"fallback-secret-{uuid.uuid4().hex}"
    proc = _scorer(tmp_path, marker, "off")
    assert proc.stdout.readline().strip() == "-"
    proc.kill()
    proc.wait()
    assert _files_with(marker)  # the attack's premise: the source is there after the kill
    with pytest.warns(RuntimeWarning):
        sb = Sandbox(isolation="off")
    jail._host_dirs.clear()  # as in a freshly started process: its first jail makes its directory and sweeps
    try:
        assert sb.run_python("print(1)", limits=SandboxLimits(wall_s=5.0)).stdout.strip() == "1"
    finally:
        jail._host_dirs.clear()
    assert _files_with(marker) == []
