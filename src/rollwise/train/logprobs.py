"""Per-token log-probs of the rollouts' sampling distribution, as pure functions of logits (or hidden states).

The distribution is `log_softmax(logits / temperature)`, and with `top_k > 0` / `top_p < 1` the same truncation
the engine sampled under (top-k, then top-p on the renormalised top-k distribution, renormalised again). The
engine records exactly that distribution's log-probs, so the trainer must use the same temperature and truncation
or every ratio is off (biased, not just noisy).

NOTE on truncation: the kept set is chosen without gradient and always includes the target token. At the
behaviour policy the sampled token is in the set anyway (so the ratio is exactly 1 there); after an update, a
token that fell out of the current policy's set keeps a finite log-prob (its mass joins the normaliser) instead
of -inf, which would turn the KL and the gap metrics into inf/NaN. Entropies are of the untruncated
logits / temperature.
NOTE on the vocabulary: with a large vocabulary the float32 copies of [N, V] logits dominate a step's memory, so
both entry points work a chunk of rows at a time and, under autograd, recompute each chunk in backward instead of
keeping it. Every row is independent, so the numbers equal the unchunked computation.
"""

from __future__ import annotations

import torch

PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Model types whose logits are lm_head(last hidden state), nothing else (no soft-capping, scaling or extra
heads): `head_logprobs` is exact for them."""


def truncation_keep(x: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """Which tokens the sampler may draw from `x` = logits / T: the top-k, then the smallest prefix of the
    renormalised top-k distribution whose mass reaches top_p. [n, V] float32 -> [n, V] bool (no gradient)."""
    with torch.no_grad():
        v = x.shape[-1]
        sorted_x, order = x.sort(dim=-1, descending=True)
        keep_sorted = torch.ones_like(sorted_x, dtype=torch.bool)
        if 0 < top_k < v:
            keep_sorted[:, top_k:] = False
        if top_p < 1.0:
            p = torch.softmax(sorted_x.masked_fill(~keep_sorted, float("-inf")), dim=-1)
            keep_sorted &= (p.cumsum(dim=-1) - p) < top_p
        return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)


def truncated(top_p: float, top_k: int) -> bool:
    """Whether (top_p, top_k) restricts the sampling distribution at all."""
    return top_p < 1.0 or 0 < top_k


def entropy(x: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(x) per row, x = logits / T in float32. [n, V] -> [n]"""
    return torch.logsumexp(x, dim=-1) - (torch.softmax(x, dim=-1) * x).sum(-1)


def scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 `logits / temperature`; at temperature 1 no division (a full pass over [n, V] saved, in backward too)."""
    x = logits.float()
    return x if temperature == 1.0 else x / temperature


def chunk_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, top_p: float = 1.0,
                   top_k: int = -1) -> torch.Tensor:
    """float32 log-prob of each target under logits / T, truncated to top-k / top-p and renormalised.
    [n, V], [n] -> [n]"""
    x = scaled(logits, temperature)
    picked = x.gather(-1, targets[:, None])[:, 0]
    if top_p >= 1.0 and top_k <= 0:
        return picked - torch.logsumexp(x, dim=-1)
    keep = truncation_keep(x, top_p, top_k).scatter_(-1, targets[:, None], True)  # see NOTE on truncation
    return picked - torch.logsumexp(x.masked_fill(~keep, float("-inf")), dim=-1)


def _empty_like_graph(src: torch.Tensor, need_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """No rows: a 0-length float32 result still attached to `src`'s graph, so a backward through it runs."""
    empty = src.new_zeros(0, dtype=torch.float32) + src.sum() * 0
    return empty, (empty.detach() if need_entropy else None)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, need_entropy: bool = False,
                   chunk: int = 1024, top_p: float = 1.0, top_k: int = -1) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-target float32 log-probs (and entropies) of `logits / temperature` (truncated to top_k / top_p when
    set, as the engine sampled), `chunk` rows at a time.

    logits [N, V] (any float dtype), targets [N] -> ([N], [N] | None). With a large vocabulary the float32 copies of
    [N, V] dominate a step's memory (16k tokens x 152k vocab = 10 GB per copy), so each chunk's float32 work is
    recomputed in backward (activation checkpointing) instead of kept: peak extra memory is one chunk, and the
    numbers are identical to the unchunked computation (each row is independent).
    """
    from torch.utils.checkpoint import checkpoint

    n = logits.shape[0]
    if truncated(top_p, top_k):
        chunk = max(1, chunk // 4)  # truncation sorts each chunk: [n, V] values + int64 indices + masks
    grad = torch.is_grad_enabled() and logits.requires_grad
    parts: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    for s in range(0, n, chunk):
        lg, tg = logits[s:s + chunk], targets[s:s + chunk]
        if grad and n > chunk:
            parts.append(checkpoint(chunk_logprobs, lg, tg, temperature, top_p, top_k, use_reentrant=False))
        else:
            parts.append(chunk_logprobs(lg, tg, temperature, top_p, top_k))
        if need_entropy:
            with torch.no_grad():
                ents.append(entropy(scaled(lg, temperature)))
    if not parts:
        return _empty_like_graph(logits, need_entropy)
    return torch.cat(parts), (torch.cat(ents) if need_entropy else None)


def _head_chunk(h: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module, temperature: float, top_p: float,
                top_k: int, need_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, H] hidden rows -> float32 ([n] log-probs of targets, [n] entropies or empty) through `head`."""
    logits = head(h)  # [n, V]
    lp = chunk_logprobs(logits, targets, temperature, top_p, top_k)
    if not need_entropy:
        return lp, lp.new_zeros(0)
    with torch.no_grad():
        ent = entropy(scaled(logits.detach(), temperature))
    return lp, ent


def vocab_size(head: torch.nn.Module) -> int:
    """Output width of an LM head: `out_features` of a Linear, else the rows of its weight (0 when neither)."""
    out = getattr(head, "out_features", 0)
    if out:
        return int(out)
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) else 0


def head_logprobs(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, temperature: float,
                  need_entropy: bool = False, chunk_elems: int = 1 << 24, top_p: float = 1.0, top_k: int = -1
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs(head(hidden), ...)` without ever holding [N, V] logits: the LM head and the log-softmax run
    on chunks of rows whose [rows, V] float32 logits stay under `chunk_elems` elements, and under autograd each
    chunk is recomputed in backward (its logits are not kept). hidden [N, H], targets [N] -> ([N], [N] | None).
    Equal to the unchunked computation: every row is independent."""
    from torch.utils.checkpoint import checkpoint

    n = hidden.shape[0]
    rows = max(1, chunk_elems // max(vocab_size(head), 1))
    if truncated(top_p, top_k):
        rows = max(1, rows // 4)  # truncation sorts each chunk: values + int64 indices + masks
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    lps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    for s in range(0, n, rows):
        h, tg = hidden[s:s + rows], targets[s:s + rows]
        if grad:
            lp, ent = checkpoint(_head_chunk, h, tg, head, temperature, top_p, top_k, need_entropy, use_reentrant=False)
        else:
            lp, ent = _head_chunk(h, tg, head, temperature, top_p, top_k, need_entropy)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        return _empty_like_graph(hidden, need_entropy)
    return torch.cat(lps), (torch.cat(ents) if need_entropy else None)


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """The whole next-token distribution the engine samples from, as float32 log-probs: logits / T truncated to
    top-k / top-p and renormalised (-inf outside the kept set). [n, V] -> [n, V]"""
    x = scaled(logits, temperature)
    if truncated(top_p, top_k):
        x = x.masked_fill(~truncation_keep(x, top_p, top_k), float("-inf"))
    return torch.log_softmax(x, dim=-1)
