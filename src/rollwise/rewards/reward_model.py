"""A sequence-classification reward model as a reward: what TRL's `GRPOTrainer(reward_funcs="path")` runs.

The model is an HF `AutoModelForSequenceClassification` with one label; the reward of a completion is that label's
logit on prompt + completion (optionally squashed by a sigmoid). As TRL does, a text prompt is joined to the
completion, and a message-list prompt goes through the reward model's chat template with the completion as the
assistant's turn; the tokenizer adds no special tokens of its own, and a tokenizer without a pad token pads with its
EOS. The model runs in batches, on the CPU by default, without gradients.

NOTE on injection: the completion is encoded as plain text (`models.plain_text`), so a completion holding the text
of a control token (`<|endoftext|>`, `<|im_end|>`) stays those characters. With TRL's own tokenization it would
become the token, and since the model reads the score at the last token that is not padding, a completion ending in
the pad token's text would move where its score is read. Without such text the ids are exactly TRL's.

Deliberately left out: reward models with several labels (TRL reads the first; rollwise refuses them when loaded),
and gradients through the reward model.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rollwise.models.plain_text import encode_parts, holds_control_text
from rollwise.rewards.judge import as_text
from rollwise.types import Score, Task


def _completion_messages(completion: Any) -> list[dict[str, Any]]:
    if isinstance(completion, list):
        return [dict(m) for m in completion]
    return [{"role": "assistant", "content": as_text(completion)}]


def conversation_ids(tokenizer: Any, messages: list[dict[str, Any]], plain_from: int) -> list[int]:
    """Ids of the chat template over `messages` (no generation prompt, as TRL renders a whole conversation), the
    contents of messages[plain_from:] (the completion) encoded as plain text. A template that rewrites those contents
    beyond trimming them is encoded as it renders when they hold no control token's text, and refused otherwise."""
    text = str(tokenizer.apply_chat_template(messages, tokenize=False))
    judged = [str(m.get("content", "")) for m in messages[plain_from:]]
    markers = [f"\x00rollwise-rm-{i}\x00" for i in range(len(judged))]
    marked = [*messages[:plain_from], *({**m, "content": k} for m, k in zip(messages[plain_from:], markers))]
    rest = str(tokenizer.apply_chat_template(marked, tokenize=False))
    pieces: list[str] = []
    ok = True
    for k in markers:
        if rest.count(k) != 1:
            ok = False
            break
        head, rest = rest.split(k, 1)
        pieces.append(head)
    if ok:
        for fill in (judged, [c.strip() for c in judged]):
            if "".join(p + c for p, c in zip(pieces, fill)) + rest == text:
                parts = [x for p, c in zip(pieces, fill) for x in ((p, False), (c, True))] + [(rest, False)]
                return encode_parts(tokenizer, parts)
    if any(holds_control_text(tokenizer, c) for c in judged):
        raise ValueError("the reward model's chat template rewrites the completion, which holds a control token's "
                         "text: it cannot be encoded as plain text")
    return list(tokenizer.encode(text, add_special_tokens=False))


def input_ids(tokenizer: Any, task: Task, completion: Any) -> list[int]:
    """What the reward model reads for one sample (see the module docstring)."""
    if isinstance(task.prompt, list):
        messages = [*task.prompt, *_completion_messages(completion)]
        return conversation_ids(tokenizer, messages, len(task.prompt))
    return encode_parts(tokenizer, [(as_text(task.prompt), False), (as_text(completion), True)])


@dataclass
class SequenceClassifierReward:
    """Rewards from a loaded sequence-classification model and its tokenizer (`rewards.model_rewards` loads them)."""

    model: Any
    """An HF `*ForSequenceClassification` module with one label, in eval mode."""
    tokenizer: Any
    name: str = "reward_model"
    normalize: str = "none"
    """'none' (the raw logit, TRL's) or 'sigmoid'."""
    batch_size: int = 8
    max_length: int | None = None
    """Tokens read per sequence (None: the model's max_position_embeddings)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.normalize not in ("none", "sigmoid"):
            raise ValueError(f"normalize must be 'none' or 'sigmoid', got {self.normalize!r}")
        labels = int(getattr(self.model.config, "num_labels", 1))
        if labels != 1:
            raise ValueError(f"the reward model has {labels} labels; a reward model has one (its logit is the reward)")
        if self.tokenizer.pad_token_id is None and self.tokenizer.eos_token is not None:
            self.tokenizer.pad_token = self.tokenizer.eos_token  # as TRL does
        text_cfg = self.model.config.get_text_config() if hasattr(self.model.config, "get_text_config") else self.model.config
        text_cfg.pad_token_id = self.tokenizer.pad_token_id  # where the model reads each sequence's last token
        if self.max_length is None:
            self.max_length = int(getattr(text_cfg, "max_position_embeddings", 0) or 2048)

    def _logits(self, seqs: list[list[int]]) -> list[float]:
        import torch

        pad = self.tokenizer.pad_token_id
        step = self.batch_size if pad is not None else 1  # without a pad token only one sequence fits a batch
        out: list[float] = []
        device = next(self.model.parameters()).device
        with self._lock, torch.inference_mode():
            for s in range(0, len(seqs), step):
                chunk = seqs[s:s + step]
                width = max(len(x) for x in chunk)
                ids = torch.full((len(chunk), width), pad if pad is not None else 0, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for r, x in enumerate(chunk):
                    ids[r, :len(x)] = torch.tensor(x, dtype=torch.long)
                    mask[r, :len(x)] = 1
                logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
                out += [float(v) for v in logits[:, 0].float().cpu()]
        return out

    def score_batch(self, tasks: Sequence[Task], completions: Sequence[Any],
                    completion_ids: Sequence[Sequence[int]] | None = None) -> list[Score]:
        """The reward model's score of each completion, in order. Raises when the model fails (the caller errors
        those samples); a sample that cannot be encoded is errored alone."""
        out: list[Score | None] = [None] * len(tasks)
        seqs: list[list[int]] = []
        cut: list[bool] = []
        asked: list[int] = []
        limit = int(self.max_length or 2048)
        for i, (task, completion) in enumerate(zip(tasks, completions)):
            try:
                ids = input_ids(self.tokenizer, task, completion)
            except ValueError as e:
                out[i] = Score(0.0, error=f"{self.name}: {e}")
                continue
            if not ids:
                out[i] = Score(0.0, error=f"{self.name}: prompt and completion are empty")
                continue
            cut.append(len(ids) > limit)
            seqs.append(ids[:limit])
            asked.append(i)
        if seqs:
            for i, logit, was_cut in zip(asked, self._logits(seqs), cut):
                if not math.isfinite(logit):
                    out[i] = Score(0.0, error=f"{self.name}: the reward model's logit is {logit!r}")
                    continue
                value = 1.0 / (1.0 + math.exp(-logit)) if self.normalize == "sigmoid" else logit
                info: dict[str, Any] = {"logit": logit}
                if was_cut:
                    info["truncated_to"] = limit
                out[i] = Score(value, parts={self.name: value}, info=info)
        return [s if s is not None else Score(0.0, error="not scored") for s in out]

    def __call__(self, task: Task, completion: Any) -> Score:
        return self.score_batch([task], [completion])[0]


def load_reward_model(model_dir: str, tokenizer_dir: str | None = None, *, device: str = "cpu",
                      **kwargs: Any) -> SequenceClassifierReward:
    """A `SequenceClassifierReward` from HF directories (`AutoModelForSequenceClassification`, num_labels=1 as TRL
    loads it; float32, eval mode). kwargs: the dataclass's other fields (name, normalize, batch_size, max_length)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32)
    model.eval().to(device)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir or model_dir)
    return SequenceClassifierReward(model, tok, **kwargs)


__all__ = ["SequenceClassifierReward", "conversation_ids", "input_ids", "load_reward_model"]
