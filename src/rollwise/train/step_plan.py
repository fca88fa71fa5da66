"""What one `Trainer.train_step` works through: per mini-batch, the sequences this rank runs and the whole
mini-batch's loss normalisers; the step's fixed log-probs (reference, proximal); and which sequences carry a
gradient at all."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rollwise.train.batch import TrainBatch


@dataclass(frozen=True)
class MiniBatchPlan:
    """One mini-batch (one optimiser step) as this rank trains it."""

    idx: list[int]
    """Indices into the step's batch of the sequences this rank runs."""
    batch: TrainBatch | None
    """Their sub-batch; None when this rank runs none of the mini-batch."""
    num_sequences: int
    """Sequences with a loss token in the WHOLE mini-batch (before skipping or splitting): the loss normaliser."""
    num_tokens: int
    """Loss tokens of the whole mini-batch: the loss normaliser."""


@dataclass(frozen=True)
class StepInputs:
    """The mini-batch plans of one step and the log-probs its losses hold fixed ([B, T] over the whole batch)."""

    plans: list[MiniBatchPlan]
    dropped: int
    """Sequences skipped for carrying no gradient."""
    mini_batches: int
    ref: torch.Tensor | None
    """Reference-policy log-probs (KL penalty), on the sequences this rank trains."""
    prox: torch.Tensor | None
    """Proximal-policy log-probs (decoupled loss with several updates), on the sequences this rank trains."""


@dataclass(frozen=True)
class MiniBatchTensors:
    """One mini-batch's per-sequence tensors on the trainer's device, [b, width] (advantages [b] or [b, width])."""

    width: int
    old: torch.Tensor
    mask: torch.Tensor
    adv: torch.Tensor
    ref: torch.Tensor | None
    prox: torch.Tensor | None
    fresh: torch.Tensor | None = None
    """[b, width] 1.0 on tokens the engine generated at the trainer's own weight version (their behaviour log-probs
    must equal the trainer's up to precision: `Trainer.train_step`'s fresh_version), else 0; None: none asked."""


def fresh_tokens(mini: TrainBatch, version: int) -> torch.Tensor:
    """[b, T] float: 1.0 where a completion token's recorded weight version is `version`, 0 elsewhere (older
    tokens of asynchronous, partial or replayed rollouts, padding)."""
    out = torch.zeros(mini.num_sequences, mini.max_completion_len, dtype=torch.float32)
    for i, versions in enumerate(mini.weight_versions):
        row = torch.tensor(versions[: out.shape[1]], dtype=torch.long)
        out[i, : len(row)] = (row == version).float()
    return out


def with_gradient(mini: TrainBatch) -> list[int]:
    """The sequences of `mini` that can move the weights when the loss has no KL term.

    NOTE: without a KL term every loss here is a sum of advantage x (ratio term): a sequence whose advantages are
    all 0 (a GRPO group with equal rewards) or that has no loss token adds exactly 0 to the loss and to the
    gradient, so it need not run through the model at all. (Per-token advantages, [b, T]: a sequence counts by
    its loss tokens' advantages only.) When none is left the shortest sequence with a loss token is kept anyway:
    its gradient is exactly 0 too, and the step still reports entropy and the trainer-vs-engine log-prob gap (a
    weight-sync check) for its tokens.
    """
    adv_rows = (mini.advantages if mini.advantages.ndim == 1
                else (mini.advantages.abs() * (mini.loss_mask > 0)).amax(dim=1))
    has_tok = [float(mini.loss_mask[j].sum()) > 0 for j in range(mini.num_sequences)]
    keep = [j for j in range(mini.num_sequences) if float(adv_rows[j]) != 0.0 and has_tok[j]]
    if not keep and any(has_tok):
        lens = mini.completion_lens
        keep = [min((j for j in range(mini.num_sequences) if has_tok[j]), key=lambda j: int(lens[j]))]
    return keep
