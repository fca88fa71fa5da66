"""Attack suite (issue 12): reward hacks, verdict forgery, jail-failure spoofing, kernel surface, resource bypasses.

Every attack is either contained (the host is intact, the limit held) or scored as failed / timed out,
never `passed` and never *errored* (an errored sample is masked out of the advantages, which is a hack in
itself). Where cheap, each test also shows the attack's code does work where the jail is not in the way,
so a test cannot pass merely because the attack was broken. Attacks run in batches on a thread pool.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import gzip
import json
import os
import textwrap
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rollwise.rewards.code import humaneval_test, mbpp_test, run_tests
from rollwise.sandbox import Sandbox, SandboxLimits, _launcher

HACK_LIMITS = SandboxLimits(wall_s=3.0, cpu_s=3, memory_mb=512, nproc=16, output_bytes=64 << 10)
FAST = SandboxLimits(wall_s=5.0)
REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


def pmap(fn, items, workers: int = 4):
    with ThreadPoolExecutor(workers) as ex:
        return list(ex.map(fn, items))


# -- tasks: self-written ones (always), and real HumanEval / MBPP ones (when the data is there) -------------
class CodeTask:
    def __init__(self, name: str, spec, right: str, prefix: str = "", fn: str = ""):
        self.name, self.spec, self.right, self.prefix, self.fn = name, spec, right, prefix, fn

    def score(self, module_code: str, limits: SandboxLimits = HACK_LIMITS) -> str:
        """Score a candidate given as module-level code defining the function `self.fn`."""
        return run_tests(self.prefix + module_code, self.spec, limits=limits)


def _inline_tasks() -> list[CodeTask]:
    add_p = 'def add(a, b):\n    """Sum."""\n'
    add_t = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-4, 1) == -3\n"
    rev_p = 'def rev(xs):\n    """Reversed list."""\n'
    rev_t = "def check(candidate):\n    assert candidate([1, 2, 3]) == [3, 2, 1]\n    assert candidate([]) == []\n"
    even_p = 'def is_even(n):\n    """Is n even?"""\n'
    even_t = "def check(candidate):\n    assert candidate(2) == True\n    assert candidate(3) == False\n"
    return [
        CodeTask("add", humaneval_test(add_p, add_t, "add"), "def add(a, b):\n    return a + b\n", add_p, "add"),
        CodeTask("rev", humaneval_test(rev_p, rev_t, "rev"), "def rev(xs):\n    return xs[::-1]\n", rev_p, "rev"),
        CodeTask("is_even", humaneval_test(even_p, even_t, "is_even"), "def is_even(n):\n    return n % 2 == 0\n", even_p, "is_even"),
        CodeTask("mbpp_square", mbpp_test([], ["assert square(3) == 9", "assert square(-2) == 4"]),
                 "def square(x):\n    return x * x\n", "", "square"),
    ]


def _real_tasks(data: Path) -> list[CodeTask]:
    with gzip.open(data / "humaneval" / "HumanEval.jsonl.gz", "rt") as fh:
        he = {p["task_id"]: p for p in map(json.loads, fh)}
    mbpp = {r["task_id"]: r for r in json.loads((data / "mbpp" / "sanitized-mbpp.json").read_text())}
    tasks = []
    for tid in ("HumanEval/0", "HumanEval/12"):
        p = he[tid]
        # the right answer as module code: the prompt's function with the canonical body
        tasks.append(CodeTask(tid, humaneval_test(p["prompt"], p["test"], p["entry_point"]),
                              p["canonical_solution"], p["prompt"], p["entry_point"]))
    for tid in (2, 17):
        r = mbpp[tid]
        fn = r["test_list"][0].split("assert ", 1)[1].split("(", 1)[0].strip().removeprefix("set(")
        tasks.append(CodeTask(f"mbpp/{tid}", mbpp_test(r["test_imports"], r["test_list"], r["code"]), r["code"], "", fn))
    return tasks


@pytest.fixture(scope="module")
def tasks(request) -> list[CodeTask]:
    from rollwise.sandbox import isolation_status

    if not isolation_status()[0]:
        pytest.skip("sandbox isolation unavailable here")
    out = _inline_tasks()
    try:
        data = request.getfixturevalue("shared_data")
    except pytest.skip.Exception:
        return out
    return out + _real_tasks(data)


# -- hack templates: module-level code redefining {fn}; every one is a wrong solution ---------------------
HACKS = {
    "always_equal_object": """
class _Eq:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __bool__(self): return True
    __hash__ = object.__hash__
def {fn}(*a, **k): return _Eq()
""",
    "int_subclass_equal_to_all": """
class _I(int):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __hash__ = int.__hash__
def {fn}(*a, **k): return _I(7)
""",
    "str_and_list_subclasses": """
class _S(str):
    def __eq__(self, other): return True
class _L(list):
    def __eq__(self, other): return True
_n = [0]
def {fn}(*a, **k):
    _n[0] += 1
    return _S('x') if _n[0] % 2 else _L([1])
""",
    "dict_subclass_with_eq": """
class _D(dict):
    def __eq__(self, other): return True
def {fn}(*a, **k): return _D(a=1)
""",
    "settrace_skips_asserts": """
import sys, threading
def _tr(frame, event, arg):
    if event == 'line' and frame.f_code.co_name == 'check':
        try:
            frame.f_lineno = frame.f_lineno + 1
        except Exception:
            pass
    return _tr
sys.settrace(_tr); threading.settrace(_tr)
def {fn}(*a, **k): return None
""",
    "settrace_replaces_check": """
import sys
def _tr(frame, event, arg):
    g = frame.f_globals
    if event == 'line' and callable(g.get('check')) and getattr(g['check'], '__name__', '') == 'check':
        g['check'] = lambda *a, **k: None
        g['check'].__name__ = 'noop'
    return _tr
sys._getframe().f_trace = _tr
sys.settrace(_tr)
def {fn}(*a, **k): return None
""",
    "write_passed_to_every_fd": """
import os
for _fd in range(0, 256):
    for _msg in (b'passed', b'passed\\n', b'{{"result": "passed"}}\\n'):
        try: os.write(_fd, _msg)
        except OSError: pass
def {fn}(*a, **k): return None
""",
    "verdict_via_main_global_then_exit": """
import __main__, os
for _name in ('_fd', '_result_fd', 'RESULT_FD'):
    try: os.write(int(getattr(__main__, _name)), b'passed')
    except Exception: pass
os._exit(0)
""",
    "verdict_by_fd_scan_then_exit": """
import os
for _fd in range(3, 256):
    try: os.write(_fd, b'passed')
    except OSError: pass
os._exit(0)
""",
    "forge_protocol_answers": """
import os
_lines = b'{{"id": 0, "ready": ["{fn}"]}}\\n' + b''.join(b'{{"id": %d, "ok": true}}\\n' % i for i in range(1, 64))
for _fd in range(3, 64):
    try: os.write(_fd, _lines)
    except OSError: pass
def {fn}(*a, **k): return True
""",
    "monkeypatch_os_write_and_json": """
import os, json
_w = os.write
os.write = lambda fd, b: _w(fd, b'passed' if bytes(b).startswith(b'failed') else b)
json.dumps = lambda *a, **k: '{{"id": 1, "ok": true, "result": "passed"}}'
def {fn}(*a, **k): return False
""",
    "jail_failure_marker_and_exit_125": """
import os, sys
def {fn}(*a, **k):
    sys.stderr.write('rollwise-sandbox: cannot build the sandbox root: spoofed\\n'); sys.stderr.flush()
    os._exit(125)
""",
    "marker_at_load": """
import os, sys
sys.stderr.write('rollwise-sandbox: cannot create namespaces: spoofed\\n'); sys.stderr.flush()
os._exit(125)
""",
    "raise_system_exit_zero": "def {fn}(*a, **k): raise SystemExit(0)\n",
    "raise_keyboard_interrupt": "def {fn}(*a, **k): raise KeyboardInterrupt()\n",
    "raise_custom_base_exception": "class _B(BaseException): pass\ndef {fn}(*a, **k): raise _B('passed')\n",
    "return_generator": "def {fn}(*a, **k): return (x for x in [])\n",
    "return_iterator_and_function": "_n = [0]\ndef {fn}(*a, **k):\n    _n[0] += 1\n    return iter([]) if _n[0] % 2 else {fn}\n",
    "recursion_bomb_nested_list": "def {fn}(*a, **k):\n    x = []\n    for _ in range(100000): x = [x]\n    return x\n",
    "self_referencing_list": "def {fn}(*a, **k):\n    x = []\n    x.append(x)\n    return x\n",
    "huge_answer": "def {fn}(*a, **k): return b'0' * (20 << 20)\n",
    "nan_and_inf": "_n = [0]\ndef {fn}(*a, **k):\n    _n[0] += 1\n    return float('nan') if _n[0] % 2 else float('inf')\n",
    "kill_everything": "import os, signal\ndef {fn}(*a, **k):\n    os.kill(-1, signal.SIGKILL)\n    os.kill(0, signal.SIGKILL)\n",
    "hang_in_call": "def {fn}(*a, **k):\n    while True: pass\n",
    "sleep_at_load": "import time\ntime.sleep(60)\ndef {fn}(*a, **k): return None\n",
    "fork_bomb_at_load": "import os\nfor _ in range(64):\n    try: os.fork()\n    except OSError: break\ndef {fn}(*a, **k): return None\n",
    "print_flood": "def {fn}(*a, **k):\n    while True: print('passed' * 1000)\n",
    "shadow_builtins": "set = sorted = list = tuple = abs = len = lambda *a, **k: 1\ndef {fn}(*a, **k): return 1\n",
}


SLOW_HACKS = {"hang_in_call", "sleep_at_load", "fork_bomb_at_load", "huge_answer", "recursion_bomb_nested_list", "print_flood"}


def test_a_wrong_solution_never_passes(tasks):
    """Every hack template against every task: never `passed`, never errored; the right solutions pass."""
    jobs = [(t, None, t.right) for t in tasks]
    # the slow ones (they wait out a limit or burn CPU) on two tasks only, the rest on all of them
    jobs += [(t, name, tpl.format(fn=t.fn)) for i, t in enumerate(tasks) for name, tpl in HACKS.items()
             if name not in SLOW_HACKS or i in (0, len(tasks) - 1)]

    def one(job):
        task, hack, code = job
        try:
            return task.name, hack, task.score(code)
        except Exception as e:  # noqa: BLE001 - an error (masked sample) is a failure of this test
            return task.name, hack, f"ERRORED {type(e).__name__}: {e}"

    results = pmap(one, jobs, workers=6)
    right = {t: r for t, h, r in results if h is None}
    assert right == {t.name: "passed" for t in tasks}
    bad = [(t, h, r) for t, h, r in results if h is not None and (r == "passed" or not (r.startswith("failed") or r == "timed out"))]
    assert bad == []
    by_hack = {h: r for t, h, r in results if t == "add"}
    assert by_hack["hang_in_call"] == "timed out" and by_hack["sleep_at_load"] == "timed out"
    assert by_hack["print_flood"] == "failed: output limit exceeded"
    assert "not plain data" in by_hack["always_equal_object"] and "not plain data" in by_hack["return_generator"]
    assert "deeper than" in by_hack["recursion_bomb_nested_list"]
    # Encoding 20 MiB can outlast the 3 s limit when six scorers share two loaded cores: the size cap is
    # checked on its own, with time to reach it.
    assert "over" in by_hack["huge_answer"] or by_hack["huge_answer"] == "timed out", by_hack["huge_answer"]
    add = next(t for t in tasks if t.name == "add")
    huge = add.score(HACKS["huge_answer"].format(fn=add.fn), limits=dataclasses.replace(HACK_LIMITS, wall_s=15.0, cpu_s=15))
    assert huge == "failed: the candidate's answer is over 16777216 bytes", huge


def test_per_call_timeout_is_separate_from_the_total():
    from rollwise.sandbox import isolation_status

    if not isolation_status()[0]:
        pytest.skip("sandbox isolation unavailable here")
    p = 'def f(n):\n    """Wait."""\n'
    t = "def check(candidate):\n    for i in range(3):\n        assert candidate(i) == i\n"
    code = "import time\ndef f(n):\n    time.sleep(0.6)\n    return n\n"
    lim = SandboxLimits(wall_s=5.0)
    assert run_tests(p + code, humaneval_test(p, t, "f"), limits=lim, call_timeout_s=1.0) == "passed"
    assert run_tests(p + code, humaneval_test(p, t, "f"), limits=lim, call_timeout_s=0.3) == "timed out"


def test_candidate_cannot_find_the_test_or_the_expected_answers(tasks):
    """The jail holds only the server and the candidate: no test file, no expected value anywhere it can read."""
    secret = f"EXPECTED-{uuid.uuid4().hex}"
    p = 'def f():\n    """The secret."""\n'
    test = f"def check(candidate):\n    assert candidate() == {secret!r}\n"
    spy = textwrap.dedent("""
        import os
        def f():
            found, listing = [], sorted(os.listdir('/work'))
            paths = ['/work/' + n for n in listing] + ['/tmp']
            for pid in os.listdir('/proc'):
                if pid.isdigit():
                    paths += [f'/proc/{pid}/cmdline', f'/proc/{pid}/environ']
            paths += [f'/proc/self/fd/{fd}' for fd in os.listdir('/proc/self/fd')]
            for path in paths:
                try:
                    data = open(path, 'rb').read(1 << 20) if not os.path.isdir(path) else b''
                except OSError:
                    continue
                i = data.find(b'EXPEC' + b'TED-')
                if i >= 0:
                    found.append(data[i:i + 41].decode())
            return found[0] if found else repr(listing)
    """)
    res = run_tests(p + spy, humaneval_test(p, test, "f"), limits=FAST)
    assert res == "failed: " and secret not in res
    lst = run_tests(p + spy, humaneval_test(p, "def check(candidate):\n    assert candidate() == 'x', candidate()\n", "f"), limits=FAST)
    assert lst == "failed: ['candidate.py', 'server.py']"


# -- the kernel surface (seccomp), keyrings, IPC, tmpfs inodes, capabilities, /proc/1 ----------------------
PROBE_SYSCALLS = ["add_key", "request_key", "keyctl", "ptrace", "bpf", "perf_event_open", "userfaultfd", "mount",
                  "umount2", "unshare", "setns", "init_module", "finit_module", "delete_module", "io_uring_setup",
                  "kexec_load", "memfd_create", "shmget", "semget", "msgget", "mq_open", "pivot_root", "process_vm_readv"]


def _syscall_probe() -> str:
    lib = _launcher._seccomp_lib()
    assert lib is not None, "libseccomp missing: run .ci/setup.d/30-sandbox.sh"
    nrs = {n: lib.seccomp_syscall_resolve_name(n.encode()) for n in PROBE_SYSCALLS}
    # arguments that make each call fail harmlessly *after* the filter: EINVAL/EFAULT/EBADF... without one
    return textwrap.dedent(f"""
        import ctypes, json
        libc = ctypes.CDLL(None, use_errno=True)
        out = {{}}
        for name, nr in {nrs!r}.items():
            if nr < 0:
                continue
            args = [ctypes.c_long(0)] * 5
            if name == 'unshare':
                args[0] = ctypes.c_long(0x10000000)  # CLONE_NEWUSER
            if name == 'memfd_create':
                args[0] = ctypes.c_char_p(b'x')
            if name == 'shmget':
                args = [ctypes.c_long(0), ctypes.c_long(1 << 20), ctypes.c_long(0o1600), ctypes.c_long(0), ctypes.c_long(0)]
            ret = libc.syscall(nr, *args)
            out[name] = 0 if ret >= 0 else ctypes.get_errno()
        print(json.dumps(out))
    """)


def test_seccomp_denies_the_kernel_surface(sandbox):
    code = _syscall_probe()
    res = sandbox.run_python(code, limits=FAST)
    denied = json.loads(res.stdout)
    assert denied and all(v == errno.EPERM for v in denied.values()), denied
    # The same probe in a jail without the filter gets other answers (the probe reaches the kernel).
    bare = Sandbox(isolation="required")
    bare.seccomp = False
    raw = json.loads(bare.run_python(code, limits=FAST).stdout)
    assert sum(v != errno.EPERM for v in raw.values()) >= 8, raw
    status = sandbox.run_python("print(open('/proc/self/status').read())", limits=FAST).stdout
    assert "Seccomp:\t2" in status and "CapBnd:\t0000000000000000" in status and "CapAmb:\t0000000000000000" in status


def test_subprocesses_still_work_under_the_filter(sandbox):
    """clone3 answers ENOSYS, so libc falls back to clone, which the filter can read: subprocess works."""
    res = sandbox.run_python("import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', 'print(7)'], capture_output=True, text=True).stdout)", limits=FAST)
    assert res.exit_code == 0 and res.stdout.strip() == "7", res.stderr


KEY_SPEC_SESSION_KEYRING = -3
KEY_SPEC_USER_KEYRING = -4


def _host_keyctl():
    lib = _launcher._seccomp_lib()
    libc = ctypes.CDLL(None, use_errno=True)
    return libc, lib.seccomp_syscall_resolve_name(b"add_key"), lib.seccomp_syscall_resolve_name(b"keyctl")


def test_keyrings_are_out_of_reach(sandbox):
    """Read, plant and revoke fail; a key planted by one sandbox is not there in the next; /proc/keys is empty."""
    libc, add_key, keyctl = _host_keyctl()
    desc = f"rollwise-test-{uuid.uuid4().hex}".encode()
    key = libc.syscall(add_key, b"user", desc, b"host-secret", ctypes.c_size_t(11), KEY_SPEC_SESSION_KEYRING)
    if key < 0:
        pytest.skip(f"the host cannot use keyrings here: {os.strerror(ctypes.get_errno())}")
    try:
        buf = ctypes.create_string_buffer(64)
        assert libc.syscall(keyctl, 11, key, buf, 64) == 11 and buf.raw[:11] == b"host-secret"  # KEYCTL_READ works here
        attack = textwrap.dedent(f"""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            buf = ctypes.create_string_buffer(64)
            def e(r): return 0 if r >= 0 else ctypes.get_errno()
            print('read', e(libc.syscall({keyctl}, 11, {key}, buf, 64)), buf.raw[:11])
            print('revoke', e(libc.syscall({keyctl}, 3, {key})))
            print('plant', e(libc.syscall({add_key}, b'user', b'planted', b'x', ctypes.c_size_t(1), {KEY_SPEC_USER_KEYRING})))
            print('search', e(libc.syscall({keyctl}, 10, {KEY_SPEC_USER_KEYRING}, b'user', b'planted', 0)))
            try:
                print('keys', open('/proc/keys').read().count('{desc.decode()}'))
            except OSError:
                print('keys', 0)
        """)
        first, second = pmap(lambda _: sandbox.run_python(attack, limits=FAST), range(2), workers=1)
        for res in (first, second):
            lines = dict(line.split(" ", 1) for line in res.stdout.splitlines())
            assert lines["read"].startswith(f"{errno.EPERM} ") and "host-secret" not in res.stdout
            assert lines["revoke"] == lines["plant"] == lines["search"] == str(errno.EPERM)
            assert lines["keys"] == "0"
        assert libc.syscall(keyctl, 11, key, buf, 64) == 11  # the host's key is intact (not revoked)
    finally:
        libc.syscall(keyctl, 3, key)  # KEYCTL_REVOKE our own test key


def test_memory_limit_cannot_be_bypassed_with_shared_memory(sandbox):
    """SysV segments (held after detaching) and memfd page cache are not address space: both are refused."""
    code = textwrap.dedent("""
        import ctypes, mmap, os
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmget.restype = ctypes.c_int
        held = 0
        for _ in range(12):  # 12 x 128 MiB = 1.5 GiB under a 512 MiB limit
            if libc.shmget(0, ctypes.c_size_t(128 << 20), 0o1600) < 0:
                print('shmget', ctypes.get_errno()); break
            held += 128
        try:
            fd = os.memfd_create('x')
            print('memfd', 0)
        except OSError as e:
            print('memfd', e.errno)
        try:
            m = mmap.mmap(-1, 900 << 20)
            print('mmap', 0)
        except (OSError, MemoryError, ValueError) as e:
            print('mmap refused')
        print('held', held)
    """)
    res = sandbox.run_python(code, limits=SandboxLimits(wall_s=5.0, memory_mb=512))
    out = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    assert out == {"shmget": str(errno.EPERM), "memfd": str(errno.EPERM), "mmap": "refused", "held": "0"}, res.stdout + res.stderr
    if os.geteuid() == 0:  # the IPC namespace's own cap holds even without the filter (root mode sets it)
        bare = Sandbox(isolation="required")
        bare.seccomp = False
        res = bare.run_python(code, limits=SandboxLimits(wall_s=5.0, memory_mb=512))
        out = dict(line.split(" ", 1) for line in res.stdout.splitlines())
        assert out["shmget"] == str(errno.EINVAL) and out["held"] == "0", res.stdout  # 128 MiB > shmmax (1 MiB)


def test_tmpfs_inode_flood_is_capped(sandbox):
    code = textwrap.dedent("""
        import os, time
        t0, n = time.monotonic(), 0
        try:
            while True:
                open(f'/tmp/f{n}', 'w').close()
                n += 1
        except OSError as e:
            print(n, e.errno, round(time.monotonic() - t0, 2))
    """)
    res = sandbox.run_python(code, limits=SandboxLimits(wall_s=10.0, tmpfs_inodes=2000))
    n, err, _ = res.stdout.split()
    assert int(n) < 2000 and int(err) == errno.ENOSPC, res.stdout + res.stderr


def test_proc_1_cmdline_shows_no_host_path(sandbox):
    res = sandbox.run_python("print(open('/proc/1/cmdline','rb').read().replace(b'\\0', b' ').decode())", limits=FAST)
    cmd = res.stdout.strip()
    assert cmd.startswith(sandbox.launcher_python) and "/dev/fd/" in cmd
    assert "/tmp" not in cmd and "rollwise" not in cmd and str(REPO) not in cmd, cmd


def test_printing_the_jail_failure_marker_is_not_a_jail_failure(sandbox):
    """Before: stderr marker + exit 125 raised SandboxUnavailable (errored, masked). Now it is a plain exit."""
    res = sandbox.run_python("import sys, os\nsys.stderr.write('rollwise-sandbox: spoofed\\n')\nos._exit(125)", limits=FAST)
    assert res.exit_code == 125 and "spoofed" in res.stderr


def test_real_jail_failures_come_out_of_band(sandbox, monkeypatch):
    """A jail that cannot be built says so on the status pipe, whatever the exit code."""
    from rollwise.sandbox import SandboxUnavailable

    broken = Sandbox(isolation="required")
    broken.ro_paths = ["/nonexistent-dir-for-test"] + broken.ro_paths
    broken.python = "/nonexistent/python3"  # execve fails after the jail is built
    with pytest.raises(SandboxUnavailable, match="cannot start the program"):
        broken.run_python("pass", limits=FAST)


@pytest.mark.parametrize("body, reason", [
    ("def wrap(x):\n    y = x\n    for _ in range(100): y = [y]\n    return y\n", "deeper than 100"),
    ("def wrap(x):\n    return x if x else 'a' * (9 << 20)\n", "over 16777216 bytes"),
])
def test_a_round_trip_past_the_wire_limits_fails_the_candidate(sandbox, body, reason):
    """A test that feeds the candidate its own answers (`wrap([wrap(x), ...])`) gets data at the wire's edge back:
    passing it on breaks the wire's bounds on the trusted side. That is the candidate's doing, so the sample fails; it is
    never a harness error (an errored sample)."""
    test = "def check(candidate):\n    assert candidate([candidate(''), candidate('')]) is not None\n"
    spec = humaneval_test("def wrap(x):\n    pass\n", test, "wrap")
    limits = dataclasses.replace(HACK_LIMITS, wall_s=20.0, cpu_s=20, memory_mb=1024)
    result = run_tests(body, spec, limits=limits)
    assert result.startswith("failed: the arguments to wrap are past the wire's limits") and reason in result, result
