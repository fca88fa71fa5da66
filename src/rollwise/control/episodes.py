"""Multi-turn environments in the loop: episodes instead of single completions, same groups and statuses.

The controller hands a group's samples to `EpisodeRunner.run` (`envs.multiturn.run_episodes` underneath): every
episode of the step is decoded in the same engine calls, round by round; the environment's replies are appended
as token ids (loss mask 0), wrapped as the next chat turn when the model has a chat template
(`chat_reply_formatter`), so nothing is ever re-tokenized. An episode becomes a Rollout through the same
`types.make_rollout` as a single-turn sample.

Deliberately left out: aborting or carrying episodes mid-way (control.policy early_stop / partial are refused
for multi-turn environments at the start of a run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from rollwise.envs.base import MultiTurnEnvironment, is_multi_turn
from rollwise.envs.multiturn import BatchGenerator, Episode, ReplyFormatter, run_episodes
from rollwise.types import SamplingParams, Task, Tokenizer

__all__ = ["EpisodeRunner", "EpisodeSource", "chat_reply_formatter", "is_multi_turn"]


class EpisodeSource(Protocol):
    """What runs a step's samples as whole episodes: a multi-turn environment's `EpisodeRunner`, or the user's agent
    function (`envs.user_agent.AgentEpisodes`). `params[i].n` episodes of `tasks[i]`, task-major."""

    def run(self, engine: BatchGenerator, tasks: Sequence[Task], params: Sequence[SamplingParams]) -> list[Episode]: ...


def chat_reply_formatter(tokenizer: Tokenizer, uses_template: bool) -> ReplyFormatter:
    """`format(reply, policy_turn_ids) -> ids` appending an environment reply as the next chat turn
    (`models.turns.ChatTurns.reply_ids`): a string as a user turn, a list of messages (e.g. `tool` results) as those
    turns. With a chat template the ids are the template's own text between the end of an assistant message and
    the start of the next one; the end-of-turn token is added first if the policy's turn stopped elsewhere (e.g. at
    a tool call's closing tag). Without a template: the reply alone."""
    from rollwise.models.prompting import PromptFormat
    from rollwise.models.turns import ChatTurns

    turns = ChatTurns(tokenizer, PromptFormat(chat_template=True if uses_template else False))
    if uses_template:
        turns._skeleton(("user",))  # a template that cannot be extended turn by turn fails here, at set-up
    return turns.reply_ids


@dataclass
class EpisodeRunner:
    """Runs a multi-turn environment's episodes for the controller and for evaluation."""

    env: MultiTurnEnvironment
    tokenizer: Tokenizer
    encode: Callable[[Task], list[int]]
    """A task's prompt ids (the same prompt building as single-turn tasks)."""
    format_reply: ReplyFormatter
    max_turns: int = 4
    max_total_tokens: int = 1024
    turn_timeout_s: float | None = 30.0
    turn_end_ids: frozenset[int] = frozenset()
    """Tokens that end a policy turn but not the episode (the chat template's end-of-turn token)."""
    stop: tuple[str, ...] = ()
    """Extra stop strings for policy turns (a tool call's closing tag when there is no chat template)."""

    def run(self, engine: BatchGenerator, tasks: Sequence[Task], params: Sequence[SamplingParams]) -> list[Episode]:
        """`params[i].n` episodes of `tasks[i]`, task-major."""
        return run_episodes(engine, self.tokenizer, self.env, list(tasks), list(params), self.max_turns,
                            self.max_total_tokens, prompts=[self.encode(t) for t in tasks],
                            format_reply=self.format_reply, turn_timeout_s=self.turn_timeout_s,
                            turn_end_ids=self.turn_end_ids, stop=self.stop, encode=self.encode)
