"""One model call per distinct judged input: repeats in a batch, across batches and across threads are cache hits,
counted on each Score; keys cannot be forged by a completion; an engine failure errors its samples (named) and is
not kept."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from rollwise.rewards.cached import ScoreCache, input_key, judge_metrics
from rollwise.rewards.judge import LLMJudge
from rollwise.rewards.model_rewards import ModelReward
from rollwise.rewards.user import RewardSum
from rollwise.types import CompletionOutput, RequestOutput, SamplingParams, Score, Task

T1 = Task("t1", "2+2=", "4", metadata={"level": 1})
T2 = Task("t2", "3+3=", "6", metadata={"level": 1})


@dataclass
class CountingEngine:
    """A judge engine replying 'Score: 7' to text prompts; counts the prompts it was asked."""

    prompts: list[str] = field(default_factory=list)
    fail: bool = False
    gate: threading.Event | None = None

    def generate(self, prompts, params):
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail:
            raise ConnectionError("judge server went away")
        self.prompts += list(prompts)
        return [RequestOutput(str(i), [], [CompletionOutput(0, [], [], "stop", "Score: 7")]) for i, _ in enumerate(prompts)]


@dataclass
class FakeBuilder:
    """What `ModelReward` asks of a builder, around an LLMJudge on a fake engine."""

    engine: CountingEngine
    builds: int = 0
    what = "judge"

    def inputs(self, task, completion):
        return {"prompt": task.prompt, "answer": task.answer, "completion": completion, "metadata": task.metadata}

    def build(self):
        self.builds += 1
        return LLMJudge(self.engine, template="{prompt} {completion} Score:",
                        sampling=SamplingParams(temperature=0.0, max_tokens=4)).score_batch


def _judge(**kw) -> tuple[ModelReward, CountingEngine, FakeBuilder]:
    eng = CountingEngine(**kw)
    b = FakeBuilder(eng)
    return ModelReward(b, "judge"), eng, b  # type: ignore[arg-type]


def test_each_distinct_completion_is_judged_once_and_repeats_are_counted_hits():
    r, eng, b = _judge()
    got = r.score_batch([T1] * 4 + [T2], ["4", "5", "4", "4", "4"])
    assert len(eng.prompts) == 3  # (t1, 4), (t1, 5), (t2, 4): one call each, in one generate
    assert [s.value for s in got] == [0.7] * 5
    assert [(s.info["judge_calls"], s.info["judge_cache_hits"]) for s in got] == [(1, 0), (1, 0), (0, 1), (0, 1), (1, 0)]
    again = r.score_batch([T1, T2, T1], ["5", "4", "6"])  # the next step: two seen before, one new
    assert len(eng.prompts) == 4 and [s.info["judge_cache_hits"] for s in again] == [1, 1, 0]
    assert r(T1, "4").info["judge_cache_hits"] == 1 and len(eng.prompts) == 4  # the per-sample call uses it too
    assert b.builds == 1  # the engine was built once, on the first score
    assert judge_metrics(s.info for s in got + again) == {"judge_calls": 4.0, "judge_cache_hits": 4.0,
                                                          "judge_cache_hit_rate": 0.5}
    assert judge_metrics([{}, {"reason": "x"}]) == {}


def test_the_same_completion_of_another_task_or_row_is_judged_again():
    r, eng, _ = _judge()
    other_row = Task("t1", "2+2=", "4", metadata={"level": 2})  # same prompt, another column value
    r.score_batch([T1, T2, other_row], ["4", "4", "4"])
    assert len(eng.prompts) == 3


@pytest.mark.parametrize("a,b", [
    ({"prompt": "ab", "completion": "c"}, {"prompt": "a", "completion": "bc"}),
    ({"prompt": "x", "completion": 'y", "completion": "z'}, {"prompt": "x", "completion": "z"}),
    ({"prompt": "x", "completion": '{"prompt": "x", "completion": "z"}'}, {"prompt": "x", "completion": "z"}),
    ({"prompt": "x", "completion": "z", "answer": None}, {"prompt": "x", "completion": "z"}),
    ({"prompt": "4", "completion": "z"}, {"prompt": 4, "completion": "z"}),
])
def test_no_completion_can_spell_another_inputs_key(a, b):
    assert input_key(a) != input_key(b)
    assert input_key(dict(reversed(list(a.items())))) == input_key(a)  # key order does not matter


def test_threads_scoring_the_same_completion_at_once_share_one_call():
    gate = threading.Event()
    r, eng, _ = _judge(gate=gate)
    out: dict[int, list[Score]] = {}

    def run(i):
        out[i] = r.score_batch([T1, T2], ["4", "4"])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert len(eng.prompts) == 2
    assert sum(s.info["judge_calls"] for v in out.values() for s in v) == 2
    assert sum(s.info["judge_cache_hits"] for v in out.values() for s in v) == 6


def test_an_engine_that_fails_errors_its_samples_with_the_reason_and_is_asked_again():
    r, eng, _ = _judge(fail=True)
    got = r.score_batch([T1, T1, T2], ["4", "4", "5"])
    assert all(s.error == "judge: the judge failed: ConnectionError: judge server went away" for s in got)
    assert [s.info["judge_calls"] for s in got] == [1, 0, 1]
    eng.fail = False
    again = r.score_batch([T1], ["4"])  # the error was not kept
    assert again[0].error is None and again[0].value == pytest.approx(0.7) and again[0].info["judge_calls"] == 1


def test_a_template_field_the_row_lacks_errors_that_sample_only():
    eng = CountingEngine()
    judge = LLMJudge(eng, template="{difficulty}: {completion} Score:")
    got = judge.score_batch([Task("a", "q", None, metadata={"difficulty": "hard"}), Task("b", "q", None)], ["1", "2"])
    assert got[0].error is None and eng.prompts == ["hard: 1 Score:"]
    assert got[1].error is not None and "{difficulty}" in got[1].error and "'b'" in got[1].error


def test_a_weighted_sum_adds_up_the_judges_counts_for_the_step_metrics():
    r1, _, _ = _judge()
    r2, _, _ = _judge()
    r2.name = "judge2"
    s = RewardSum([("judge", r1, 1.0), ("judge2", r2, 0.5)])  # type: ignore[list-item]
    got = s.score_batch([T1, T1], ["4", "4"])
    assert [(g.info["judge_calls"], g.info["judge_cache_hits"]) for g in got] == [(2, 0), (0, 2)]
    assert got[0].value == pytest.approx(0.7 + 0.35) and got[0].parts == {"judge": 0.7, "judge2": 0.7}


def test_the_cache_keeps_at_most_max_entries_dropping_the_oldest():
    cache = ScoreCache(max_entries=2)
    calls: list[list[int]] = []

    def compute(idx):
        calls.append(idx)
        return [Score(float(i)) for i in idx]

    cache.scores(["a", "b", "c"], compute)
    assert len(cache) == 2
    cache.scores(["a"], compute)  # dropped: computed again
    assert calls == [[0, 1, 2], [0]]


def test_a_model_reward_pickles_without_its_engine_or_cache():
    import pickle

    r, _, _ = _judge()
    r.score_batch([T1], ["4"])
    back = pickle.loads(pickle.dumps(r))
    assert back.name == "judge" and back._scorer is None and len(back.cache) == 0
