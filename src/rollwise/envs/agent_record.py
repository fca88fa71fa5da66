"""An agent episode's model calls, as recorded, and the one rule that lays them out as training sequences.

The endpoint (`envs.agent_endpoint`) records every call of an episode as an `AgentCall`: the prompt ids it built, the
completion ids the engine returned, their behaviour log-probs and weight versions. `assemble(calls)` turns them into
token sequences (`types.RolloutSegment`):

- a call whose prompt ids start with an open sequence's whole ids (its prompt, then everything after) extends that
  sequence: the prompt's new tokens are the agent's (tool results, its own messages: loss mask 0, log-prob 0.0,
  weight version -1), then the call's completion (loss mask 1, the engine's log-probs and versions);
- any other call starts a new sequence, with the reason it could not extend the previous call's.

Of several open sequences a call extends the latest it can, so an agent that interleaves a side conversation (a
summariser, a critic) with its main one keeps the main one whole. Pure bookkeeping: ids and lists, no tokenizer, no
engine (tests build calls by hand).

Deliberately left out: merging sequences after the fact (a call that extends two sequences extends the latest), and
dropping a sequence that a later one contains (both are trained; each call's completion is trained exactly once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rollwise.types import RolloutSegment

AGENT_TOKEN_VERSION = -1
"""NOTE: weight version recorded for the tokens an agent put between calls (as for environment tokens in
`envs.multiturn`); they are masked out of the loss."""


@dataclass
class AgentCall:
    """One model call of an episode, as the endpoint served it."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]  # [len(completion_token_ids)]
    weight_versions: list[int]  # [len(completion_token_ids)]
    finish_reason: str | None = None
    text: str = ""
    """The completion as text (what the client got)."""
    extended: bool = False
    """Whether the endpoint built this prompt by appending to an earlier call's ids (it found the earlier
    conversation at the start of this one), rather than rendering it afresh."""
    meta: dict[str, object] = field(default_factory=dict)


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _new(call: AgentCall, reason: str) -> RolloutSegment:
    n = len(call.completion_token_ids)
    return RolloutSegment(list(call.prompt_token_ids), list(call.completion_token_ids), list(call.logprobs),
                          list(call.weight_versions), [1] * n, reason)


def _full(seg: RolloutSegment) -> list[int]:
    return list(seg.prompt_token_ids) + list(seg.completion_token_ids)


def assemble(calls: Sequence[AgentCall]) -> list[RolloutSegment]:
    """The training sequences of an episode's calls, in the order they started (the first one's `reason` is '').

    Every completion token of every call appears in exactly one sequence, with loss mask 1."""
    segs: list[RolloutSegment] = []
    prev: list[int] = []
    for call in calls:
        before, prev = prev, list(call.prompt_token_ids) + list(call.completion_token_ids)
        host = None
        for seg in reversed(segs):  # the latest open sequence this call extends
            full = _full(seg)
            if len(call.prompt_token_ids) >= len(full) and call.prompt_token_ids[: len(full)] == full:
                host = seg
                break
        if host is None:
            if not segs:
                segs.append(_new(call, ""))
                continue
            k = _lcp(before, call.prompt_token_ids)
            segs.append(_new(call, f"prompt departs from the previous call's tokens at {k} of {len(before)}"))
            continue
        added = list(call.prompt_token_ids[len(_full(host)):])
        n = len(call.completion_token_ids)
        host.completion_token_ids += added + list(call.completion_token_ids)
        host.logprobs += [0.0] * len(added) + list(call.logprobs)
        host.weight_versions += [AGENT_TOKEN_VERSION] * len(added) + list(call.weight_versions)
        host.loss_mask += [0] * len(added) + [1] * n
    return segs


__all__ = ["AGENT_TOKEN_VERSION", "AgentCall", "assemble"]
