"""Math verifier: extraction conventions, numeric normalisation, math-verify fallback, and real data."""

from __future__ import annotations

import json
import os
import random
import string
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwise.rewards.math import MathVerifyTimeout, extract_answer, gold_of, math_equal, to_number, verify_math


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so 3 + 4 = 7\n#### 7", "7"),
        ("#### 1,000 dollars", "1,000 dollars"),
        ("We get $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("nested \\boxed{\\frac{3}{\\sqrt{4}}} done", "\\frac{3}{\\sqrt{4}}"),
        ("The answer is $18.00.", "18.00"),
        ("so the final answer is: 42 apples.", "42"),
        ("Therefore the answer is 50%.", "50%"),
        ("He runs 9*60=540 meters\nA: 540", "540"),
        ("first 3 then -4.5 at last", "-4.5"),
        ("The answer is x^2+1", "x^2+1"),
        ("no numbers here", None),
        ("", None),
    ],
)
def test_extraction(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "pred, gold, same",
    [
        ("1,000", "1000", True),
        ("$18.00", "18", True),
        ("18.50", "18.5", True),
        ("3/4", "0.75", True),
        ("\\frac{1}{2}", "0.5", True),
        ("42 apples", "42", True),
        ("50%", "50", True),
        ("x^2+1", "1+x^2", True),
        ("\\sqrt{4}", "2", True),
        ("17", "18", False),
        ("1,001", "1000", False),
        (None, "3", False),
    ],
)
def test_equivalence(pred, gold, same):
    assert math_equal(pred, gold) is same


def test_gold_of_takes_the_hashes_part():
    assert gold_of("work <<1+1=2>>2\n#### 1,234") == "1,234"
    assert gold_of(72) == "72"


def _formats(n: int, r: random.Random) -> str:
    body = f"{n:,}" if r.random() < 0.5 else str(n)
    return r.choice([
        f"Some work.\n#### {body}",
        f"so \\boxed{{{n}}}",
        f"The answer is {body}.",
        f"The answer is ${body}.00",
        f"steps 12 and 7\nA: {body}",
        f"lots of reasoning 3 4 5 ... so {body}",
    ])


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-10**9, max_value=10**9), st.randoms(use_true_random=False))
def test_any_integer_in_any_format_round_trips(n, r):
    text = _formats(n, r)
    assert math_equal(extract_answer(text), str(n)), text
    assert not math_equal(extract_answer(text), str(n + 1)), text


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=string.printable + "\\{}$#π√", max_size=300))
def test_extraction_and_verification_never_raise(text):
    got = extract_answer(text)
    assert got is None or isinstance(got, str)
    s = verify_math(text, "12")
    assert s.value in (0.0, 1.0) and s.error is None


@settings(max_examples=100, deadline=None)
@given(st.fractions(min_value=-1000, max_value=1000, max_denominator=50))
def test_fraction_forms_agree(q):
    assert to_number(f"{q.numerator}/{q.denominator}") == q
    assert math_equal(f"\\frac{{{q.numerator}}}{{{q.denominator}}}", f"{q.numerator}/{q.denominator}")


def test_gsm8k_gold_answers_all_score_one_and_shuffled_near_zero(shared_data):
    rows = [json.loads(line) for line in (shared_data / "gsm8k" / "test.jsonl").open()]
    assert len(rows) == 1319
    gold = [verify_math(r["answer"], r["answer"]).value for r in rows]
    assert sum(gold) == 1319
    perm = list(range(len(rows)))
    random.Random(0).shuffle(perm)
    shuffled = sum(verify_math(rows[perm[i]]["answer"], rows[i]["answer"]).value for i in range(len(rows)))
    assert shuffled / len(rows) < 0.03  # only coincidentally equal answers


def test_agreement_with_openai_labels_on_real_model_solutions(shared_data):
    """The 1319 x 4 GPT-3 solutions with OpenAI's is_correct labels: the verifier must agree on >= 99.5%."""
    path = shared_data / "gsm8k" / "example_model_solutions.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    agree = total = 0
    disagreements = []
    for line in path.open():
        row = json.loads(line)
        gold = row["ground_truth"].rsplit("A:", 1)[1].strip()
        for name, sol in row.items():
            if not isinstance(sol, dict):
                continue
            ok = verify_math(sol["solution"], gold).value == 1.0
            total += 1
            agree += ok == sol["is_correct"]
            if ok != sol["is_correct"]:
                disagreements.append((name, sol["solution"][-80:], gold))
    rate = agree / total
    print(f"math verifier agreement with is_correct labels: {agree}/{total} = {rate:.4f}")
    assert total == 4 * 1319
    assert rate >= 0.995, disagreements[:5]


# ---------------------------------------------------------------------------------------------- killable sympy

PATHOLOGICAL = "so the answer is \\boxed{9^{9^{9^{9}}}}"  # sympy evaluates the tower in C big-integer code: never ends


@pytest.fixture()
def small_pool():
    from rollwise.rewards.procpool import WorkerPool

    pool = WorkerPool(size=1, deadline_s=2.0)
    yield pool
    pool.close()


def _in_thread(fn, timeout_s):
    out: dict = {}
    th = threading.Thread(target=lambda: out.setdefault("v", fn()), daemon=True)
    t0 = time.monotonic()
    th.start()
    th.join(timeout_s)
    return out.get("v"), time.monotonic() - t0, th.is_alive()


def test_runaway_sympy_call_is_killed_at_its_deadline_and_scored_wrong(small_pool):
    """The worker's deadline is the backstop behind `rewards.bounds`: an answer that gets past the bounds and
    holds the worker is a wrong answer saying so (the policy wrote it), never errored."""
    from rollwise.rewards.math import symbolic_verdict

    assert math_equal("x^2+1", "1+x^2", pool=small_pool)  # the worker is up and answers
    (pid,) = small_pool.pids()
    verdict, elapsed, alive = _in_thread(lambda: symbolic_verdict("9^{9^{9^{9}}}", "3", pool=small_pool), 30)
    assert not alive, "the runaway call was not stopped"
    assert elapsed < 15
    assert not verdict.correct and "did not finish within 2s" in verdict.reason and "9^{9^{9^{9}}}" in verdict.reason
    # Through verify_math the same answer never reaches the worker: the bounds reject the tower at once.
    score, elapsed, _ = _in_thread(lambda: verify_math(PATHOLOGICAL, "3", pool=small_pool), 30)
    assert elapsed < 1 and score.error is None and score.value == 0.0 and "power tower" in score.info["reason"]
    assert score.info["extracted"] == "9^{9^{9^{9}}}"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the worker that was burning CPU is gone (killed and reaped)
    assert small_pool.num_killed == 1 and small_pool.pids() == []
    # The next call gets a fresh worker.
    assert math_equal("\\sqrt{4}", "2", pool=small_pool) and small_pool.pids() and small_pool.pids()[0] != pid


def test_math_equal_raises_on_timeout_instead_of_false(small_pool):
    with pytest.raises(MathVerifyTimeout, match="did not finish"):
        math_equal("9^{9^{9^{9}}}", "3", pool=small_pool)


def test_symbolic_scoring_off_the_main_thread_prints_no_timeout_warning(capfd, caplog):
    from rollwise.rewards.procpool import WorkerPool

    pool = WorkerPool(size=1)
    try:
        v, _, alive = _in_thread(lambda: math_equal("\\frac{x}{2}", "x/2", pool=pool), 60)
        assert v is True and not alive
    finally:
        pool.close()
    assert "Timeout is disabled" not in capfd.readouterr().err  # the worker's stderr is this process's fd 2
    assert not [r for r in caplog.records if "Timeout is disabled" in r.getMessage()]


def test_pool_serves_concurrent_callers_and_reports_worker_errors():
    from rollwise.rewards.procpool import WorkerError, WorkerPool

    pool = WorkerPool(size=2, deadline_s=30)
    try:
        cases = [("x^2+1", "1+x^2", True), ("x+1", "x+2", False), ("\\sqrt{9}", "3", True), ("2x", "x+x", True)] * 4
        results: list = [None] * len(cases)

        def work(i):
            results[i] = math_equal(cases[i][0], cases[i][1], pool=pool)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results == [c[2] for c in cases]
        assert len(pool.pids()) <= 2
        with pytest.raises(ValueError, match="unknown worker function"):
            pool.call("os.system", "true")
        with pytest.raises(WorkerError, match="failed in the worker"):
            pool.call("math_verify_equal", 1)  # wrong arity: the worker reports, and stays usable
        assert math_equal("x^2", "x*x", pool=pool)
    finally:
        pool.close()


def test_worker_ends_a_runaway_call_by_itself_when_nobody_kills_it():
    """The CPU-time limit set before each call stops a runaway even if the parent never kills the worker."""
    import signal

    from rollwise.rewards.procpool import CallTimeout, _Worker

    w = _Worker(memory_mb=2048, start_timeout_s=60)
    try:
        with pytest.raises(CallTimeout):
            w.call("math_verify_equal", ["9^{9^{9^{9}}}", "3"], deadline_s=1.0)
        assert w.proc.wait(timeout=20) == -signal.SIGXCPU  # ~2 x deadline of CPU, then the kernel ends it
    finally:
        w.kill()
