"""`TrainBatch`: scored rollouts laid out for the trainer, with sequences packed into padding-free micro-batches.

Two layouts live side by side, because the model and the loss want different ones:

- per sequence, completion-aligned, right-padded to T = the longest completion (what the losses take):
  `old_logprobs`, `loss_mask` `[B, T]` and `advantages` `[B]`;
- packed (what the model runs on): each `PackedMicroBatch` is ONE row of whole sequences (prompt + completion)
  concatenated, at most `micro_batch_tokens` long, with `position_ids` restarting at 0 for every sequence and
  `seq_index` saying which sequence each token belongs to. The trainer turns `seq_index` into a block-diagonal
  causal attention mask, so attention never crosses a sequence boundary, and scatters the row's log-probs back
  into the `[B, T]` layout with the `target_*` index tensors.

Packing is first-fit decreasing over whole sequences: no padding at all and few rows. A sequence longer than
`micro_batch_tokens` gets a row of its own (it cannot be split without changing its log-probs).

NOTE on cost: with the dense block-diagonal mask (sdpa/eager) a row's attention costs O(L^2), not sum of l_i^2, so
a long row full of short sequences wastes attention work: keep `micro_batch_tokens` modest on CPU (a 128-hidden,
3-layer model with 128 sequences of ~18 tokens: one 4096-token row 1.39 s per step, 256-token rows 0.55 s).
Flash-attention (position_ids only, no dense mask) has no such cost.

NOTE: the row holds no padding, and positions restart per sequence; that is what makes the packed log-probs
equal to per-sequence log-probs (HF Llama takes positions from `position_ids`, not from the mask: FINDINGS.md).

Deliberately left out: splitting one long sequence over rows (context parallelism) and padding to fixed shapes
for CUDA graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rollwise.types import Rollout


@dataclass
class PackedMicroBatch:
    """One forward/backward pass: whole sequences concatenated into one row of L tokens (no padding)."""

    input_ids: torch.Tensor  # [L] long: prompt + completion of each packed sequence, back to back
    position_ids: torch.Tensor  # [L] long: 0, 1, ... restarting at each sequence start
    seq_index: torch.Tensor  # [L] long: batch index of the sequence each token belongs to
    seq_ids: list[int]  # batch indices of the packed sequences, in row order
    pred_positions: torch.Tensor  # [N] long: row positions whose logits predict a completion token
    target_ids: torch.Tensor  # [N] long: the completion token predicted at pred_positions
    target_seq: torch.Tensor  # [N] long: batch index of each target's sequence
    target_tok: torch.Tensor  # [N] long: index of each target within its completion (column of the [B, T] layout)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def attention_mask(self) -> torch.Tensor:
        """Block-diagonal causal mask, True = may attend. [L] -> [1, 1, L, L] bool."""
        s = self.seq_index
        same = s[:, None] == s[None, :]  # [L, L]
        causal = torch.ones(len(s), len(s), dtype=torch.bool, device=s.device).tril()  # [L, L]
        return (same & causal)[None, None]

    def to(self, device: torch.device | str) -> PackedMicroBatch:
        return PackedMicroBatch(
            input_ids=self.input_ids.to(device), position_ids=self.position_ids.to(device),
            seq_index=self.seq_index.to(device), seq_ids=list(self.seq_ids),
            pred_positions=self.pred_positions.to(device), target_ids=self.target_ids.to(device),
            target_seq=self.target_seq.to(device), target_tok=self.target_tok.to(device),
        )


def pack_first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bin-pack item indices by length into bins of at most `capacity` (oversize items get their own bin).

    First-fit decreasing: longest first, each into the first bin with room. Within a bin, indices keep the order
    they were placed in. Ties are broken by index, so the result is deterministic.
    """
    if capacity < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1, got {capacity}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        n = lengths[i]
        for b, load in enumerate(loads):
            if load + n <= capacity:
                bins[b].append(i)
                loads[b] += n
                break
        else:
            bins.append([i])
            loads.append(n)
    return bins


@dataclass
class TrainBatch:
    """Scored rollouts ready for `Trainer.train_step`. Build with `TrainBatch.from_rollouts`."""

    tokens: list[list[int]]  # B sequences: prompt + completion token ids
    prompt_lens: list[int]  # [B]
    old_logprobs: torch.Tensor  # [B, T] float32 behaviour log-probs from the engine, 0 on padding
    loss_mask: torch.Tensor  # [B, T] float32, 1 = a policy token to train on, 0 = env token or padding
    advantages: torch.Tensor  # [B] float32, one per sequence
    completion_lens: torch.Tensor  # [B] long
    micro_batches: list[PackedMicroBatch]
    micro_batch_tokens: int
    weight_versions: list[list[int]] = field(default_factory=list)  # [B][T_i] engine weight version per token

    @classmethod
    def from_rollouts(cls, rollouts: Sequence[Rollout], micro_batch_tokens: int) -> TrainBatch:
        """Lay out `rollouts` (each with `advantage` set) and pack them into micro-batches.

        Errors are one line and name the offending rollout: a missing advantage, lengths that disagree, or an
        empty prompt (the first completion token must be predicted from something).
        """
        if not rollouts:
            raise ValueError("TrainBatch.from_rollouts: no rollouts to train on")
        tokens, prompt_lens, comps, lps, masks, advs = [], [], [], [], [], []
        for r in rollouts:
            who = f"rollout {r.group_id}/{r.sample_index}"
            n = len(r.completion_token_ids)
            if r.advantage is None:
                raise ValueError(f"{who} has no advantage: compute advantages before building a TrainBatch")
            if len(r.logprobs) != n or len(r.loss_mask) != n:
                raise ValueError(f"{who}: {n} completion tokens but {len(r.logprobs)} logprobs and {len(r.loss_mask)} loss_mask entries")
            if not r.prompt_token_ids:
                raise ValueError(f"{who} has an empty prompt: the first completion token needs a prompt token before it")
            tokens.append(list(r.prompt_token_ids) + list(r.completion_token_ids))
            prompt_lens.append(len(r.prompt_token_ids))
            comps.append(n)
            lps.append(r.logprobs)
            masks.append(r.loss_mask)
            advs.append(float(r.advantage))
        t_max = max(max(comps), 1)
        b = len(rollouts)
        old = torch.zeros(b, t_max, dtype=torch.float32)  # [B, T]
        mask = torch.zeros(b, t_max, dtype=torch.float32)  # [B, T]
        for i in range(b):
            if comps[i]:
                old[i, : comps[i]] = torch.tensor(lps[i], dtype=torch.float32)
                mask[i, : comps[i]] = torch.tensor(masks[i], dtype=torch.float32)
        # NOTE: a behaviour log-prob is only meaningful on policy tokens; zero it elsewhere (env tokens carry 0.0
        # by convention, and a stray value there must not reach a ratio).
        old = old * (mask > 0)
        return cls._build(tokens, prompt_lens, old, mask, torch.tensor(advs, dtype=torch.float32),
                          torch.tensor(comps, dtype=torch.long), micro_batch_tokens,
                          [list(r.weight_versions) for r in rollouts])

    @classmethod
    def _build(cls, tokens: list[list[int]], prompt_lens: list[int], old: torch.Tensor, mask: torch.Tensor,
               advantages: torch.Tensor, comp_lens: torch.Tensor, micro_batch_tokens: int,
               weight_versions: list[list[int]]) -> TrainBatch:
        bins = pack_first_fit_decreasing([len(t) for t in tokens], micro_batch_tokens)
        micro = [_pack_row(tokens, prompt_lens, ids) for ids in bins]
        return cls(tokens=tokens, prompt_lens=prompt_lens, old_logprobs=old, loss_mask=mask, advantages=advantages,
                   completion_lens=comp_lens, micro_batches=micro, micro_batch_tokens=micro_batch_tokens,
                   weight_versions=weight_versions)

    @property
    def num_sequences(self) -> int:
        return len(self.tokens)

    @property
    def num_tokens(self) -> int:
        """Tokens the model runs on (prompt + completion, all sequences): the packed rows hold exactly these."""
        return sum(len(t) for t in self.tokens)

    @property
    def max_completion_len(self) -> int:
        return int(self.old_logprobs.shape[1])

    def subset(self, indices: Sequence[int]) -> TrainBatch:
        """A batch of the sequences at `indices` (in that order), repacked. Used for PPO-style mini-batches."""
        idx = list(indices)
        if not idx:
            raise ValueError("TrainBatch.subset: empty index list")
        t_max = max(max(int(self.completion_lens[i]) for i in idx), 1)
        sel = torch.tensor(idx, dtype=torch.long)
        return self._build([self.tokens[i] for i in idx], [self.prompt_lens[i] for i in idx],
                           self.old_logprobs[sel, :t_max].clone(), self.loss_mask[sel, :t_max].clone(),
                           self.advantages[sel].clone(), self.completion_lens[sel].clone(), self.micro_batch_tokens,
                           [self.weight_versions[i] for i in idx] if self.weight_versions else [])


def _pack_row(tokens: list[list[int]], prompt_lens: list[int], ids: list[int]) -> PackedMicroBatch:
    """Concatenate sequences `ids` into one row and index their completion targets."""
    inp: list[int] = []
    pos: list[int] = []
    seq: list[int] = []
    pred: list[int] = []
    tgt: list[int] = []
    tseq: list[int] = []
    ttok: list[int] = []
    for i in ids:
        start = len(inp)
        toks = tokens[i]
        p = prompt_lens[i]
        inp.extend(toks)
        pos.extend(range(len(toks)))
        seq.extend([i] * len(toks))
        # completion token k sits at start + p + k and is predicted by the logits one position earlier
        for k in range(len(toks) - p):
            pred.append(start + p + k - 1)
            tgt.append(toks[p + k])
            tseq.append(i)
            ttok.append(k)
    long = torch.long
    return PackedMicroBatch(
        input_ids=torch.tensor(inp, dtype=long), position_ids=torch.tensor(pos, dtype=long),
        seq_index=torch.tensor(seq, dtype=long), seq_ids=list(ids),
        pred_positions=torch.tensor(pred, dtype=long), target_ids=torch.tensor(tgt, dtype=long),
        target_seq=torch.tensor(tseq, dtype=long), target_tok=torch.tensor(ttok, dtype=long),
    )
