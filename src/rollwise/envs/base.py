"""What an environment is: typed task records, a loader, and scoring; multi-turn ones also run episodes.

An environment turns data into `Task`s and says what a completion is worth (`rollwise.types.Score`).
Single-turn environments stop there. Multi-turn environments add a tiny episode protocol: `reset(task)`
gives the opening state, `step(state, completion_text)` answers with the next observation text, or None
when the episode is over; the runner (`envs.multiturn.run_episodes`) owns tokens, masks and limits, so an
environment never sees token ids and never re-tokenizes a conversation.

Deliberately left out: async environments and batched scoring inside the protocol (concurrency lives in
`rewards.concurrent.score_many`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard, runtime_checkable

from rollwise.models.turns import Reply
from rollwise.types import Score, Task

__all__ = ["Environment", "EpisodeState", "MultiTurnEnvironment", "Reply", "Task", "is_multi_turn", "split_of"]


@runtime_checkable
class Environment(Protocol):
    """A single-turn environment: load tasks, score one completion."""

    @property
    def name(self) -> str:
        """Read-only here, so an environment may compute it (a wrapper names itself after what it wraps)."""
        ...

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]: ...

    def score(self, task: Task, completion: str) -> Score: ...


@dataclass
class EpisodeState:
    """Where a multi-turn episode is. Environments keep their own data in `data`; `done` ends it."""

    task: Task
    turn: int = 0
    transcript: list[tuple[str, str]] = field(default_factory=list)
    """(role, text) pairs: ("policy", completion) and ("env", observation), in order."""
    done: bool = False
    data: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class MultiTurnEnvironment(Environment, Protocol):
    """An environment whose episodes alternate policy turns and environment observations.

    `reset` opens an episode; `step` gets the policy's latest turn as text and returns the observation to
    append (the runner tokenizes exactly that text, alone, and appends it; a list of chat messages, such as one
    `tool` message per call, becomes those turns), or None when the episode is over.

    Optional hooks the runner (`envs.multiturn`) looks up, so an environment defines only those it needs:
    `score_episode(state) -> Score` scores a finished episode from its state (without it, `score(task, text)` scores
    the policy's turns as one text); `score_episodes(states) -> list[Score]` scores all episodes of a call at once
    (user rewards with `environments=`); `opening(state) -> str | None` text joining the first user turn;
    `teardown(state)` per-episode cleanup; `stop`: stop strings that end a policy turn (a tool call's closing tag).
    `score(task, text)` stays available for scoring a whole transcript given as one string (e.g. by
    `rollwise score`).
    """

    def reset(self, task: Task) -> EpisodeState: ...

    def step(self, state: EpisodeState, completion: str) -> Reply | None: ...


def is_multi_turn(env: object) -> TypeGuard[MultiTurnEnvironment]:
    """Whether `env` runs episodes: it has `reset` and `step` (what the runner and the loop decide by)."""
    return callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))


def split_of(key: str, test_fraction: float) -> str:
    """Deterministic train/test assignment by hashing a problem's canonical text (disjoint by construction)."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return "test" if h < test_fraction else "train"
