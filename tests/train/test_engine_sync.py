"""Trainer <-> engine round trip on a tiny Llama: the trainer's log-probs match the engine's behaviour log-probs
on the same tokens (same temperature), a weight sync keeps them matched after an update, and a missed sync
shows up in the mismatch metric."""

from __future__ import annotations

import pytest

from rollwise.config import TrainConfig
from rollwise.train.advantages import assign_advantages
from rollwise.train.batch import TrainBatch
from rollwise.train.losses import LOSSES, LossConfig
from rollwise.train.trainer import Trainer
from rollwise.types import Rollout, RolloutGroup, SamplingParams

engine = pytest.importorskip("rollwise.engine.llm")

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
TEMP = 0.8


def _groups(llm, seed):
    outs = llm.generate(PROMPTS, SamplingParams(n=4, temperature=TEMP, max_tokens=10, seed=seed, ignore_eos=True))
    groups = []
    for gi, o in enumerate(outs):
        ros = [Rollout(str(gi), str(gi), j, o.prompt_token_ids, c.token_ids, c.logprobs, [0] * len(c.token_ids),
                       [1] * len(c.token_ids), reward=float(c.token_ids[0] % 2)) for j, c in enumerate(o.outputs)]
        groups.append(RolloutGroup(str(gi), str(gi), ros))
    assign_advantages(groups, "grpo")
    return [r for g in groups for r in g.rollouts]


def test_trainer_matches_engine_and_sync_keeps_it(tiny_llama):
    llm = engine.LLM(str(tiny_llama), device="cpu", dtype="float32", max_num_seqs=16, kv_cache_gb=0.05)
    tr = Trainer(tiny_llama, TrainConfig(lr=1e-2), temperature=TEMP)
    m = tr.train_step(TrainBatch.from_rollouts(_groups(llm, 0), 48), LOSSES["grpo"], LossConfig())
    assert m["logprob_diff_max"] < 1e-4  # same weights, same temperature: same numbers

    for _ in range(2):  # a few updates with a large LR so the policy really moves
        tr.train_step(TrainBatch.from_rollouts(_groups(llm, 1), 48), LOSSES["grpo"], LossConfig())
    stale = tr.train_step(TrainBatch.from_rollouts(_groups(llm, 2), 48), LOSSES["grpo"], LossConfig())
    assert stale["logprob_diff_max"] > 1e-3  # the engine was never synced: the metric says so

    llm.load_weights(tr.state_dict_for_sync())
    batch = TrainBatch.from_rollouts(_groups(llm, 3), 48)
    diff = ((tr.compute_logprobs(batch) - batch.old_logprobs).abs() * batch.loss_mask).max().item()
    assert diff < 1e-4
