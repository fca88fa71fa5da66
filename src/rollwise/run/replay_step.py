"""Feeding past rollouts back into a training step (the `replay` config section).

Two uses of `rollwise.store.replay.ReplayBuffer`:
- rescue: a group whose samples all failed teaches nothing under GRPO; a past success of the same prompt,
  added to the group before advantages are computed, gives it a positive example;
- reuse: past rollouts with a non-zero advantage are trained on again, a bounded number of times and no older
  than `max_age` weight versions.

Replayed rollouts keep their stored behaviour log-probs and weight versions, so the loss's clipped ratio
(pi_current / pi_behaviour) is the importance correction. They are copies marked in `env_info`
("replay_from_step"), are never written to the store again (they are already there under their own step),
and do not count in a step's rollout totals.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from rollwise.store.replay import ReplayBuffer
from rollwise.types import Rollout, RolloutGroup

REPLAY_KEY = "replay_from_step"


def is_replayed(r: Rollout) -> bool:
    return REPLAY_KEY in r.env_info


def _copy(r: Rollout, **changes) -> Rollout:
    info = dict(r.env_info)
    info[REPLAY_KEY] = r.step
    return dataclasses.replace(r, env_info=info, **changes)


def rescue_groups(buf: ReplayBuffer, groups: Sequence[RolloutGroup], version: int, k: int) -> list[Rollout]:
    """Append up to `k` past successes to each all-failed group (in place); returns the added copies."""
    added: list[Rollout] = []
    by_id = {g.group_id: g for g in groups}
    for gid, samples in buf.rescue(groups, version, k).items():
        g = by_id[gid]
        for s in samples:
            c = _copy(s.rollout, group_id=gid, sample_index=len(g.rollouts), status="kept",
                      status_reason=f"replayed success from step {s.rollout.step} (age {s.age})", advantage=None)
            g.rollouts.append(c)
            added.append(c)
    return added


def reuse_rollouts(buf: ReplayBuffer, n: int, version: int) -> list[Rollout]:
    """Up to `n` past rollouts with a non-zero advantage, as marked copies (their stored advantage kept)."""
    out = []
    for s in buf.sample(n, version):
        if s.rollout.advantage is not None and abs(s.rollout.advantage) > 0:
            out.append(_copy(s.rollout, status="kept",
                             status_reason=f"reused from step {s.rollout.step} (age {s.age})"))
    return out
