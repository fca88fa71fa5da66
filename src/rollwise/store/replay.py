"""A replay buffer of scored rollouts: reuse over several updates, and rescue for all-failed groups.

Two uses, one buffer:

- **Reuse**: a rollout costs far more to generate than to train on, so `sample(n, version)` hands back
  recent rollouts for another update, each at most `max_reuse` times.
- **Rescue**: when every sample of a prompt's current group failed, GRPO-style advantages are all zero and
  the prompt teaches nothing; `rescue(groups, version)` returns successful past rollouts of those prompts
  to mix into the group, so there is a signal again.

Staleness is bounded by weight versions, not steps: a rollout produced under version v is dropped once
the policy is at version > v + `max_age`. A rollout's version is the oldest version among its generated
tokens (a sample resumed across an update is as old as its oldest token), unless the caller says otherwise.

NOTE: the buffer never computes importance weights. Every `ReplaySample` carries the stored behaviour
log-probs and per-token weight versions; the trainer, which has the current policy's log-probs, turns them
into importance ratios (and clips them) itself.

Persistence: `state_dict()` names each held rollout by (step, group_id, sample_index) - the rollout store
already holds every one of them - with its version, use count and the sampling RNG; `load_state_dict(state,
lookup)` rebuilds the buffer from the store. A checkpoint and each step's write-ahead log record carry it, so a
resumed run reuses and rescues exactly what the interrupted one would have.

Deliberately left out: prioritised sampling and any torch.
"""

from __future__ import annotations

import dataclasses
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollwise.filter import REPLAYABLE, REPLAYED, has_reward
from rollwise.types import ROLLOUT_STATUSES, Rollout, RolloutGroup


@dataclass
class ReplayConfig:
    """How much to keep, for how long, and what counts as a success. Validated at construction."""

    capacity: int = 4096
    """Most rollouts held; the oldest added go first."""
    max_age: int = 4
    """A rollout from weight version v is usable while current_version - v <= max_age."""
    max_reuse: int = 2
    """How many times `sample` may return the same rollout."""
    success_threshold: float = 1.0
    """A rollout with reward >= this is a success (a rescue candidate); a group with none has all failed. The loop
    passes `env.pass_threshold`, so rescue and accuracy agree on what a success is."""
    statuses: tuple[str, ...] = REPLAYABLE
    """Statuses admitted by `add`. Filtered rollouts are admitted on purpose: a zero-variance group that
    dynamic sampling filtered out because every sample succeeded is exactly what rescue needs."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"ReplayConfig.capacity must be >= 1, got {self.capacity}")
        if self.max_age < 0:
            raise ValueError(f"ReplayConfig.max_age must be >= 0 weight versions, got {self.max_age}")
        if self.max_reuse < 1:
            raise ValueError(f"ReplayConfig.max_reuse must be >= 1, got {self.max_reuse}")
        bad = [s for s in self.statuses if s not in ROLLOUT_STATUSES]
        if bad:
            raise ValueError(f"ReplayConfig.statuses has unknown status(es) {bad}")


@dataclass
class ReplaySample:
    """One rollout handed back for training, with what the trainer needs for importance weighting."""

    rollout: Rollout
    version: int
    """Weight version the rollout counts as produced under (its oldest generated token's, by default)."""
    age: int
    """current_version - version at the time it was handed out."""
    uses: int
    """Times it has been handed out, this one included."""

    @property
    def behaviour_logprobs(self) -> list[float]:
        """[num completion tokens] log-probs under the policy that sampled each token."""
        return self.rollout.logprobs

    @property
    def weight_versions(self) -> list[int]:
        """[num completion tokens] weight version that sampled each token."""
        return self.rollout.weight_versions


@dataclass
class _Entry:
    rollout: Rollout
    version: int
    uses: int = 0


def rollout_version(r: Rollout) -> int:
    """Oldest weight version among generated tokens (environment tokens, loss_mask 0, do not count), over every
    segment of an agent episode."""
    seqs = [r, *(r.segments or ())]  # an agent episode's segments count too
    versions = [v for s in seqs for v, m in zip(s.weight_versions, s.loss_mask) if m]
    if not versions:
        versions = [v for s in seqs for v in s.weight_versions]
    if not versions:
        raise ValueError(f"rollout {r.group_id}/{r.sample_index} has no weight versions; pass version= to add()")
    return min(versions)


class ReplayBuffer:
    """Holds scored rollouts keyed by (group_id, sample_index); adding the same key again replaces it."""

    def __init__(self, config: ReplayConfig | None = None) -> None:
        self.config = config or ReplayConfig()
        self._entries: OrderedDict[tuple[str, int], _Entry] = OrderedDict()
        self._rng = random.Random(self.config.seed)

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, rollouts: Iterable[Rollout], version: int | None = None) -> int:
        """Admit scored rollouts (reward set, status in `config.statuses`); returns how many were admitted.

        version: the weight version they were produced under; default: each rollout's oldest token version.
        """
        n = 0
        for r in rollouts:
            if r.reward is None or r.status not in self.config.statuses:
                continue
            key = (r.group_id, r.sample_index)
            self._entries.pop(key, None)
            self._entries[key] = _Entry(r, rollout_version(r) if version is None else int(version))
            n += 1
        while len(self._entries) > self.config.capacity:
            self._entries.popitem(last=False)
        return n

    def evict_stale(self, current_version: int) -> int:
        """Drop rollouts older than `max_age` versions; returns how many went."""
        stale = [k for k, e in self._entries.items() if current_version - e.version > self.config.max_age]
        for k in stale:
            del self._entries[k]
        return len(stale)

    def _hand_out(self, key: tuple[str, int], e: _Entry, current_version: int, count_use: bool) -> ReplaySample:
        if count_use:
            e.uses += 1
            if e.uses >= self.config.max_reuse:
                del self._entries[key]
        return ReplaySample(rollout=e.rollout, version=e.version, age=current_version - e.version, uses=e.uses)

    def sample(self, n: int, current_version: int) -> list[ReplaySample]:
        """Up to `n` distinct fresh rollouts, uniformly at random; each use counts towards `max_reuse`."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self.evict_stale(current_version)
        keys = list(self._entries)
        chosen = self._rng.sample(keys, min(n, len(keys)))
        return [self._hand_out(k, self._entries[k], current_version, True) for k in chosen]

    def successes(self, prompt_id: str, current_version: int, k: int = 1) -> list[ReplaySample]:
        """Up to `k` fresh successful rollouts of `prompt_id`, newest version first (uses are not counted:
        a rescue sample is a stand-in for a success the policy can produce, not a reuse of data)."""
        self.evict_stale(current_version)
        found = [
            (key, e)
            for key, e in self._entries.items()
            if e.rollout.prompt_id == prompt_id and e.rollout.reward is not None
            and e.rollout.reward >= self.config.success_threshold - 1e-9
        ]
        found.sort(key=lambda ke: -ke[1].version)
        return [self._hand_out(key, e, current_version, False) for key, e in found[:k]]

    def all_failed(self, group: RolloutGroup) -> bool:
        """True when no scored, non-errored sample of the group reached the success threshold."""
        scored = [r for r in group.rollouts if has_reward(r)]
        return bool(scored) and all(r.reward < self.config.success_threshold - 1e-9 for r in scored)  # type: ignore[operator]

    def rescue(self, groups: Sequence[RolloutGroup], current_version: int, k: int = 1) -> dict[str, list[ReplaySample]]:
        """For each group whose samples all failed: up to `k` past successes of its prompt, by group_id.

        Groups with nothing to rescue them are absent from the result.
        """
        out: dict[str, list[ReplaySample]] = {}
        for g in groups:
            if self.all_failed(g):
                found = self.successes(g.prompt_id, current_version, k)
                if found:
                    out[g.group_id] = found
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: [step, group_id, sample_index, version, uses] per held rollout (oldest first) and the RNG."""
        version, internal, gauss = self._rng.getstate()
        return {"entries": [[e.rollout.step, e.rollout.group_id, e.rollout.sample_index, e.version, e.uses]
                            for e in self._entries.values()],
                "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: Mapping[str, Any], lookup: Callable[[int, str, int], Rollout]) -> None:
        """Replace the contents with what `state_dict` saved; `lookup(step, group_id, sample_index)` returns the
        stored rollout (e.g. from the rollout store) or raises a one-line error naming what is missing."""
        entries: OrderedDict[tuple[str, int], _Entry] = OrderedDict()
        for step, gid, idx, version, uses in state["entries"]:
            r = lookup(int(step), str(gid), int(idx))
            entries[(r.group_id, r.sample_index)] = _Entry(r, int(version), int(uses))
        self._entries = entries
        v, internal, gauss = state["rng"]
        self._rng.setstate((v, tuple(internal), gauss))

    def stats(self, current_version: int) -> dict[str, float]:
        """Size and age figures for metrics.jsonl."""
        ages = [current_version - e.version for e in self._entries.values()]
        return {
            "replay_size": float(len(ages)),
            "replay_age_mean": sum(ages) / len(ages) if ages else 0.0,
            "replay_age_max": float(max(ages)) if ages else 0.0,
        }


# ------------------------------------------------------------------------------------------------- in the loop
# Replayed rollouts keep their stored behaviour log-probs and weight versions, so the loss's clipped ratio
# (pi_current / pi_behaviour) is the importance correction. They are copies marked in `env_info`
# ("replay_from_step"), are never written to the store again (they are already there under their own step),
# and do not count in a step's rollout totals. A rescued copy gets its advantage anew from the group it joins, so its
# per-token advantages go with its old one; a reused copy keeps both.

REPLAY_KEY = "replay_from_step"


def is_replayed(r: Rollout) -> bool:
    return REPLAY_KEY in r.env_info


def _copy(r: Rollout, **changes) -> Rollout:
    info = dict(r.env_info)
    info[REPLAY_KEY] = r.step
    # NOTE: a copy trains on its own, away from the tree it grew in (its parent is not in the batch, and a rescue
    # copy sits in another group, where its tree_parent would name a stranger): its links are cut, so the trainer
    # runs its whole completion instead of looking for a shared prefix. Its tokens are all there already.
    return dataclasses.replace(r, env_info=info, tree_parent=None, tree_fork=None, **changes)


def rescue_groups(buf: ReplayBuffer, groups: Sequence[RolloutGroup], version: int, k: int) -> list[Rollout]:
    """Append up to `k` past successes to each all-failed group (in place, before advantages); returns the copies."""
    added: list[Rollout] = []
    by_id = {g.group_id: g for g in groups}
    for gid, samples in buf.rescue(groups, version, k).items():
        g = by_id[gid]
        for s in samples:
            c = _copy(s.rollout, group_id=gid, sample_index=len(g.rollouts), status=REPLAYED,
                      status_reason=f"replayed success from step {s.rollout.step} (age {s.age})", advantage=None,
                      token_advantages=None)
            g.rollouts.append(c)
            added.append(c)
    return added


def reuse_rollouts(buf: ReplayBuffer, n: int, version: int) -> list[Rollout]:
    """Up to `n` past rollouts with a non-zero advantage, as marked copies (their stored advantage kept)."""
    out = []
    for s in buf.sample(n, version):
        if s.rollout.has_signal:
            out.append(_copy(s.rollout, status=REPLAYED,
                             status_reason=f"reused from step {s.rollout.step} (age {s.age})"))
    return out
