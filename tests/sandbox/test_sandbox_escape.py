"""Escape tests: each attack runs inside the sandbox, is contained within its limit, and the host is intact.

Every test also checks the attack would have *worked* outside the jail where that is cheap to show, so a
test cannot pass merely because the attack code was broken.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from rollwise.sandbox import SandboxLimits

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
FAST = SandboxLimits(wall_s=5.0)


def procs_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker` (to prove nothing was left behind)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmd and state != "Z":
            pids.append(int(d))
    return pids


def procs_of_uid(uid: int) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            for line in Path(f"/proc/{d}/status").read_text().splitlines():
                if line.startswith("Uid:") and int(line.split()[1]) == uid:
                    pids.append(int(d))
        except (OSError, ValueError):
            continue
    return pids


def wait_gone(fn, timeout=5.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        left = fn()
        if not left:
            return []
        time.sleep(0.05)
    return fn()


def test_write_to_tmp_outside_sandbox_dir_stays_inside(sandbox):
    target = f"/tmp/rollwise-escape-{uuid.uuid4().hex}"
    res = sandbox.run_python(f"open({target!r}, 'w').write('owned'); print(open({target!r}).read())", limits=FAST)
    assert res.exit_code == 0 and res.stdout.strip() == "owned"  # it wrote to *its own* /tmp
    assert not os.path.exists(target)  # ... which is not the host's


def test_write_to_repo_fails(sandbox):
    target = REPO / f"escape-{uuid.uuid4().hex}"
    code = f"""
import os
for path in [{str(target)!r}, {str(REPO / 'src' / 'owned.py')!r}, '/usr/owned', '/etc/owned', '/owned']:
    try:
        open(path, 'w').write('x')
        print('WROTE', path)
    except OSError as e:
        print('blocked', path, e.errno)
"""
    res = sandbox.run_python(code, limits=FAST)
    assert res.exit_code == 0, res.stderr
    assert "WROTE" not in res.stdout and res.stdout.count("blocked") == 5
    assert not target.exists() and not (REPO / "src" / "owned.py").exists()


def test_read_home_and_project_files_fails(sandbox):
    home = os.path.expanduser("~")
    code = f"""
import os
for path in [{home!r}, {str(REPO)!r}]:
    try:
        print('LISTED', path, os.listdir(path)[:3])
    except OSError as e:
        print('blocked', path, e.errno)
try:
    print('READ', open({str(REPO / 'pyproject.toml')!r}).read()[:20])
except OSError as e:
    print('blocked file', e.errno)
print('home env', os.environ.get('HOME'))
"""
    # The same code on the host lists both directories and reads the file: the test can fail.
    host = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert host.stdout.count("LISTED") == 2 and "READ [build-system]" in host.stdout, host.stdout + host.stderr
    res = sandbox.run_python(code, limits=FAST)
    assert res.exit_code == 0, res.stderr
    assert "LISTED" not in res.stdout and "READ" not in res.stdout and res.stdout.count("blocked") == 3, res.stdout
    assert f"home env {home}" not in res.stdout


def test_no_network_not_even_loopback(sandbox):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    accepted = []

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                accepted.append(conn.recv(64))
                conn.close()
            except OSError:
                pass

    stop = threading.Event()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        attack = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'sandbox')\nprint('CONNECTED')"
        # The same code outside the jail does reach the server: the test can fail.
        subprocess.run([sys.executable, "-c", attack], check=True, capture_output=True, timeout=10)
        deadline = time.monotonic() + 2
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert accepted == [b"sandbox"]
        res = sandbox.run_python(attack, limits=FAST)
        assert "CONNECTED" not in res.stdout
        assert res.exit_code != 0 and ("unreachable" in res.stderr or "refused" in res.stderr), res.stderr
        dns = sandbox.run_python("import socket\ntry:\n    socket.getaddrinfo('example.com', 80)\n    print('RESOLVED')\nexcept OSError as e:\n    print('no dns', e)", limits=FAST)
        assert "RESOLVED" not in dns.stdout
        time.sleep(0.1)
        assert accepted == [b"sandbox"]
    finally:
        stop.set()
        t.join()
        srv.close()


def test_fork_bomb_contained_and_reaped(sandbox):
    code = "import os, sys\nprint(os.getuid(), flush=True)\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    res = sandbox.run_python(code, limits=SandboxLimits(wall_s=2.0, nproc=16))
    assert res.timed_out and time.monotonic() - t0 < 10
    uid = int(res.stdout.split()[0])
    assert uid >= 100000
    assert wait_gone(lambda: procs_of_uid(uid)) == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


def test_memory_hog_contained(sandbox):
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))\n"
    res = sandbox.run_python(code, limits=SandboxLimits(wall_s=10.0, memory_mb=256))
    assert res.exit_code != 0 and not res.timed_out
    assert "MemoryError" in res.stderr
    big = sandbox.run_python("x = bytearray(100 << 20); print(len(x))", limits=SandboxLimits(wall_s=10.0, memory_mb=512))
    assert big.exit_code == 0 and big.stdout.strip() == str(100 << 20)  # the limit, not a broken allocator


def test_infinite_loop_hits_wall_limit(sandbox):
    t0 = time.monotonic()
    res = sandbox.run_python("while True:\n    pass\n", limits=SandboxLimits(wall_s=1.5, cpu_s=30))
    took = time.monotonic() - t0
    assert res.timed_out and res.exit_code == 128 + signal.SIGKILL
    assert 1.4 <= took < 6


def test_cpu_limit_kills_busy_loop(sandbox):
    res = sandbox.run_python("while True:\n    pass\n", limits=SandboxLimits(wall_s=20.0, cpu_s=1))
    assert res.timed_out and res.wall_s < 10


def test_sleeping_program_hits_wall_limit(sandbox):
    res = sandbox.run_python("import time\ntime.sleep(60)\n", limits=SandboxLimits(wall_s=1.0))
    assert res.timed_out and res.wall_s < 5


def test_output_flood_is_capped_and_killed(sandbox):
    t0 = time.monotonic()
    res = sandbox.run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", limits=SandboxLimits(wall_s=10.0, output_bytes=100_000))
    assert res.output_limited and len(res.stdout) == 100_000
    assert time.monotonic() - t0 < 5
    err = sandbox.run_python("import sys\nwhile True:\n    sys.stderr.write('y' * 65536)\n", limits=SandboxLimits(wall_s=10.0, output_bytes=50_000))
    assert err.output_limited and len(err.stderr) == 50_000


def test_file_flood_is_bounded(sandbox):
    code = "try:\n    with open('/work/big', 'wb') as f:\n        f.write(b'0' * (40 << 20))\n    print('WROTE')\nexcept OSError as e:\n    print('blocked', e.errno)\n"
    res = sandbox.run_python(code, limits=SandboxLimits(wall_s=10.0, fsize_mb=8, memory_mb=512))
    assert "WROTE" not in res.stdout  # RLIMIT_FSIZE (SIGXFSZ) or tmpfs size stops it


def test_killing_parents_from_inside_is_refused(sandbox):
    code = textwrap.dedent("""
        import os, signal
        print('ppid', os.getppid())
        for pid in (os.getppid(), 1):
            try:
                os.kill(pid, signal.SIGKILL)
                print('KILLED', pid)
            except OSError as e:
                print('refused', pid, e.errno)
        try:
            os.kill(-1, signal.SIGKILL)  # everything this uid may signal except itself: nothing outside
        except OSError:
            pass
        print('still here')
    """)
    res = sandbox.run_python(code, limits=FAST)
    assert "KILLED" not in res.stdout and "refused 1" in res.stdout
    assert res.exit_code == 0 and "still here" in res.stdout
    assert os.getppid() > 1  # this test process is alive and still has its parent


def test_killing_the_scorer_leaves_nothing_behind(tmp_path):
    from rollwise.sandbox import isolation_status

    if not isolation_status()[0]:
        pytest.skip("sandbox isolation unavailable")
    marker = f"marker{uuid.uuid4().hex}"
    scorer = tmp_path / "scorer.py"
    scorer.write_text(textwrap.dedent(f"""
        import sys
        from rollwise.sandbox import Sandbox, SandboxLimits
        sb = Sandbox(isolation="required")
        code = "import os, time\\nos.fork()\\ntime.sleep(120)  # {marker}"
        print("started", flush=True)
        sb.run([sb.python, "-c", code], limits=SandboxLimits(wall_s=120))
    """))
    proc = subprocess.Popen([sys.executable, str(scorer)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 10
    # the program and its fork (the launcher and init take their configuration from a pipe, not argv)
    while len(procs_with(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(procs_with(marker)) >= 2, procs_with(marker)
    proc.kill()
    proc.wait()
    assert wait_gone(lambda: procs_with(marker)) == []


def test_background_processes_die_with_the_program(sandbox):
    marker = f"bg{uuid.uuid4().hex}"
    code = (
        "import os, subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {marker}'], start_new_session=True)\n"
        "if os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(60)\n"
        "print('parent done')\n"
    )
    res = sandbox.run([sandbox.python, "-c", code + f"# {marker}"], limits=FAST)
    assert res.exit_code == 0 and "parent done" in res.stdout
    assert wait_gone(lambda: procs_with(marker)) == []


def test_identity_is_dropped_and_environment_scrubbed(sandbox, monkeypatch):
    monkeypatch.setenv("ROLLWISE_SECRET_TOKEN", "hunter2")
    code = textwrap.dedent("""
        import os
        print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())
        print(sorted(os.environ))
        status = open('/proc/self/status').read()
        print([l for l in status.splitlines() if l.startswith(('NoNewPrivs', 'CapEff'))])
        print(os.listdir('/proc')[:0], len([p for p in os.listdir('/proc') if p.isdigit()]))
    """)
    res = sandbox.run_python(code, limits=FAST)
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    uid, euid, gid, groups = lines[0].split(" ", 3)
    assert int(uid) >= 100000 and uid == euid == gid and groups == "[]"
    assert "ROLLWISE_SECRET_TOKEN" not in lines[1] and "hunter2" not in res.stdout
    assert "NoNewPrivs:\\t1" in lines[2] and "CapEff:\\t0000000000000000" in lines[2]
    assert int(lines[3].split()[-1]) <= 3  # its own PID namespace: init, itself (and nothing of the host)


def test_init_process_is_no_way_out(sandbox):
    code = textwrap.dedent(f"""
        import os
        for p in ['/proc/1/root{REPO}/pyproject.toml', '/proc/1/root/root', '/proc/1/cwd', '/proc/1/environ', '/proc/1/fd/0']:
            try:
                if os.path.isdir(p):
                    print('LISTED', p, os.listdir(p)[:3])
                else:
                    print('READ', p, open(p, 'rb').read()[:40])
            except OSError as e:
                print('blocked', p, e.errno)
    """)
    res = sandbox.run_python(code, limits=FAST)
    assert res.exit_code == 0, res.stderr
    assert res.stdout.count("blocked") == 5, res.stdout
