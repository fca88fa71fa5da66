"""Token sampling with exact behaviour log-probs and batch-invariant, per-request seeds.

Why counter-based randomness: RL needs "same seed, same output" per request even though the continuous
batch around it changes from run to run, and a resumed (or preempted and recomputed) sample must draw the
same noise at the same position. A global torch.Generator cannot give that. Each sample instead draws its
uniform number from a hash of (its 63-bit seed, its output position) and samples by inverse CDF; the draw
depends on nothing else in the batch.

Log-probs are those of the sampling distribution *before* top-p/top-k truncation: log_softmax(logits / T)
in float32 (for greedy, T is taken as 1). That is what the trainer recomputes, so the two can be compared
token by token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (lowbias32) on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32  # int64 product wraps; the low 32 bits are still right
    return x ^ (x >> 16)


def uniform_from_counter(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A float64 uniform in [0, 1) per row, a pure function of (seed, position). seeds, positions: [B] int64."""
    lo = seeds & _M32
    hi = (seeds >> 32) & _M32
    h = _mix32(lo ^ _mix32(hi ^ _mix32(positions & _M32)))
    h2 = _mix32(h ^ 0x9E3779B9)
    return ((h >> 5).double() * 67108864.0 + (h2 >> 6).double()) / 9007199254740992.0  # 53 bits


@dataclass
class SamplingBatch:
    """Per-row sampling settings for one step, as tensors on the logits' device."""

    temperature: torch.Tensor  # [B] float32; 0 = greedy
    top_p: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int64; <= 0 = off
    seeds: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64: output position of the token being sampled
    all_greedy: bool
    any_truncation: bool


def sample(logits: torch.Tensor, sb: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [B, V] float32 -> (token ids [B] int64, log-probs [B] float32)."""
    logits = logits.float()
    greedy = sb.temperature <= 0
    temp = torch.where(greedy, torch.ones_like(sb.temperature), sb.temperature)
    scaled = logits / temp[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)  # [B, V]
    if sb.all_greedy:
        tokens = logits.argmax(dim=-1)
        return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)
    u = uniform_from_counter(sb.seeds, sb.positions)  # [B]
    if sb.any_truncation:
        tokens = _sample_truncated(logprobs, sb, u)
    else:
        cdf = logprobs.exp().double().cumsum(dim=-1)
        tokens = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
        tokens = tokens.clamp_(max=logits.shape[1] - 1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), tokens)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def _sample_truncated(logprobs: torch.Tensor, sb: SamplingBatch, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling restricted to the top-k / top-p set, in descending-probability order."""
    probs = logprobs.exp()
    sorted_p, order = probs.sort(dim=-1, descending=True)
    v = probs.shape[1]
    rank = torch.arange(v, device=probs.device)[None, :]
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    k = torch.where(sb.top_k > 0, sb.top_k, torch.full_like(sb.top_k, v))
    keep &= rank < k[:, None]
    # top-p: keep the smallest prefix whose mass reaches p (the token that crosses p is kept).
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p
    keep &= mass_before < sb.top_p[:, None]
    kept = torch.where(keep, sorted_p, torch.zeros_like(sorted_p)).double()
    cdf = kept.cumsum(dim=-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp_(max=v - 1)
    return order.gather(1, idx).squeeze(1)
