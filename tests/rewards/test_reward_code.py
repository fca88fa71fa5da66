"""Code verifier: HumanEval's result vocabulary through the sandbox."""

from __future__ import annotations

import pytest

from rollwise.envs.base import Task
from rollwise.rewards.code import CodeTests, check_program, run_tests
from rollwise.sandbox import SandboxLimits, isolation_status

PROMPT = "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n"
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0, 'negatives'\n"
TASK = Task(id="add", prompt=PROMPT, answer="    return a + b\n", metadata={"prompt": PROMPT, "test": TEST, "entry_point": "add"})


@pytest.fixture(autouse=True, scope="module")
def _isolated():
    ok, reason = isolation_status()
    if not ok:
        pytest.skip(f"sandbox isolation unavailable here: {reason}")


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
    ],
)
def test_results_use_humaneval_vocabulary(completion, result):
    s = CodeTests(limits=SandboxLimits(wall_s=2.0))(TASK, completion)
    assert s.info["result"].startswith(result)
    assert s.value == (1.0 if result == "passed" else 0.0) and s.error is None


def test_program_is_humanevals_check_program():
    assert check_program("P", "C", "T", "f") == "PC\nT\ncheck(f)"


def test_hard_exit_without_verdict_and_output_flood_fail():
    prog = check_program(PROMPT, "    import os; os._exit(0)\n", TEST, "add")
    assert run_tests(prog).startswith("failed: program ended without a verdict")
    flood = check_program(PROMPT, "    while True: print('x' * 10000)\n", TEST, "add")
    assert run_tests(flood, limits=SandboxLimits(wall_s=5.0, output_bytes=20000)) == "failed: output limit exceeded"


def test_missing_metadata_is_a_clear_error():
    with pytest.raises(ValueError, match="lacks test, entry_point"):
        CodeTests()(Task("x", "p", "a"), "c")
