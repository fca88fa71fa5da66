"""Built-in environments: arithmetic, countdown (and its safe evaluator), GSM8K, HumanEval, MBPP, tool_calc."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwise.envs import Environment, get_env
from rollwise.envs.arithmetic import LEVELS, ArithmeticEnv
from rollwise.envs.calc import CalcError, evaluate
from rollwise.envs.countdown import CountdownEnv, extract_equation


# -- arithmetic ---------------------------------------------------------------------------------------------
def test_arithmetic_prompt_format_and_scoring():
    env = ArithmeticEnv()
    task = env.make_task("23+45")
    assert (task.prompt, task.answer) == ("23+45=", 68)
    assert env.score(task, "68").value == 1.0
    assert env.score(task, "68\n12").value == 1.0  # only the leading integer counts
    assert env.score(task, "69").value == 0.0
    assert env.score(task, "").value == 0.0 and env.score(task, "").error is None
    assert env.make_task("3-7*2").answer == -11


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_arithmetic_levels_stay_in_charset_and_are_right(level):
    env = ArithmeticEnv(level=level)
    for t in env.load("train", n=50):
        assert set(t.prompt) <= set(ArithmeticEnv.charset) and set(str(t.answer)) <= set(env.charset)
        assert t.prompt.endswith("=") and eval(t.prompt[:-1]) == t.answer  # noqa: S307 - test oracle
        assert env.score(t, str(t.answer)).value == 1.0


def test_arithmetic_is_deterministic_with_disjoint_splits():
    env = ArithmeticEnv(digits=2)
    assert [t.id for t in env.load("train", 200, seed=3)] == [t.id for t in ArithmeticEnv(digits=2).load("train", 200, seed=3)]
    assert [t.id for t in env.load("train", 200, seed=3)] != [t.id for t in env.load("train", 200, seed=4)]
    train = {t.id for s in range(3) for t in env.load("train", 2000, seed=s)}
    test = {t.id for s in range(3) for t in env.load("test", 500, seed=s)}
    assert train and test and not train & test
    assert len(env.load("test", 500)) == 500


def test_arithmetic_small_space_returns_what_exists():
    env = ArithmeticEnv(digits=1, ops="+")
    train, test = env.load("train", 1000), env.load("test", 1000)
    assert len(train) + len(test) == 100 and len({t.id for t in train}) == len(train)


@pytest.mark.parametrize("kw", [{"level": 9}, {"digits": 0}, {"ops": "/"}, {"operands": 1}])
def test_arithmetic_rejects_bad_config(kw):
    with pytest.raises(ValueError, match="arithmetic"):
        ArithmeticEnv(**kw)


# -- countdown ----------------------------------------------------------------------------------------------
def test_countdown_tasks_are_solvable_and_scored_by_rules():
    env = CountdownEnv(count=3)
    tasks = env.load("train", n=30)
    assert len(tasks) == 30 and all(1 <= t.answer <= env.max_target for t in tasks)
    t = env.load("train", n=1)[0].__class__(id="x", prompt="", answer=24, metadata={"numbers": [4, 6, 1]})
    assert env.score(t, "<answer>4*6*1</answer>").value == 1.0
    assert env.score(t, "so (6 - 1 + 1) * 4 = 24").parts["correct"] == 0.0  # 1 used twice, 4 once... wrong set
    assert env.score(t, "<answer>4*6</answer>").info["reason"].startswith("uses")
    assert env.score(t, "<answer>4*6*1 + 0</answer>").value == 0.0
    assert env.score(t, "<answer>__import__('os')</answer>").parts["format"] == 0.0
    assert env.score(t, "no idea").info["reason"] == "no equation"


def test_countdown_equation_extraction():
    assert extract_equation("blah\n<answer> 3*4+1 = 13 </answer>") == "3*4+1"
    assert extract_equation("13 = 3*4+1") == "3*4+1"
    assert extract_equation("nothing") is None


def test_safe_evaluator_is_exact_and_refuses_code():
    assert evaluate("7/2*2") == (7, [7, 2, 2])
    assert evaluate("2^10")[0] == 1024
    for bad in ["__import__('os').system('x')", "1/0", "1e400", "(1).real", "9**99", "[1]", "a+1", "", "1" * 300]:
        with pytest.raises(CalcError):
            evaluate(bad)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789+-*/().^ e_a", max_size=40))
def test_safe_evaluator_only_raises_calc_error(expr):
    try:
        evaluate(expr)
    except CalcError:
        pass


# -- data-backed environments -------------------------------------------------------------------------------
def test_gsm8k_loads_real_data(shared_data):
    env = get_env("gsm8k", path=str(shared_data))
    test = env.load("test")
    assert len(test) == 1319 and test[0].answer == "18" and "Janet" in test[0].prompt
    sub = env.load("train", n=20, seed=1)
    assert len(sub) == 20 and [t.id for t in sub] == [t.id for t in env.load("train", n=20, seed=1)]
    assert env.score(test[0], "... so she makes $18 every day.\n#### 18").value == 1.0
    with pytest.raises(ValueError, match="splits"):
        env.load("validation")
    with pytest.raises(ValueError, match="lacks 'answer'"):
        env.task_from_record({"question": "q"}, 0)


def test_humaneval_loads_and_scores(shared_data):
    env = get_env("humaneval", path=str(shared_data))
    tasks = env.load("test")
    assert len(tasks) == 164 and tasks[0].id == "HumanEval/0"
    assert set(tasks[0].metadata) == {"prompt", "test", "entry_point"}
    assert env.score(tasks[0], tasks[0].answer).info["result"] == "passed"
    assert env.score(tasks[0], "    return not " + tasks[0].answer.strip().splitlines()[-1].split("return")[-1] + "\n").value == 0.0
    with pytest.raises(ValueError, match="only a 'test' split"):
        env.load("train")


def test_every_builtin_satisfies_the_protocol(shared_data):
    for name in ("arithmetic", "countdown", "gsm8k", "humaneval", "mbpp", "tool_calc"):
        env = get_env(name, path=str(shared_data)) if name in ("gsm8k", "humaneval", "mbpp") else get_env(name)
        assert isinstance(env, Environment) and env.name == name
        task = env.load("test", n=2)[0]
        assert isinstance(task.id, str) and isinstance(task.prompt, str)


def test_mbpp_references_pass_and_broken_code_fails(shared_data):
    from rollwise.envs.mbpp import strip_fence
    from rollwise.rewards import score_many

    env = get_env("mbpp", path=str(shared_data))
    tasks = env.load("test")
    assert len(tasks) == 427 and "Your code should pass these tests:" in tasks[0].prompt
    # NOTE: mbpp/123's reference is O(n^2) up to 9999 and takes seconds: it times out on a loaded 2-core box.
    sample = [t for t in random.Random(0).sample(tasks, 25) if t.id != "mbpp/123"]
    fenced = [(t, f"Here you go:\n```python\n{t.answer}\n```\nDone.") for t in sample]
    broken = [(t, "def nothing():\n    pass\n") for t in sample[:5]]
    scores = score_many(env, fenced + broken, max_workers=4)
    assert [s.info["result"] for s in scores[: len(sample)]] == ["passed"] * len(sample)
    assert all(s.value == 0.0 and s.info["result"].startswith("failed: ") for s in scores[len(sample):])
    assert strip_fence("no fence") == "no fence"
    with pytest.raises(ValueError, match="one 'test' split"):
        env.load("train")
