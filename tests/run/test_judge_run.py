"""Rewards computed by a model, end to end from config: the built-in tiny model as the policy and as its own LLM
judge (in-process engine), and a sequence-classification reward model built on the fly, each through a few RL
steps on the CPU."""

from __future__ import annotations

import json
import time

import pytest

from rollwise.run.loop import train
from rollwise.store.writer import RolloutStore

JUDGE = ["env.reward.judge.model=builtin:tiny", "env.reward.judge.template='{prompt}{completion}+1='",
         r"env.reward.judge.score_pattern='(\d)'", "env.reward.judge.max_score=9", "env.reward.judge.max_tokens=3",
         "run.eval_samples=1", "rollout.temperature=0.2"]
"""The warmed-up addition model reads "a+b=c+1=" and writes digits: its first digit, out of 9, is the reward."""


def _lines(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_run_judged_by_the_built_in_model_records_rewards_and_judge_calls(run_cfg, tmp_path):
    out = tmp_path / "run"
    t0 = time.perf_counter()
    summary = train(run_cfg(out, *JUDGE, builtin=True), log=lambda s: None)
    wall = time.perf_counter() - t0
    assert summary is not None and summary["steps"] == 3
    lines = _lines(out)
    assert [m["step"] for m in lines] == [1, 2, 3]
    rows = RolloutStore(out).read()
    assert len(rows) == 3 * 16 and all(r.status != "errored" for r in rows), {r.status_reason for r in rows}
    # a judge's verdict on each sample: its reply, and its score / 9 (or a wrong answer when it wrote no digit)
    assert all(r.reward is not None and 0.0 <= r.reward <= 1.0 for r in rows)
    assert all("judge" in r.reward_parts for r in rows)
    assert any("raw_score" in r.env_info or "reason" in r.env_info for r in rows)
    for m in lines:  # every sample was judged once or found in the cache
        assert m["judge_calls"] + m["judge_cache_hits"] == 16
        assert m["judge_calls"] >= 1 and 0.0 <= m["judge_cache_hit_rate"] <= 1.0
    assert sum(r.env_info["judge_calls"] for r in rows) == sum(m["judge_calls"] for m in lines)
    # a completion judged before is a cache hit (at temperature 0.2 a group repeats its answers)
    assert sum(m["judge_cache_hits"] for m in lines) > 0
    print(f"judged run: {wall:.1f}s for 3 steps; judge calls per step "
          f"{[int(m['judge_calls']) for m in lines]}, cache hits {[int(m['judge_cache_hits']) for m in lines]}")


def test_a_judge_that_cannot_load_stops_the_run_with_one_line(run_cfg, tmp_path):
    """An engine that fails is outside the episode: every sample of step 1 errors, and the run stops (run.guard)."""
    from rollwise.run.guard import RewardBroken

    out = tmp_path / "run"
    cfg = run_cfg(out, *JUDGE, "env.reward.judge.chat_template=true", builtin=True)  # the char tokenizer has none
    with pytest.raises(RewardBroken) as e:
        train(cfg, log=lambda s: None)
    msg = str(e.value)
    assert "\n" not in msg and "judge: the judge failed" in msg and "chat template" in msg, msg


def test_a_run_scored_by_a_reward_model_with_a_format_reward(run_cfg, tmp_path, tiny_reward_model):
    rm = tiny_reward_model
    out = tmp_path / "run"
    (tmp_path / "fmt.py").write_text("def digits(task, completion):\n    return float(completion.strip().isdigit())\n")
    cfg = run_cfg(out, "run.eval_samples=1", "env.pass_threshold=0.5",
                  f"env.rewards=[{{fn: '{tmp_path}/fmt.py:digits', weight: 0.5}}, "
                  f"{{reward_model: {{path: '{rm}', normalize: sigmoid, batch_size: 4}}, weight: 1.0}}]",
                  builtin=True)
    summary = train(cfg, log=lambda s: None)
    assert summary is not None and summary["steps"] == 3
    rows = RolloutStore(out).read()
    assert all(r.status != "errored" for r in rows)
    assert all(set(r.reward_parts) == {"digits", rm.name} for r in rows)
    assert all(0.0 < r.reward_parts[rm.name] < 1.0 for r in rows)  # a sigmoid of the logit
    assert all(r.reward == pytest.approx(0.5 * r.reward_parts["digits"] + r.reward_parts[rm.name]) for r in rows)
    for m in _lines(out):
        assert m["judge_calls"] + m["judge_cache_hits"] == 16 and f"rewards/{rm.name}/mean" in m


def test_a_trl_script_with_a_reward_model_path_runs(tmp_path, tiny_model, tiny_reward_model):
    """`GRPOTrainer(reward_funcs=[fn, "path/to/reward-model"])`, as a TRL script writes it, trains with both."""
    from rollwise.trl import GRPOConfig, GRPOTrainer

    def exact(completions, answer, **kwargs):
        return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]

    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10, 30) for b in (3, 7)]
    args = GRPOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=16, num_generations=4,
                      max_completion_length=6, learning_rate=3e-4, max_steps=2, logging_steps=1, use_cpu=True,
                      report_to="none", reward_weights=[1.0, 0.1])
    t = GRPOTrainer(model=str(tiny_model), reward_funcs=[exact, str(tiny_reward_model)], args=args,
                    train_dataset=rows[8:], eval_dataset=rows[:8])
    t.train()
    hist = t.state.log_history
    name = tiny_reward_model.name
    assert [h["step"] for h in hist[:2]] == [1, 2]
    for h in hist[:2]:
        assert f"rewards/{name}/mean" in h and "rewards/exact/mean" in h
        assert h["reward"] == pytest.approx(h["rewards/exact/mean"] + 0.1 * h[f"rewards/{name}/mean"], abs=1e-6)
    lines = _lines(tmp_path / "run")
    assert all(m["judge_calls"] + m["judge_cache_hits"] == 16 for m in lines)
