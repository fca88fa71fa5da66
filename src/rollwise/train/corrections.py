"""Rollout-policy corrections: how the loss weights each token by rho = pi_trainer / pi_engine.

The engine samples with its own kernels and dtype, so the log-probs it records (pi_engine, the behaviour policy)
are never exactly the trainer's (pi_trainer: the trainer's log-probs of the same tokens before this update, the
proximal policy of `losses`). The loss multiplies each token's surrogate by a detached weight built from

    rho_t = pi_trainer(y_t) / pi_engine(y_t)        (per token)
    rho_seq = prod_t rho_t                           (per sequence, `ratio="product"`)
    rho_seq = exp(mean_t log rho_t)                  (per sequence, `ratio="geometric"`: the geometric mean)

and one rule outside the bounds [low, high]:

    truncate: w = clamp(rho, low, high)               (tis, sequence_truncate)
    mask:     w = rho inside [low, high], else 0      (token_mask, icepop, sequence_mask)

A sequence rule gives every loss token of the sequence the sequence's weight, so a masked sequence trains on
nothing. A masked token keeps its place in the loss normaliser (TRL's semantics: its weight is 0, the loss is
not renormalised over the survivors), so micro-batches still sum to the full batch. The weight does not touch
the KL penalty. The names follow TRL's `vllm_importance_sampling_mode` (token_truncate = `tis`) and verl's
rollout-correction docs (geometric sequence ratios; typical bounds there are within 1e-3 of 1); `icepop` is the
token mask with two-sided bounds by construction (Ring-1T's IcePop, [0.5, 5] by default).

Sequence-level losses (GSPO) take one weight per sequence: a token rule is applied to the sequence's geometric-mean
ratio (GSPO's own notion of a sequence ratio), a sequence rule as above.

Deliberately left out: verl's batch renormalisation of the weights and its per-token veto; a rule that drops
masked tokens from the normaliser (it would need the whole batch's weights before the first micro-batch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

Ratio = Literal["product", "geometric"]


@dataclass(frozen=True)
class CorrectionWeights:
    """What a rule gives the loss: one weight per token and which loss tokens it truncated or masked."""

    weight: torch.Tensor  # [B, T] detached, 0 off the loss mask
    truncated: torch.Tensor  # [B, T] bool: loss tokens whose weight was clamped to a bound
    masked: torch.Tensor  # [B, T] bool: loss tokens whose weight the rule set to 0


@dataclass(frozen=True)
class SequenceWeights:
    """One weight per sequence (for sequence-level losses)."""

    weight: torch.Tensor  # [B] detached
    truncated: torch.Tensor  # [B] bool
    masked: torch.Tensor  # [B] bool


def _bounds_check(name: str, low: float | None, high: float | None, *, truncate: bool) -> None:
    for b in (low, high):
        if b is not None and not (b > 0 and math.isfinite(b)):
            raise ValueError(f"{name}: bounds must be finite and > 0, got low={low} high={high}")
    if truncate and high is None:
        raise ValueError(f"{name}: truncation needs an upper bound (high)")
    if low is None and high is None:
        raise ValueError(f"{name}: masking needs a bound (low, high or both)")
    if low is not None and high is not None and low > high:
        raise ValueError(f"{name}: low ({low}) must not exceed high ({high})")


def _apply(log_rho: torch.Tensor, low: float | None, high: float | None,
           truncate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, out of bounds) for log-ratios of any shape. Worked in log space: a product ratio over a long
    sequence may not fit in a float, its logarithm does."""
    lo = math.log(low) if low is not None else -math.inf
    hi = math.log(high) if high is not None else math.inf
    out = (log_rho < lo) | (log_rho > hi)
    if truncate:
        return torch.exp(log_rho.clamp(min=lo, max=hi)), out
    # NOTE: exp() of a masked entry may overflow; where() picks the 0, and the weight is detached anyway.
    return torch.where(out, torch.zeros_like(log_rho), torch.exp(log_rho.clamp(max=hi))), out


def _geometric(log_rho: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Log of the geometric mean: mean over each sequence's loss tokens of log rho. [B, T] -> [B]"""
    return (log_rho * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


@dataclass(frozen=True)
class TokenRule:
    """Per-token ratio, truncated (`tis`) or masked (`token_mask`, `icepop`) outside [low, high]."""

    name: str
    low: float | None
    high: float | None
    truncate: bool

    def __post_init__(self) -> None:
        _bounds_check(self.name, self.low, self.high, truncate=self.truncate)

    def token_weights(self, log_rho: torch.Tensor, mask: torch.Tensor) -> CorrectionWeights:
        """log_rho: [B, T] log(pi_trainer / pi_engine), 0 off-mask; mask: [B, T] 0/1."""
        on = mask > 0
        w, out = _apply(log_rho, self.low, self.high, self.truncate)
        w = torch.where(on, w, torch.zeros_like(w))
        hit = out & on
        return CorrectionWeights(w, hit if self.truncate else torch.zeros_like(hit),
                                 torch.zeros_like(hit) if self.truncate else hit)

    def sequence_weights(self, log_rho: torch.Tensor, mask: torch.Tensor) -> SequenceWeights:
        w, out = _apply(_geometric(log_rho, mask), self.low, self.high, self.truncate)
        return SequenceWeights(w, out if self.truncate else torch.zeros_like(out),
                               torch.zeros_like(out) if self.truncate else out)


@dataclass(frozen=True)
class SequenceRule:
    """One ratio per sequence (product or geometric mean of its token ratios), truncated (`sequence_truncate`) or
    masked (`sequence_mask`) outside [low, high]; every loss token of the sequence gets the sequence's weight."""

    name: str
    low: float | None
    high: float | None
    truncate: bool
    ratio: Ratio = "product"

    def __post_init__(self) -> None:
        _bounds_check(self.name, self.low, self.high, truncate=self.truncate)
        if self.ratio not in ("product", "geometric"):
            raise ValueError(f"{self.name}: ratio must be 'product' or 'geometric', got {self.ratio!r}")

    def sequence_weights(self, log_rho: torch.Tensor, mask: torch.Tensor) -> SequenceWeights:
        log_seq = (log_rho * mask).sum(dim=1) if self.ratio == "product" else _geometric(log_rho, mask)  # [B]
        w, out = _apply(log_seq, self.low, self.high, self.truncate)
        return SequenceWeights(w, out if self.truncate else torch.zeros_like(out),
                               torch.zeros_like(out) if self.truncate else out)

    def token_weights(self, log_rho: torch.Tensor, mask: torch.Tensor) -> CorrectionWeights:
        s = self.sequence_weights(log_rho, mask)
        on = mask > 0
        w = torch.where(on, s.weight[:, None].expand_as(log_rho), torch.zeros_like(log_rho))
        return CorrectionWeights(w, s.truncated[:, None] & on, s.masked[:, None] & on)


Correction = TokenRule | SequenceRule

ICEPOP_BOUNDS = (0.5, 5.0)
"""IcePop's [alpha, beta] in the Ring-1T report's reasoning RL stage."""


def _icepop(low: float | None, high: float | None, ratio: Ratio) -> Correction:
    """Two-sided by construction: one bound given, the other is its reciprocal; none, the report's [0.5, 5]."""
    if low is None and high is None:
        low, high = ICEPOP_BOUNDS
    elif low is None and high is not None:
        low = 1.0 / high
    elif high is None and low is not None:
        high = 1.0 / low
    return TokenRule("icepop", low, high, truncate=False)


CORRECTIONS: dict[str, Callable[[float | None, float | None, Ratio], Correction]] = {
    "tis": lambda low, high, ratio: TokenRule("tis", low, high, truncate=True),
    "token_mask": lambda low, high, ratio: TokenRule("token_mask", low, high, truncate=False),
    "icepop": _icepop,
    "sequence_truncate": lambda low, high, ratio: SequenceRule("sequence_truncate", low, high, True, ratio),
    "sequence_mask": lambda low, high, ratio: SequenceRule("sequence_mask", low, high, False, ratio),
}
"""mode -> factory(low, high, sequence ratio) of its rule (`algo.correction.mode`; 'none' is no rule at all)."""

SEQUENCE_MODES = ("sequence_truncate", "sequence_mask")
"""Modes whose ratio is taken per sequence (`algo.correction.sequence_ratio` applies to them)."""


def build_correction(mode: str, low: float | None = None, high: float | None = None,
                     ratio: Ratio = "product") -> Correction | None:
    """The rule for `mode` ('none' -> None); ValueError naming what is wrong for a bad mode or bounds."""
    if mode == "none":
        return None
    if mode not in CORRECTIONS:
        raise ValueError(f"correction mode must be one of none, {', '.join(CORRECTIONS)}; got {mode!r}")
    return CORRECTIONS[mode](low, high, ratio)


def correction_metrics(cw: CorrectionWeights, mask: torch.Tensor, truncates: bool) -> dict[str, float]:
    """The step's correction metrics: `tis_clip_frac` (truncating rules: share of loss tokens whose weight was
    clamped) or `masked_token_frac` and `masked_seq_frac` (masking rules: share of loss tokens with weight 0, share
    of sequences with a loss token whose every loss token has weight 0)."""
    m = mask.to(torch.float64)
    n_tok = max(float(m.sum().item()), 1.0)
    if truncates:
        return {"tis_clip_frac": float((cw.truncated.to(torch.float64) * m).sum().item()) / n_tok}
    has = m.sum(dim=1) > 0  # [B]
    all_masked = has & ((cw.masked.to(torch.float64) * m).sum(dim=1) == m.sum(dim=1))  # [B]
    return {
        "masked_token_frac": float((cw.masked.to(torch.float64) * m).sum().item()) / n_tok,
        "masked_seq_frac": float(all_masked.sum().item()) / max(float(has.sum().item()), 1.0),
    }
