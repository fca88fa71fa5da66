"""Conversations as token ids, one turn at a time: the one renderer for multi-turn rollouts and demonstrations.

A multi-turn episode is never re-tokenized: its ids are the prompt's ids (`PromptFormat.encode`), then each policy
turn's generated ids as the engine returned them, then each environment turn's ids from `reply_ids`. A
demonstration (`{"messages": [...]}` for SFT) is rendered by `render_conversation` through the same three pieces,
so what SFT trains on is laid out exactly as a rollout with the same text would be.

`reply_ids(messages, policy_ids)` are the template's own text between the end of an assistant message and the start
of the next one, with the environment's messages (`tool` results, or `user` replies) in between: found once per
sequence of roles by rendering a short probe conversation with and without marker messages, so any template that
renders a conversation as a prefix of its continuation works. When the policy's turn did not end with the
template's end-of-turn token (a stop string cut it, e.g. at a tool call's closing tag), that token is added first.
Without a template, an environment reply is its text alone (`str`) or, for messages, `"{role}: {content}\\n"` per
message then `"assistant: "` (the template-less fallback of `models.prompting`).

NOTE: the end-of-turn token ends a policy turn, not the episode, when replies are chat turns: the template puts
further turns after it (`turn_end_ids`).

Deliberately left out: templates that rewrite earlier turns when a later one arrives (e.g. dropping past reasoning);
they cannot be extended token by token and are refused with one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollwise.models.plain_text import encode_parts
from rollwise.models.prompting import FALLBACK_ASSISTANT_PREFIX, PromptFormat, end_of_turn_id
from rollwise.models.tool_calls import assistant_text, template_renders_tools

Reply = str | list[dict[str, Any]]


def _encode(tokenizer: Any, text: str) -> list[int]:
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:
        return list(tokenizer.encode(text))


@dataclass
class ChatTurns:
    """How environment turns and demonstration turns become ids, for one tokenizer and prompt format."""

    tokenizer: Any
    prompt_format: PromptFormat = field(default_factory=PromptFormat)
    templated: bool = field(init=False)
    eot: int | None = field(init=False)
    eot_text: str = field(init=False)
    tail: str = field(init=False)
    _skeletons: dict[tuple[str, ...], list[str]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        tok = self.tokenizer
        self.templated = tok is not None and self.prompt_format.uses_template(tok)
        self.eot = end_of_turn_id(tok) if self.templated else None
        self.eot_text = tok.decode([self.eot]) if self.eot is not None else ""
        self.tail = ""
        if self.templated:
            before = self._probe_before()
            cut = before.rfind(self.eot_text) + len(self.eot_text) if self.eot_text and self.eot_text in before else len(before)
            self.tail = before[cut:]  # what the template writes after the end-of-turn token (e.g. "\n")

    @property
    def turn_end_ids(self) -> set[int]:
        """Tokens that end a policy turn without ending the episode (the template's end-of-turn token)."""
        return {self.eot} if self.eot is not None else set()

    def _probe_before(self) -> str:
        probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        return self.tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)

    def _skeleton(self, roles: tuple[str, ...]) -> list[str]:
        """The template's text around `len(roles)` messages after an assistant turn: len(roles) + 1 pieces."""
        if roles in self._skeletons:
            return self._skeletons[roles]
        markers = [f"\x00rollwise-reply-{i}\x00" for i in range(len(roles))]
        probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        before = self._probe_before()
        try:
            after = self.tokenizer.apply_chat_template(
                probe + [{"role": r, "content": m} for r, m in zip(roles, markers)], tokenize=False,
                add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - e.g. a template that refuses the role: one line
            raise ValueError(f"the chat template cannot render {list(roles)} turns after an assistant turn: "
                             f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}") from None
        if not after.startswith(before) or any(m not in after for m in markers):
            raise ValueError("the chat template does not render a conversation as a prefix of its continuation; "
                             "set env.chat_template: false for multi-turn environments with this model")
        rest = after[len(before):]
        pieces = []
        for m in markers:
            head, rest = rest.split(m, 1)
            pieces.append(head)
        pieces.append(rest)
        self._skeletons[roles] = pieces
        return pieces

    def reply_ids(self, reply: Reply, policy_ids: list[int], role: str = "user") -> list[int]:
        """Ids to append after a policy turn for an environment reply: a string (one `role` message) or a list of
        `{"role", "content"}` messages (e.g. one `tool` message per call)."""
        msgs = [{"role": role, "content": reply}] if isinstance(reply, str) else list(reply)
        # NOTE: the messages' contents (tool results, observations) are plain text: never control tokens, whatever
        # they hold (`models.plain_text`); only the template's own text around them is.
        if not self.templated:
            if isinstance(reply, str):
                return encode_parts(self.tokenizer, [(reply, True)])
            text = "\n" + "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + FALLBACK_ASSISTANT_PREFIX
            return encode_parts(self.tokenizer, [(text, True)])
        pieces = self._skeleton(tuple(m["role"] for m in msgs))
        closed = bool(policy_ids) and self.eot is not None and policy_ids[-1] == self.eot
        parts = [(("" if closed else self.eot_text) + self.tail + pieces[0], False)]
        for m, piece in zip(msgs, pieces[1:]):
            parts += [(str(m["content"]), True), (piece, False)]
        return encode_parts(self.tokenizer, parts)

    # ------------------------------------------------------------------------------------- demonstrations
    def _assistant_ids(self, messages: list[dict[str, Any]], i: int) -> list[int]:
        """Ids of assistant message i as the policy would write them, ending with the end-of-turn token."""
        m = messages[i]
        fmt = self.prompt_format
        if self.templated and m.get("tool_calls") and template_renders_tools(self.tokenizer):
            # the template writes tool calls in its own syntax: take its text for this message
            clean = [{**x, "content": x.get("content") or ""} for x in messages[: i + 1]]
            head = self.tokenizer.apply_chat_template(fmt.messages(clean[:i], True), tools=fmt.tools, tokenize=False,
                                                      add_generation_prompt=True)
            full = self.tokenizer.apply_chat_template(fmt.messages(clean, True), tools=fmt.tools, tokenize=False)
            if not full.startswith(head):
                raise ValueError("the chat template does not render a conversation as a prefix of its continuation")
            body = full[len(head):]
            end = body.find(self.eot_text) if self.eot_text else -1
            return _encode(self.tokenizer, body[: end + len(self.eot_text)] if end >= 0 else body)
        text = assistant_text(m)
        if self.templated:
            return _encode(self.tokenizer, text) + ([self.eot] if self.eot is not None else [])
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return _encode(self.tokenizer, text) + ([eos] if isinstance(eos, int) and i == len(messages) - 1 else [])

    def render_conversation(self, messages: list[dict[str, Any]]) -> tuple[list[int], list[int], list[int]]:
        """(prompt ids, completion ids, loss mask) of a whole conversation, laid out as a rollout: the messages
        before the first assistant turn are the prompt; assistant turns have mask 1 (their end-of-turn token
        included), every other turn mask 0. The conversation must end with an assistant turn."""
        first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
        if first is None or first == 0:
            raise ValueError("a demonstration needs at least one message before the first assistant turn, and an "
                             "assistant turn")
        if messages[-1].get("role") != "assistant":
            raise ValueError("a demonstration must end with an assistant turn (the policy's last reply)")
        prompt_msgs = [{"role": m["role"], "content": m.get("content") or ""} for m in messages[:first]]
        prompt = self.prompt_format.encode(self.tokenizer, prompt_msgs)
        ids: list[int] = []
        mask: list[int] = []
        i = first
        while i < len(messages):
            if messages[i].get("role") == "assistant":
                a = self._assistant_ids(messages, i)
                ids += a
                mask += [1] * len(a)
                last_policy = a
                i += 1
                continue
            j = i
            while j < len(messages) and messages[j].get("role") != "assistant":
                j += 1
            env = [{"role": m["role"], "content": m.get("content") or ""} for m in messages[i:j]]
            r = self.reply_ids(env if self.templated or len(env) > 1 or env[0]["role"] != "user" else env[0]["content"],
                               last_policy)
            ids += r
            mask += [0] * len(r)
            i = j
        return prompt, ids, mask


__all__ = ["ChatTurns", "Reply"]
