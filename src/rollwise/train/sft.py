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


def load_demos(path: str | Path) -> list[DemoMessages]:
    """Every demonstration's messages, in file order (one-line errors name the file and line)."""
    p = Path(path)
    if not p.is_file():
        raise DemoError(f"sft.path {str(p)!r} does not exist")
    out = []
    with open(p, encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{p}: line {lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DemoError(f"{where}: not valid JSON ({e.msg})") from None
            msgs = rec.get("messages") if isinstance(rec, dict) else None
            if not isinstance(msgs, list) or not msgs:
                raise DemoError(f'{where}: expected {{"messages": [...]}} with a non-empty message list')
            for i, m in enumerate(msgs):
                if not isinstance(m, dict) or m.get("role") not in _ROLES:
                    raise DemoError(f"{where}: message {i} needs a role in {list(_ROLES)}")
                if m["role"] != "assistant" and not isinstance(m.get("content"), str):
                    raise DemoError(f"{where}: message {i} ({m['role']}) needs string content")
                if m["role"] == "assistant" and not (isinstance(m.get("content"), str) or m.get("tool_calls")):
                    raise DemoError(f"{where}: assistant message {i} needs content or tool_calls")
            out.append(msgs)
    if not out:
        raise DemoError(f"{p}: no demonstrations")
    return out


@dataclass
class RenderedDemo:
    """One demonstration as ids: `prompt_ids` then `completion_ids` with `loss_mask` (1 = assistant token)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]


class ConversationRenderer(Protocol):
    """What rendering demonstrations asks of `models.turns.ChatTurns`."""

    def render_conversation(self, messages: DemoMessages) -> tuple[list[int], list[int], list[int]]: ...


def render_demos(demos: list[DemoMessages], turns: ConversationRenderer, where: str = "sft.path") -> list[RenderedDemo]:
    """Each demonstration through `turns` (`models.turns.ChatTurns`); an error names the demonstration."""
    out = []
    for i, msgs in enumerate(demos):
        try:
            p, ids, mask = turns.render_conversation(msgs)
        except (ValueError, KeyError, TypeError) as e:
            raise DemoError(f"{where}: demonstration {i + 1}: {e}") from None
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


__all__ = ["DemoError", "RenderedDemo", "demo_rollouts", "load_demos", "render_demos", "sft_loss"]
