"""Advantage estimators: scored groups of rollouts in, one scalar advantage per rollout (or one per token) out.

The idea: every estimator here is a pure function of a `[G, K]` reward table (G prompts, K samples per
prompt) and a `[G, K]` validity mask, so it can be tested against the paper's formula on hand-made numbers and
swapped by name (`ADVANTAGES`). Numpy in gives numpy out, torch in gives torch out (same dtype); the maths is
done once, in torch, in float64, so both paths give identical numbers.

The mask exists because groups are ragged in practice: an aborted rollout has no reward, and an errored one
(a user's reward raised, the sandbox could not be built) has none of its own. Which entries are valid, and
what an errored rollout counts as, is the Filter room's rule (`rollwise.filter.advantage_values`): by default
an errored rollout counts as a wrong answer, so a policy never gains by making the scorer fail; with
`algo.errored_reward: null` it is masked out. Masked entries get advantage 0.

One estimator needs more than the table: `tree` (TreeRL-style credit, `TOKEN_ADVANTAGES`) reads the completions'
tokens too and gives one advantage per token (`Rollout.token_advantages`); it is a pure function of one group's
completion token ids and values, tested on hand-made numbers like the others.

One estimator cannot be finished here: `gae` (`CRITIC_ADVANTAGES`) needs a learned value model's values, which
live where the model does. Here each rollout gets its episode's return (the reward its advantages see: the
advantage a zero critic gives at every token, with gamma 1), and the trainer turns it into per-token GAE
advantages with its critic (`train/critic.py`, `train/gae.py`) at the start of the update. A resume re-trains a
stored step from the same returns and the restored critic, so the update is the same.

Deliberately left out: reward shaping. The one shaping term the advantages see is DAPO's soft overlong penalty
(`train/overlong.py`), kept apart from the task reward in `reward_parts` so accuracy and the store still report the
task's own score. Advantages are computed before the trainer; the trainer only sees the numbers
(docs/architecture.md: the trainer is algorithm-blind; with a critic, the trainer handle runs the critic beside it).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from rollwise.filter import DEFAULT_RULES, FilterRules, advantage_values, differ

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.types import Rollout, RolloutGroup

Array = TypeVar("Array", np.ndarray, torch.Tensor)


def _as_torch(rewards: Any, mask: Any | None) -> tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], Any]]:
    """Validate shapes and convert to float64 torch; return a converter back to the caller's type."""
    if isinstance(rewards, torch.Tensor):
        r = rewards.to(torch.float64)
        out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32

        def back(x: torch.Tensor) -> Any:
            return x.to(out_dtype)

    else:
        arr = np.asarray(rewards)
        r = torch.from_numpy(arr.astype(np.float64, copy=False))
        np_dtype = arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.float32

        def back(x: torch.Tensor) -> Any:
            return x.detach().numpy().astype(np_dtype)

    if r.ndim != 2:
        raise ValueError(f"rewards must have shape [num_groups, group_size], got shape {tuple(r.shape)}")
    if mask is None:
        m = torch.ones_like(r, dtype=torch.bool)
    else:
        m = mask.to(device=r.device, dtype=torch.bool) if isinstance(mask, torch.Tensor) else torch.from_numpy(np.asarray(mask, dtype=bool))
        if tuple(m.shape) != tuple(r.shape):
            raise ValueError(f"mask shape {tuple(m.shape)} does not match rewards shape {tuple(r.shape)}")
    # NOTE: masked entries may hold NaN (an errored rollout); zero them so they cannot poison sums or grads.
    r = torch.where(m, r, torch.zeros_like(r))
    return r, m, back


def _group_stats(r: torch.Tensor, m: torch.Tensor, unbiased: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group count, mean and std over valid entries. r, m: [G, K] -> each [G, 1]."""
    mf = m.to(r.dtype)
    n = mf.sum(dim=1, keepdim=True)  # [G, 1]
    mean = (r * mf).sum(dim=1, keepdim=True) / n.clamp(min=1)  # [G, 1]
    denom = (n - 1).clamp(min=1) if unbiased else n.clamp(min=1)
    var = (((r - mean) * mf) ** 2).sum(dim=1, keepdim=True) / denom  # [G, 1]
    return n, mean, _safe_sqrt(var)


def _safe_sqrt(var: torch.Tensor) -> torch.Tensor:
    # NOTE: d sqrt(x)/dx is infinite at 0, and zero-variance groups are common (all-correct, all-wrong); keep the
    # gradient finite (0) there so a caller differentiating through advantages never sees NaN.
    return torch.where(var > 0, var.clamp(min=1e-300).sqrt(), torch.zeros_like(var))


def grpo(rewards: Array, mask: Array | None = None, *, eps: float = 1e-6, unbiased_std: bool = True) -> Array:
    """GRPO (Shao et al. 2024, DeepSeekMath): A_i = (r_i - mean_group) / (std_group + eps).

    rewards, mask: [G, K] -> advantages [G, K]. `unbiased_std` uses the sample std (n-1), as TRL and verl do;
    a group with a single valid sample has std 0 and gets advantage 0.
    """
    r, m, back = _as_torch(rewards, mask)
    _, mean, std = _group_stats(r, m, unbiased_std)
    adv = (r - mean) / (std + eps)  # [G, K]
    return back(torch.where(m, adv, torch.zeros_like(adv)))


def dr_grpo(rewards: Array, mask: Array | None = None) -> Array:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean_group, no std.

    Dividing by the group std up-weights near-unanimous groups (a question that is almost always right or almost
    always wrong); Dr. GRPO drops it. rewards, mask: [G, K] -> [G, K].
    """
    r, m, back = _as_torch(rewards, mask)
    _, mean, _ = _group_stats(r, m, True)
    adv = r - mean  # [G, K]
    return back(torch.where(m, adv, torch.zeros_like(adv)))


def rloo(rewards: Array, mask: Array | None = None) -> Array:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): A_i = r_i - mean_{j != i} r_j over the group.

    Equals n/(n-1) * (r_i - mean_group) for a group of n valid samples; a group of one gets 0 (no baseline).
    rewards, mask: [G, K] -> [G, K].
    """
    r, m, back = _as_torch(rewards, mask)
    mf = m.to(r.dtype)
    n = mf.sum(dim=1, keepdim=True)  # [G, 1]
    total = (r * mf).sum(dim=1, keepdim=True)  # [G, 1]
    loo_mean = (total - r) / (n - 1).clamp(min=1)  # [G, K]
    adv = torch.where(n > 1, r - loo_mean, torch.zeros_like(r))
    return back(torch.where(m, adv, torch.zeros_like(adv)))


def reinforce_pp(rewards: Array, mask: Array | None = None, *, baseline: str = "group", eps: float = 1e-6) -> Array:
    """REINFORCE++ (Hu et al. 2025): subtract a baseline, then normalise by the std over the whole batch.

    baseline="group" is REINFORCE++-baseline (subtract the group mean, suited to several samples per prompt);
    baseline="batch" subtracts the batch mean (plain REINFORCE++ global normalisation). In both cases the
    centred values are whitened over all valid entries of the batch: A = (c - mean_batch(c)) / (std_batch(c) + eps),
    with the unbiased std. Unlike GRPO, one batch-wide scale means a low-variance group is not blown up.
    rewards, mask: [G, K] -> [G, K].
    """
    if baseline not in ("group", "batch"):
        raise ValueError(f"reinforce_pp baseline must be 'group' or 'batch', got {baseline!r}")
    r, m, back = _as_torch(rewards, mask)
    mf = m.to(r.dtype)
    if baseline == "group":
        _, gmean, _ = _group_stats(r, m, True)
        c = r - gmean  # [G, K]
    else:
        c = r
    n = mf.sum()
    bmean = (c * mf).sum() / n.clamp(min=1)
    bvar = (((c - bmean) * mf) ** 2).sum() / (n - 1).clamp(min=1)
    adv = (c - bmean) / (_safe_sqrt(bvar) + eps)  # [G, K]
    return back(torch.where(m, adv, torch.zeros_like(adv)))


ADVANTAGES: dict[str, Callable[..., Any]] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
}
"""name -> estimator `(rewards [G, K], mask [G, K] | None, **kwargs) -> advantages [G, K]`."""


def tree(completions: Sequence[Sequence[int]], values: Sequence[float | None], *,
         eps: float = 1e-6) -> list[list[float]]:
    """Tree credit for ONE group (TreeRL, Hou et al. 2025, global + local advantage): one advantage per token.

    completions: [K][T_k] completion token ids; values: [K] the reward each one's advantage sees (None = left out:
    it gets 0s and enters no value). The valid completions form a trie of their tokens; a segment is a maximal run
    of trie nodes without branching (a completion ending inside a run ends it there, so equal completions end in the
    same segment). V(s) = the mean value of the valid completions through segment s, V(root) = the group mean,
    sigma = the group's unbiased std (as GRPO), and every token of segment s gets

        A(s) = [(V(s) - V(root)) + (V(s) - V(parent(s)))] / 2 / (sigma + eps)        (parent of a top segment: root)

    The global term says how good the prefix is against the group, the local one how much the step from its
    parent changed that. The 1/2 (not in TreeRL, whose scale is 1/sqrt(leaves below)) makes the estimator exactly
    GRPO where no prefix is shared: then every completion is one top segment and both terms are v - mean. A trunk
    every completion shares gets 0; groups without a signal (`filter.differ`: fewer than two valid values, or all
    equal) get 0s. -> [K][T_k] float advantages.

    NOTE: it works from tokens alone (not from `Rollout.tree_parent`), so it applies to independent samples too: a
    prefix they share by chance (a common opening "Let's") gets the mean value of the samples that continued it,
    a fair estimate of that prefix's value, since each of them is a sample of the policy continuing it.
    """
    if len(completions) != len(values):
        raise ValueError(f"tree advantages: {len(completions)} completions but {len(values)} values")
    out = [[0.0] * len(c) for c in completions]
    valid = [i for i, v in enumerate(values) if v is not None]
    vals = [float(values[i]) for i in valid]  # type: ignore[arg-type]
    if not differ(vals):
        return out
    n = len(vals)
    mean = sum(vals) / n
    sigma = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    # the trie of the valid completions: node 0 is the root; a child is always created after its parent
    children: list[dict[int, int]] = [{}]
    parent, total, count = [-1], [0.0], [0]
    paths: dict[int, list[int]] = {}
    for i, v in zip(valid, vals):
        node = 0
        total[0] += v
        count[0] += 1
        path = []
        for t in completions[i]:
            nxt = children[node].get(t)
            if nxt is None:
                nxt = len(children)
                children[node][t] = nxt
                children.append({})
                parent.append(node)
                total.append(0.0)
                count.append(0)
            node = nxt
            total[node] += v
            count[node] += 1
            path.append(node)
        paths[i] = path
    value = [t / c for t, c in zip(total, count)]  # V of each node's segment
    # NOTE: a node is in its parent's segment exactly when it has as many completions through it (no branching and
    # no completion ending between them); otherwise its segment starts here and its parent's is the one above
    up = [0.0] * len(value)  # V(parent segment) of each node's segment
    for j in range(1, len(value)):
        p = parent[j]
        up[j] = up[p] if p != 0 and count[p] == count[j] else value[p]
    scale = 2.0 * (sigma + eps)
    adv = [((value[j] - mean) + (value[j] - up[j])) / scale for j in range(len(value))]
    for i, path in paths.items():
        out[i] = [adv[j] for j in path]
    return out


TOKEN_ADVANTAGES: dict[str, Callable[..., list[list[float]]]] = {
    "tree": tree,
}
"""name -> per-token estimator `(completions [K][T_k], values [K] (None = left out), **kwargs) -> [K][T_k]`, called
once per group; the rollout's scalar `advantage` is GRPO's (logged, and what filters and replay look at)."""

def episode_return(rewards: Array, mask: Array | None = None) -> Array:
    """The episode's return, the scalar `gae` leaves on each rollout: its reward (masked entries 0). The trainer's
    critic turns it into per-token advantages (`train/gae.py`). rewards, mask: [G, K] -> [G, K]."""
    r, m, back = _as_torch(rewards, mask)
    return back(torch.where(m, r, torch.zeros_like(r)))


CRITIC_ADVANTAGES: dict[str, Callable[..., Any]] = {
    "gae": episode_return,
}
"""name -> the per-rollout scalar `(rewards [G, K], mask [G, K] | None) -> [G, K]` for an estimator whose per-token
advantages need the trainer's critic (GAE): what `assign_advantages` writes into `Rollout.advantage`."""

ADVANTAGE_NAMES: tuple[str, ...] = (*ADVANTAGES, *TOKEN_ADVANTAGES, *CRITIC_ADVANTAGES)
"""Every estimator `assign_advantages` knows (what `algo.advantage` may name)."""


SHAPING_PARTS = ("overlong_penalty",)
"""`Rollout.reward_parts` keys added to the reward the advantages see (not to `Rollout.reward`)."""


def _shaping(ro: Rollout) -> float:
    return sum(ro.reward_parts.get(k, 0.0) for k in SHAPING_PARTS)


def group_table(groups: Sequence[RolloutGroup], rules: FilterRules = DEFAULT_RULES) -> tuple[np.ndarray, np.ndarray]:
    """Lay ragged groups out as a `[G, K_max]` float64 reward table and a bool validity mask.

    Entries and their values are the Filter room's (`filter.advantage_values`): real rewards (filtered and
    truncated rollouts keep theirs: truncation is a property of the sample, not a missing score), and errored
    rollouts at the wrong-answer score when `rules.errored_reward` is set. Shaping terms in `reward_parts`
    (`SHAPING_PARTS`: DAPO's soft overlong penalty) are added to the real rewards here.
    """
    k_max = max((len(g.rollouts) for g in groups), default=0)
    rewards = np.zeros((len(groups), k_max), dtype=np.float64)  # [G, K_max]
    mask = np.zeros((len(groups), k_max), dtype=bool)  # [G, K_max]
    for gi, g in enumerate(groups):
        for ki, v in enumerate(advantage_values(g, rules, shaping=_shaping)):
            if v is not None:
                rewards[gi, ki] = v
                mask[gi, ki] = True
    return rewards, mask


_SHARED_KNOBS = frozenset({"eps", "baseline", "unbiased_std"})


def assign_advantages(groups: Sequence[RolloutGroup], name: str, *, rules: FilterRules = DEFAULT_RULES,
                      **knobs: Any) -> np.ndarray:
    """Compute advantages with estimator `name` and write them into each `Rollout.advantage` (invalid: 0.0), and,
    for a per-token estimator (`TOKEN_ADVANTAGES`), each `Rollout.token_advantages` (None otherwise).

    `rules`: the Filter room's (which entries count, and as what). Knobs from the config (`eps=algo.adv_eps`,
    `baseline=algo.reinforce_baseline`) go to the estimators that take them and are ignored by the others, so a
    loop calls every estimator the same way; any other unknown keyword is an error. Returns the `[G, K_max]`
    scalar advantage table (GRPO's for a per-token estimator; the episode returns for `gae`, whose per-token
    advantages the trainer's critic gives).
    """
    if name not in ADVANTAGE_NAMES:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {', '.join(sorted(ADVANTAGE_NAMES))}")
    fn: Callable[..., object] = ADVANTAGES.get(name) or TOKEN_ADVANTAGES.get(name) or CRITIC_ADVANTAGES[name]
    accepted = inspect.signature(fn).parameters
    bad = [k for k in knobs if k not in accepted and k not in _SHARED_KNOBS]
    if bad:
        raise ValueError(f"advantage estimator {name!r} has no option {bad[0]!r}")
    kwargs = {k: v for k, v in knobs.items() if k in accepted}
    rewards, mask = group_table(groups, rules)
    per_token = name in TOKEN_ADVANTAGES
    if per_token:
        adv = grpo(rewards, mask, **{k: v for k, v in knobs.items() if k == "eps"})  # [G, K_max], the tree's sigma
        tok_fn = TOKEN_ADVANTAGES[name]
    else:
        adv = (ADVANTAGES.get(name) or CRITIC_ADVANTAGES[name])(rewards, mask, **kwargs)  # [G, K_max]
    for gi, g in enumerate(groups):
        tok = None
        if per_token:
            vals = [float(rewards[gi, ki]) if mask[gi, ki] else None for ki in range(len(g.rollouts))]
            tok = tok_fn([ro.completion_token_ids for ro in g.rollouts], vals, **kwargs)
        for ki, ro in enumerate(g.rollouts):
            ro.advantage = float(adv[gi, ki]) if mask[gi, ki] else 0.0
            ro.token_advantages = tok[ki] if tok is not None else None
    return adv
