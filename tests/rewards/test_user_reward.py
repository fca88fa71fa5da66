"""User rewards: TRL's batch convention and rollwise's per-sample one, weighted sums, failures as data."""

from __future__ import annotations

import json
import pickle
import textwrap
import time

import pytest

from rollwise.envs.build import RewardedEnv, make_env
from rollwise.rewards.base import is_correct
from rollwise.rewards.concurrent import score_many
from rollwise.rewards.user import RewardSum, load_reward, make_reward, reward_kind
from rollwise.types import Score, Task

REWARDS_PY = '''
import math, time
CALLS = []

def trl_accuracy(prompts, completions, completion_ids=None, answer=None, **kwargs):
    """TRL's convention: a batch in, one float per completion out."""
    CALLS.append({"n": len(completions), "ids": completion_ids, "keys": sorted(kwargs)})
    return [1.0 if c.strip() == str(a) else 0.0 for c, a in zip(completions, answer)]

def trl_chat_format(completions, **kwargs):
    """Conversational data: each completion is [{"role": "assistant", "content": ...}]."""
    return [0.5 if c[0]["content"].startswith("<answer>") else 0.0 for c in completions]

def level_bonus(completions, level, **kwargs):
    return [0.1 * lv for lv in level]

def skips_some(completions, **kwargs):
    return [None if c == "skip" else 1.0 for c in completions]

def returns_nan(completions, **kwargs):
    return [math.nan for _ in completions]

def wrong_length(completions, **kwargs):
    return [1.0]

def not_a_list(completions, **kwargs):
    return 1.0

def raises(completions, **kwargs):
    raise RuntimeError("reward server down")

def hangs(completions, **kwargs):
    time.sleep(30)

def only_named(completions, answer):
    return [float(c == a) for c, a in zip(completions, answer)]

def per_sample(task, completion):
    return 1.0 if completion.strip() == str(task.answer) else 0.0

def per_sample_score(task, completion):
    from rollwise.types import Score
    return Score(0.25, parts={"len": float(len(completion))})

def per_sample_raises(task, completion):
    raise ValueError("cannot parse")

def bad_signature(x):
    return 1.0
'''


@pytest.fixture()
def rfile(tmp_path):
    f = tmp_path / "my_rewards.py"
    f.write_text(REWARDS_PY)
    return f


@pytest.fixture()
def data(tmp_path):
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1), "level": i % 3} for i in range(12)]
    f = tmp_path / "train.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def tasks(n=3, messages=False):
    out = []
    for i in range(n):
        prompt = [{"role": "user", "content": f"{i}+1?"}] if messages else f"{i}+1?"
        out.append(Task(id=f"t{i}", prompt=prompt, answer=str(i + 1), metadata={"level": i}))
    return out


def test_trl_reward_on_a_dataset_is_one_call_per_batch_with_columns(rfile, data):
    env = make_env("dataset", {"path": str(data), "prompt_key": "prompt", "test_size": 2},
                   reward=f"{rfile}:trl_accuracy")
    assert isinstance(env, RewardedEnv) and env.reward.kind == "batch"
    ts = env.load("train")[:4]
    items = [(t, t.answer if i % 2 == 0 else "nope", [5, 6, i]) for i, t in enumerate(ts) for _ in range(2)]
    scores = score_many(env, items, max_workers=4)
    assert [s.value for s in scores] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert scores[0].parts == {"trl_accuracy": 1.0} and all(s.error is None for s in scores)
    calls = env.reward.fn.__globals__["CALLS"]
    assert len(calls) == 1 and calls[0]["n"] == 8  # one call for the whole step, not one per sample
    assert calls[0]["ids"][4] == [5, 6, 2] and "level" in calls[0]["keys"]
    assert is_correct(scores[0]) and not is_correct(scores[2])


def test_messages_prompts_get_message_completions(rfile):
    r = load_reward(f"{rfile}:trl_chat_format")
    scores = r.score_batch(tasks(2, messages=True), ["<answer>1</answer>", "1"])
    assert [s.value for s in scores] == [0.5, 0.0]


def test_function_without_kwargs_gets_only_what_it_names(rfile):
    r = load_reward(f"{rfile}:only_named")
    assert [s.value for s in r.score_batch(tasks(2), ["1", "3"])] == [1.0, 0.0]
    r = load_reward(f"{rfile}:level_bonus")
    assert [round(s.value, 3) for s in r.score_batch(tasks(3), ["a", "b", "c"])] == [0.0, 0.1, 0.2]


@pytest.mark.parametrize("fn,reason", [
    ("raises", "trl.*raises: RuntimeError: reward server down|raises: RuntimeError: reward server down"),
    ("wrong_length", "returned 1 values for 3 completions"),
    ("not_a_list", "returned float, expected a list of 3"),
    ("returns_nan", "returned nan for sample 0"),
])
def test_failing_batch_rewards_give_errored_scores(rfile, fn, reason):
    scores = load_reward(f"{rfile}:{fn}").score_batch(tasks(3), ["1", "2", "3"])
    assert len(scores) == 3 and all(s.errored and s.value == 0.0 for s in scores)
    import re

    assert re.search(reason, scores[0].error), scores[0].error
    assert not any(is_correct(s, 0.0) for s in scores)


def test_none_is_errored_never_a_silent_zero(rfile):
    scores = load_reward(f"{rfile}:skips_some").score_batch(tasks(3), ["ok", "skip", "ok"])
    assert [s.errored for s in scores] == [False, True, False]
    assert "returned None for sample 1" in scores[1].error


def test_hanging_reward_times_out(rfile):
    r = load_reward(f"{rfile}:hangs", timeout_s=0.3)
    t0 = time.perf_counter()
    scores = r.score_batch(tasks(2), ["a", "b"])
    assert time.perf_counter() - t0 < 5
    assert all(s.errored and "timed out after 0.3s" in s.error for s in scores)


def test_per_sample_rewards(rfile):
    assert reward_kind(lambda task, completion: 1.0) == "sample"
    r = load_reward(f"{rfile}:per_sample")
    assert r.kind == "sample"
    assert [s.value for s in score_many(RewardedEnv(None, r), [(t, t.answer) for t in tasks(3)])] == [1.0] * 3
    s = load_reward(f"{rfile}:per_sample_score")(tasks(1)[0], "abc")
    assert s.value == 0.25 and s.parts == {"len": 3.0}
    bad = load_reward(f"{rfile}:per_sample_raises").score_batch(tasks(2), ["a", "b"])
    assert all(x.errored and "ValueError: cannot parse" in x.error for x in bad)


def test_weighted_sum_keeps_parts(rfile):
    r = make_reward(rewards=[{"fn": f"{rfile}:trl_accuracy", "weight": 1.0},
                             {"fn": f"{rfile}:level_bonus", "weight": 2.0},
                             {"fn": f"{rfile}:per_sample", "weight": 0.5, "name": "sample"}])
    assert isinstance(r, RewardSum)
    scores = r.score_batch(tasks(3), ["1", "0", "3"])
    assert scores[2].parts == {"trl_accuracy": 1.0, "level_bonus": pytest.approx(0.2), "sample": 1.0}
    assert scores[2].value == pytest.approx(1.0 + 0.4 + 0.5) and scores[1].value == pytest.approx(0.2)
    r2 = make_reward(rewards=[{"fn": f"{rfile}:per_sample"}, {"fn": f"{rfile}:skips_some", "weight": 1}])
    s = r2.score_batch(tasks(2), ["1", "skip"])
    assert not s[0].errored and s[1].errored and s[1].error.startswith("skips_some: ")
    dup = make_reward(rewards=[{"fn": f"{rfile}:per_sample"}, {"fn": f"{rfile}:per_sample", "weight": 2}])
    assert [p[0] for p in dup.parts] == ["per_sample", "per_sample_1"]


def test_bad_reward_specs_are_one_line(rfile, tmp_path):
    with pytest.raises(TypeError, match=r"matches neither TRL's .* nor rollwise's fn\(task, completion\)"):
        load_reward(f"{rfile}:bad_signature")
    with pytest.raises(FileNotFoundError, match="not found"):
        load_reward(f"{tmp_path}/none.py:fn")
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        load_reward(f"{rfile}:nope")
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    with pytest.raises(ValueError, match=r"importing .*broken.py' failed: SyntaxError") as e:
        load_reward(f"{broken}:f")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="not both"):
        make_reward(reward=f"{rfile}:per_sample", rewards=[{"fn": f"{rfile}:per_sample"}])
    with pytest.raises(ValueError, match=r"unknown keys \['wieght'\]"):
        make_reward(rewards=[{"fn": f"{rfile}:per_sample", "wieght": 2}])


def test_module_spec_and_user_module(tmp_path, monkeypatch):
    (tmp_path / "team_rewards.py").write_text("def exact(prompts, completions, answer, **kw):\n"
                                              "    return [float(c == str(a)) for c, a in zip(completions, answer)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_env("arithmetic", {"digits": 1}, reward="team_rewards:exact")
    t = env.load("test", n=2)
    assert [s.value for s in score_many(env, [(t[0], str(t[0].answer)), (t[1], "x")])] == [1.0, 0.0]


def test_make_env_refusals(tmp_path, rfile, data):
    with pytest.raises(ValueError, match="dataset has no reward of its own"):
        make_env("dataset", {"path": str(data), "test_size": 2})
    # A multi-turn environment is no longer refused: the user's reward scores its whole episodes
    # (tests/envs/test_agent_env.py runs one).
    assert type(make_env("tool_calc", {}, reward=f"{rfile}:per_sample")).__name__ == "RewardedEpisodes"
    # Without a user reward, a built-in environment comes back as it is.
    assert type(make_env("arithmetic", {})).__name__ == "ArithmeticEnv"


def test_rewarded_env_pickles_by_spec(rfile, data):
    """Ray ships environments to scoring actors: a reward from a .py file is re-imported from its spec."""
    env = make_env("dataset", {"path": str(data), "test_size": 2}, reward=f"{rfile}:trl_accuracy")
    env2 = pickle.loads(pickle.dumps(env))
    t = env2.load("train")[0]
    assert score_many(env2, [(t, t.answer)])[0].value == 1.0


def test_score_many_batch_scorer_failures_are_data():
    class Broken:
        name = "broken"

        def score_batch(self, tasks, completions, completion_ids=None):
            return [Score(1.0)]

    out = score_many(Broken(), [(t, "x") for t in tasks(3)])
    assert all(s.errored and "returned 1 scores for 3" in s.error for s in out)


def test_pass_threshold():
    assert is_correct(Score(1.0)) and not is_correct(Score(0.99))
    assert is_correct(Score(0.6), 0.5) and not is_correct(Score(0.6, error="x"), 0.5)


def test_reward_file_matches_the_docs_example(tmp_path):
    """The README-style example: a TRL reward file used unchanged."""
    f = tmp_path / "reward.py"
    f.write_text(textwrap.dedent('''
        import re
        def correct_sum(completions, answer, **kwargs):
            out = []
            for c, a in zip(completions, answer):
                nums = re.findall(r"-?\\d+", c)
                out.append(1.0 if nums and nums[-1] == str(a) else 0.0)
            return out
    '''))
    r = load_reward(f"{f}:correct_sum")
    assert [s.value for s in r.score_batch(tasks(2), ["the sum is 1", "it is 7"])] == [1.0, 0.0]


def test_with_reward_accepts_a_trl_function(rfile):
    from rollwise.envs import get_env, with_reward

    env = with_reward(get_env("arithmetic", digits=1), f"{rfile}:trl_accuracy")
    t = env.load("test", n=1)[0]
    assert env.score(t, str(t.answer)).value == 1.0 and env.score(t, "x").value == 0.0


class _Hostile:
    """A value whose every conversion raises: float(), repr() and str() alike."""

    def __float__(self):
        raise RuntimeError("no float")

    def __repr__(self):
        raise RuntimeError("no repr")


@pytest.mark.parametrize("bad, reason", [
    (10 ** 400, "int that is not one finite number (OverflowError"),  # int() of a policy's 400-digit answer
    (10 ** 5000, "int that is not one finite number (OverflowError"),  # past Python's int-to-text limit too
    ("np2", "ndarray that is not one finite number (ValueError"),  # a 2-element array for one sample
    (float("inf"), "inf"),
    (_Hostile(), "returned _Hostile"),
    (Score(10 ** 400), "a Score with value int that is not one finite number"),
], ids=["int400", "int5000", "array2", "inf", "hostile", "score400"])
@pytest.mark.parametrize("kind", ["batch", "sample"])
def test_one_bad_reward_value_errors_its_own_sample_only(bad, reason, kind):
    """A reward value that cannot be a finite float errors that sample, with its reason; the batch's other samples
    keep their scores (it used to raise out of score_batch, and every sample of the batch was errored)."""
    import numpy as np

    value = np.array([1.0, 2.0]) if isinstance(bad, str) else bad

    def trl_reward(completions, **kw):
        return [value if c == "bad" else 1.0 for c in completions]

    def per_sample(task, completion):
        return value if completion == "bad" else 1.0

    r = load_reward(trl_reward if kind == "batch" else per_sample)
    tasks = [Task(str(i), "q", None) for i in range(3)]
    scores = r.score_batch(tasks, ["ok", "bad", "ok"])
    assert [s.value for s in scores] == [1.0, 0.0, 1.0] and scores[0].error is None and scores[2].error is None
    assert scores[1].error is not None and reason in scores[1].error, scores[1].error


def test_a_weighted_sum_that_overflows_is_errored_not_inf():
    big = make_reward(rewards=[{"fn": lambda task, completion: 1e308, "weight": 10.0, "name": "a"}])
    (s,) = big.score_batch([Task("0", "q", None)], ["x"])
    assert s.error == "the weighted sum of the parts is inf"


def test_a_weighted_composite_that_overflows_is_errored_not_inf():
    from rollwise.rewards.compose import Weighted

    s = Weighted([("a", lambda task, completion: 1e308, 10.0)])(Task("0", "q", None), "x")
    assert s.error == "the weighted sum of the parts is inf" and s.value == 0.0


def test_a_score_part_that_is_not_a_number_errors_that_sample():
    """Parts reach metrics.jsonl and the rollout store: a part of 10**5000 (past Python's int-to-text limit) raised
    there, outside the episode; now it errors its own sample."""
    from rollwise.rewards.base import as_score

    bad = as_score(Score(1.0, parts={"len": 10 ** 5000}), where="fn")
    assert bad.error == "fn returned a Score whose part 'len' is int that is not one finite number (OverflowError: int " \
                        "too large to convert to float)"
    ok = as_score(Score(1.0, parts={"len": 3}), where="fn")
    assert ok.error is None and ok.parts == {"len": 3.0}


def test_a_reward_raising_an_exception_whose_message_cannot_be_made_errors_that_sample_only():
    def trl_reward(completions, **kw):
        if "bad" in completions:
            raise ValueError(10 ** 5000)  # str() of this exception raises in turn
        return [1.0] * len(completions)

    def per_sample(task, completion):
        if completion == "bad":
            raise ValueError(10 ** 5000)
        return 1.0

    (s,) = load_reward(trl_reward).score_batch([Task("0", "q", None)], ["bad"])
    assert s.error is not None and s.error.startswith("trl_reward: ValueError")
    scores = load_reward(per_sample).score_batch([Task(str(i), "q", None) for i in range(2)], ["ok", "bad"])
    assert scores[0].error is None and scores[1].error.startswith("per_sample: ValueError")
