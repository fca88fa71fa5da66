"""Supervised fine-tuning on demonstrations: data, rendering, and the loss, as pure pieces the SFT stage composes.

A demonstration is one JSONL line `{"messages": [...]}` in the OpenAI / transformers chat format: system / user
messages, assistant turns (with `content` and optionally `tool_calls`), `tool`-role results. It is rendered by
`models.turns.ChatTurns.render_conversation`, the renderer multi-turn rollouts use, so the tokens SFT trains on are
laid out exactly as a rollout with the same text would be: the prompt (the messages before the first assistant
turn, through `PromptFormat` with the same system prompt and tools), then each assistant turn (loss mask 1, its
end-of-turn token included) and each environment turn (loss mask 0).

The SFT update is the trainer's ordinary `train_step` with `sft_loss`: the token-mean negative log-likelihood of
the assistant tokens (every sequence carries advantage 1 so none is skipped; behaviour log-probs are not used).
The trainer is algorithm-blind; SFT is one more loss function.

Deliberately left out: packing several demonstrations' prompts (each is its own sequence; the trainer packs rows),
per-turn loss weights, and datasets other than JSONL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from rollwise.types import Rollout

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.train.losses import LossConfig

DemoMessages = list[dict[str, Any]]
_ROLES = ("system", "user", "assistant", "tool")


class DemoError(ValueError):
    """A demonstration file or line that cannot be used; one line naming the file and the line."""


def _render_errors() -> tuple[type[BaseException], ...]:
    """What rendering a demonstration raises on a bad one: the renderer's own errors and the chat template's."""
    errors: tuple[type[BaseException], ...] = (ValueError, KeyError, TypeError)
    try:
        from jinja2 import TemplateError  # the chat template's `raise_exception`, a template that cannot render it
    except ImportError:  # pragma: no cover - transformers brings jinja2
        return errors
    return (*errors, TemplateError)


_RENDER_ERRORS: tuple[type[BaseException], ...] = (*_render_errors(), RecursionError)


MAX_DEPTH = 64
"""How deeply a demonstration line may nest (lists and objects); a chat message needs a handful of levels, and a
line nested thousands deep would take down the JSON parser or the chat template with a RecursionError."""


@dataclass
class DemoFile:
    """The demonstrations of one file, in file order, with the line each came from (for errors naming it)."""

    path: Path
    messages: list[DemoMessages]
    lines: list[int]
    """1-based line number of each demonstration in `path`."""

    def where(self, i: int) -> str:
        """'FILE: line N' of demonstration i (0-based)."""
        return f"{self.path}: line {self.lines[i]}"


def _too_deep(value: Any, limit: int) -> bool:
    """Whether `value` nests lists/objects more than `limit` levels (iterative: safe at any depth)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            if d > limit:
                return True
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def _tool_call_problem(calls: Any) -> str | None:
    """Why an assistant message's `tool_calls` is unusable, or None: a list of {"function": {"name", "arguments"}}
    objects (or the flat {"name", "arguments"}), arguments an object or a JSON string."""
    if not isinstance(calls, list):
        return f"tool_calls must be a list of calls, not a JSON {_json_type(calls)}"
    for k, call in enumerate(calls):
        if not isinstance(call, dict):
            return f"tool call {k} must be an object with a function, not {_json_type(call)}"
        fn = call.get("function", call)
        if not isinstance(fn, dict):
            return f"tool call {k}: its function must be an object with a name, not {_json_type(fn)}"
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            return f"tool call {k} needs a function name (a string)"
        if "arguments" in fn and not isinstance(fn["arguments"], (dict, str)):
            return f"tool call {k} arguments must be an object or a JSON string, not {_json_type(fn['arguments'])}"
    return None


def _json_type(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number" if isinstance(v, (int, float)) else type(v).__name__)


def _message_problem(i: int, m: Any) -> str | None:
    """Why message i of a demonstration is unusable, or None."""
    if not isinstance(m, dict) or m.get("role") not in _ROLES:
        return f"message {i} needs a role in {list(_ROLES)}"
    if m["role"] != "assistant":
        return None if isinstance(m.get("content"), str) else f"message {i} ({m['role']}) needs string content"
    if m.get("content") is not None and not isinstance(m["content"], str):
        return f"assistant message {i} content must be a string, not {_json_type(m['content'])}"
    calls = m.get("tool_calls")
    if calls is not None and (problem := _tool_call_problem(calls)) is not None:
        return f"assistant message {i}: {problem}"
    if not (isinstance(m.get("content"), str) or calls):
        return f"assistant message {i} needs content or tool_calls"
    return None


def read_demos(path: str | Path) -> DemoFile:
    """Every demonstration of a JSONL file with its line number (one-line errors name the file and line)."""
    p = Path(path)
    if not p.is_file():
        raise DemoError(f"sft.path {str(p)!r} does not exist")
    out, lines = [], []
    with open(p, encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{p}: line {lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DemoError(f"{where}: not valid JSON ({e.msg})") from None
            except RecursionError:
                raise DemoError(f"{where}: nested more than {MAX_DEPTH} levels deep") from None
            if _too_deep(rec, MAX_DEPTH):
                raise DemoError(f"{where}: nested more than {MAX_DEPTH} levels deep")
            msgs = rec.get("messages") if isinstance(rec, dict) else None
            if not isinstance(msgs, list) or not msgs:
                raise DemoError(f'{where}: expected {{"messages": [...]}} with a non-empty message list')
            for i, m in enumerate(msgs):
                if (problem := _message_problem(i, m)) is not None:
                    raise DemoError(f"{where}: {problem}")
            out.append(msgs)
            lines.append(lineno)
    if not out:
        raise DemoError(f"{p}: no demonstrations")
    return DemoFile(p, out, lines)


def load_demos(path: str | Path) -> list[DemoMessages]:
    """Every demonstration's messages, in file order (one-line errors name the file and line)."""
    return read_demos(path).messages


@dataclass
class RenderedDemo:
    """One demonstration as ids: `prompt_ids` then `completion_ids` with `loss_mask` (1 = assistant token)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]


class ConversationRenderer(Protocol):
    """What rendering demonstrations asks of `models.turns.ChatTurns`."""

    def render_conversation(self, messages: DemoMessages) -> tuple[list[int], list[int], list[int]]: ...


def render_demos(demos: list[DemoMessages] | DemoFile, turns: ConversationRenderer,
                 where: str = "sft.path") -> list[RenderedDemo]:
    """Each demonstration through `turns` (`models.turns.ChatTurns`); an error names the demonstration (its file
    and line when given a `DemoFile`)."""
    msgs_list = demos.messages if isinstance(demos, DemoFile) else demos
    out = []
    for i, msgs in enumerate(msgs_list):
        try:
            p, ids, mask = turns.render_conversation(msgs)
        except _RENDER_ERRORS as e:
            at = demos.where(i) if isinstance(demos, DemoFile) else f"{where}: demonstration {i + 1}"
            text = " ".join(str(e).split()) or type(e).__name__
            raise DemoError(f"{at}: {text}") from None
        out.append(RenderedDemo(p, ids, mask))
    return out


def demo_rollouts(demos: list[RenderedDemo], tag: str = "sft") -> list[Rollout]:
    """Demonstrations as trainer input: advantage 1, behaviour log-probs 0 (unused by `sft_loss`)."""
    return [Rollout(prompt_id=f"{tag}/{i}", group_id=f"{tag}/{i}", sample_index=0, prompt_token_ids=d.prompt_ids,
                    completion_token_ids=d.completion_ids, logprobs=[0.0] * len(d.completion_ids),
                    weight_versions=[0] * len(d.completion_ids), loss_mask=d.loss_mask, advantage=1.0)
            for i, d in enumerate(demos)]


def sft_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
             cfg: LossConfig | None = None, ref_logprobs: torch.Tensor | None = None, prox_logprobs: torch.Tensor | None = None,
             entropy: torch.Tensor | None = None, num_sequences: int | None = None,
             num_tokens: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean negative log-likelihood of the masked (assistant) tokens.

    logprobs [B, T] (with grad), mask [B, T] 0/1; num_tokens: loss tokens in the whole mini-batch (so summing
    micro-batch losses gives the full-batch loss). The other arguments are the loss protocol's, unused here."""
    m = mask.to(logprobs.dtype)
    denom = float(num_tokens) if num_tokens else max(float(m.sum()), 1.0)
    loss = -(logprobs * m).sum() / denom
    with torch.no_grad():
        n = max(float(m.sum()), 1.0)
        nll = float(-(logprobs * m).sum() / n)
        metrics = {"loss": float(loss.detach()), "nll": nll}
        if entropy is not None:
            metrics["entropy"] = float((entropy * m).sum() / n)
    return loss, metrics


__all__ = ["DemoError", "DemoFile", "RenderedDemo", "demo_rollouts", "load_demos", "read_demos", "render_demos", "sft_loss"]
