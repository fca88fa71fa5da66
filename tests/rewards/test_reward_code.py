"""Code verifier: HumanEval's result vocabulary, the trusted checker, strict comparisons, real datasets."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from rollwise.envs.base import Task
from rollwise.rewards.code import CodeTests, check_program, code_sandbox, humaneval_test, mbpp_test, run_tests
from rollwise.sandbox import SandboxLimits, isolation_status

PROMPT = "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n"
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0, 'negatives'\n"
TASK = Task(id="add", prompt=PROMPT, answer="    return a + b\n", metadata={"prompt": PROMPT, "test": TEST, "entry_point": "add"})
LIM = SandboxLimits(wall_s=4.0)


@pytest.fixture(autouse=True, scope="module")
def _isolated():
    ok, reason = isolation_status()
    if not ok:
        pytest.skip(f"sandbox isolation unavailable here: {reason}")


def he(completion: str, test: str = TEST, prompt: str = PROMPT, entry: str = "add", limits=LIM) -> str:
    return run_tests(prompt + completion, humaneval_test(prompt, test, entry), limits=limits)


def f1(completion: str, test: str) -> str:
    """A one-argument task `f(a)`."""
    return he(completion, test=test, prompt="def f(a):\n    \"\"\"Doc.\"\"\"\n", entry="f")


@pytest.mark.parametrize(
    "completion, result",
    [
        ("    return a + b\n", "passed"),
        ("    return a - b\n", "failed: "),  # bare assert: HumanEval writes "failed: " + str(AssertionError())
        ("    return 5 if a == 2 else 1\n", "failed: negatives"),
        ("    return undefined\n", "failed: name 'undefined' is not defined"),
        ("    import sys; sys.exit(0)\n", "failed: 0"),
        ("    while True: pass\n", "timed out"),
        ("  return a +\n", "failed: "),  # SyntaxError's str starts with the message; checked loosely below
        ("    import os; os._exit(0)\n", "failed: the candidate process ended without answering"),
        ("    return True if a == 2 else 0\n", "failed: "),  # True is not 5 ... and bool is never an int
    ],
)
def test_results_use_humaneval_vocabulary(completion, result):
    s = CodeTests(limits=SandboxLimits(wall_s=2.0))(TASK, completion)
    assert s.info["result"].startswith(result)
    assert s.value == (1.0 if result == "passed" else 0.0) and s.error is None


def test_program_is_humanevals_check_program():
    assert check_program("P", "C", "T", "f") == "PC\nT\ncheck(f)"


def test_output_flood_fails():
    flood = "    while True: print('x' * 10000)\n"
    assert he(flood, limits=SandboxLimits(wall_s=5.0, output_bytes=20000)) == "failed: output limit exceeded"


def test_missing_metadata_is_a_clear_error():
    with pytest.raises(ValueError, match="lacks test, entry_point"):
        CodeTests()(Task("x", "p", "a"), "c")


def test_comparisons_are_type_strict():
    """bool is never a number, list is never a tuple; int and float compare by value."""
    test = ("def check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2) == 2.0\n"
            "    assert candidate(3) in [3, 4]\n    assert candidate(4) != True\n")
    assert f1("    return a\n", test=test) == "passed"
    assert f1("    return float(a)\n", test=test) == "passed"
    assert f1("    return True if a == 1 else a\n", test=test) == "failed: "
    assert f1("    return [a]\n", test="def check(candidate):\n    assert candidate(1) == (1,)\n") == "failed: "
    assert f1("    return {True: 1}\n", test="def check(candidate):\n    assert candidate(1) == {1: 1}\n") == "failed: "
    assert f1("    return {1, 2}\n", test="def check(candidate):\n    assert candidate(1) == {2, 1}\n") == "passed"


def test_candidate_exceptions_keep_their_builtin_type():
    test = ("def check(candidate):\n    try:\n        candidate(0)\n    except ZeroDivisionError:\n        pass\n"
            "    else:\n        assert False, 'no error'\n")
    assert f1("    return 1 / a\n", test=test) == "passed"
    assert f1("    return a\n", test=test) == "failed: no error"
    # a BaseException that is not an Exception never lets a test go on, even one that catches everything
    catch_all = "def check(candidate):\n    try:\n        candidate(0)\n    except BaseException:\n        pass\n"
    assert f1("    raise KeyboardInterrupt('stop')\n", test=catch_all) == "failed: stop"
    # StopIteration would silently end an iteration over the candidate's answers in the test
    assert f1("    raise StopIteration\n", test="def check(candidate):\n    assert all(map(candidate, [1, 0]))\n").startswith("failed: StopIteration")


def test_isolation_is_reported_as_data():
    info = CodeTests().isolation_info()
    assert info["mode"] == "required" and info["isolated"] and info["seccomp"] and info["warning"] is None
    assert code_sandbox() is CodeTests().sandbox  # one process-wide sandbox per setting


def _humaneval(shared_data):
    with gzip.open(shared_data / "humaneval" / "HumanEval.jsonl.gz", "rt") as fh:
        return [json.loads(line) for line in fh]


def test_humaneval_canonical_solutions_pass_sample(shared_data):
    """A sample here (CI time); all 164 were measured to pass (docs/sandbox.md)."""
    from concurrent.futures import ThreadPoolExecutor

    problems = random.Random(0).sample(_humaneval(shared_data), 12)
    lim = SandboxLimits(wall_s=15.0, cpu_s=15)

    def one(p):
        return p["task_id"], he(p["canonical_solution"], p["test"], p["prompt"], p["entry_point"], lim)

    with ThreadPoolExecutor(4) as ex:
        results = dict(ex.map(one, problems))
    assert results == {p["task_id"]: "passed" for p in problems}


def test_mbpp_reference_solutions_pass_sample(shared_data):
    """A sample, plus the tasks that need the reference's hints (builtin-named `sum`, implicit `sys`)."""
    from concurrent.futures import ThreadPoolExecutor

    recs = json.loads((shared_data / "mbpp" / "sanitized-mbpp.json").read_text())
    by_id = {r["task_id"]: r for r in recs}
    chosen = random.Random(1).sample(recs, 10) + [by_id[126], by_id[596], by_id[88]]
    lim = SandboxLimits(wall_s=15.0, cpu_s=15)

    def one(r):
        spec = mbpp_test(r["test_imports"], r["test_list"], r["code"])
        return r["task_id"], run_tests(r["code"] + "\n" + "\n".join(r["test_imports"]), spec, limits=lim)

    with ThreadPoolExecutor(4) as ex:
        results = dict(ex.map(one, chosen))
    assert results == {r["task_id"]: "passed" for r in chosen}


def test_unisolated_scoring_is_explicit_loud_and_still_trusted(monkeypatch, capsys):
    """isolation='off' must be asked for; the verdict still comes from the trusted checker."""
    from rollwise.rewards import code
    from rollwise.sandbox import jail

    monkeypatch.setattr(jail, "_warned", set())
    monkeypatch.setattr(code, "_sandboxes", {})
    with pytest.warns(RuntimeWarning, match="UNAVAILABLE"):
        tests = CodeTests(isolation="off", limits=SandboxLimits(wall_s=4.0))
    assert "ROLLWISE SANDBOX WARNING" in capsys.readouterr().err
    info = tests.isolation_info()
    assert info["mode"] == "off" and not info["isolated"] and "less than the full sandbox" in info["warning"]
    assert tests(TASK, "    return a + b\n").info["result"] == "passed"
    hack = "    class E:\n        def __eq__(s, o): return True\n    return E()\n"
    assert "not plain data" in tests(TASK, hack).info["result"]


def test_checker_workers_are_reused_only_after_a_clean_answer():
    """A worker that answered in time serves the next test; one that hung or died is replaced."""
    from rollwise.sandbox import calls
    from rollwise.sandbox.calls import CallTest

    def idle_pids():
        return {c.proc.pid for lst in calls._pool._idle.values() for c in lst}

    lim = SandboxLimits(wall_s=2.0)
    assert he("    return a + b\n", limits=lim) == "passed"
    before = idle_pids()
    assert before and he("    return a + b\n", limits=lim) == "passed" and idle_pids() == before
    # trusted test code that never ends: the scorer's deadline kills the worker
    hung = run_tests("def f(): return 1\n", CallTest(test="while True: pass\n"), limits=lim)
    assert hung == "timed out"
    died = run_tests("def f(): return 1\n", CallTest(test="import os\nos._exit(3)\n"), limits=lim)
    assert died == "failed: the test process ended without a verdict"
    assert he("    return a + b\n", limits=lim) == "passed"
    assert len(idle_pids()) <= len(before) + 1


def test_code_rewards_refuse_without_the_full_jail_in_one_line(monkeypatch):
    """Default isolation is 'required': no silent unisolated fallback for code rewards (issue 12)."""
    from rollwise.envs.humaneval import HumanEvalEnv
    from rollwise.envs.mbpp import MBPPEnv
    from rollwise.rewards import code
    from rollwise.sandbox import SandboxUnavailable, jail

    monkeypatch.delenv("ROLLWISE_SANDBOX", raising=False)
    monkeypatch.setattr(code, "_sandboxes", {})
    monkeypatch.setattr(jail, "_status", jail._Capabilities(True, False, "simulated: libseccomp is not installed"))
    for make in (CodeTests, HumanEvalEnv, MBPPEnv):
        with pytest.raises(SandboxUnavailable) as err:
            make()
        assert "\n" not in str(err.value) and "required but unavailable: simulated" in str(err.value)


@pytest.mark.slow
def test_all_humaneval_canonical_and_mbpp_reference_solutions(shared_data):
    """The full counts: 164/164 HumanEval; MBPP all but the three `re.Match` tasks (123 may time out under load)."""
    from concurrent.futures import ThreadPoolExecutor

    lim = SandboxLimits(wall_s=20.0, cpu_s=20)
    he_jobs = [(p["task_id"], p["prompt"] + p["canonical_solution"], humaneval_test(p["prompt"], p["test"], p["entry_point"]))
               for p in _humaneval(shared_data)]
    recs = json.loads((shared_data / "mbpp" / "sanitized-mbpp.json").read_text())
    mbpp_jobs = [(r["task_id"], r["code"] + "\n" + "\n".join(r["test_imports"]) + "\n", mbpp_test(r["test_imports"], r["test_list"], r["code"]))
                 for r in recs]
    with ThreadPoolExecutor(4) as ex:
        results = dict(ex.map(lambda j: (j[0], run_tests(j[1], j[2], limits=lim)), he_jobs + mbpp_jobs))
    failing = {k: v for k, v in results.items() if v != "passed"}
    assert len(he_jobs) == 164 and len(results) == 164 + len(recs)
    assert set(failing) - {123} == {737, 787, 794}, failing
    assert all("Match is not plain data" in failing[k] for k in (737, 787, 794))
