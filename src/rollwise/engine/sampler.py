"""Token sampling with exact behaviour log-probs and batch-invariant, per-request seeds.

Why counter-based randomness: RL needs "same seed, same output" per request even though the continuous
batch around it changes from run to run, and a resumed (or preempted and recomputed) sample must draw the
same noise at the same position. A global torch.Generator cannot give that. Each sample instead draws its
uniform number from a hash of (its 63-bit seed, its output position) and samples by inverse CDF; the draw
depends on nothing else in the batch.

Log-probs (`logprobs_mode`, after vLLM's option of that name):
- "processed" (the default): log p of the sampled token under the distribution it was actually drawn from:
  logits / T, then top-k, then top-p on the renormalised top-k distribution, renormalised again; float32. That
  is the behaviour policy an importance ratio needs, and what the trainer recomputes when it is given the same
  truncation (`Trainer(top_p=, top_k=)`), so the two can be compared token by token. vLLM calls this
  `processed_logprobs`. Greedy rows use T = 1 and no truncation (log_softmax(logits)).
- "raw": log_softmax(logits) of the model, before temperature and truncation (vLLM's `raw_logprobs`).

NOTE on top-p: the token whose cumulative mass first reaches p is kept (the kept set is never empty), and
with top_p = 1 nothing is cut, even where float32 cumulative sums reach 1 early.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

LogprobsMode = Literal["processed", "raw"]
LOGPROBS_MODES = ("processed", "raw")

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


def sample(logits: torch.Tensor, sb: SamplingBatch, logprobs_mode: LogprobsMode = "processed",
           fused: Callable[..., list[torch.Tensor]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [B, V] (float32; bfloat16 is widened) -> (token ids [B] int64, log-probs [B] float32); see the module
    docstring.

    `fused`: the CPU kernel `engine.cpu_kernels.sample_kernel()`, used for what it covers (float32 or bfloat16 CPU
    logits, processed log-probs, no top-k/top-p); the same draws, two passes over the logits instead of eight."""
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
    if (fused is not None and logprobs_mode == "processed" and not sb.any_truncation and logits.device.type == "cpu"
            and logits.is_contiguous() and logits.dtype in (torch.float32, torch.bfloat16)):
        tokens, lps = fused(logits, sb.temperature.float().contiguous(), uniform_from_counter(sb.seeds, sb.positions))
        return tokens, lps
    logits = logits.float()
    greedy = sb.temperature <= 0
    temp = torch.where(greedy, torch.ones_like(sb.temperature), sb.temperature)
    scaled = logits / temp[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)  # [B, V]
    log_norm = None  # [B]: log of the kept mass under truncation (0 where nothing is cut)
    if sb.all_greedy:
        tokens = logits.argmax(dim=-1)
    else:
        u = uniform_from_counter(sb.seeds, sb.positions)  # [B]
        if sb.any_truncation:
            tokens, log_norm = _sample_truncated(logprobs, sb, u, greedy)
        else:
            cdf = logprobs.exp().double().cumsum(dim=-1)
            tokens = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
            tokens = tokens.clamp_(max=logits.shape[1] - 1)
        tokens = torch.where(greedy, logits.argmax(dim=-1), tokens)
    if logprobs_mode == "raw":
        return tokens, torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    lp = logprobs.gather(1, tokens[:, None]).squeeze(1)
    return tokens, (lp if log_norm is None else lp - log_norm)


def _sample_truncated(logprobs: torch.Tensor, sb: SamplingBatch, u: torch.Tensor, greedy: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF sampling restricted to the top-k, then top-p set, in descending-probability order.

    logprobs [B, V] (of logits / T), u [B], greedy [B] bool -> (tokens [B], log kept mass [B]; 0 on rows
    without truncation and on greedy rows)."""
    sorted_lp, order = logprobs.sort(dim=-1, descending=True)  # [B, V]
    v = logprobs.shape[1]
    rank = torch.arange(v, device=logprobs.device)[None, :]
    k = torch.where(sb.top_k > 0, sb.top_k, torch.full_like(sb.top_k, v))
    keep = rank < k[:, None]  # top-k
    neg = torch.tensor(float("-inf"), device=logprobs.device)
    # top-p on the renormalised top-k distribution: keep the smallest prefix whose mass reaches p.
    p_k = torch.softmax(torch.where(keep, sorted_lp, neg), dim=-1)
    mass_before = p_k.cumsum(dim=-1) - p_k
    keep &= (mass_before < sb.top_p[:, None]) | (sb.top_p[:, None] >= 1.0)
    log_norm = torch.logsumexp(torch.where(keep, sorted_lp, neg), dim=-1)  # [B]
    truncating = ((sb.top_k > 0) & (sb.top_k < v)) | (sb.top_p < 1.0)
    log_norm = torch.where(truncating & ~greedy, log_norm, torch.zeros_like(log_norm))
    kept = torch.where(keep, sorted_lp.exp(), torch.zeros_like(sorted_lp)).double()
    cdf = kept.cumsum(dim=-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp_(max=v - 1)
    # The clamp above can only land on a zero-mass token through rounding; step back to the last kept one.
    idx = torch.minimum(idx, keep.sum(dim=-1, keepdim=True) - 1)
    return order.gather(1, idx).squeeze(1), log_norm
