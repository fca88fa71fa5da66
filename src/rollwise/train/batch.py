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

Shared prompts (`share_prompt=True`, the default): the samples of a GRPO group have the same prompt ids, and under
causal attention a prompt's hidden states do not depend on what follows it. So the rollouts are grouped by their
exact prompt ids and each group becomes one `Segment` of the row: the prompt ONCE, then every sample's completion,
each completion at positions P, P+1, ... and attending to the whole prompt plus its own earlier tokens. The
log-probs are those of the per-sequence forward (same positions, same keys and values), and the gradient reaches
the prompt's computation once, summed over the group's samples, which is what the chain rule gives anyway. A
group's first completion token of every sample is predicted by the same logit row (the prompt's last position).
A group too large for `micro_batch_tokens` is split over several segments, each with its own copy of the prompt.
Rollouts whose prompts differ are simply groups of one. The trainer runs a segment row with per-segment attention
(`rollwise.train.attention`), never a dense [L, L] mask; `attention_mask()` builds the equivalent dense mask for
tests and for attention implementations that want one.

NOTE on cost: with the dense block-diagonal mask (sdpa/eager) a row's attention costs O(L^2), not sum of l_i^2, so
a long row full of short sequences wastes attention work: keep `micro_batch_tokens` modest on CPU (a 128-hidden,
3-layer model with 128 sequences of ~18 tokens: one 4096-token row 1.39 s per step, 256-token rows 0.55 s).
Flash-attention (position_ids only, no dense mask) has no such cost.

NOTE: the row holds no padding, and positions restart per sequence (per segment with shared prompts); that is what makes the packed log-probs
equal to per-sequence log-probs (HF Llama takes positions from `position_ids`, not from the mask: FINDINGS.md).

Deliberately left out: splitting one long sequence over rows (context parallelism) and padding to fixed shapes
for CUDA graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rollwise.types import Rollout


@dataclass(frozen=True)
class Segment:
    """One prompt shared by `len(seq_ids)` completions, laid out at row offset `start`: the prompt's `prompt_len`
    tokens, then each completion (`comp_lens[i]` tokens of sequence `seq_ids[i]`) back to back."""

    start: int
    prompt_len: int
    seq_ids: tuple[int, ...]
    comp_lens: tuple[int, ...]

    @property
    def length(self) -> int:
        return self.prompt_len + sum(self.comp_lens)

    def mask(self) -> torch.Tensor:
        """[S, S] bool, True = may attend: causal in the prompt; a completion sees the whole prompt and its own
        earlier tokens, never another completion."""
        p, n = self.prompt_len, self.length
        owner = torch.full((n,), -1, dtype=torch.long)  # -1 = prompt token
        o = p
        for k, c in enumerate(self.comp_lens):
            owner[o:o + c] = k
            o += c
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        return causal & ((owner[:, None] == owner[None, :]) | (owner[None, :] < 0))


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
    # shared-prompt rows only: the row's segments in order (they tile it); seq_index is -1 on shared prompt tokens
    segments: list[Segment] | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def attention_mask(self) -> torch.Tensor:
        """Dense mask, True = may attend. [L] -> [1, 1, L, L] bool: block-diagonal causal over sequences, or over
        segments (with their prompt/completion structure) for a shared-prompt row."""
        if self.segments is not None:
            n = self.num_tokens
            out = torch.zeros(n, n, dtype=torch.bool)
            for sg in self.segments:
                out[sg.start:sg.start + sg.length, sg.start:sg.start + sg.length] = sg.mask()
            return out[None, None]
        s = self.seq_index
        same = s[:, None] == s[None, :]  # [L, L]
        causal = torch.ones(len(s), len(s), dtype=torch.bool, device=s.device).tril()  # [L, L]
        return (same & causal)[None, None]

    def to(self, device: torch.device | str) -> PackedMicroBatch:
        return PackedMicroBatch(
            input_ids=self.input_ids.to(device), position_ids=self.position_ids.to(device),
            seq_index=self.seq_index.to(device), seq_ids=list(self.seq_ids),
            pred_positions=self.pred_positions.to(device), target_ids=self.target_ids.to(device),
            target_seq=self.target_seq.to(device), target_tok=self.target_tok.to(device), segments=self.segments,
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
    share_prompt: bool = True  # micro_batches hold shared-prompt segments (see the module docstring)

    @classmethod
    def from_rollouts(cls, rollouts: Sequence[Rollout], micro_batch_tokens: int, *, share_prompt: bool = True) -> TrainBatch:
        """Lay out `rollouts` (each with `advantage` set) and pack them into micro-batches (rollouts with identical
        prompt ids share one prompt per segment unless `share_prompt=False`).

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
                          [list(r.weight_versions) for r in rollouts], share_prompt)

    @classmethod
    def _build(cls, tokens: list[list[int]], prompt_lens: list[int], old: torch.Tensor, mask: torch.Tensor,
               advantages: torch.Tensor, comp_lens: torch.Tensor, micro_batch_tokens: int,
               weight_versions: list[list[int]], share_prompt: bool) -> TrainBatch:
        if share_prompt:
            micro = _pack_segments(tokens, prompt_lens, micro_batch_tokens)
        else:
            bins = pack_first_fit_decreasing([len(t) for t in tokens], micro_batch_tokens)
            micro = [_pack_row(tokens, prompt_lens, ids) for ids in bins]
        return cls(tokens=tokens, prompt_lens=prompt_lens, old_logprobs=old, loss_mask=mask, advantages=advantages,
                   completion_lens=comp_lens, micro_batches=micro, micro_batch_tokens=micro_batch_tokens,
                   weight_versions=weight_versions, share_prompt=share_prompt)

    def with_layout(self, share_prompt: bool) -> TrainBatch:
        """The same batch repacked with or without shared prompts (self when it already has that layout)."""
        if share_prompt == self.share_prompt:
            return self
        return self._build(self.tokens, self.prompt_lens, self.old_logprobs, self.loss_mask, self.advantages,
                           self.completion_lens, self.micro_batch_tokens, self.weight_versions, share_prompt)

    @property
    def num_sequences(self) -> int:
        return len(self.tokens)

    @property
    def num_tokens(self) -> int:
        """Prompt + completion tokens of all sequences (what an unshared forward runs on)."""
        return sum(len(t) for t in self.tokens)

    @property
    def row_tokens(self) -> int:
        """Tokens the model actually runs on: the packed rows' lengths (fewer than num_tokens with shared prompts)."""
        return sum(mb.num_tokens for mb in self.micro_batches)

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
                           [self.weight_versions[i] for i in idx] if self.weight_versions else [], self.share_prompt)


class _Row:
    """Accumulates one packed row (tokens, positions, owners) and its completion targets; `build` makes the tensors."""

    def __init__(self) -> None:
        self.inp: list[int] = []
        self.pos: list[int] = []
        self.seq: list[int] = []
        self.pred: list[int] = []
        self.tgt: list[int] = []
        self.tseq: list[int] = []
        self.ttok: list[int] = []

    def tokens(self, ids: list[int], first_pos: int, owner: int) -> int:
        """Append `ids` at positions first_pos, first_pos+1, ...; returns the row offset of the first one."""
        off = len(self.inp)
        self.inp.extend(ids)
        self.pos.extend(range(first_pos, first_pos + len(ids)))
        self.seq.extend([owner] * len(ids))
        return off

    def target(self, pred: int, token: int, seq: int, k: int) -> None:
        self.pred.append(pred)
        self.tgt.append(token)
        self.tseq.append(seq)
        self.ttok.append(k)

    def build(self, seq_ids: list[int], segments: list[Segment] | None = None) -> PackedMicroBatch:
        long = torch.long
        return PackedMicroBatch(
            input_ids=torch.tensor(self.inp, dtype=long), position_ids=torch.tensor(self.pos, dtype=long),
            seq_index=torch.tensor(self.seq, dtype=long), seq_ids=seq_ids,
            pred_positions=torch.tensor(self.pred, dtype=long), target_ids=torch.tensor(self.tgt, dtype=long),
            target_seq=torch.tensor(self.tseq, dtype=long), target_tok=torch.tensor(self.ttok, dtype=long),
            segments=segments,
        )


def _pack_row(tokens: list[list[int]], prompt_lens: list[int], ids: list[int]) -> PackedMicroBatch:
    """Concatenate sequences `ids` into one row and index their completion targets."""
    row = _Row()
    for i in ids:
        toks, p = tokens[i], prompt_lens[i]
        start = row.tokens(toks, 0, i)
        # completion token k sits at start + p + k and is predicted by the logits one position earlier
        for k in range(len(toks) - p):
            row.target(start + p + k - 1, toks[p + k], i, k)
    return row.build(list(ids))


def _pack_segments(tokens: list[list[int]], prompt_lens: list[int], capacity: int) -> list[PackedMicroBatch]:
    """Group sequences by identical prompt ids into segments (prompt once + completions, at most `capacity` tokens
    unless a single sequence is longer), then first-fit-decreasing the segments into rows."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, t in enumerate(tokens):
        groups.setdefault(tuple(t[:prompt_lens[i]]), []).append(i)
    segs: list[tuple[int, list[int]]] = []  # (prompt_len, seq ids)
    for key, ids in groups.items():
        p = len(key)
        cur: list[int] = []
        load = p
        for i in ids:
            c = len(tokens[i]) - p
            if cur and load + c > capacity:
                segs.append((p, cur))
                cur, load = [], p
            cur.append(i)
            load += c
        segs.append((p, cur))
    lengths = [p + sum(len(tokens[i]) - p for i in ids) for p, ids in segs]
    rows = []
    for bin_ in pack_first_fit_decreasing(lengths, capacity):
        rows.append(_pack_segment_row(tokens, [segs[b] for b in bin_]))
    return rows


def _pack_segment_row(tokens: list[list[int]], segs: list[tuple[int, list[int]]]) -> PackedMicroBatch:
    row = _Row()
    seq_ids: list[int] = []
    segments: list[Segment] = []
    for p, ids in segs:
        start = row.tokens(tokens[ids[0]][:p], 0, -1)  # the shared prompt, owned by no single sequence
        last_prompt = start + p - 1
        for i in ids:
            comp = tokens[i][p:]
            off = row.tokens(comp, p, i)
            # completion token k is predicted by the logits of the token before it: the shared prompt's last
            # position for k = 0, the completion's own token k - 1 after that
            for k, t in enumerate(comp):
                row.target(last_prompt if k == 0 else off + k - 1, t, i, k)
        seq_ids.extend(ids)
        segments.append(Segment(start=start, prompt_len=p, seq_ids=tuple(ids),
                                comp_lens=tuple(len(tokens[i]) - p for i in ids)))
    return row.build(seq_ids, segments)
