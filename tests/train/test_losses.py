"""Every loss against a naive reference written from its paper's formula with Python loops over sequences and
tokens (scalar torch ops, so autograd gives the reference gradient). Values AND gradients are compared."""

from __future__ import annotations

import pytest
import torch

from rollwise.train.losses import LOSSES, LossConfig, kl_per_token, normalizers

B, T = 5, 9


def _clip(r, lo, hi):
    return torch.clamp(r, lo, hi)


def naive_loss(name, lp, old, adv, mask, cfg, ref=None, prox=None):
    """Loops straight from the formulas. lp: [B, T] leaf; everything else plain data."""
    el = cfg.clip_eps_low
    eh = cfg.clip_eps_high if cfg.clip_eps_high is not None else (0.28 if name == "dapo" else el)
    use_prox = prox is not None or cfg.decoupled or cfg.tis_cap is not None
    seqs = [i for i in range(B) if sum(mask[i]) > 0]
    n_seq = len(seqs)
    n_tok = sum(sum(row) for row in mask)

    def anchor(i, t):
        if not use_prox:
            return old[i][t]
        return prox[i][t] if prox is not None else lp[i, t].detach()

    def kl(i, t):
        if cfg.kl_estimator == "k1":
            return lp[i, t] - ref[i][t]
        x = torch.exp(ref[i][t] - lp[i, t])  # pi_ref / pi
        return x - torch.log(x) - 1

    if name == "gspo":
        total = 0.0
        for i in seqs:
            toks = [t for t in range(T) if mask[i][t]]
            log_s = sum(lp[i, t] - anchor(i, t) for t in toks) / len(toks)
            s = torch.exp(log_s)
            a = adv[i]
            term = torch.maximum(-a * s, -a * _clip(s, 1 - el, 1 + eh))
            if use_prox:
                w = torch.exp(torch.tensor(sum(float(anchor(i, t)) - old[i][t] for t in toks) / len(toks), dtype=torch.float64))
                if cfg.tis_cap is not None:
                    w = torch.clamp(w, max=cfg.tis_cap)
                term = term * w
            if ref is not None and cfg.kl_coef:
                term = term + cfg.kl_coef * sum(kl(i, t) for t in toks) / len(toks)
            total = total + term
        return total / n_seq

    per_seq_terms = {}
    for i in seqs:
        terms = []
        for t in range(T):
            if not mask[i][t]:
                continue
            r = torch.exp(lp[i, t] - anchor(i, t))
            a = adv[i]
            term = torch.maximum(-a * r, -a * _clip(r, 1 - el, 1 + eh))
            if use_prox:
                w = torch.exp(torch.tensor(float(anchor(i, t)) - old[i][t], dtype=torch.float64))
                if cfg.tis_cap is not None:
                    w = torch.clamp(w, max=cfg.tis_cap)
                term = term * w
            if ref is not None and cfg.kl_coef:
                term = term + cfg.kl_coef * kl(i, t)
            terms.append(term)
        per_seq_terms[i] = terms

    if name in ("ppo", "dapo"):  # token-level mean over the batch
        return sum(sum(ts) for ts in per_seq_terms.values()) / n_tok
    if name == "grpo":  # (1/G) sum_i (1/|o_i|) sum_t
        return sum(sum(ts) / len(ts) for ts in per_seq_terms.values()) / n_seq
    if name == "dr_grpo":  # (1/G) sum_i sum_t / MAX_LEN
        return sum(sum(ts) / cfg.max_length for ts in per_seq_terms.values()) / n_seq
    raise KeyError(name)


def _inputs(seed, noise=0.35):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3  # behaviour log-probs
    lp = old + noise * torch.randn(B, T, generator=g, dtype=torch.float64)
    prox = old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.zeros(B, T, dtype=torch.float64)
    lens = [T, 4, 7, 1, 6]
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    mask[2, 3] = 0  # an environment token in the middle of a multi-turn sequence
    mask[4] = 0  # a sequence with no policy token at all
    # padding holds garbage that must not leak
    lp = torch.where(mask > 0, lp, torch.full_like(lp, -1e4))
    return lp, old, adv, mask, ref, prox


CASES = [
    ("plain", LossConfig(clip_eps_low=0.2, max_length=12), False, False),
    ("asym", LossConfig(clip_eps_low=0.1, clip_eps_high=0.3, max_length=12), False, False),
    ("kl_k1", LossConfig(kl_coef=0.1, kl_estimator="k1", max_length=12), True, False),
    ("kl_k3", LossConfig(kl_coef=0.1, kl_estimator="k3", max_length=12), True, False),
    ("tis", LossConfig(tis_cap=1.1, max_length=12), False, True),
    ("tis_no_prox", LossConfig(tis_cap=1.1, max_length=12), False, False),
    ("decoupled", LossConfig(decoupled=True, max_length=12), False, True),
    ("decoupled_tis_kl", LossConfig(decoupled=True, tis_cap=1.2, kl_coef=0.05, max_length=12), True, True),
]


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_loss_matches_naive(name, case):
    _, cfg, with_ref, with_prox = case
    if name == "gspo":  # GSPO's paper eps are tiny; use them
        cfg = LossConfig(**{**cfg.__dict__, "clip_eps_low": 3e-2, "clip_eps_high": 4e-2})
    for seed in (0, 1):
        lp0, old, adv, mask, ref, prox = _inputs(seed, noise=0.1 if name == "gspo" else 0.35)
        lp = lp0.clone().requires_grad_(True)
        loss, metrics = LOSSES[name](lp, old, adv, mask, cfg=cfg, ref_logprobs=ref if with_ref else None,
                                    prox_logprobs=prox if with_prox else None)
        loss.backward()

        lp_n = lp0.clone().requires_grad_(True)
        want = naive_loss(name, lp_n, old.tolist(), adv.tolist(), mask.tolist(), cfg,
                          ref=ref.tolist() if with_ref else None, prox=prox.tolist() if with_prox else None)
        want.backward()
        torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(lp.grad, lp_n.grad, rtol=1e-9, atol=1e-12)
        assert torch.all(lp.grad[mask == 0] == 0)
        assert metrics["loss"] == pytest.approx(want.item())
        if with_ref:
            assert "kl" in metrics


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_random_inputs_exercise_clipping(name):
    """Guard against a vacuous comparison: the random inputs above do hit the clipped branch."""
    cfg = LossConfig(clip_eps_low=0.2, max_length=12) if name != "gspo" else LossConfig(clip_eps_low=3e-2, clip_eps_high=4e-2)
    hit = False
    for seed in (0, 1):
        lp, old, adv, mask, _, _ = _inputs(seed, noise=0.1 if name == "gspo" else 0.35)
        _, m = LOSSES[name](lp, old, adv, mask, cfg=cfg)
        hit |= 0 < m["clip_frac"] < 1
    assert hit


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_micro_batches_sum_to_full_batch(name):
    """With whole-batch normalisers, summing micro-batch losses gives the full-batch loss and gradient."""
    cfg = LossConfig(clip_eps_low=0.2, kl_coef=0.1, max_length=12)
    lp0, old, adv, mask, ref, _ = _inputs(3)
    lp = lp0.clone().requires_grad_(True)
    full, _ = LOSSES[name](lp, old, adv, mask, cfg=cfg, ref_logprobs=ref)
    full.backward()
    n_seq, n_tok = normalizers(mask)
    lp2 = lp0.clone().requires_grad_(True)
    total = 0.0
    for idx in ([0, 3], [1], [2, 4]):
        part, _ = LOSSES[name](lp2[idx], old[idx], adv[idx], mask[idx], cfg=cfg, ref_logprobs=ref[idx],
                               num_sequences=n_seq, num_tokens=n_tok)
        total = total + part
    total.backward()
    torch.testing.assert_close(total, full, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lp2.grad, lp.grad, rtol=1e-9, atol=1e-12)


def test_hand_numbers_clip():
    # ratio 1.5 with positive advantage is clipped at 1.2: loss -1.2 and no gradient
    lp = torch.tensor([[0.0]], dtype=torch.float64).add(torch.log(torch.tensor(1.5, dtype=torch.float64))).requires_grad_(True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    loss, m = LOSSES["grpo"](lp, old, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1), cfg=LossConfig())
    assert float(loss) == pytest.approx(-1.2)
    loss.backward()
    assert float(lp.grad) == 0.0 and m["clip_frac"] == 1.0
    # the same ratio with a negative advantage is not clipped (pessimistic bound): loss 1.5, gradient 1.5
    lp.grad = None
    loss, m = LOSSES["grpo"](lp, old, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 1), cfg=LossConfig())
    loss.backward()
    assert float(loss) == pytest.approx(1.5) and float(lp.grad) == pytest.approx(1.5) and m["clip_frac"] == 0.0
    # DAPO's clip-higher default lets the same ratio up to 1.28
    loss, _ = LOSSES["dapo"](lp, old, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1), cfg=LossConfig())
    assert float(loss) == pytest.approx(-1.28)


def test_kl_estimators_hand_numbers():
    lp = torch.tensor([[-1.0]])
    ref = torch.tensor([[-2.0]])
    assert float(kl_per_token(lp, ref, "k1")) == pytest.approx(1.0)
    # k3 = e^{-1} - (-1) - 1
    assert float(kl_per_token(lp, ref, "k3")) == pytest.approx(float(torch.exp(torch.tensor(-1.0))))
    assert float(kl_per_token(ref, ref, "k3")) == 0.0


def test_entropy_metric_and_errors():
    lp, old, adv, mask, _, _ = _inputs(0)
    ent = torch.full((B, T), 2.0, dtype=torch.float64)
    _, m = LOSSES["ppo"](lp, old, adv, mask, cfg=LossConfig(), entropy=ent)
    assert m["entropy"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="max_length"):
        LOSSES["dr_grpo"](lp, old, adv, mask, cfg=LossConfig())
    with pytest.raises(ValueError, match="ref_logprobs"):
        LOSSES["grpo"](lp, old, adv, mask, cfg=LossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="old_logprobs shape"):
        LOSSES["grpo"](lp, old[:, :3], adv, mask, cfg=LossConfig())
    with pytest.raises(ValueError, match="one advantage per sequence"):
        LOSSES["gspo"](lp, old, adv[:, None].expand(B, T), mask, cfg=LossConfig())
    with pytest.raises(ValueError, match="kl_estimator"):
        LossConfig(kl_estimator="k2")


def test_per_token_advantages_accepted():
    lp, old, adv, mask, _, _ = _inputs(0)
    a, _ = LOSSES["grpo"](lp, old, adv, mask, cfg=LossConfig())
    b, _ = LOSSES["grpo"](lp, old, adv[:, None].expand(B, T), mask, cfg=LossConfig())
    torch.testing.assert_close(a, b)
