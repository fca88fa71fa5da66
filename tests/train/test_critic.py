"""The critic of `algo.advantage: gae` on tiny random Llamas: its values line up with a per-sequence forward, it
learns values a prompt predicts, the actor-critic step trains both models (the policy waiting during the critic's
warm-up), and a checkpoint brings back the critic's weights and optimiser exactly."""

from __future__ import annotations

import random

import pytest
import torch

from rollwise.cluster.trainer_handle import LocalTrainer
from rollwise.config import CriticConfig, GaeConfig, TrainConfig
from rollwise.train.batch import TrainBatch
from rollwise.train.checkpoint import CheckpointError, load_checkpoint, restore_checkpoint, save_checkpoint
from rollwise.train.critic import CRITIC_DIR, Critic, CriticSpec, actor_critic_step, episodes_of
from rollwise.train.gae import episode_gae, explained_variance
from rollwise.train.losses import LOSSES, LossConfig
from rollwise.train.precision import train_precision
from rollwise.train.trainer import Trainer
from rollwise.types import Rollout, RolloutSegment

from .synthetic import SPEC, _groups, make_rollouts


def _critic(path, *, lr=1e-3, clip=0.5, updates=1, warmup=0, gamma=1.0, lam=1.0, whiten=True, seed=0):
    spec = CriticSpec(str(path), CriticConfig(lr=lr, cliprange_value=clip, updates_per_step=updates,
                                              warmup_steps=warmup), GaeConfig(gamma=gamma, lam=lam, whiten=whiten))
    return Critic(spec, device=torch.device("cpu"), precision=train_precision(False, torch.device("cpu")), seed=seed)


def per_sequence_values(critic, rollouts):
    """One plain HF token-classification forward per sequence: V at the positions predicting each completion
    token."""
    rows = []
    for r in rollouts:
        ids = torch.tensor([r.prompt_token_ids + r.completion_token_ids])
        out = critic.model(input_ids=ids).logits[0, :, 0]
        p, c = len(r.prompt_token_ids), len(r.completion_token_ids)
        rows.append(out[p - 1:p - 1 + c])
    t = max(len(x) for x in rows)
    return torch.stack([torch.nn.functional.pad(x, (0, t - len(x))) for x in rows])


@pytest.mark.parametrize("cap, shared", [(8, False), (24, True), (1000, True)])
def test_values_equal_a_per_sequence_forward(tiny_llama, cap, shared):
    critic = _critic(tiny_llama)
    with torch.no_grad():  # a new head starts at 0: give it weights so the check means something
        critic.head.weight.normal_(0, 0.5)
        critic.head.bias.fill_(0.1)
    ros = _groups(SPEC) + make_rollouts(6, seed=4)
    ros = [r for r in ros if r.completion_token_ids]
    got = critic.values(TrainBatch.from_rollouts(ros, cap, share_prompt=shared))
    with torch.no_grad():
        want = per_sequence_values(critic, ros)
    for i, r in enumerate(ros):
        n = len(r.completion_token_ids)
        torch.testing.assert_close(got[i, :n], want[i, :n], atol=1e-5, rtol=0)
        assert torch.all(got[i, n:] == 0)


def test_a_new_value_head_starts_at_zero_and_leaves_the_rng_alone(tiny_llama):
    torch.manual_seed(5)
    before = torch.get_rng_state()
    critic = _critic(tiny_llama)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.all(critic.values(TrainBatch.from_rollouts(make_rollouts(4), 64)) == 0)


def _parity_rollouts(n, rng, step=0):
    """Prompts [3, k] with k in 10..41; reward 1 when k is even: a value the prompt predicts, whatever follows."""
    out = []
    for i in range(n):
        k = rng.randrange(10, 42)
        c = rng.randint(2, 6)
        out.append(Rollout(prompt_id=str(k), group_id=f"s{step}-{i}", sample_index=0, prompt_token_ids=[3, k],
                           completion_token_ids=[rng.randrange(4, 64) for _ in range(c)], logprobs=[-1.0] * c,
                           weight_versions=[0] * c, loss_mask=[1] * c, advantage=float(k % 2 == 0)))
    return out


def _gae_of(critic, ros, batch):
    values = critic.values(batch)
    episodes, outcomes = episodes_of(ros)
    adv, ret = episode_gae(values, batch.loss_mask, outcomes, episodes, batch.completion_lens.tolist(),
                           gamma=1.0, lam=1.0)
    return values, ret


def test_the_critic_learns_values_the_prompt_predicts(tiny_llama):
    """Fixed-policy rollouts whose reward is the prompt token's parity: the explained variance of held-out returns
    by the critic's values climbs from 0 (a new head) to above 0.5."""
    rng = random.Random(0)
    critic = _critic(tiny_llama, lr=3e-3, clip=None)
    held = _parity_rollouts(64, random.Random(99))
    held_batch = TrainBatch.from_rollouts(held, 256)
    v, ret = _gae_of(critic, held, held_batch)
    ev_before = explained_variance(v, ret, held_batch.loss_mask)
    curve = []
    for step in range(60):
        ros = _parity_rollouts(32, rng, step)
        batch = TrainBatch.from_rollouts(ros, 256)
        values, ret = _gae_of(critic, ros, batch)
        critic.train_step(batch, ret, values)
        if step % 10 == 9:
            v, r = _gae_of(critic, held, held_batch)
            curve.append(explained_variance(v, r, held_batch.loss_mask))
    assert ev_before == pytest.approx(0.0, abs=1e-6)
    assert curve[-1] > 0.5, curve


def _params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _handle(path, critic, lr=1e-3):
    tr = Trainer(path, TrainConfig(lr=lr, steps=6, seed=0))
    return LocalTrainer(tr, 64, "ppo", LossConfig(), critic)


def _step_rollouts(step):
    rng = random.Random(step)
    ros = make_rollouts(8, seed=step)
    for r in ros:
        r.advantage = float(rng.random() < 0.5)  # gae's scalar: the episode's return
        r.weight_versions = [step] * len(r.completion_token_ids)
    return ros


def test_the_actor_critic_step_trains_both_and_the_policy_waits_for_the_warmup(tiny_llama):
    critic = _critic(tiny_llama, warmup=2)
    h = _handle(tiny_llama, critic)
    p0, c0 = _params(h.trainer.model), _params(critic.model)
    m1 = h.train_step(_step_rollouts(0))
    assert m1["critic/warmup"] == 1.0 and "loss" not in m1 and "train_s" in m1
    assert torch.equal(_params(h.trainer.model), p0) and not torch.equal(_params(critic.model), c0)
    h.train_step(_step_rollouts(1))
    m3 = h.train_step(_step_rollouts(2))
    assert m3["critic/warmup"] == 0.0 and "loss" in m3 and "logprob_diff_mean" in m3
    assert not torch.equal(_params(h.trainer.model), p0)
    for k in ("critic/value_loss", "critic/value_clip_frac", "critic/explained_var", "critic/value_mean",
              "critic/return_mean", "critic/grad_norm", "critic/lr", "critic/train_s"):
        assert k in m3, k
    assert h.version == 3 and critic.rl_step == 3 and h.trainer.rl_step == 1


def test_an_agent_episode_of_several_sequences_trains_as_one(tiny_llama):
    critic = _critic(tiny_llama)
    h = _handle(tiny_llama, critic)
    r = make_rollouts(1, seed=3)[0]
    r.advantage = 1.0
    r.segments = [RolloutSegment(prompt_token_ids=[5, 6, 7], completion_token_ids=[8, 9, 10], logprobs=[-1.0] * 3,
                                 weight_versions=[0] * 3, loss_mask=[1, 0, 1], reason="rewrote its history")]
    assert episodes_of([r, r]) == ([[0, 1], [2, 3]], [1.0, 1.0])
    m = h.train_step([r, make_rollouts(2, seed=8)[1]])
    assert "loss" in m and m["critic/return_mean"] > 0


def test_resume_restores_the_critic_exactly(tiny_llama, tmp_path):
    full = _handle(tiny_llama, _critic(tiny_llama, updates=2, warmup=1))
    for s in range(4):
        full.train_step(_step_rollouts(s))

    first = _handle(tiny_llama, _critic(tiny_llama, updates=2, warmup=1))
    for s in range(2):
        first.train_step(_step_rollouts(s))
    path = first.save(tmp_path, 2, {}, keep=None)
    assert (path / CRITIC_DIR / "model.safetensors").is_file() and (path / CRITIC_DIR / "config.json").is_file()
    from transformers import AutoModelForTokenClassification

    AutoModelForTokenClassification.from_pretrained(str(path / CRITIC_DIR))  # an HF directory users can load
    del first

    resumed = _handle(tiny_llama, _critic(tiny_llama, updates=2, warmup=1))
    resumed.restore(path)
    assert resumed.critic is not None and resumed.critic.rl_step == 2 and resumed.critic.step == 4
    for s in range(2, 4):
        resumed.train_step(_step_rollouts(s))
    assert full.critic is not None
    torch.testing.assert_close(_params(resumed.critic.model), _params(full.critic.model), atol=1e-6, rtol=0)
    torch.testing.assert_close(_params(resumed.trainer.model), _params(full.trainer.model), atol=1e-6, rtol=0)
    a = full.critic.optimizer.state_dict()["state"]
    b = resumed.critic.optimizer.state_dict()["state"]
    assert a.keys() == b.keys() and all(torch.allclose(a[k]["exp_avg"], b[k]["exp_avg"], atol=1e-7) for k in a)


def test_a_checkpoint_without_a_critic_is_refused_in_one_line(tiny_llama, tmp_path):
    tr = Trainer(tiny_llama, TrainConfig(lr=1e-3))
    tr.train_step(TrainBatch.from_rollouts(make_rollouts(4), 64), LOSSES["ppo"], LossConfig())
    save_checkpoint(tr, tmp_path, 1)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt is not None
    with pytest.raises(CheckpointError, match="holds no critic") as e:
        restore_checkpoint(Trainer(tiny_llama, TrainConfig(lr=1e-3)), ckpt, critic=_critic(tiny_llama))
    assert "\n" not in str(e.value)


def test_a_critic_with_another_vocabulary_is_refused(tiny_llama, tmp_path):
    from .conftest import build_tiny_llama

    small = build_tiny_llama(tmp_path / "small", vocab=16)
    critic = _critic(small)
    with pytest.raises(Exception, match="share the policy's tokenizer"):
        critic.values(TrainBatch.from_rollouts(make_rollouts(3), 64))


def test_the_step_sets_per_token_advantages_the_trainer_sees(tiny_llama):
    """The policy trains on GAE's per-token advantages (whitened over the batch's policy tokens)."""
    critic = _critic(tiny_llama)
    tr = Trainer(tiny_llama, TrainConfig(lr=1e-3))
    ros = _step_rollouts(0)
    batch = TrainBatch.from_rollouts(ros, 64)
    actor_critic_step(tr, critic, batch, ros, LOSSES["ppo"], LossConfig())
    assert batch.advantages.shape == batch.loss_mask.shape
    on = batch.loss_mask > 0
    assert abs(float(batch.advantages[on].mean())) < 1e-5 and float(batch.advantages[on].std()) == pytest.approx(1, abs=1e-3)
    assert torch.all(batch.advantages[~on] == 0)
