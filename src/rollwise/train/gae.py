"""Generalized advantage estimation over the tokens the policy generated: pure functions of `[B, T]` tensors.

The idea (Schulman et al. 2016): with per-token rewards r_t and a critic's values V_t, the TD residuals
delta_t = r_t + gamma V_{t+1} - V_t are summed with weights (gamma lambda)^k into the advantage
A_t = sum_k (gamma lambda)^k delta_{t+k}, and A_t + V_t is the lambda-return the critic regresses on. In RL on
language models the reward is the episode's outcome, placed on its last policy token; every other r_t is 0.

The time axis is the policy's own tokens. A multi-turn episode interleaves tokens the policy generated (loss mask
1) with tokens it did not (tool results, user turns: mask 0). Those are not actions: they get no advantage, no value
target, and they do not break the recursion. Policy token t's successor is the next policy token, however many
environment tokens sit between them, so gamma discounts per policy token, not per token of text. (The other choice,
treating environment tokens as steps with zero reward, would discount an answer by the length of a tool's output.)
An agent episode laid out as several sequences (`Rollout.segments`) is one time axis over its sequences in order
(`episode_gae`).

Everything is computed in float64 and returned in the values' dtype; masked and padding positions are 0.

Deliberately left out: per-token rewards other than the outcome (a KL penalty folded into the reward, process
rewards): the KL stays in the loss (`algo.kl_coef`), and rewards are per episode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over each row's policy tokens. rewards, values, mask: [B, T] -> (advantages [B, T], returns [B, T]).

    Row b's time axis is its positions with mask 1, in order; the value after its last policy token is 0 (the
    episode ends there). Rewards must sit on policy tokens: one on a masked position is not part of any step and
    is refused, since it would silently vanish.
    """
    if rewards.shape != values.shape or rewards.shape != mask.shape or rewards.ndim != 2:
        raise ValueError(f"gae needs rewards, values and mask of one [B, T] shape, got {tuple(rewards.shape)}, "
                         f"{tuple(values.shape)}, {tuple(mask.shape)}")
    on = mask > 0
    if bool(((rewards != 0) & ~on).any()):
        raise ValueError("gae: a reward sits on a token outside the loss mask (not a policy step); put it on the "
                         "last policy token")
    r = rewards.to(torch.float64)
    v = torch.where(on, values.to(torch.float64), torch.zeros_like(r))
    adv = torch.zeros_like(r)
    next_value = torch.zeros(r.shape[0], dtype=torch.float64, device=r.device)  # V of the next policy token
    next_adv = torch.zeros_like(next_value)  # A of the next policy token
    for t in range(r.shape[1] - 1, -1, -1):
        # NOTE: a masked position leaves the carried (next value, next advantage) as they are, so the recursion
        # jumps from one policy token to the next across environment tokens and padding.
        m = on[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(m, a, torch.zeros_like(a))
        next_value = torch.where(m, v[:, t], next_value)
        next_adv = torch.where(m, a, next_adv)
    returns = torch.where(on, adv + v, torch.zeros_like(adv))
    return adv.to(values.dtype), returns.to(values.dtype)


def outcome_rewards(mask: torch.Tensor, outcomes: torch.Tensor) -> torch.Tensor:
    """Per-token rewards with each row's outcome on its last policy token. mask [B, T], outcomes [B] -> [B, T].
    A row without a policy token gets no reward (it has no step to give it to)."""
    b, t = mask.shape
    on = mask > 0
    pos = torch.arange(t, device=mask.device).expand(b, t)
    last = torch.where(on, pos, torch.full_like(pos, -1)).amax(dim=1)  # [B], -1 = none
    out = torch.zeros(b, t, dtype=torch.float64, device=mask.device)
    has = last >= 0
    rows = torch.arange(b, device=mask.device)[has]
    out[rows, last[has]] = outcomes.to(torch.float64).to(mask.device)[has]
    return out


def episode_gae(values: torch.Tensor, mask: torch.Tensor, outcomes: Sequence[float], episodes: Sequence[Sequence[int]],
                lengths: Sequence[int], *, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE for episodes laid out over the rows of a `[B, T]` batch: episode e is rows `episodes[e]`, in order (one
    row, or an agent episode's sequences), `lengths[i]` the completion length of row i, and `outcomes[e]` its
    reward, on its last policy token. values, mask: [B, T] -> (advantages [B, T], returns [B, T]).

    An episode of several rows is one time axis: its rows' completions back to back, so the last policy token of a
    row is followed by the first one of the next (the environment's tokens and the next prompt between them are not
    steps)."""
    b, t = mask.shape
    if len(outcomes) != len(episodes):
        raise ValueError(f"episode_gae: {len(outcomes)} outcomes for {len(episodes)} episodes")
    rows = sorted(i for e in episodes for i in e)
    if rows != list(range(b)):
        raise ValueError("episode_gae: the episodes must cover every row of the batch exactly once")
    width = max((sum(int(lengths[i]) for i in e) for e in episodes), default=1) or 1
    n = len(episodes)
    ev = torch.zeros(n, width, dtype=values.dtype, device=values.device)  # [E, W] the episodes' concatenated rows
    em = torch.zeros(n, width, dtype=mask.dtype, device=mask.device)
    where: list[list[tuple[int, int, int]]] = []  # per episode: (row, offset in the episode, length)
    for k, e in enumerate(episodes):
        off, parts = 0, []
        for i in e:
            n_i = int(lengths[i])
            ev[k, off:off + n_i] = values[i, :n_i]
            em[k, off:off + n_i] = mask[i, :n_i]
            parts.append((i, off, n_i))
            off += n_i
        where.append(parts)
    rewards = outcome_rewards(em, torch.tensor([float(o) for o in outcomes], dtype=torch.float64))
    ea, er = gae(rewards.to(values.dtype), ev, em, gamma=gamma, lam=lam)  # [E, W]
    adv = torch.zeros_like(values)
    ret = torch.zeros_like(values)
    for k, parts in enumerate(where):
        for i, off, n_i in parts:
            adv[i, :n_i] = ea[k, off:off + n_i]
            ret[i, :n_i] = er[k, off:off + n_i]
    return adv, ret


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked entries (unbiased variance), 0 elsewhere. [B, T] -> [B, T].
    One entry: its mean removed (0). Over the whole batch, so every sequence's advantages share one scale."""
    on = mask > 0
    x64 = x.to(torch.float64)
    n = int(on.sum().item())
    if n == 0:
        return torch.zeros_like(x)
    mean = x64[on].mean()
    var = x64[on].var(unbiased=True) if n > 1 else torch.zeros((), dtype=torch.float64)
    out = (x64 - mean) / torch.sqrt(var + eps) if n > 1 else x64 - mean
    return torch.where(on, out, torch.zeros_like(out)).to(x.dtype)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked entries: 1 = the values predict the returns, 0 = no
    better than their mean, negative = worse. NaN when the returns do not vary (nothing to explain)."""
    on = mask > 0
    if int(on.sum().item()) < 2:
        return float("nan")
    r = returns.to(torch.float64)[on]
    var_r = r.var(unbiased=False)
    if float(var_r) == 0.0:
        return float("nan")
    resid = r - values.to(torch.float64)[on]
    return float(1.0 - resid.var(unbiased=False) / var_r)
