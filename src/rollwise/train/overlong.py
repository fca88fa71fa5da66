"""DAPO's overlong handling (Yu et al. 2025, §3.4): what to do with samples that hit the length limit.

A truncated sample is scored as it stands, so a sample cut off mid-reasoning is punished as if its reasoning
were wrong, which is noise. DAPO adds two fixes, both on by default with `algo.loss: dapo`:

- **Overlong filtering**: truncated samples are masked out of the loss. They still count in their group's
  advantage baseline (they were sampled, and their reward says how the group did); only their own tokens get
  no gradient. The Filter room decides it (`rollwise.filter.drop_overlong` / `filter.trains`);
  `trainable_rollouts(groups, drop_truncated=True)` asks it for the rollouts to train on.
- **Soft overlong punishment** (DAPO Eq. 13): a length-aware penalty added to the reward the advantages see,

      R_length(y) = 0                                 if |y| <= L_max - L_cache
                  = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                  = -1                                if |y| > L_max

  with L_max = `rollout.max_tokens` and L_cache = `algo.overlong_cache` (the paper: 20480 and 4096). The
  penalty is kept in `reward_parts["overlong_penalty"]`, and `advantages.group_table` adds it to the reward;
  `Rollout.reward` (the task's score, which accuracy and the store report) is left alone.

|y| is the completion length in tokens (`len(completion_token_ids)`). Errored and aborted rollouts get no
penalty (they have no reward to shape).

Left out: DAPO's dynamic sampling lives in `control/policies/dynamic.py`, its token-level loss and clip-higher in
`losses.dapo_loss`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch

from rollwise import filter as room
from rollwise.types import Rollout, RolloutGroup

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.config import AlgoConfig

Array = TypeVar("Array", np.ndarray, torch.Tensor)

PENALTY_PART = "overlong_penalty"
"""The `Rollout.reward_parts` key holding the soft overlong penalty (added to the reward by the advantages)."""


def soft_overlong_penalty(lengths: Array, max_length: int, cache_len: int) -> Array:
    """DAPO Eq. 13: lengths [B] (tokens) -> penalties [B] in [-1, 0] (float; numpy in, numpy out; torch likewise).

    0 up to `max_length - cache_len` tokens, then falling linearly to -1 at `max_length`, and -1 beyond."""
    if max_length < 1 or not 1 <= cache_len <= max_length:
        raise ValueError(f"soft overlong penalty needs 1 <= overlong_cache <= max length, got cache {cache_len}, "
                         f"max length {max_length} (algo.overlong_cache vs rollout.max_tokens)")
    expected = max_length - cache_len
    if isinstance(lengths, torch.Tensor):
        pen = ((expected - lengths.to(torch.float64)) / cache_len).clamp(min=-1.0, max=0.0)  # [B]
        return pen.to(lengths.dtype if lengths.is_floating_point() else torch.float32)
    y = torch.from_numpy(np.asarray(lengths, dtype=np.float64))
    return ((expected - y) / cache_len).clamp(min=-1.0, max=0.0).numpy()


@dataclass(frozen=True)
class OverlongOptions:
    """Resolved `algo` settings: whether to filter and punish, and L_cache."""

    filter: bool
    punish: bool
    cache_len: int | None  # None: max_length // 5 (the paper's 4096 of 20480)

    def cache_for(self, max_length: int) -> int:
        return self.cache_len if self.cache_len is not None else max(1, max_length // 5)


def overlong_options(algo: AlgoConfig) -> OverlongOptions:
    """From an `AlgoConfig`: `overlong_filter` / `overlong_penalty` None mean on for `loss: dapo`, off otherwise."""
    dapo = getattr(algo, "loss", None) == "dapo"
    f = getattr(algo, "overlong_filter", None)
    p = getattr(algo, "overlong_penalty", None)
    return OverlongOptions(filter=dapo if f is None else bool(f), punish=dapo if p is None else bool(p),
                           cache_len=getattr(algo, "overlong_cache", None))


def shape_overlong(groups: Sequence[RolloutGroup], max_length: int, cache_len: int) -> int:
    """Write each scored rollout's soft overlong penalty into `reward_parts["overlong_penalty"]` (call before the
    advantages). Returns how many rollouts got a non-zero penalty."""
    scored = [r for g in groups for r in g.rollouts if room.has_reward(r)]
    if not scored:
        return 0
    pen = soft_overlong_penalty(np.array([len(r.completion_token_ids) for r in scored]), max_length, cache_len)
    for r, p in zip(scored, pen.tolist()):
        r.reward_parts[PENALTY_PART] = float(p)
    return int((pen < 0).sum())


def is_overlong(r: Rollout) -> bool:
    """Whether the sample was cut off by the length limit (status 'truncated' or finish_reason 'length')."""
    return room.is_overlong(r)


def trainable_rollouts(groups: Sequence[RolloutGroup], drop_truncated: bool,
                       rules: room.FilterRules = room.DEFAULT_RULES) -> list[Rollout]:
    """The rollouts that go into the loss (the Filter room's `trainable`), with overlong filtering as asked."""
    return room.trainable(groups, dataclasses.replace(rules, overlong_filter=drop_truncated))
