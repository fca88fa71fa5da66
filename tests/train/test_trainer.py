"""Trainer on tiny random Llamas: packed log-probs equal per-sequence ones, one update equals a naive unpacked
update, temperature, KL reference, LoRA merge, gradient checkpointing, schedules and errors."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from rollwise.config import LoraConfig, TrainConfig
from rollwise.train.batch import TrainBatch
from rollwise.train.losses import LOSSES, LossConfig
from rollwise.train.logprobs import token_logprobs
from rollwise.train.trainer import Trainer, TrainerError, lr_lambda

from .synthetic import make_rollouts

from .conftest import build_tiny_llama


def per_sequence_logprobs(model, rollouts, temperature=1.0):
    """The unpacked reference: one forward per sequence, no masks, default positions."""
    rows = []
    for r in rollouts:
        ids = torch.tensor([r.prompt_token_ids + r.completion_token_ids])
        logits = model(input_ids=ids).logits[0].float() / temperature
        ls = torch.log_softmax(logits, -1)
        p = len(r.prompt_token_ids)
        rows.append(torch.stack([ls[p + k - 1, t] for k, t in enumerate(r.completion_token_ids)]))
    t_max = max(len(x) for x in rows)
    return torch.stack([torch.nn.functional.pad(x, (0, t_max - len(x))) for x in rows])


@pytest.mark.parametrize("cap, temperature", [(8, 1.0), (24, 0.7), (1000, 1.0)])
def test_packed_logprobs_equal_unpacked(tiny_llama, cap, temperature):
    tr = Trainer(tiny_llama, temperature=temperature)
    ros = make_rollouts(8)
    batch = TrainBatch.from_rollouts(ros, cap)
    if cap == 24:
        assert any(len(mb.seq_ids) > 1 for mb in batch.micro_batches)  # really packed
    got = tr.compute_logprobs(batch)
    with torch.no_grad():
        want = per_sequence_logprobs(tr.model, ros, temperature)
    for i, r in enumerate(ros):
        n = len(r.completion_token_ids)
        torch.testing.assert_close(got[i, :n], want[i, :n], atol=1e-5, rtol=0)
        assert torch.all(got[i, n:] == 0)


def test_packed_logprobs_eager_attention_and_tied_weights(tmp_path):
    path = build_tiny_llama(tmp_path / "m", seed=3, tie=True)
    tr = Trainer(path, attn_implementation="eager")
    from rollwise.train.attention import base_implementation

    assert base_implementation(tr.model) == "eager" and tr.model.config._attn_implementation == "rollwise_eager"
    ros = make_rollouts(6, seed=2)
    got = tr.compute_logprobs(TrainBatch.from_rollouts(ros, 30))
    with torch.no_grad():
        want = per_sequence_logprobs(tr.model, ros)
    torch.testing.assert_close(got * (want != 0), want, atol=1e-5, rtol=0)


def test_block_diagonal_mask_is_needed(tiny_llama):
    """Sanity check that the comparison above can fail: a plain causal mask over the packed row changes the
    log-probs of every sequence but the first (attention crosses sequence boundaries)."""
    tr = Trainer(tiny_llama)
    ros = make_rollouts(4, seed=5)
    batch = TrainBatch.from_rollouts(ros, 1000, share_prompt=False)
    mb = batch.micro_batches[0]
    assert len(mb.seq_ids) == 4
    mask = mb.attention_mask()[0, 0]
    first, second = mb.seq_ids[0], mb.seq_ids[1]
    n0 = len(ros[first].prompt_token_ids) + len(ros[first].completion_token_ids)
    assert not mask[n0, : n0].any() and mask[n0, n0] and mask[n0 - 1, : n0].all()
    good = tr.compute_logprobs(batch)
    mb.attention_mask = lambda: torch.ones(mb.num_tokens, mb.num_tokens, dtype=torch.bool).tril()[None, None]
    bad = tr.compute_logprobs(batch)
    torch.testing.assert_close(good[first], bad[first])
    assert (good[second] - bad[second]).abs().max() > 1e-3


def _sgd(tr):
    """Swap in plain SGD with lr 1 so that a step's parameter change IS the (clipped) gradient."""
    tr.optimizer = torch.optim.SGD([p for p in tr.model.parameters() if p.requires_grad], lr=1.0)
    tr.scheduler = torch.optim.lr_scheduler.LambdaLR(tr.optimizer, lambda s: 1.0)
    return tr


@pytest.mark.parametrize("loss_name", ["grpo", "dapo"])  # per-sequence and per-token normalisers
def test_one_update_equals_naive_unpacked_gradient(tiny_llama, loss_name):
    lcfg = LossConfig(max_length=12)
    ros = make_rollouts(8, seed=1)
    tr = _sgd(Trainer(tiny_llama, TrainConfig(grad_clip=0.5), temperature=0.8))
    tr.logprob_chunk = 5  # exercise the chunked, recomputed log-prob path through the model
    naive = copy.deepcopy(tr.model)
    before = [p.detach().clone() for p in tr.model.parameters()]
    m = tr.train_step(TrainBatch.from_rollouts(ros, 20), LOSSES[loss_name], lcfg)
    assert m["micro_batches"] > 1

    lp = per_sequence_logprobs(naive, ros, 0.8)
    full = TrainBatch.from_rollouts(ros, 10_000)
    loss, _ = LOSSES[loss_name](lp, full.old_logprobs, full.advantages, full.loss_mask, cfg=lcfg)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(naive.parameters(), 0.5)
    assert m["grad_norm"] == pytest.approx(gn.item(), rel=1e-4)
    assert m["loss"] == pytest.approx(loss.item(), rel=1e-4, abs=1e-6)
    for (name, a), b0, b in zip(tr.model.named_parameters(), before, naive.parameters()):
        torch.testing.assert_close(b0 - a, b.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_packing_does_not_change_the_update(tiny_llama):
    ros = make_rollouts(8, seed=4)
    params = []
    for cap in (12, 10_000):
        tr = Trainer(tiny_llama, TrainConfig(lr=1e-3))
        tr.train_step(TrainBatch.from_rollouts(ros, cap), LOSSES["grpo"], LossConfig())
        params.append(torch.cat([p.detach().flatten() for p in tr.model.parameters()]))
    # AdamW's first step is about lr * sign(grad): allow a sign flip on near-zero gradient entries
    diff = (params[0] - params[1]).abs()
    assert (diff > 1e-6).float().mean() < 1e-3 and diff.max() <= 2.1e-3


def test_logprob_mismatch_metric_and_learning_signal(tiny_llama):
    tr = Trainer(tiny_llama, TrainConfig(lr=3e-3), temperature=0.9)
    ros = make_rollouts(6, seed=6, env_tokens=False)
    batch = TrainBatch.from_rollouts(ros, 64)
    own = tr.compute_logprobs(batch)
    for i, r in enumerate(ros):  # an engine in perfect sync reports the trainer's own log-probs
        r.logprobs = own[i, : len(r.completion_token_ids)].tolist()
        r.advantage = 1.0 if i == 0 else -0.2
    batch = TrainBatch.from_rollouts(ros, 64)
    m = tr.train_step(batch, LOSSES["grpo"], LossConfig())
    assert m["logprob_diff_max"] < 1e-5
    for key in ("loss", "pg_loss", "entropy", "clip_frac", "ratio_mean", "grad_norm", "lr", "train_tokens", "train_s"):
        assert key in m, key
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and m["clip_frac"] == 0.0
    assert m["entropy"] > 0
    before = own[0, : len(ros[0].completion_token_ids)].sum()
    for _ in range(3):
        tr.train_step(batch, LOSSES["grpo"], LossConfig())
    after = tr.compute_logprobs(batch)[0, : len(ros[0].completion_token_ids)].sum()
    assert after > before  # positive advantage raises the sequence's log-likelihood
    # a temperature mismatch shows up in the metric
    tr2 = Trainer(tiny_llama, temperature=1.0)
    assert tr2.train_step(batch, LOSSES["grpo"], LossConfig())["logprob_diff_mean"] > 1e-3


def test_kl_reference(tiny_llama):
    tr = Trainer(tiny_llama, TrainConfig(lr=3e-3), reference=True)
    ros = make_rollouts(6, seed=7)
    batch = TrainBatch.from_rollouts(ros, 64)
    ref0 = tr.compute_logprobs(batch, reference=True)
    m1 = tr.train_step(batch, LOSSES["grpo"], LossConfig(kl_coef=0.1, kl_estimator="k3"))
    assert m1["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first update
    m2 = tr.train_step(batch, LOSSES["grpo"], LossConfig(kl_coef=0.1, kl_estimator="k3"))
    assert m2["kl"] > 0
    torch.testing.assert_close(tr.compute_logprobs(batch, reference=True), ref0)  # the reference stays frozen
    with pytest.raises(TrainerError, match="reference=True"):
        Trainer(tiny_llama).train_step(batch, LOSSES["grpo"], LossConfig(kl_coef=0.1))


def test_multiple_updates_decoupled_and_nan_guard(tiny_llama):
    tr = Trainer(tiny_llama, TrainConfig(lr=1e-3, updates_per_step=2))
    ros = make_rollouts(8, seed=8)
    m = tr.train_step(TrainBatch.from_rollouts(ros, 30), LOSSES["ppo"], LossConfig(decoupled=True, tis_cap=2.0),
                      generator=torch.Generator().manual_seed(0))
    assert tr.step == 2 and tr.rl_step == 1
    assert "behav_weight_mean" in m
    for r in ros:
        r.advantage = float("nan")
    before = [p.detach().clone() for p in tr.model.parameters()]
    m = tr.train_step(TrainBatch.from_rollouts(ros, 30), LOSSES["grpo"], LossConfig())
    assert m["skipped_steps"] == 2
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))


def test_gradient_checkpointing_same_update(tiny_llama):
    ros = make_rollouts(6, seed=9)
    out = []
    for gc in (False, True):
        tr = Trainer(tiny_llama, TrainConfig(lr=1e-3, gradient_checkpointing=gc))
        tr.train_step(TrainBatch.from_rollouts(ros, 20), LOSSES["grpo"], LossConfig())
        out.append(torch.cat([p.detach().flatten() for p in tr.model.parameters()]))
    torch.testing.assert_close(out[0], out[1], atol=1e-6, rtol=0)


def test_lora_sync_weights_are_merged(tiny_llama_tied):
    pytest.importorskip("peft")
    cfg = TrainConfig(lr=1e-2, lora=LoraConfig(enabled=True, r=4, alpha=8))
    tr = Trainer(tiny_llama_tied, cfg, reference=True)
    base_names = set(Trainer(tiny_llama_tied).state_dict_for_sync())
    ros = make_rollouts(6, seed=10)
    batch = TrainBatch.from_rollouts(ros, 40)
    tr.train_step(batch, LOSSES["grpo"], LossConfig(kl_coef=0.05))
    tr.train_step(batch, LOSSES["grpo"], LossConfig(kl_coef=0.05))
    sd = tr.state_dict_for_sync()
    assert set(sd) == base_names
    merged = copy.deepcopy(tr.model).merge_and_unload().state_dict()
    for k, v in sd.items():
        torch.testing.assert_close(v, merged[k], atol=1e-6, rtol=0, msg=k)
    # the adapter really moved the weights, and the live base weights are untouched by the sync
    base = Trainer(tiny_llama_tied).state_dict_for_sync()
    assert (sd["model.layers.0.self_attn.q_proj.weight"] - base["model.layers.0.self_attn.q_proj.weight"]).abs().max() > 0
    live = dict(tr.model.named_parameters())["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"]
    torch.testing.assert_close(live, base["model.layers.0.self_attn.q_proj.weight"])
    # the reference is the adapter-free base
    torch.testing.assert_close(tr.compute_logprobs(batch, reference=True), Trainer(tiny_llama_tied).compute_logprobs(batch))


def test_lora_errors(tiny_llama, monkeypatch):
    with pytest.raises(TrainerError, match="no module named 'qkv'"):
        pytest.importorskip("peft")
        Trainer(tiny_llama, TrainConfig(lora=LoraConfig(enabled=True, target_modules=["qkv"])))
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(TrainerError, match=r"needs peft: pip install"):
        Trainer(tiny_llama, TrainConfig(lora=LoraConfig(enabled=True)))


def test_bad_inputs(tmp_path, tiny_llama):
    with pytest.raises(TrainerError, match="no config.json"):
        Trainer(tmp_path / "nothing")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(TrainerError, match="cannot load model from"):
        Trainer(tmp_path / "broken")
    with pytest.raises(TrainerError, match="temperature must be > 0"):
        Trainer(tiny_llama, temperature=0.0)


def test_lr_schedules():
    kw = dict(warmup_steps=2, total_steps=12, min_lr_ratio=0.1)
    assert [lr_lambda(s, schedule="constant", **kw) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_lambda(7, schedule="linear", **kw) == pytest.approx(1 - 0.9 * 0.5)
    assert lr_lambda(12, schedule="linear", **kw) == pytest.approx(0.1)
    assert lr_lambda(7, schedule="cosine", **kw) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_lambda(99, schedule="cosine", **kw) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="unknown LR schedule"):
        lr_lambda(5, schedule="step", **kw)


def test_scheduler_follows_config(tiny_llama):
    tr = Trainer(tiny_llama, TrainConfig(lr=1e-3, schedule="linear", warmup_steps=1, steps=3, min_lr_ratio=0.0))
    batch = TrainBatch.from_rollouts(make_rollouts(4), 64)
    lrs = [tr.train_step(batch, LOSSES["grpo"], LossConfig())["lr"] for _ in range(3)]
    assert lrs == pytest.approx([1e-3, 1e-3, 5e-4])  # the LR each update used
    assert tr.optimizer.param_groups[0]["lr"] == pytest.approx(0.0)  # the schedule reached its end


def test_chunked_token_logprobs_are_exact():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(37, 50, generator=g, dtype=torch.float32).requires_grad_(True)
    targets = torch.randint(0, 50, (37,), generator=g)
    w = torch.randn(37, generator=g)
    out = []
    for chunk in (8, 10_000):
        lp, ent = token_logprobs(logits, targets, 0.7, need_entropy=True, chunk=chunk)
        (lp * w).sum().backward()
        out.append((lp.detach(), ent, logits.grad.clone()))
        logits.grad = None
    for a, b in zip(out[0], out[1]):
        assert torch.equal(a, b)
    ref = torch.log_softmax(logits.detach() / 0.7, -1).gather(-1, targets[:, None])[:, 0]
    torch.testing.assert_close(out[0][0], ref)
    p = torch.softmax(logits.detach() / 0.7, -1)
    torch.testing.assert_close(out[0][1], -(p * p.log()).sum(-1))
