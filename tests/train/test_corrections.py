"""Rollout-policy corrections against a naive reference written from their formulas (TRL's
vllm_importance_sampling_mode, verl's rollout-correction docs, IcePop's masking function), with Python loops over
sequences and tokens: each loss with each correction, values and gradients, on random inputs with padding,
environment tokens inside a sequence and a sequence without a loss token."""

from __future__ import annotations

import math

import pytest
import torch

from rollwise.config import load_config
from rollwise.train.corrections import ICEPOP_BOUNDS, SequenceRule, TokenRule, build_correction
from rollwise.train.losses import LOSSES, LossConfig, normalizers

B, T = 6, 9


def _inputs(seed: int, noise: float = 0.35, gap: float = 0.2):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3  # engine (behaviour) log-probs
    prox = old + gap * torch.randn(B, T, generator=g, dtype=torch.float64)  # trainer's, before the update
    lp = prox + noise * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.zeros(B, T, dtype=torch.float64)
    for i, n in enumerate([T, 4, 7, 1, 6, 8]):
        mask[i, :n] = 1
    mask[2, 3] = 0  # an environment token inside a multi-turn sequence
    mask[4] = 0  # no policy token at all
    lp = torch.where(mask > 0, lp, torch.full_like(lp, -1e4))  # padding garbage must not leak
    old = torch.where(mask > 0, old, torch.full_like(old, 7.0))
    return lp, old, prox, adv, mask


def naive_weight(mode, low, high, ratio, rhos, t):
    """The weight of token t of a sequence whose token ratios pi_trainer / pi_engine are `rhos` (loss tokens only)."""
    if mode == "icepop":
        if low is None and high is None:
            low, high = ICEPOP_BOUNDS
        elif low is None:
            low = 1 / high
        elif high is None:
            high = 1 / low
    lo = low if low is not None else -math.inf
    hi = high if high is not None else math.inf
    if mode in ("sequence_truncate", "sequence_mask"):
        prod = 1.0
        for r in rhos:
            prod *= r
        rho = prod if ratio == "product" else prod ** (1.0 / len(rhos))
    else:
        rho = rhos[t]
    if mode in ("tis", "sequence_truncate"):
        return min(max(rho, lo), hi)
    return rho if lo <= rho <= hi else 0.0


def naive_loss(name, lp, old, prox, adv, mask, cfg, mode, low, high, ratio):
    el = cfg.clip_eps_low
    eh = cfg.clip_eps_high if cfg.clip_eps_high is not None else (0.28 if name == "dapo" else el)
    seqs = [i for i in range(B) if sum(mask[i]) > 0]
    n_tok = sum(sum(row) for row in mask)
    total = 0.0
    for i in seqs:
        toks = [t for t in range(T) if mask[i][t]]
        rhos = [math.exp(prox[i][t] - old[i][t]) for t in toks]
        a = adv[i]
        if name == "gspo":
            s = torch.exp(sum(lp[i, t] - prox[i][t] for t in toks) / len(toks))
            term = torch.maximum(-a * s, -a * torch.clamp(s, 1 - el, 1 + eh))
            if mode in ("sequence_truncate", "sequence_mask"):
                w = naive_weight(mode, low, high, ratio, rhos, 0)
            else:  # a token rule on the geometric-mean ratio
                geo = math.exp(sum(math.log(r) for r in rhos) / len(rhos))
                w = naive_weight(mode, low, high, ratio, [geo], 0)
            total = total + term * w / len(seqs)
            continue
        terms = []
        for k, t in enumerate(toks):
            r = torch.exp(lp[i, t] - prox[i][t])
            term = torch.maximum(-a * r, -a * torch.clamp(r, 1 - el, 1 + eh))
            terms.append(term * naive_weight(mode, low, high, ratio, rhos, k))
        if name in ("ppo", "dapo"):
            total = total + sum(terms) / n_tok
        elif name == "grpo":
            total = total + sum(terms) / len(terms) / len(seqs)
        elif name == "dr_grpo":
            total = total + sum(terms) / cfg.max_length / len(seqs)
    return total


# (id, mode, low, high, sequence ratio): bounds chosen so the random inputs land on both sides of them
MODES = [
    ("tis", "tis", None, 1.1, "product"),
    ("tis_two_sided", "tis", 0.9, 1.1, "product"),
    ("token_mask", "token_mask", None, 1.15, "product"),
    ("token_mask_two_sided", "token_mask", 0.85, 1.15, "product"),
    ("icepop", "icepop", 0.85, 1.2, "product"),
    ("icepop_k", "icepop", None, 1.2, "product"),
    ("sequence_truncate", "sequence_truncate", 0.8, 1.25, "product"),
    ("sequence_truncate_geo", "sequence_truncate", 0.97, 1.03, "geometric"),
    ("sequence_mask", "sequence_mask", 0.8, 1.25, "product"),
    ("sequence_mask_geo", "sequence_mask", 0.97, 1.03, "geometric"),
]


def _cfg(name, mode, low, high, ratio):
    eps = {"clip_eps_low": 3e-2, "clip_eps_high": 4e-2} if name == "gspo" else {}
    return LossConfig(correction=build_correction(mode, low, high, ratio), max_length=12, **eps)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("case", MODES, ids=[m[0] for m in MODES])
def test_correction_matches_naive(name, case):
    _, mode, low, high, ratio = case
    cfg = _cfg(name, mode, low, high, ratio)
    for seed in (0, 1, 2):
        lp0, old, prox, adv, mask = _inputs(seed, noise=0.05 if name == "gspo" else 0.35)
        lp = lp0.clone().requires_grad_(True)
        loss, metrics = LOSSES[name](lp, old, adv, mask, cfg=cfg, prox_logprobs=prox)
        loss.backward()
        lp_n = lp0.clone().requires_grad_(True)
        want = naive_loss(name, lp_n, old.tolist(), prox.tolist(), adv.tolist(), mask.tolist(), cfg, mode, low, high,
                          ratio)
        want.backward()
        torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(lp.grad, lp_n.grad, rtol=1e-6, atol=1e-6)
        assert torch.all(lp.grad[mask == 0] == 0)
        assert ("tis_clip_frac" in metrics) == (mode in ("tis", "sequence_truncate"))
        assert ("masked_token_frac" in metrics) == (mode not in ("tis", "sequence_truncate"))


@pytest.mark.parametrize("case", MODES, ids=[m[0] for m in MODES])
def test_random_inputs_hit_the_bounds(case):
    """Guard against a vacuous comparison: every rule truncates or masks some loss tokens of the inputs above, not
    all of them, and the metrics count exactly the tokens (and sequences) the naive rule changes."""
    _, mode, low, high, ratio = case
    seen = []
    for seed in (0, 1, 2):
        _, old, prox, adv, mask = _inputs(seed)
        _, m = LOSSES["ppo"](prox.clone(), old, adv, mask, cfg=_cfg("ppo", mode, low, high, ratio), prox_logprobs=prox)
        changed, zero_seqs, n_tok, n_seq = 0, 0, 0, 0
        for i in range(B):
            toks = [t for t in range(T) if mask[i, t]]
            if not toks:
                continue
            rhos = [math.exp(float(prox[i, t] - old[i, t])) for t in toks]
            seq_rho = [math.prod(rhos) if ratio == "product" else math.prod(rhos) ** (1 / len(rhos))]
            ws = [naive_weight(mode, low, high, ratio, rhos, k) for k in range(len(toks))]
            own = seq_rho * len(toks) if mode.startswith("sequence") else rhos
            changed += sum(w != r for w, r in zip(ws, own))
            zero_seqs += all(w == 0 for w in ws)
            n_tok, n_seq = n_tok + len(toks), n_seq + 1
        key = "tis_clip_frac" if mode in ("tis", "sequence_truncate") else "masked_token_frac"
        assert m[key] == pytest.approx(changed / n_tok)
        if key == "masked_token_frac":
            assert m["masked_seq_frac"] == pytest.approx(zero_seqs / n_seq)
        seen.append(m[key])
    assert 0 < max(seen) and min(seen) < 1


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("mode", ["token_mask", "sequence_mask"])
def test_micro_batches_sum_to_full_batch(name, mode):
    """A masked token or sequence keeps its place in the normaliser, so micro-batches still sum to the batch."""
    cfg = _cfg(name, mode, 0.85, 1.15, "product")
    lp0, old, prox, adv, mask = _inputs(3)
    lp = lp0.clone().requires_grad_(True)
    full, _ = LOSSES[name](lp, old, adv, mask, cfg=cfg, prox_logprobs=prox)
    full.backward()
    n_seq, n_tok = normalizers(mask)
    lp2 = lp0.clone().requires_grad_(True)
    total = 0.0
    for idx in ([0, 3], [1, 5], [2, 4]):
        part, _ = LOSSES[name](lp2[idx], old[idx], adv[idx], mask[idx], cfg=cfg, prox_logprobs=prox[idx],
                               num_sequences=n_seq, num_tokens=n_tok)
        total = total + part
    total.backward()
    torch.testing.assert_close(total, full, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lp2.grad, lp.grad, rtol=1e-9, atol=1e-12)


def test_hand_numbers():
    """Two tokens with ratios 2 and 0.25: their product 0.5, their geometric mean 1/sqrt(2)."""
    log_rho = torch.log(torch.tensor([[2.0, 0.25]], dtype=torch.float64))
    mask = torch.ones(1, 2, dtype=torch.float64)
    w = TokenRule("tis", 0.5, 1.5, truncate=True).token_weights(log_rho, mask)
    assert w.weight[0].tolist() == pytest.approx([1.5, 0.5]) and w.truncated.tolist() == [[True, True]]
    w = TokenRule("token_mask", None, 1.5, truncate=False).token_weights(log_rho, mask)
    assert w.weight[0].tolist() == pytest.approx([0.0, 0.25]) and w.masked.tolist() == [[True, False]]
    w = build_correction("icepop", None, 3.0).token_weights(log_rho, mask)  # [1/3, 3]: 0.25 is out
    assert w.weight[0].tolist() == pytest.approx([2.0, 0.0])
    w = SequenceRule("sequence_mask", 0.6, 3.0, truncate=False).token_weights(log_rho, mask)  # 0.5 < 0.6
    assert w.weight.tolist() == [[0.0, 0.0]] and w.masked.all()
    w = SequenceRule("sequence_mask", 0.6, 3.0, truncate=False, ratio="geometric").token_weights(log_rho, mask)
    assert w.weight[0].tolist() == pytest.approx([2 ** -0.5] * 2) and not w.masked.any()
    w = SequenceRule("sequence_truncate", 0.6, 3.0, truncate=True).token_weights(log_rho, mask)
    assert w.weight[0].tolist() == pytest.approx([0.6, 0.6])
    # a product over a long sequence that does not fit in a float is masked, not inf * 0
    long = torch.full((1, 400), 0.5, dtype=torch.float32)
    w = SequenceRule("sequence_mask", None, 3.0, truncate=False).token_weights(long, torch.ones(1, 400))
    assert torch.all(w.weight == 0) and torch.isfinite(w.weight).all()


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="upper bound"):
        build_correction("tis", 0.5, None)
    with pytest.raises(ValueError, match="needs a bound"):
        build_correction("sequence_mask")
    with pytest.raises(ValueError, match="must not exceed"):
        build_correction("token_mask", 2.0, 1.0)
    with pytest.raises(ValueError, match="one of none"):
        build_correction("token_clip", 1.0, 2.0)
    assert build_correction("none") is None
    assert build_correction("icepop") == TokenRule("icepop", *ICEPOP_BOUNDS, truncate=False)
    assert build_correction("icepop", 0.25) == TokenRule("icepop", 0.25, 4.0, truncate=False)
    with pytest.raises(ValueError, match="not both"):
        LossConfig(tis_cap=2.0, correction=build_correction("token_mask", None, 2.0))
    assert LossConfig(tis_cap=2.0).correction == TokenRule("tis", None, 2.0, truncate=True)


def test_config_builds_the_rule():
    def loss_cfg(*sets):
        return LossConfig.from_algo(load_config(None, list(sets)).algo, max_length=8)

    assert loss_cfg().correction is None
    assert loss_cfg("algo.tis_cap=3").correction == TokenRule("tis", None, 3.0, truncate=True)
    assert loss_cfg("algo.correction.mode=sequence_mask", "algo.correction.high=3", "algo.correction.low=0.5",
                    "algo.correction.sequence_ratio=geometric").correction == \
        SequenceRule("sequence_mask", 0.5, 3.0, truncate=False, ratio="geometric")
    assert loss_cfg("algo.correction.mode=icepop", "algo.correction.high=4").correction == \
        TokenRule("icepop", 0.25, 4.0, truncate=False)
    # the low-precision default is TIS unless a correction is chosen
    assert load_config(None, ["model.dtype=bfloat16"]).algo.tis_cap == 2.0
    c = load_config(None, ["model.dtype=bfloat16", "algo.correction.mode=token_mask", "algo.correction.high=2"])
    assert c.algo.tis_cap is None and c.algo.correction.mode == "token_mask"
    for bad, why in [(["algo.correction.mode=tis"], "set algo.correction.high"),
                     (["algo.tis_cap=2", "algo.correction.mode=icepop"], "set one of them"),
                     (["algo.correction.mode=tis", "algo.correction.high=2",
                       "algo.correction.sequence_ratio=geometric"], "no effect"),
                     (["algo.correction.low=0.5"], "no effect"),
                     (["algo.correction.mode=icepop", "algo.correction.high=0.5"], "high >= 1")]:
        with pytest.raises(Exception, match=why):
            load_config(None, bad)
