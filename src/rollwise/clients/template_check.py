"""Does a serving engine render chat messages as rollwise does? The template it applies against the one trained with.

rollwise sends a remote engine token ids, so its own rollouts never depend on the server's chat template. A client
that sends the server *messages* does (an agent over the OpenAI API, evaluation harnesses, users of the trained
model): if the server renders them with another template than the one rollwise trained with (another version of the
tokenizer, a `--chat-template` flag, a template rollwise swapped for its prefix-preserving fix), what the model sees
there differs from what it was trained on. `served_template_problem` renders the run's probe conversation
(`models.template_check.probe_conversation`, up to its last user turn, with the generation prompt) both ways: here
with the run's tokenizer, there through vLLM's `POST /tokenize` with `messages`, and names the first differing token.
A server without that route (not vLLM) is reported as unchecked, never refused.

Deliberately left out: refusing the run (rollwise's own rollouts are token-exact whatever the server's template).
"""

from __future__ import annotations

import json
from typing import Any

from rollwise.clients.remote_check import RemoteEngineError
from rollwise.models.prompting import PromptFormat
from rollwise.models.template_check import compare_rendering, probe_conversation
from rollwise.models.tool_calls import template_renders_tools


def _wire(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages in OpenAI's wire format (tool-call arguments as JSON strings, ids linking calls and results)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{"id": f"call_{k}", "type": "function",
                                "function": {"name": c["function"]["name"],
                                             "arguments": json.dumps(c["function"]["arguments"])}}
                               for k, c in enumerate(m["tool_calls"])]
        if m.get("role") == "tool":
            m.setdefault("tool_call_id", "call_0")
        out.append(m)
    return out


def probe_until_last_user(tokenizer: Any, fmt: PromptFormat, tool_turns: bool) -> list[dict[str, Any]]:
    """The probe conversation up to (with) its last user turn, with the run's system prompt and tool text."""
    msgs = probe_conversation(tokenizer, fmt, tool_turns)
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    renders = bool(fmt.tools) and template_renders_tools(tokenizer)
    return fmt.messages(msgs[: last_user + 1], renders)


def served_template_problem(http: Any, model: str | None, tokenizer: Any, fmt: PromptFormat, *, tool_turns: bool,
                            timeout_s: float = 30.0) -> tuple[bool, str | None]:
    """(checked, problem): whether the server could render the probe (`POST /tokenize` with messages), and the
    first difference from rollwise's rendering (None: the same token ids). `http`: the engine's
    `clients.http_client.HttpClient`."""
    msgs = probe_until_last_user(tokenizer, fmt, tool_turns)
    renders = bool(fmt.tools) and template_renders_tools(tokenizer)
    ours = list(tokenizer.encode(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                                               **({"tools": fmt.tools} if renders else {})),
                                 add_special_tokens=False))
    payload: dict[str, Any] = {"messages": _wire(msgs), "add_generation_prompt": True, "add_special_tokens": False}
    if model:
        payload["model"] = model
    if renders:
        payload["tools"] = fmt.tools
    if template_kwargs := getattr(tokenizer, "template_kwargs", None):  # the run's env.chat_template_kwargs
        payload["chat_template_kwargs"] = template_kwargs
    try:
        data = http.json("POST", "/tokenize", payload, deadline_s=timeout_s)
    except (RemoteEngineError, OSError, ValueError):
        return False, None
    theirs = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(theirs, list) or not all(isinstance(t, int) for t in theirs):
        return False, None
    return True, compare_rendering(tokenizer, ours, theirs, "rollwise's template", "the server's")


__all__ = ["probe_until_last_user", "served_template_problem"]
