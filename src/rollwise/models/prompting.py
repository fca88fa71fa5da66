"""Prompts as the model expects them: one implementation for train, eval, generate and serve.

A task's prompt is a string or a list of chat messages (`{"role": ..., "content": ...}`). `PromptFormat`
turns it into the token ids the engine samples from and the trainer trains on:
- chat template on (`True`, or `"auto"` when the tokenizer has one): a string becomes the user message,
  preceded by `system_prompt` when set; a message list goes through the template as given (with
  `system_prompt` put first only when the list has no system message). The template is rendered with the
  generation prompt and the text is encoded without adding special tokens (the template writes its own),
  exactly as `transformers`' `apply_chat_template(tokenize=True)` does.
- chat template off (`False`, or `"auto"` without one): a string is encoded with the special tokens the
  tokenizer adds by default (`add_special_tokens=True`, e.g. a BOS), as `transformers` and vLLM do for a raw
  prompt. A message list is rendered with a small documented fallback, `"{role}: {content}\\n"` per message
  then `"assistant: "` (what `rollwise serve` has always used for template-less models).

`stop_token_ids(tokenizer, model_dir)` is where generation ends: the generation config's eos ids plus the
template's end-of-turn token (e.g. `<|im_end|>`), which many converted or fine-tuned checkpoints leave out of
their eos ids.

Deliberately left out: multi-turn continuation (appending an environment turn to an ongoing episode is
`models.turns`' job) and string stop sequences. Tools (`tools=`): the template renders them when it can, else the
system prompt describes them (`models.tool_calls`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from rollwise.config import check_template_kwargs

Messages = list[dict[str, Any]]
Prompt = Union[str, Messages]
FALLBACK_ASSISTANT_PREFIX = "assistant: "
_PROBE = "\x1fROLLWISE_PROBE\x1f"


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def check_messages(messages: Any, where: str = "prompt") -> Messages:
    """The list itself when it is a non-empty list of {role: str, content: str} dicts; else a one-line ValueError."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: chat messages must be a non-empty list of {{'role', 'content'}} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}: message {i} must be an object with string 'role' and 'content', got {str(m)[:80]}")
    return messages


def render_fallback(messages: Messages) -> str:
    """The template-less rendering: "{role}: {content}\\n" per message, then "assistant: "."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + FALLBACK_ASSISTANT_PREFIX


class TemplateKwargs:
    """A tokenizer whose `apply_chat_template` always gets the run's extra template variables (TRL's
    `chat_template_kwargs`, e.g. `enable_thinking=False`).

    Why a wrapper: prompts, tool turns, demonstrations, the agent endpoint and the template checks all render through
    the one tokenizer the run loads, so wrapping it once at setup reaches every rendering, and no call site can
    forget the variables (a prompt rendered without them and a turn rendered with them would not be prefixes of
    each other). Everything else (encode, decode, attributes, assignment of `chat_template`) is the tokenizer's own.
    """

    def __init__(self, tokenizer: Any, kwargs: dict[str, Any]) -> None:
        object.__setattr__(self, "_tokenizer", tokenizer)
        object.__setattr__(self, "_template_kwargs", check_template_kwargs(kwargs))

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """The variables every rendering gets (a server rendering the same template needs them too)."""
        return dict(self._template_kwargs)

    def apply_chat_template(self, conversation: Any, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer.apply_chat_template(conversation, *args, **{**self._template_kwargs, **kwargs})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._tokenizer)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_tokenizer"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._tokenizer, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (TemplateKwargs, (self._tokenizer, self._template_kwargs))


def with_template_kwargs(tokenizer: Any, kwargs: dict[str, Any] | None) -> Any:
    """`tokenizer` rendering every chat template with `kwargs` (`TemplateKwargs`); itself when there are none."""
    if tokenizer is None or not kwargs:
        return tokenizer
    return TemplateKwargs(tokenizer, kwargs)


@dataclass(frozen=True)
class PromptFormat:
    """How task prompts become token ids (the `env.chat_template` and `env.system_prompt` keys)."""

    chat_template: Literal["auto"] | bool = "auto"
    """"auto": use the tokenizer's chat template when it has one; True: require it; False: raw text."""
    system_prompt: str | None = None
    """System message put before the user's (chat template only)."""
    tools: list[dict[str, Any]] | None = field(default=None, compare=False)
    """Tool schemas (OpenAI / transformers JSON schema) the prompt offers: passed to the template as `tools=` when it
    renders them, else described in the system prompt (`models.tool_calls.describe_tools`)."""

    def __post_init__(self) -> None:
        if self.chat_template not in ("auto", True, False):
            raise ValueError(f"chat_template must be 'auto', true or false, got {self.chat_template!r}")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ValueError(f"system_prompt must be a string, got {type(self.system_prompt).__name__}")
        if self.chat_template is False and self.system_prompt:
            raise ValueError("system_prompt needs the chat template, but chat_template is false")

    def uses_template(self, tokenizer: Any) -> bool:
        if self.chat_template == "auto":
            return has_chat_template(tokenizer)
        if self.chat_template and not has_chat_template(tokenizer):
            raise ValueError("chat_template is true but the tokenizer has no chat template "
                             "(set chat_template to 'auto' or false, or use a model whose tokenizer has one)")
        return bool(self.chat_template)

    def messages(self, prompt: Prompt, renders_tools: bool = False) -> Messages:
        """The chat messages of a prompt (a string becomes the user message; the system prompt goes first, with the
        tool list after it unless `renders_tools`: the template then gets the tools as `tools=`)."""
        if isinstance(prompt, str):
            msgs: Messages = [{"role": "user", "content": prompt}]
        else:
            msgs = list(check_messages(prompt))
        system = self._system_text(renders_tools)
        if system and not any(m["role"] == "system" for m in msgs):
            msgs = [{"role": "system", "content": system}, *msgs]
        elif system and self.tools and system != self.system_prompt:  # the tool list joins the given system message
            i = next(k for k, m in enumerate(msgs) if m["role"] == "system")
            msgs[i] = {**msgs[i], "content": f"{msgs[i]['content']}\n\n{self._tools_text()}"}
        return msgs

    def _tools_text(self) -> str:
        from rollwise.models.tool_calls import describe_tools

        return describe_tools(self.tools or [])

    def _tools_in_template(self, tokenizer: Any) -> bool:
        from rollwise.models.tool_calls import template_renders_tools

        return bool(self.tools) and template_renders_tools(tokenizer)

    def _system_text(self, renders_tools: bool) -> str | None:
        """The system prompt, with the tool list after it when the template will not render `tools` itself."""
        if not self.tools or renders_tools:
            return self.system_prompt
        return f"{self.system_prompt}\n\n{self._tools_text()}" if self.system_prompt else self._tools_text()

    def render(self, tokenizer: Any, prompt: Prompt) -> tuple[str, bool]:
        """(prompt text, whether the tokenizer should add its default special tokens when encoding it)."""
        if self.uses_template(tokenizer):
            renders = self._tools_in_template(tokenizer)
            msgs = self.messages(prompt, renders)
            try:
                text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                                     **({"tools": self.tools} if renders else {}))
            except Exception as e:  # noqa: BLE001 - e.g. a template that refuses a system message: one line
                first = (str(e).strip().splitlines() or [""])[0]
                raise ValueError(f"the tokenizer's chat template failed on {[m['role'] for m in msgs]} messages: "
                                 f"{type(e).__name__}: {first}") from None
            return text, False
        if isinstance(prompt, str):
            if self.system_prompt:
                raise ValueError("system_prompt is set but the tokenizer has no chat template to put it in")
            return (f"{self._tools_text()}\n\n{prompt}" if self.tools else prompt), True
        return render_fallback(self.messages(prompt)), False

    def encode(self, tokenizer: Any, prompt: Prompt) -> list[int]:
        """Token ids of `prompt` for generation (see the module docstring for the rules)."""
        if tokenizer is None:
            raise ValueError("text prompts need a tokenizer, and this model has none next to its weights")
        text, add_special = self.render(tokenizer, prompt)
        ids = self._plain_contents(tokenizer, prompt, text, add_special)
        if ids is None:
            ids = list(tokenizer.encode(text, add_special_tokens=add_special))
        if not ids:
            raise ValueError(f"the prompt is empty after tokenization: {str(prompt)[:60]!r}")
        return ids


    def _plain_contents(self, tokenizer: Any, prompt: Prompt, text: str, add_special: bool) -> list[int] | None:
        """Ids of the rendered `text` with the prompt's message contents encoded as plain text (`models.plain_text`:
        an observation or a row holding `<|im_end|>` stays that text); None when no content holds a control token's
        text (the usual case: then the whole text is encoded at once, exactly as `transformers` does), or when the
        template rewrites contents in a way the markers cannot follow (then it is encoded as it is)."""
        from rollwise.models.plain_text import default_prefix, encode_parts, holds_control_text

        contents = [prompt] if isinstance(prompt, str) else [str(m.get("content", "")) for m in prompt]
        if not any(holds_control_text(tokenizer, c) for c in contents):
            return None
        markers = [f"\x00rollwise-content-{i}\x00" for i in range(len(contents))]
        marked: Prompt = (markers[0] if isinstance(prompt, str)
                          else [{**m, "content": k} for m, k in zip(prompt, markers)])
        try:
            marked_text, _ = self.render(tokenizer, marked)
        except ValueError:
            return None
        pieces: list[str] = []
        rest = marked_text
        for k in markers:
            if rest.count(k) != 1:
                return None
            head, rest = rest.split(k, 1)
            pieces.append(head)
        for fill in (contents, [c.strip() for c in contents]):  # e.g. Llama 3's template trims every content
            if "".join(p + c for p, c in zip(pieces, fill)) + rest == text:
                parts = [x for p, c in zip(pieces, fill) for x in ((p, False), (c, True))] + [(rest, False)]
                return (default_prefix(tokenizer) if add_special else []) + encode_parts(tokenizer, parts)
        return None

    def task_encoder(self, tokenizer: Any) -> Any:
        """`encode(task) -> ids` for tasks (anything with `.id` and `.prompt`); an error names the task."""
        def encode_task(task: Any) -> list[int]:
            try:
                return self.encode(tokenizer, task.prompt)
            except ValueError as e:
                raise ValueError(f"task {task.id!r}: {e}") from None

        return encode_task


def encode(tokenizer: Any, prompt: Prompt, fmt: PromptFormat | None = None) -> list[int]:
    """`PromptFormat.encode` with the default format ("auto", no system prompt) unless `fmt` is given."""
    return (fmt or PromptFormat()).encode(tokenizer, prompt)


def end_of_turn_id(tokenizer: Any) -> int | None:
    """The special token the chat template writes right after an assistant message (e.g. `<|im_end|>`), if any."""
    if not has_chat_template(tokenizer):
        return None
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}],
                                             tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot render this probe simply has no detectable end token
        return None
    if _PROBE not in text:
        return None
    rest = text.split(_PROBE, 1)[1]
    ids = tokenizer.encode(rest, add_special_tokens=False) if rest else []
    if not ids:
        return None
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    first = int(ids[0])
    if first in special or (first in decoder and getattr(decoder[first], "special", False)):
        return first
    return None


def _eos_from(path: Path) -> list[int]:
    if not path.is_file():
        return []
    try:
        e = json.loads(path.read_text()).get("eos_token_id")
    except (json.JSONDecodeError, AttributeError):
        return []
    if isinstance(e, int):
        return [e]
    if isinstance(e, list):
        return [int(x) for x in e if isinstance(x, int)]
    return []


def stop_token_ids(tokenizer: Any, model_dir: str | Path | None = None) -> list[int]:
    """Token ids that end generation: the generation config's eos ids (config.json's when there is no
    generation config), the tokenizer's eos, and the chat template's end-of-turn token; sorted, unique."""
    ids: set[int] = set()
    if model_dir is not None:
        d = Path(model_dir)
        ids.update(_eos_from(d / "generation_config.json") or _eos_from(d / "config.json"))
    if tokenizer is not None:
        if isinstance(getattr(tokenizer, "eos_token_id", None), int):
            ids.add(tokenizer.eos_token_id)
        eot = end_of_turn_id(tokenizer)
        if eot is not None:
            ids.add(eot)
    return sorted(ids)
