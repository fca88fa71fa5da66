"""A realistic synthetic run directory: 20 steps of metrics, a summary with a rollout card, and shards."""

from __future__ import annotations

import json
import math
import random

import pytest

from rollwise.store.card import ACCURACY_METHOD_DEFAULT, build_rollout_card
from rollwise.store.writer import RolloutStore
from rollwise.types import Rollout

VOCAB = list("0123456789+= ") + ["<eos>"]
PROMPTS = [f"{a}+{b}=" for a, b in [(12, 30), (7, 45), (33, 21), (50, 49), (8, 8), (61, 17)]]
STEPS = 20


def decode(ids):
    return "".join(VOCAB[i] if 0 <= i < len(VOCAB) else "?" for i in ids)


def encode(text):
    return [VOCAB.index(c) for c in text]


def make_step(step: int, rng: random.Random) -> list[Rollout]:
    out = []
    for g, prompt in enumerate(PROMPTS):
        a, b = map(int, prompt[:-1].split("+"))
        for i in range(4):
            right = rng.random() < min(0.9, 0.2 + step / 25)
            answer = str(a + b if right else a + b + rng.choice([-2, -1, 1, 3]))
            ids = encode(answer) + [VOCAB.index("<eos>")]
            status, reason, finish, reward = "kept", "", "stop", float(right)
            mask = [1] * len(ids)
            if g == 5 and i == 3:
                # A multi-turn sample: a tool reply (environment tokens, loss_mask 0) then more generation.
                ids = encode(answer) + encode(" = ") + encode(answer) + [VOCAB.index("<eos>")]
                mask = [1] * len(answer) + [0, 0, 0] + [1] * (len(answer) + 1)
            if step % 7 == 3 and g == 1 and i == 0:
                status, reason, reward = "errored", "verifier timeout after 5.0s", None
            if step % 5 == 4 and g == 2 and i == 1:
                ids = ids[:-1] + encode("1111")
                mask = [1] * len(ids)
                status, reason, finish = "truncated", "hit max_tokens=8", "length"
            out.append(
                Rollout(
                    prompt_id=f"add-{g}",
                    group_id=f"s{step}-g{g}",
                    sample_index=i,
                    prompt_token_ids=encode(prompt),
                    completion_token_ids=ids,
                    logprobs=[-abs(rng.gauss(0.05 if right else 0.9, 0.4)) for _ in ids],
                    weight_versions=[max(0, step - (1 if i % 2 else 0))] * len(ids),
                    loss_mask=mask,
                    text=decode(ids),
                    finish_reason=finish,
                    reward=reward,
                    reward_parts={} if reward is None else {"correct": reward, "format": 1.0},
                    advantage=None if reward is None else round(reward - 0.5, 3),
                    status=status,
                    status_reason=reason,
                    timings={"generate_s": 0.02},
                    env_info={"turns": 2 if mask.count(0) else 1},
                    seed=1000 * step + 10 * g + i,
                    step=step,
                )
            )
    return out


@pytest.fixture
def run_dir(tmp_path):
    rng = random.Random(0)
    run = tmp_path / "run-add"
    run.mkdir()
    store = RolloutStore(run, decode=decode)
    with open(run / "metrics.jsonl", "w") as f:
        wall = 0.0
        for step in range(STEPS):
            rollouts = make_step(step, rng)
            store.write_step(step, rollouts)
            rewards = [r.reward for r in rollouts if r.reward is not None]
            t = {"time_generate_s": 0.6 + 0.01 * step, "time_score_s": 0.05, "time_train_s": 0.3, "time_sync_s": 0.02}
            wall += sum(t.values())
            tail = 0.2 + 0.01 * step  # the generate phase split as the controller logs it (control/tail.py)
            split = {"time_tail_s": tail, "tail_frac": tail / t["time_generate_s"],
                     "time_gen_useful_s": 0.25 * (t["time_generate_s"] - tail),
                     "time_gen_filtered_s": 0.75 * (t["time_generate_s"] - tail), "step_s": sum(t.values()) + 0.03}
            rec = {
                "step": step, "wall_s": round(wall, 3), "reward_mean": sum(rewards) / len(rewards),
                "accuracy": sum(rewards) / len(rewards), "zero_var_frac": rng.random() * 0.3,
                "resp_len_mean": 3.1, "resp_len_max": 8, "truncation_rate": 0.04 if step % 5 == 4 else 0.0,
                "gen_tokens_per_s": 1800 + 40 * step, **t, **split, "staleness_mean": 0.5, "logprob_mismatch_mean": 1e-4 * (1 + step % 3),
                "kl": 0.001 * step, "entropy": 1.2 - 0.03 * step, "grad_norm": 0.5 + math.sin(step),
                "lr": 1e-4,
            }  # fmt: skip
            f.write(json.dumps(rec) + "\n")
        f.write('{"step": 20, "wall_s": 9')  # the line a SIGKILL cut short
    card = build_rollout_card(
        store.counts_by_status(), config_hash="9f2c…", seeds={"run": 0}, accuracy_method=ACCURACY_METHOD_DEFAULT
    )
    summary = {**card, "eval_before": {"accuracy": 0.29}, "eval_after": {"accuracy": 0.75}, "steps": STEPS, "wall_s": wall}
    (run / "summary.json").write_text(json.dumps(summary))
    return run
