"""Tool calls as text: the default call format, its parser, and how tools are described to the model.

A tool is described by an OpenAI / transformers JSON schema (`{"type": "function", "function": {name, description,
parameters}}`, what `transformers.utils.get_json_schema` makes from a typed, documented function).

The call format, one for generation, parsing and demonstrations alike:

    <tool_call>{"name": "multiply", "arguments": {"a": 347, "b": 29}}</tool_call>

(JSON inside the tags; whitespace around it is allowed, so Hermes / Qwen-style calls, which put the JSON on its own
line, parse too). A turn may hold several calls. The result goes back as a `tool`-role chat turn.

- When the tokenizer's chat template renders `tools` (Qwen2.5, Hermes, Llama 3.1 ...), prompts are rendered with
  `tools=` and the template's own instructions describe the format; assistant turns with `tool_calls` in
  demonstrations are rendered by the template.
- When it does not (SmolLM2's template ignores `tools`), `describe_tools` writes the tool list and this format into
  the system prompt, and an assistant turn's `tool_calls` are written as above after its content.

`parse_tool_calls(text)` is linear in the text (plain `str.find`, no backtracking regex) and never raises: a
malformed call comes back as a `CallError` with a reason the model can read.

Deliberately left out: streaming / partial-call parsing and model-specific call syntaxes other than JSON in
`<tool_call>` tags (e.g. Llama 3.1's `<|python_tag|>`): such a model is trained to this format by the demos.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
MAX_CALL_CHARS = 4000
"""A call's JSON longer than this is refused unparsed (an error observation), bounding the parser's work."""
MAX_CALL_DEPTH = 64
"""A call's JSON nested deeper than this is refused unparsed: `json.loads` recurses, and a few thousand brackets
would raise RecursionError there (or later, in whatever walks the arguments)."""


def _nesting(body: str) -> int:
    """The deepest bracket nesting of JSON text, strings skipped (one linear pass, no recursion)."""
    depth = deepest = 0
    in_str = escaped = False
    for ch in body:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


@dataclass
class ToolCall:
    """One parsed call: the tool's name and its arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class CallError:
    """A call that could not be parsed; `reason` is shown to the model."""

    reason: str


def render_tool_call(name: str, arguments: dict[str, Any] | str) -> str:
    """The default text of one call (`arguments` may be a JSON string, as OpenAI messages carry them)."""
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    return CALL_OPEN + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + CALL_CLOSE


def _one_call(body: str) -> ToolCall | CallError:
    body = body.strip()
    if len(body) > MAX_CALL_CHARS:
        return CallError(f"tool call is {len(body)} characters long, over the {MAX_CALL_CHARS} limit")
    if _nesting(body) > MAX_CALL_DEPTH:
        return CallError(f"tool call is nested more than {MAX_CALL_DEPTH} levels deep")
    try:
        obj = json.loads(body)
    except RecursionError:  # NOTE: unreachable past the depth check above; kept so the parser never raises
        return CallError(f"tool call is nested more than {MAX_CALL_DEPTH} levels deep")
    except json.JSONDecodeError as e:
        return CallError(f"tool call is not valid JSON ({e.msg} at character {e.pos}); write "
                         f'{CALL_OPEN}{{"name": ..., "arguments": {{...}}}}{CALL_CLOSE}')
    except ValueError as e:  # e.g. an integer past Python's digit limit
        return CallError(f"tool call is not valid JSON ({str(e)[:100]})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return CallError('tool call must be a JSON object with a string "name" and an "arguments" object')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI's wire format carries arguments as a JSON string
        if _nesting(args) > MAX_CALL_DEPTH:
            return CallError(f"the arguments of tool call {obj['name']!r} are nested more than {MAX_CALL_DEPTH} "
                             "levels deep")
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return CallError(f"the arguments of tool call {obj['name']!r} are not valid JSON")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return CallError(f'the "arguments" of tool call {obj["name"]!r} must be a JSON object')
    return ToolCall(obj["name"], args)


def parse_tool_calls(text: str, max_calls: int = 8) -> list[ToolCall | CallError]:
    """Every `<tool_call>...</tool_call>` in `text`, in order (an unclosed last one runs to the end of the text);
    at most `max_calls` (more are one CallError). Linear time; never raises."""
    out: list[ToolCall | CallError] = []
    pos = 0
    while True:
        start = text.find(CALL_OPEN, pos)
        if start < 0:
            return out
        if len(out) >= max_calls:
            out.append(CallError(f"more than {max_calls} tool calls in one turn; the rest were not run"))
            return out
        begin = start + len(CALL_OPEN)
        end = text.find(CALL_CLOSE, begin)
        body = text[begin:] if end < 0 else text[begin:end]
        out.append(_one_call(body))
        if end < 0:
            return out
        pos = end + len(CALL_CLOSE)


def _signature(fn: dict[str, Any]) -> str:
    params = fn.get("parameters", {}) or {}
    props = params.get("properties", {}) or {}
    args = ", ".join(f"{k}: {v.get('type', 'any') if isinstance(v, dict) else 'any'}" for k, v in props.items())
    return f"{fn['name']}({args})"


def describe_tools(schemas: list[dict[str, Any]]) -> str:
    """The system-prompt text that lists the tools and the call format (for templates that do not render tools):
    one line per tool, `name(arg: type, ...): description`, then how to call one. Compact on purpose: every
    prompt and demonstration carries it."""
    lines = ["Tools:"]
    for s in schemas:
        fn = s.get("function", s)
        desc = (fn.get("description") or "").strip()
        lines.append(f"- {_signature(fn)}" + (f": {desc}" if desc else ""))
    lines.append(f'To call a tool, reply with {CALL_OPEN}{{"name": "<tool>", "arguments": {{...}}}}{CALL_CLOSE}; '
                 "the result comes back in a tool message. Reply without a tool call to give your answer.")
    return "\n".join(lines)


_PROBE_TOOL = {"type": "function", "function": {"name": "rollwise_probe_tool_x7", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template writes the `tools` it is given into the prompt (probed once)."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    cached = getattr(tokenizer, "_rollwise_renders_tools", None)
    if cached is not None:
        return bool(cached)
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL], tokenize=False,
                                             add_generation_prompt=True)
        ok = "rollwise_probe_tool_x7" in text
    except Exception:  # noqa: BLE001 - a template that cannot take tools does not render them
        ok = False
    try:
        tokenizer._rollwise_renders_tools = ok
    except AttributeError:
        pass
    return ok


def assistant_text(message: dict[str, Any]) -> str:
    """An assistant message's text in the default format: its content, then each of its `tool_calls`."""
    text = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call)
        text += render_tool_call(fn["name"], fn.get("arguments", {}))
    return text


__all__ = ["CALL_CLOSE", "CALL_OPEN", "CallError", "ToolCall", "assistant_text", "describe_tools", "parse_tool_calls",
           "render_tool_call", "template_renders_tools"]
