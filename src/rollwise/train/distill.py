"""On-policy distillation: a frozen teacher scores every token the policy sampled, and the per-token reverse KL is
the advantage.

The idea (Agarwal et al. 2024, GKD; Thinking Machines' "On-Policy Distillation", 2025): the policy samples as in RL,
the teacher's log-prob of each sampled token is one forward over the finished sequences, and

    A_t = coef * (log pi_teacher(y_t) - log pi_policy(y_t)) + reward_weight * A_task        on policy tokens, else 0

where log pi_policy is the behaviour log-prob the engine recorded for the token (the distribution it was sampled
from) and A_task the task reward's advantage (`algo.advantage`, one per sequence or per token). The first term is
minus a one-sample estimate of the reverse KL, KL(pi_policy || pi_teacher), at that position: a policy-gradient
step on it lowers the reverse KL (mode-seeking: the policy learns where the teacher puts its mass, on the states
it visits itself). Every sampled token gets a signal, where a sparse reward gives one per sequence; so a group whose
rewards are all equal still trains (the Filter room keeps it: `filter.FilterRules.teacher_signal`).

Both log-probs are of the same sampling transform: the teacher's logits / rollout.temperature, truncated by the same
top-k / top-p as the policy's (`train.logprobs`), so the KL compares the distribution the policy samples from with
the one the teacher would sample from under the same settings (at temperature 1 without truncation, the models'
own distributions). Environment tokens of a multi-turn episode (loss mask 0) get no advantage: they are context
for both models, never the policy's choice.

The teacher runs beside the trainer (`Trainer(distill=...)`), loaded as the policy is and frozen, its forward in the
trainer's precision; the advantage arithmetic and the tokenizer check are pure functions here, tested against a
loop-by-loop reference (tests/train/test_distill.py).

Deliberately left out: the full-vocabulary KL (it needs the policy's whole distribution in the loss, not one
sampled token's log-prob), forward KL on teacher samples (off-policy), several teachers, a teacher on an inference
server, and teachers with another tokenizer (their tokens would have to be aligned by text): the run is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class DistillOptions:
    """What the trainer takes of `algo.distill` (`config.DistillConfig`)."""

    teacher: str
    """The teacher model (a checkpoint dir, a .gguf file, a known name or a hub id; `models.convert.resolve_model`)."""
    coef: float = 1.0
    """Weight of the reverse-KL advantage."""
    reward_weight: float = 0.0
    """Weight of the task reward's advantage added to it."""

    @classmethod
    def from_config(cls, distill: Any) -> DistillOptions | None:
        """From a `config.DistillConfig` (duck-typed); None when no teacher is set."""
        teacher = getattr(distill, "teacher", None)
        if teacher is None:
            return None
        return cls(str(teacher), float(distill.coef), float(distill.reward_weight))


def distill_advantages(old_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor,
                       task_advantages: torch.Tensor, *, coef: float, reward_weight: float) -> torch.Tensor:
    """Per-token advantages of on-policy distillation (see the module docstring).

    old_logprobs, teacher_logprobs, mask: [B, T] (behaviour log-probs of the sampled tokens, the teacher's, 1 on
    policy tokens); task_advantages: [B] (one per sequence) or [B, T]. -> [B, T] float32, 0 where mask is 0.
    """
    if old_logprobs.shape != teacher_logprobs.shape or old_logprobs.shape != mask.shape:
        raise ValueError(f"distill_advantages: shapes differ: old {tuple(old_logprobs.shape)}, teacher "
                         f"{tuple(teacher_logprobs.shape)}, mask {tuple(mask.shape)}")
    task = task_advantages.to(torch.float32)
    if task.ndim == 1:
        task = task[:, None]  # [B, 1]: the sequence's advantage on each of its tokens
    elif task.shape != old_logprobs.shape:
        raise ValueError(f"distill_advantages: task advantages {tuple(task.shape)} are neither [B] nor [B, T] = "
                         f"{tuple(old_logprobs.shape)}")
    kl = old_logprobs.to(torch.float32) - teacher_logprobs.to(torch.float32)  # [B, T] one-sample reverse KL
    on = (mask > 0).to(torch.float32)
    return (-coef * kl + reward_weight * task) * on


def distill_metrics(old_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The step's `distill_reverse_kl` (mean over policy tokens of log pi_policy - log pi_teacher: the reverse KL
    estimate, falling as the policy moves toward the teacher) and `distill_teacher_logprob` (the teacher's mean
    log-prob of the sampled tokens). [B, T] each; {} without a policy token."""
    on = mask > 0
    n = int(on.sum())
    if n == 0:
        return {}
    kl = (old_logprobs.float() - teacher_logprobs.float())[on]
    return {"distill_reverse_kl": float(kl.sum()) / n, "distill_teacher_logprob": float(teacher_logprobs.float()[on].sum()) / n}


_SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def tokenizer_mismatch(policy: Any, teacher: Any, prompts: Sequence[tuple[Sequence[int], Sequence[int]]] = ()
                       ) -> str | None:
    """How the teacher's tokenizer differs from the policy's, in one phrase, or None when they agree.

    Checked in order: the vocabulary (every token's id, added tokens included), the special tokens' ids, and
    `prompts`: pairs (the policy's prompt ids, the teacher's) of the same task, each rendered through its own
    tokenizer's chat template. The teacher scores the policy's token ids, so any difference would score other text.
    """
    pv, tv = _vocab(policy), _vocab(teacher)
    if pv is not None and tv is not None and pv != tv:
        if len(pv) != len(tv):
            return f"its vocabulary has {len(tv)} tokens, the policy's {len(pv)}"
        tok = next(t for t in sorted(pv) if pv.get(t) != tv.get(t))
        return f"token {tok!r} has id {tv.get(tok)} in it and {pv[tok]} in the policy's"
    for attr in _SPECIAL_IDS:
        a, b = getattr(policy, attr, None), getattr(teacher, attr, None)
        if a != b:
            return f"its {attr.removesuffix('_id')} is {b}, the policy's {a}"
    a_ids, b_ids = _special_ids(policy), _special_ids(teacher)
    if a_ids != b_ids:
        return f"its special token ids are {sorted(b_ids)}, the policy's {sorted(a_ids)}"
    for k, (p_ids, t_ids) in enumerate(prompts):
        if list(p_ids) != list(t_ids):
            at = next((i for i, (x, y) in enumerate(zip(p_ids, t_ids)) if x != y), min(len(p_ids), len(t_ids)))
            return (f"its chat template renders training prompt {k} differently (from token {at}: "
                    f"{list(t_ids)[at:at + 4]} against the policy's {list(p_ids)[at:at + 4]})")
    return None


def _vocab(tok: Any) -> Mapping[str, int] | None:
    get = getattr(tok, "get_vocab", None)
    return dict(get()) if callable(get) else None


def _special_ids(tok: Any) -> set[int]:
    return {int(i) for i in getattr(tok, "all_special_ids", None) or ()}
