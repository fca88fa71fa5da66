"""With top-p / top-k sampling the trainer recomputes the engine's behaviour log-probs (same truncation), so the
importance ratio is 1 at the behaviour policy; without the truncation it is not."""

from __future__ import annotations

import pytest
import torch

from rollwise.config import TrainConfig
from rollwise.train.advantages import assign_advantages
from rollwise.train.batch import TrainBatch
from rollwise.train.losses import LOSSES, LossConfig
from rollwise.train.logprobs import token_logprobs, truncation_keep
from rollwise.train.trainer import Trainer, TrainerError
from rollwise.types import Rollout, RolloutGroup, SamplingParams

engine = pytest.importorskip("rollwise.engine.llm")

PROMPTS = [[5, 6, 7, 8], [8, 9], [10, 11, 12, 13, 14]]


def _rollouts(llm, sp):
    groups = []
    for gi, o in enumerate(llm.generate(PROMPTS, sp)):
        ros = [Rollout(str(gi), str(gi), j, o.prompt_token_ids, c.token_ids, c.logprobs, [0] * len(c.token_ids),
                       [1] * len(c.token_ids), reward=float(c.token_ids[0] % 2)) for j, c in enumerate(o.outputs)]
        groups.append(RolloutGroup(str(gi), str(gi), ros))
    assign_advantages(groups, "grpo")
    return [r for g in groups for r in g.rollouts]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("temperature,top_p,top_k", [(0.8, 0.7, -1), (1.0, 0.9, 6)])
def test_trainer_logprobs_equal_engine_under_truncation(tiny_ckpts, arch, temperature, top_p, top_k):
    path = tiny_ckpts[arch]
    llm = engine.LLM(str(path), block_size=4, kv_cache_gb=0.05)
    sp = SamplingParams(n=4, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=10, seed=5,
                        ignore_eos=True)
    batch = TrainBatch.from_rollouts(_rollouts(llm, sp), 256)
    tr = Trainer(path, TrainConfig(lr=1e-4), temperature=temperature, top_p=top_p, top_k=top_k)
    gap = ((tr.compute_logprobs(batch) - batch.old_logprobs).abs() * batch.loss_mask).max().item()
    assert gap < 1e-4
    m = tr.train_step(batch, LOSSES["grpo"], LossConfig())
    assert m["logprob_diff_max"] < 1e-4 and abs(m["ratio_mean"] - 1.0) < 1e-4
    # The same rollouts scored without the truncation (the old behaviour) are far off: the test can fail.
    untrunc = Trainer(path, TrainConfig(lr=1e-4), temperature=temperature)
    assert ((untrunc.compute_logprobs(batch) - batch.old_logprobs).abs() * batch.loss_mask).max().item() > 1e-2


def test_truncated_logprobs_keep_the_target_and_stay_finite_with_gradients():
    torch.manual_seed(0)
    logits = (torch.randn(6, 30) * 4).requires_grad_()
    targets = torch.tensor([0, 1, 2, 3, 4, 5])
    keep = truncation_keep(logits.detach(), 0.5, 3)
    assert keep.sum(-1).min() >= 1 and keep.sum(-1).max() <= 3
    lp, _ = token_logprobs(logits, targets, 1.0, top_p=0.5, top_k=3)
    assert torch.isfinite(lp).all()  # a target outside the set keeps a finite log-prob (NOTE on truncation)
    inside = keep[torch.arange(6), targets]
    ref = torch.log_softmax(logits.detach().masked_fill(~keep, float("-inf")), -1)[torch.arange(6), targets]
    assert torch.allclose(lp.detach()[inside], ref[inside], atol=1e-6)
    lp.sum().backward()
    assert torch.isfinite(logits.grad).all()
    # Chunked (checkpointed) computation gives the same numbers.
    lp2, _ = token_logprobs(logits, targets, 1.0, chunk=2, top_p=0.5, top_k=3)
    assert torch.allclose(lp, lp2)


def test_bad_truncation_arguments_fail_clearly(tiny_llama):
    with pytest.raises(TrainerError, match="top_p"):
        Trainer(tiny_llama, TrainConfig(), top_p=0.0)
    with pytest.raises(TrainerError, match="top_k"):
        Trainer(tiny_llama, TrainConfig(), top_k=-3)
