"""Drafts for speculative rollouts: each prompt's most recent completions, handed to the engine with its next group.

The idea: RL samples the same prompts again and again under a policy that moves a little per step, so what the
policy wrote for a prompt last time is a good guess of what it writes now. The controller feeds `DraftStore` every
step's groups (`observe`) and asks it for a group's drafts when it builds the group's engine requests (`for_task`);
the engine verifies them exactly (engine/speculative.py), so a stale or wrong draft costs time, never correctness.

Configured by `rollout.speculative` (`source`: off | past | ngram | both, `k`, `per_prompt`). The store also keeps
the run's measured draft acceptance (decayed per step) and hands it to each new request as its cold-start estimate
(`DraftSpec.prior`): with Beta(1, 1) a request drafts nothing at a full batch until its own samples have shown
acceptance, which on short completions is most of their life.

Left out: drafts from the on-disk rollout store or the replay buffer across a resume (the store starts empty on a
resumed run and fills again in one epoch), and drafts for multi-turn episodes.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Sequence

from rollwise.engine.speculative import DraftSpec
from rollwise.types import RolloutGroup

if TYPE_CHECKING:  # the section's type only: importing control does not import pydantic
    from rollwise.config import SpeculativeConfig

SOURCES = ("off", "past", "ngram", "both")


HISTORY_DECAY = 0.7
"""Per step, the weight of older acceptance history (the policy moves, so old acceptance says less)."""
PRIOR_WEIGHT = 8.0
"""A new request's acceptance prior is worth this many draft tokens of history (`DraftSpec.prior`)."""


class DraftStore:
    """Most recent completion token ids per prompt (task id), as `DraftSpec`s for the engine."""

    def __init__(self, source: str = "past", k: int = 8, per_prompt: int = 8, max_prompts: int = 100_000) -> None:
        if source not in SOURCES:
            raise ValueError(f"speculative source must be one of {', '.join(SOURCES)}, got {source!r}")
        if per_prompt < 1 or max_prompts < 1:
            raise ValueError(f"per_prompt and max_prompts must be >= 1, got {per_prompt}, {max_prompts}")
        DraftSpec((), k)  # validates k
        self.source, self.k, self.per_prompt, self.max_prompts = source, k, per_prompt, max_prompts
        self._past: OrderedDict[str, deque[tuple[int, ...]]] = OrderedDict()  # LRU over prompts
        self._accepted = self._tested = 0.0  # the run's draft tokens, decayed by HISTORY_DECAY per step

    @classmethod
    def from_config(cls, spec_cfg: SpeculativeConfig) -> DraftStore | None:
        """From a `rollout.speculative` section (read by attribute); None when the source is 'off'."""
        if spec_cfg.source == "off":
            return None
        return cls(spec_cfg.source, spec_cfg.k, spec_cfg.per_prompt)

    def observe(self, groups: Sequence[RolloutGroup]) -> None:
        """Remember the completions of a step's groups (`RolloutGroup`s, as the controller returns them), newest
        last; empty completions are skipped."""
        if self.source not in ("past", "both"):
            return
        for g in groups:
            for r in g.rollouts:
                ids = tuple(r.completion_token_ids)
                if not ids:
                    continue
                q = self._past.get(r.prompt_id)
                if q is None:
                    q = self._past[r.prompt_id] = deque(maxlen=self.per_prompt)
                    if len(self._past) > self.max_prompts:
                        self._past.popitem(last=False)
                else:
                    self._past.move_to_end(r.prompt_id)
                q.append(ids)

    def observe_acceptance(self, accepted: float, tested: float) -> None:
        """A step's verified draft tokens (the engine's books): the history new requests start from."""
        self._accepted = HISTORY_DECAY * self._accepted + max(0.0, accepted)
        self._tested = HISTORY_DECAY * self._tested + max(0.0, tested)

    def prior(self) -> tuple[float, float]:
        """Beta prior of a new sample's acceptance: Beta(1, 1) before any history, then the run's decayed
        acceptance rate worth PRIOR_WEIGHT tokens (each side at least 0.5, so no estimate is ever certain)."""
        if self._tested < 1.0:
            return (1.0, 1.0)
        rate = self._accepted / self._tested
        return (max(0.5, PRIOR_WEIGHT * rate), max(0.5, PRIOR_WEIGHT * (1.0 - rate)))

    def for_task(self, task_id: str) -> DraftSpec | None:
        """The drafts for a new group of this prompt, or None (no speculation for it)."""
        if self.source == "off":
            return None
        past = tuple(reversed(self._past.get(task_id, ()))) if self.source in ("past", "both") else ()
        if self.source == "past" and not past:
            return None
        return DraftSpec(past, self.k, ngram=self.source in ("ngram", "both"), prior=self.prior())

    def __len__(self) -> int:
        return len(self._past)
