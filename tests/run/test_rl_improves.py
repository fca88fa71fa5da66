"""End to end: RL must raise held-out accuracy. Fails if the loss, its sign or the advantages break.

The built-in tiny model learns an easy task with a fixed seed: echo a 3-digit number ("417=" -> "417").
Its supervised warm-up imitates noisy demonstrations (60% of answers off by 1 or 2), so it knows the answer
(greedy is mostly right) but samples it about a third of the time; the task generalises, so sharpening it
on the training numbers carries over to held-out numbers the run never saw. That is the loop's whole story
in under a minute on 2 cores: measured 0.29 -> 0.78 sampled held-out accuracy in 30 steps (10 s of RL).
With the advantage's sign flipped, the same run falls (measured 0.29 -> 0.00), so a wrong sign, a loss that
ignores advantages or an update that never reaches the engine's weights all fail the margin below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from rollwise.envs.base import Task, split_of
from rollwise.rewards.match import leading_int
from rollwise.types import Score


@dataclass
class EchoEnv:
    """Echo a 3-digit number; a quarter of the numbers are held out (split by hash, disjoint)."""

    name: str = "echo"
    charset: str = field(default="0123456789= \n", init=False)

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        tasks = [Task(id=f"echo/{k}", prompt=f"{k}=", answer=k) for k in range(100, 1000)
                 if split_of(str(k), 0.25) == split]
        return tasks[:n] if n else tasks

    def score(self, task: Task, completion: str) -> Score:
        got = leading_int(completion)
        ok = got is not None and got == int(task.answer)
        return Score(float(ok), parts={"correct": float(ok)})


@pytest.fixture(scope="module")
def warmup_cache(tmp_path_factory):
    """One warm-up for both precisions (the warm-up does not depend on train.bf16)."""
    return tmp_path_factory.mktemp("echo-warmup")


@pytest.mark.parametrize("bf16", ["false", "true"])
def test_rl_raises_held_out_accuracy(tmp_path, warmup_cache, bf16):
    """float32 training, and bf16 mixed precision (float32 master weights) on the same run: both must learn."""
    from rollwise.config import load_config
    from rollwise.run.loop import train

    cfg = load_config(None, [
        f"run.out_dir={tmp_path / 'run'}", f"env.name={__file__}:EchoEnv", "env.eval_size=100",
        "model.builtin.hidden_size=64", "model.builtin.num_layers=2", "model.builtin.intermediate_size=128",
        "warmup.steps=150", "warmup.seconds=300", f"warmup.cache_dir={warmup_cache}", f"train.bf16={bf16}",
        "rollout.prompts_per_step=8", "rollout.samples_per_prompt=8", "rollout.max_tokens=5",
        "train.steps=30", "train.lr=3e-4", "train.micro_batch_tokens=512", "train.seed=0",
        "model.device=cpu", "run.cpu_threads=1", "run.loggers=[jsonl]",
    ])
    summary = train(cfg, log=lambda s: None)
    before, after = summary["eval_before"], summary["eval_after"]
    assert before["n"] == after["n"] == 100 and before["errored"] == after["errored"] == 0
    # The warm-up leaves room (it samples the answer a third of the time) and RL takes it: +49 points measured.
    assert before["accuracy"] < 0.5, before
    assert after["accuracy"] >= before["accuracy"] + 0.25, (before, after)
    assert after["accuracy_greedy"] >= before["accuracy_greedy"], (before, after)



@dataclass
class HalfEchoEnv(EchoEnv):
    """Echo, but only numbers below 550 pay: the prompt predicts half of every value, so a critic has more to learn
    than the mean reward (plain echo's value is decided by the last digit sampled, barely before the end)."""

    name: str = "half_echo"

    def score(self, task: Task, completion: str) -> Score:
        ok = int(task.answer) < 550 and super().score(task, completion).value > 0
        return Score(float(ok), parts={"correct": float(ok)})


def test_ppo_with_a_critic_raises_held_out_accuracy(tmp_path, warmup_cache):
    """`algo.advantage: gae` (PPO with a learned critic, docs/ppo.md) from the same warm-up: held-out accuracy rises
    as with GRPO (measured 0.29 -> 0.70 sampled in 30 steps, about 8 s of RL), and the critic's values come to
    explain the returns (explained variance 0 at the first step, about 0.4 over the last ten)."""
    import json

    from rollwise.config import load_config
    from rollwise.run.loop import train

    cfg = load_config(None, [
        f"run.out_dir={tmp_path / 'run'}", f"env.name={__file__}:HalfEchoEnv", "env.eval_size=100",
        "model.builtin.hidden_size=64", "model.builtin.num_layers=2", "model.builtin.intermediate_size=128",
        "warmup.steps=150", "warmup.seconds=300", f"warmup.cache_dir={warmup_cache}", "train.bf16=false",
        "rollout.prompts_per_step=8", "rollout.samples_per_prompt=8", "rollout.max_tokens=5",
        "train.steps=30", "train.lr=3e-4", "train.micro_batch_tokens=512", "train.seed=0",
        "algo.advantage=gae", "algo.loss=ppo", "algo.critic.lr=3e-3",
        "model.device=cpu", "run.cpu_threads=1", "run.loggers=[jsonl]",
    ])
    summary = train(cfg, log=lambda s: None)
    before, after = summary["eval_before"], summary["eval_after"]
    assert before["accuracy"] < 0.5, before
    assert after["accuracy"] >= before["accuracy"] + 0.25, (before, after)
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    ev = [m["critic/explained_var"] for m in lines if m.get("critic/explained_var") is not None]
    assert abs(ev[0]) < 1e-6 and sum(ev[-10:]) / 10 > 0.2, ev  # a new head explains nothing; then it learns
    assert (tmp_path / "run" / "checkpoints" / "step-30" / "critic" / "model.safetensors").is_file()
