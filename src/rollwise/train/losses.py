"""Policy-gradient losses as pure functions: tensors in, `(loss, metrics)` out.

Every loss has the signature

    loss_fn(logprobs, old_logprobs, advantages, mask, *, cfg, ref_logprobs=None, prox_logprobs=None,
            entropy=None, num_sequences=None, num_tokens=None) -> (loss, metrics)

    logprobs       # [B, T] float, log pi_theta(y_t) of the current policy, with grad (completion-aligned)
    old_logprobs   # [B, T] float, behaviour log-probs: what the engine sampled with (pi_behav)
    advantages     # [B] (one per sequence) or [B, T] (per token)
    mask           # [B, T] 0/1, 1 = a policy token that receives gradient (env tokens and padding are 0)
    ref_logprobs   # [B, T] reference-model log-probs for the KL penalty (needed when cfg.kl_coef > 0)
    prox_logprobs  # [B, T] proximal-policy log-probs for decoupled PPO / TIS (see below)
    entropy        # [B, T] per-token entropy of the current policy, only reported as a metric

The variants differ in two places only, so each is a few lines over a shared core:
- the ratio: per token (PPO, GRPO, Dr. GRPO, DAPO) or per sequence (GSPO: exp of the mean token log-ratio);
- the aggregation: token-mean over the batch (PPO, DAPO), sequence-mean then batch-mean (GRPO), token-sum over
  a constant length then batch-mean (Dr. GRPO), batch-mean of sequence terms (GSPO).

NOTE on micro-batching: a mean over the batch does not decompose into a mean over micro-batches of unequal size.
Pass `num_sequences` / `num_tokens` counted over the WHOLE batch (see `normalizers`); the loss then divides by
those, and summing the losses of the micro-batches gives exactly the full-batch loss and gradient.

NOTE on the anchor of the ratio. Plain PPO clips pi_theta / pi_behav, the engine's log-probs. The engine and
trainer never compute identical numbers (kernels, dtype), so with `cfg.decoupled` (Hilton et al. 2022, as AReaL
uses it) or `cfg.correction` (truncated importance sampling, Yao et al. 2025, and its masked and sequence-level
variants) the ratio is taken against a proximal policy pi_prox (the trainer's own log-probs before this update:
`prox_logprobs`, or `logprobs.detach()` when not given, which is exact for a single update per batch), and the
token term is multiplied by the detached behaviour weight w = pi_prox / pi_behav, reshaped by `cfg.correction`
(`train/corrections.py`: truncated per token, as `tis_cap` sets it, or per sequence, or masked to 0 outside its
bounds per token or per sequence).

The critic's loss (`value_loss`, for `algo.advantage: gae`) is here too, beside the policy losses but not in
`LOSSES`: it trains a separate model (`train/critic.py`) and takes values and returns, not log-probs.

Deliberately left out: dual-clip, entropy bonuses, sequence masking by reward or status (the controller's job: a rollout that should not train is masked before it gets here; masking by the
engine/trainer ratio is a correction).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from rollwise.train.corrections import Correction, CorrectionWeights, TokenRule, build_correction, correction_metrics

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.config import AlgoConfig

Metrics = dict[str, float]


@dataclass(frozen=True)
class LossConfig:
    """Knobs of the loss functions; built from the run config's `algo` section (`LossConfig.from_algo`)."""

    clip_eps_low: float = 0.2
    """Lower clip: the ratio is clipped at 1 - clip_eps_low."""
    clip_eps_high: float | None = None
    """Upper clip: 1 + clip_eps_high. None means equal to clip_eps_low, except for `dapo` where it means 0.28."""
    kl_coef: float = 0.0
    """Weight of the KL(pi_theta || pi_ref) penalty; 0 turns it off (no reference model needed)."""
    kl_estimator: str = "k3"
    """'k1' (log-ratio, unbiased, high variance, can be negative) or 'k3' (Schulman's non-negative estimator)."""
    tis_cap: float | None = None
    """Truncated importance sampling: multiply by min(pi_prox / pi_behav, tis_cap), detached. None = off. Shorthand
    for `correction=TokenRule('tis', None, tis_cap, truncate=True)`; give one or the other."""
    correction: Correction | None = None
    """The rollout-policy correction rule (`train.corrections.build_correction`); None = weight 1 (or pi_prox /
    pi_behav uncapped with `decoupled`)."""
    decoupled: bool = False
    """Decoupled PPO: clip against the proximal policy and weight by pi_prox / pi_behav (uncapped unless a
    correction is set)."""
    max_length: int | None = None
    """Dr. GRPO's constant normaliser (the generation budget, e.g. rollout.max_tokens). Required by `dr_grpo`."""

    def __post_init__(self) -> None:
        if self.clip_eps_low < 0 or (self.clip_eps_high is not None and self.clip_eps_high < 0):
            raise ValueError(f"clip eps must be >= 0, got low={self.clip_eps_low} high={self.clip_eps_high}")
        if self.kl_estimator not in ("k1", "k3"):
            raise ValueError(f"kl_estimator must be 'k1' or 'k3', got {self.kl_estimator!r}")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError(f"tis_cap must be > 0 or None, got {self.tis_cap}")
        if self.tis_cap is not None:
            tis = TokenRule("tis", None, self.tis_cap, truncate=True)
            if self.correction is not None and self.correction != tis:
                raise ValueError("set tis_cap or correction, not both (tis_cap is the 'tis' correction's high bound)")
            object.__setattr__(self, "correction", tis)
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"max_length must be >= 1 or None, got {self.max_length}")

    @classmethod
    def from_algo(cls, algo: AlgoConfig, *, max_length: int | None = None) -> LossConfig:
        """Build from a `rollwise.config.AlgoConfig` (named for the type checker only: no pydantic import here)."""
        return cls(
            clip_eps_low=algo.clip_eps_low,
            clip_eps_high=algo.clip_eps_high,
            kl_coef=algo.kl_coef,
            kl_estimator=algo.kl_estimator,
            tis_cap=algo.tis_cap,
            correction=build_correction(algo.correction.mode, algo.correction.low, algo.correction.high,
                                        algo.correction.sequence_ratio),
            decoupled=algo.decoupled,
            max_length=algo.max_length if algo.max_length is not None else max_length,
        )

    @property
    def uses_proximal(self) -> bool:
        return self.decoupled or self.correction is not None


class LossFn(Protocol):
    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        cfg: LossConfig,
        ref_logprobs: torch.Tensor | None = None,
        prox_logprobs: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        num_sequences: int | None = None,
        num_tokens: int | None = None,
    ) -> tuple[torch.Tensor, Metrics]: ...


def normalizers(mask: torch.Tensor) -> tuple[int, int]:
    """(num_sequences, num_tokens) of a [B, T] mask: sequences with at least one loss token, and loss tokens."""
    m = mask.to(torch.float32)
    return int((m.sum(dim=1) > 0).sum().item()), int(m.sum().item())


def kl_per_token(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta (Schulman, "Approximating KL").

    k1 = log pi - log pi_ref;  k3 = pi_ref/pi - 1 - log(pi_ref/pi) (non-negative, lower variance). [B, T] -> [B, T].
    """
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k3":
        d = ref_logprobs - logprobs
        return torch.exp(d) - d - 1.0
    raise ValueError(f"kl_estimator must be 'k1' or 'k3', got {estimator!r}")


@dataclass
class _Prepared:
    mask: torch.Tensor  # [B, T] float, 0/1
    adv: torch.Tensor  # [B, 1] or [B, T]
    log_ratio: torch.Tensor  # [B, T] log(pi_theta / pi_anchor), 0 off-mask
    behav_w: torch.Tensor | None  # [B, T] detached pi_prox / pi_behav as the correction shapes it, None without one
    log_behav_w: torch.Tensor | None  # [B, T] detached log(pi_prox / pi_behav), untruncated, 0 off-mask
    corr: CorrectionWeights | None  # the correction's weights and what it truncated or masked, None without one
    num_sequences: int
    num_tokens: int


def _prepare(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    prox_logprobs: torch.Tensor | None,
    num_sequences: int | None,
    num_tokens: int | None,
) -> _Prepared:
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    for name, t in (("old_logprobs", old_logprobs), ("mask", mask)) + ((("prox_logprobs", prox_logprobs),) if prox_logprobs is not None else ()):
        if tuple(t.shape) != tuple(logprobs.shape):
            raise ValueError(f"{name} shape {tuple(t.shape)} does not match logprobs shape {tuple(logprobs.shape)}")
    if advantages.ndim == 1 and advantages.shape[0] == logprobs.shape[0]:
        adv = advantages.to(logprobs.dtype)[:, None]  # [B, 1]
    elif tuple(advantages.shape) == tuple(logprobs.shape):
        adv = advantages.to(logprobs.dtype)  # [B, T]
    else:
        raise ValueError(f"advantages must be [B] or [B, T] with B, T = {tuple(logprobs.shape)}, got {tuple(advantages.shape)}")
    adv = adv.detach()
    m = mask.to(logprobs.dtype)
    on = m > 0
    old = old_logprobs.detach().to(logprobs.dtype)
    behav_w = log_behav_w = corr = None
    if prox_logprobs is not None or cfg.uses_proximal:
        prox = (prox_logprobs if prox_logprobs is not None else logprobs).detach().to(logprobs.dtype)
        anchor = prox
        # NOTE: masked positions may hold padding garbage; zero the log-ratios there so exp() stays finite.
        log_behav_w = torch.where(on, prox - old, torch.zeros_like(prox))
        if cfg.correction is not None:
            corr = cfg.correction.token_weights(log_behav_w, m)
            behav_w = corr.weight
        else:
            behav_w = torch.exp(log_behav_w)
    else:
        anchor = old
    log_ratio = torch.where(on, logprobs - anchor, torch.zeros_like(logprobs))
    n_seq, n_tok = normalizers(m)
    return _Prepared(
        mask=m,
        adv=adv,
        log_ratio=log_ratio,
        behav_w=behav_w,
        log_behav_w=log_behav_w,
        corr=corr,
        num_sequences=max(num_sequences if num_sequences is not None else n_seq, 1),
        num_tokens=max(num_tokens if num_tokens is not None else n_tok, 1),
    )


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> float:
    return float((x * m).sum().item() / max(m.sum().item(), 1.0))


def _token_surrogate(p: _Prepared, eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clipped per-token surrogate (to minimise). Returns (per_token [B, T], ratio [B, T], clipped [B, T] bool)."""
    ratio = torch.exp(p.log_ratio)  # [B, T]
    unclipped = -p.adv * ratio  # [B, T]
    clipped_term = -p.adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)  # [B, T]
    per_tok = torch.maximum(unclipped, clipped_term)  # [B, T] pessimistic bound
    clipped = (clipped_term > unclipped) & (p.mask > 0)  # the clipped branch is active: no gradient there
    if p.behav_w is not None:
        per_tok = per_tok * p.behav_w
    return per_tok, ratio, clipped


def _agg_token_mean(x: torch.Tensor, p: _Prepared) -> torch.Tensor:
    """sum over all loss tokens of the batch / num_tokens. [B, T] -> []"""
    return (x * p.mask).sum() / p.num_tokens


def _agg_seq_mean(x: torch.Tensor, p: _Prepared) -> torch.Tensor:
    """mean over each sequence's loss tokens, then sum / num_sequences. [B, T] -> []"""
    lens = p.mask.sum(dim=1).clamp(min=1.0)  # [B]
    return ((x * p.mask).sum(dim=1) / lens).sum() / p.num_sequences


def _agg_const_len(x: torch.Tensor, p: _Prepared, max_length: int) -> torch.Tensor:
    """sum over each sequence's loss tokens / max_length, then sum / num_sequences. [B, T] -> []"""
    return (x * p.mask).sum() / (max_length * p.num_sequences)


def _finish(
    pg_loss: torch.Tensor,
    p: _Prepared,
    logprobs: torch.Tensor,
    cfg: LossConfig,
    agg: Callable[[torch.Tensor, _Prepared], torch.Tensor],
    ref_logprobs: torch.Tensor | None,
    entropy: torch.Tensor | None,
    metrics: Metrics,
) -> tuple[torch.Tensor, Metrics]:
    loss = pg_loss
    metrics["pg_loss"] = float(pg_loss.detach().item())
    if ref_logprobs is not None:
        ref = ref_logprobs.detach().to(logprobs.dtype)
        on = p.mask > 0
        # NOTE: substitute before computing, not after: exp() of padding garbage is inf, and a where() applied
        # afterwards still back-propagates 0 * inf = NaN into the masked positions.
        kl_tok = kl_per_token(torch.where(on, logprobs, ref), ref, cfg.kl_estimator)  # [B, T], 0 off-mask
        metrics["kl"] = _masked_mean(kl_tok.detach(), p.mask)
        if cfg.kl_coef != 0.0:
            loss = loss + cfg.kl_coef * agg(kl_tok, p)
    elif cfg.kl_coef != 0.0:
        raise ValueError("kl_coef > 0 needs ref_logprobs (a reference model); set algo.kl_coef=0 or provide them")
    if entropy is not None:
        metrics["entropy"] = _masked_mean(entropy.detach().to(logprobs.dtype), p.mask)
    if p.behav_w is not None:
        metrics["behav_weight_mean"] = _masked_mean(p.behav_w, p.mask)
    if p.corr is not None and cfg.correction is not None:  # set together
        metrics.update(correction_metrics(p.corr, p.mask, cfg.correction.truncate))
    metrics["loss"] = float(loss.detach().item())
    return loss, metrics


def _clipped_token_loss(
    agg: Callable[[torch.Tensor, _Prepared], torch.Tensor],
    eps_high_default: float | None,
) -> LossFn:
    def loss_fn(
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        cfg: LossConfig,
        ref_logprobs: torch.Tensor | None = None,
        prox_logprobs: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        num_sequences: int | None = None,
        num_tokens: int | None = None,
    ) -> tuple[torch.Tensor, Metrics]:
        p = _prepare(logprobs, old_logprobs, advantages, mask, cfg, prox_logprobs, num_sequences, num_tokens)
        eps_high = cfg.clip_eps_high if cfg.clip_eps_high is not None else (eps_high_default if eps_high_default is not None else cfg.clip_eps_low)
        per_tok, ratio, clipped = _token_surrogate(p, cfg.clip_eps_low, eps_high)  # [B, T] each
        metrics: Metrics = {
            "clip_frac": _masked_mean(clipped.to(p.mask.dtype), p.mask),
            "ratio_mean": _masked_mean(ratio.detach(), p.mask),
            "ratio_max": float((ratio.detach() * p.mask).max().item()) if p.mask.numel() else 1.0,
        }
        return _finish(agg(per_tok, p), p, logprobs, cfg, agg, ref_logprobs, entropy, metrics)

    return loss_fn


ppo_loss = _clipped_token_loss(_agg_token_mean, None)
ppo_loss.__doc__ = """PPO clipped surrogate (Schulman et al. 2017) against the behaviour log-probs, token-mean over the batch:
    L = sum_{i,t} max(-A r_it, -A clip(r_it, 1-eps_low, 1+eps_high)) / N_tokens,  r_it = pi_theta / pi_old."""

grpo_loss = _clipped_token_loss(_agg_seq_mean, None)
grpo_loss.__doc__ = """GRPO (Shao et al. 2024): the PPO clipped token term, averaged over each sequence's tokens, then
over sequences:  L = (1/G) sum_i (1/|o_i|) sum_t max(-A r_it, -A clip(r_it, 1-eps, 1+eps))."""

dapo_loss = _clipped_token_loss(_agg_token_mean, 0.28)
dapo_loss.__doc__ = """DAPO (Yu et al. 2025): clip-higher (eps_high > eps_low; 0.28 when clip_eps_high is None) and
token-level normalisation over all tokens of the batch, so long sequences are not down-weighted:
    L = sum_{i,t} max(-A r_it, -A clip(r_it, 1-eps_low, 1+eps_high)) / sum_i |o_i|."""


def dr_grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    cfg: LossConfig,
    ref_logprobs: torch.Tensor | None = None,
    prox_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Dr. GRPO (Liu et al. 2025): no per-sequence length normalisation; the token sum is divided by a constant
    (the generation budget) so the loss has no length bias:  L = (1/G) sum_i sum_t term_it / MAX_LEN.
    Pair with the `dr_grpo` advantage (no std)."""
    if cfg.max_length is None:
        raise ValueError("the dr_grpo loss needs LossConfig.max_length (set algo.max_length, or pass the rollout max_tokens)")
    max_len = cfg.max_length

    def agg(x: torch.Tensor, p: _Prepared) -> torch.Tensor:
        return _agg_const_len(x, p, max_len)

    return _clipped_token_loss(agg, None)(
        logprobs, old_logprobs, advantages, mask, cfg=cfg, ref_logprobs=ref_logprobs, prox_logprobs=prox_logprobs,
        entropy=entropy, num_sequences=num_sequences, num_tokens=num_tokens,
    )


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    cfg: LossConfig,
    ref_logprobs: torch.Tensor | None = None,
    prox_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO (Zheng et al. 2025): one importance ratio per sequence, s_i = exp((1/|o_i|) sum_t log(pi_theta/pi_old)),
    clipped at sequence level:  L = (1/G) sum_i max(-A_i s_i, -A_i clip(s_i, 1-eps_low, 1+eps_high)).
    The paper's eps are tiny (3e-4 / 4e-4): set algo.clip_eps_low/high accordingly. With a proximal policy the
    behaviour weight is also taken per sequence: a token correction (tis: min(exp(mean_t log(pi_prox/pi_behav)),
    tis_cap)) applies to the geometric-mean ratio, a sequence correction to its own sequence ratio.
    Advantages must be one per sequence ([B])."""
    if advantages.ndim != 1:
        raise ValueError(f"gspo needs one advantage per sequence ([B]), got shape {tuple(advantages.shape)}")
    p = _prepare(logprobs, old_logprobs, advantages, mask, cfg, prox_logprobs, num_sequences, num_tokens)
    eps_high = cfg.clip_eps_high if cfg.clip_eps_high is not None else cfg.clip_eps_low
    lens = p.mask.sum(dim=1).clamp(min=1.0)  # [B]
    has = (p.mask.sum(dim=1) > 0).to(p.mask.dtype)  # [B]
    s = torch.exp((p.log_ratio * p.mask).sum(dim=1) / lens)  # [B]
    a = p.adv[:, 0]  # [B]
    unclipped = -a * s  # [B]
    clipped_term = -a * s.clamp(1.0 - cfg.clip_eps_low, 1.0 + eps_high)  # [B]
    per_seq = torch.maximum(unclipped, clipped_term)  # [B]
    if p.log_behav_w is not None:
        if cfg.correction is not None:
            sw = cfg.correction.sequence_weights(p.log_behav_w, p.mask)
            w = sw.weight  # [B]
            on = p.mask > 0
            p.corr = CorrectionWeights(w[:, None] * p.mask, sw.truncated[:, None] & on, sw.masked[:, None] & on)
        else:
            w = torch.exp((p.log_behav_w * p.mask).sum(dim=1) / lens)  # [B]
        p.behav_w = w[:, None] * p.mask
        per_seq = per_seq * w
    pg_loss = (per_seq * has).sum() / p.num_sequences
    n_has = max(float(has.sum().item()), 1.0)
    metrics: Metrics = {
        "clip_frac": float((((clipped_term > unclipped).to(has.dtype)) * has).sum().item() / n_has),
        "ratio_mean": float((s.detach() * has).sum().item() / n_has),
        "ratio_max": float((s.detach() * has).max().item()) if has.numel() else 1.0,
    }
    return _finish(pg_loss, p, logprobs, cfg, _agg_seq_mean, ref_logprobs, entropy, metrics)


LOSSES: dict[str, LossFn] = {
    "ppo": ppo_loss,
    "grpo": grpo_loss,
    "dr_grpo": dr_grpo_loss,
    "dapo": dapo_loss,
    "gspo": gspo_loss,
}
"""name -> loss function with the signature in the module docstring."""


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
               cliprange_value: float | None, num_tokens: int | None = None) -> tuple[torch.Tensor, Metrics]:
    """The critic's clipped squared error (PPO's value clipping, as in OpenAI baselines' PPO2, verl and OpenRLHF),
    token-mean over the loss tokens:

        v_clip = old + clip(v - old, -c, c)
        L = 0.5 * sum_t max((v - R)^2, (v_clip - R)^2) * m_t / N_tokens

    values [B, T] with grad; old_values [B, T] the values the step's advantages were computed with; returns [B, T]
    the GAE lambda-returns; mask [B, T]. cliprange_value None: plain 0.5 (v - R)^2. Like the policy losses, pass
    `num_tokens` counted over the whole mini-batch when it runs as micro-batches. Metrics: value_loss,
    value_clip_frac (loss tokens whose clipped error is the larger, so they get no gradient), value_mean.
    """
    if values.shape != old_values.shape or values.shape != returns.shape or values.shape != mask.shape:
        raise ValueError(f"value_loss needs values, old_values, returns and mask of one shape, got "
                         f"{tuple(values.shape)}, {tuple(old_values.shape)}, {tuple(returns.shape)}, {tuple(mask.shape)}")
    m = mask.to(values.dtype)
    on = m > 0
    ret = returns.detach().to(values.dtype)
    old = old_values.detach().to(values.dtype)
    # NOTE: substitute off-mask positions before squaring, so padding garbage can never reach a gradient
    v = torch.where(on, values, ret)
    err = (v - ret) ** 2  # [B, T]
    if cliprange_value is not None:
        v_clip = old + (v - old).clamp(-cliprange_value, cliprange_value)
        err_clip = (torch.where(on, v_clip, ret) - ret) ** 2  # [B, T]
        per_tok = torch.maximum(err, err_clip)
        clipped = (err_clip > err) & on
    else:
        per_tok = err
        clipped = torch.zeros_like(on)
    n = max(num_tokens if num_tokens is not None else int(m.sum().item()), 1)
    loss = 0.5 * (per_tok * m).sum() / n
    metrics: Metrics = {
        "value_loss": float(loss.detach().item()),
        "value_clip_frac": _masked_mean(clipped.to(m.dtype), m),
        "value_mean": _masked_mean(values.detach(), m),
    }
    return loss, metrics
