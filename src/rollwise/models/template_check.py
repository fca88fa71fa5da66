"""Is the chat template prefix-preserving for the conversations this run renders? Checked once, at set-up.

Multi-turn rollouts and SFT demonstrations (`models.turns`) append turns as token ids: the prompt's ids, the policy's
ids, then the template's text for the next turns. That is right only when the template renders every conversation as
a prefix of its continuation. A one-exchange probe misses the templates that fail only on the run's real shape: a
system prompt, `tools=`, an assistant turn that calls a tool, the tool's result, reasoning content (Qwen3's template
drops the `<think>` block of every assistant turn but the last, so a later turn rewrites an earlier one).

`probe_conversation(tokenizer, fmt, tool_turns)` builds that shape from the run's own prompt format (its system
prompt and tools; a tool call written as the policy writes it: through the template when it renders tools, else in
rollwise's fallback format, `models.tool_calls`). `prefix_problem(tokenizer, messages, fmt)` renders it step by
step (each assistant turn's generation prompt, the turn, the turns after it) and names the first step that changes
what was rendered before, with the first differing tokens. `ensure_prefix_preserving` refuses such a template with
that one line, or swaps in a prefix-preserving version where one is known: a training template of the TRL wheel
(`trl/chat_templates/<name>_training.jinja`) whose original is, character for character, the model's template (read
from the installed package's data files; TRL is not imported).

`compare_rendering(ours, theirs)` is the same first-difference report for two token sequences: the prompt rollwise
trains on against the one a serving engine renders from the same messages (`clients.template_check`).

Deliberately left out: repairing a template (editing Jinja), and multimodal content.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rollwise.models.prompting import PromptFormat
from rollwise.models.tool_calls import render_tool_call, template_renders_tools

Messages = list[dict[str, Any]]
_SAMPLE = {"integer": 6, "number": 1.5, "string": "x", "boolean": True, "array": [], "object": {}}
SHOWN_TOKENS = 4
"""Tokens shown on each side of a difference."""


class TemplateError(ValueError):
    """A chat template that cannot be extended token by token for this run; one line, with the first difference."""


def _tool_call(fmt: PromptFormat) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of a call to the run's first tool (arguments of the right types), or a stand-in."""
    if not fmt.tools:
        return "lookup", {"query": "x"}
    fn = fmt.tools[0]["function"]
    params = fn.get("parameters", {})
    props = params.get("properties", {})
    args = {}
    for k in params.get("required", list(props)):
        kind = props.get(k, {}).get("type", "string")
        args[k] = _SAMPLE.get(kind if isinstance(kind, str) else kind[0], "x")
    return fn["name"], args


def has_reasoning(tokenizer: Any) -> bool:
    """Whether the template renders assistant reasoning (`reasoning_content`, or a `<think>` block)."""
    t = getattr(tokenizer, "chat_template", None)
    return isinstance(t, str) and ("reasoning_content" in t or "<think>" in t)


def probe_conversation(tokenizer: Any, fmt: PromptFormat, tool_turns: bool) -> Messages:
    """The run's shape as messages: (system and tools from `fmt`) user, then with `tool_turns` an assistant tool call
    and its result, an assistant answer, a user reply, an assistant answer; reasoning on assistant turns when the
    template has it."""
    think = {"reasoning_content": "Let me think."} if has_reasoning(tokenizer) else {}
    msgs: Messages = [{"role": "user", "content": "What is 6 times 7?"}]
    if tool_turns:
        name, args = _tool_call(fmt)
        if template_renders_tools(tokenizer):
            call: dict[str, Any] = {"content": "", "tool_calls": [
                {"type": "function", "function": {"name": name, "arguments": args}}]}
        else:  # the policy writes the call as text (rollwise's fallback format)
            call = {"content": render_tool_call(name, args)}
        msgs += [{"role": "assistant", **call, **think}, {"role": "tool", "name": name, "content": "42"}]
    msgs += [{"role": "assistant", "content": "It is 42.", **think}, {"role": "user", "content": "Thanks."},
             {"role": "assistant", "content": "You are welcome.", **think}]
    return msgs


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def first_difference(tokenizer: Any, before: str, after: str) -> str:
    """Where `after` stops extending `before`, as tokens: 'at token K: ... before | ... after'."""
    a, b = _encode(tokenizer, before), _encode(tokenizer, after)
    return compare_rendering(tokenizer, a, b, "before", "after", prefix=True) or "the texts differ only in spacing"


def compare_rendering(tokenizer: Any, ours: list[int], theirs: list[int], ours_name: str = "rollwise",
                      theirs_name: str = "server", *, prefix: bool = False) -> str | None:
    """None when `theirs` equals `ours` (with `prefix`: starts with it); else one line naming the first differing
    token and a few tokens around it on each side."""
    n = min(len(ours), len(theirs))
    k = next((i for i in range(n) if ours[i] != theirs[i]), n)
    if k == len(ours) and (prefix or len(theirs) == len(ours)):
        return None

    def shown(ids: list[int]) -> str:
        part = ids[max(0, k - SHOWN_TOKENS): k + SHOWN_TOKENS]
        return repr(tokenizer.decode(part)) if part else "(end)"

    return (f"at token {k} of {len(ours)}: {ours_name} has {shown(ours)}, {theirs_name} has {shown(theirs)}")


def _render(tokenizer: Any, fmt: PromptFormat, messages: Messages, gen: bool) -> str:
    renders = bool(fmt.tools) and template_renders_tools(tokenizer)
    text: str = tokenizer.apply_chat_template(fmt.messages(messages, renders), tokenize=False,
                                              add_generation_prompt=gen, **({"tools": fmt.tools} if renders else {}))
    return text


def prefix_problem(tokenizer: Any, messages: Messages, fmt: PromptFormat) -> str | None:
    """None when every rendering step of `messages` extends the one before; else what broke, in one line."""
    prev, prev_what = None, ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        try:
            steps = [(_render(tokenizer, fmt, messages[:i], True),
                      f"message {i - 1} ({messages[i - 1]['role']}) with the generation prompt"),
                     (_render(tokenizer, fmt, messages[: i + 1], False), f"message {i} (assistant)")]
        except Exception as e:  # noqa: BLE001 - a template that refuses the shape: one line
            first = (str(e).strip().splitlines() or [""])[0]
            raise TemplateError(f"the chat template cannot render this run's conversations "
                                f"({[x['role'] for x in messages[: i + 1]]}): {type(e).__name__}: {first}") from None
        for text, what in steps:
            if prev is not None and not text.startswith(prev):
                return (f"adding {what} re-renders the conversation up to {prev_what}, "
                        f"{first_difference(tokenizer, prev, text)}")
            prev, prev_what = text, what
    return None


def known_training_template(template: str) -> tuple[str, str] | None:
    """(file name, text) of the TRL wheel's prefix-preserving training version of `template`, when TRL is installed
    and ships one for exactly this template; else None."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.origin:
        return None
    folder = Path(spec.origin).parent / "chat_templates"
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.jinja")):
        if path.stem.endswith("_training"):
            continue
        training = path.with_name(f"{path.stem}_training.jinja")
        if training.is_file() and path.read_text(encoding="utf-8").strip() == template.strip():
            return training.name, training.read_text(encoding="utf-8")
    return None


@dataclass(frozen=True)
class TemplateVerdict:
    """What `ensure_prefix_preserving` found: the problem of the model's own template (None: none), and the
    template used instead (None: the model's own)."""

    problem: str | None
    replaced_by: str | None = None


def ensure_prefix_preserving(tokenizer: Any, fmt: PromptFormat, *, tool_turns: bool, what: str = "multi-turn rollouts",
                             log: Callable[[str], None] = lambda s: None) -> TemplateVerdict:
    """Check the template on the run's shape (`probe_conversation`); swap in TRL's training version where one is
    known (the tokenizer's `chat_template` is set to it), else raise `TemplateError` with the first difference."""
    if tokenizer is None or not fmt.uses_template(tokenizer):
        return TemplateVerdict(None)
    messages = probe_conversation(tokenizer, fmt, tool_turns)
    problem = prefix_problem(tokenizer, messages, fmt)
    if problem is None:
        return TemplateVerdict(None)
    own = tokenizer.chat_template
    known = known_training_template(own) if isinstance(own, str) else None
    if known is not None:
        tokenizer.chat_template = known[1]
        if prefix_problem(tokenizer, probe_conversation(tokenizer, fmt, tool_turns), fmt) is None:
            log(f"chat template: the model's own is not prefix-preserving for {what} ({problem}); using TRL's "
                f"{known[0]}, which is")
            return TemplateVerdict(problem, known[0])
        tokenizer.chat_template = own
    raise TemplateError(f"the chat template is not prefix-preserving for {what}: {problem}; give the model a template "
                        "that renders each turn the same whatever follows (model.tokenizer: a directory with one), or "
                        "set env.chat_template: false")


__all__ = ["TemplateError", "TemplateVerdict", "compare_rendering", "ensure_prefix_preserving", "first_difference",
           "has_reasoning", "known_training_template", "prefix_problem", "probe_conversation"]
