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

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from rollwise.envs.multiturn import Episode, encode_reply, run_episodes
from rollwise.types import SamplingParams, Task


def is_multi_turn(env: Any) -> bool:
    """Whether `env` runs episodes (it has the `reset` / `step` protocol of `envs.base.MultiTurnEnvironment`)."""
    return callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))


def chat_reply_formatter(tokenizer: Any, uses_template: bool) -> Callable[[str, list[int]], list[int]]:
    """`format(reply, policy_turn_ids) -> ids` appending an environment reply as the next user turn.

    With a chat template the ids are the template's own text between the end of an assistant message and the
    start of the next assistant message, with the reply as a user message in between (found by rendering a short
    conversation with and without the reply, so any template works); the end-of-turn token is added first if the
    policy's turn stopped elsewhere (e.g. at a tool call's closing tag). Without a template: the reply alone."""
    if not uses_template:
        return lambda reply, _ids: encode_reply(tokenizer, reply)
    from rollwise.models.prompting import end_of_turn_id

    marker = "\x00rollwise-reply\x00"
    probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    before = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
    after = tokenizer.apply_chat_template(probe + [{"role": "user", "content": marker}], tokenize=False,
                                          add_generation_prompt=True)
    if not after.startswith(before) or marker not in after:
        raise ValueError("the chat template does not render a conversation as a prefix of its continuation; "
                         "set env.chat_template: false for multi-turn environments with this model")
    eot = end_of_turn_id(tokenizer)
    eot_text = tokenizer.decode([eot]) if eot is not None else ""
    cut = before.rfind(eot_text) + len(eot_text) if eot_text and eot_text in before else len(before)
    tail = before[cut:]  # what the template writes after the end-of-turn token (e.g. "\n")
    head, rest = after[len(before):].split(marker, 1)

    def fmt(reply: str, policy_ids: list[int]) -> list[int]:
        closed = bool(policy_ids) and eot is not None and policy_ids[-1] == eot
        text = ("" if closed else eot_text) + tail + head + reply + rest
        return list(tokenizer.encode(text, add_special_tokens=False))

    return fmt


@dataclass
class EpisodeRunner:
    """Runs a multi-turn environment's episodes for the controller and for evaluation."""

    env: Any
    tokenizer: Any
    encode: Callable[[Task], list[int]]
    """A task's prompt ids (the same prompt building as single-turn tasks)."""
    format_reply: Callable[[str, list[int]], list[int]]
    max_turns: int = 4
    max_total_tokens: int = 1024
    turn_timeout_s: float | None = 30.0

    def run(self, engine: Any, tasks: Sequence[Task], params: Sequence[SamplingParams]) -> list[Episode]:
        """`params[i].n` episodes of `tasks[i]`, task-major."""
        return run_episodes(engine, self.tokenizer, self.env, list(tasks), list(params), self.max_turns,
                            self.max_total_tokens, prompts=[self.encode(t) for t in tasks],
                            format_reply=self.format_reply, turn_timeout_s=self.turn_timeout_s)
