"""`TrainBatch`: scored rollouts laid out for the trainer, with sequences packed into padding-free micro-batches.

Two layouts live side by side, because the model and the loss want different ones:

- per sequence, completion-aligned, right-padded to T = the longest completion (what the losses take):
  `old_logprobs`, `loss_mask` `[B, T]` and `advantages` `[B]` (or `[B, T]` when the rollouts carry per-token
  advantages, `Rollout.token_advantages`: 0 past each completion);
- packed (what the model runs on): each `PackedMicroBatch` is ONE row of whole sequences (prompt + completion)
  concatenated, at most `micro_batch_tokens` long, with `position_ids` restarting at 0 for every sequence and
  `seq_index` saying which sequence each token belongs to. The trainer turns `seq_index` into a block-diagonal
  causal attention mask, so attention never crosses a sequence boundary, and scatters the row's log-probs back
  into the `[B, T]` layout with the `target_*` index tensors.

Packing is first-fit decreasing over whole sequences: no padding at all and few rows. A sequence longer than
`micro_batch_tokens` gets a row of its own (it cannot be split without changing its log-probs).

Shared prefixes (`share_prompt=True`, the default): the samples of a GRPO group have the same prompt ids, and
under causal attention a prefix's hidden states do not depend on what follows it. So the rollouts are grouped by
their exact prompt ids and each group becomes one `Segment` of the row: the prompt ONCE, then the group's
completions laid out as a trie, each distinct completion prefix ONCE (a tree rollout's trunk, or two independent
samples that happen to start alike). Trie nodes are in depth-first preorder, so a node's subtree is a contiguous
range of the segment and its mask is ancestor-or-self: a token attends to the prompt, its ancestors and itself,
at position = its depth (prompt 0..P-1, completion token k at P+k). Keys, values and positions are those of the
per-sequence forward, so the log-probs are too, and the gradient reaches a shared prefix's computation once,
summed over the sequences below it, which is what the chain rule gives anyway. Completion token k of a sequence
is predicted by the row of its token k-1's node (the prompt's last token for k = 0), so several targets (of
sequences that share a prefix) may share one logit row; the loss is still taken per sequence on those logits.
A group whose trie is too large for `micro_batch_tokens` is split by sequences (sorted, so that sequences sharing
a prefix stay together) over several segments, each with its own copy of the prompt. Rollouts whose prompts differ
are simply groups of one. The trainer runs a segment row with per-segment attention (`rollwise.train.attention`),
never a dense [L, L] mask; `attention_mask()` builds the equivalent dense mask for tests and for attention
implementations that want one.

NOTE on cost: with the dense block-diagonal mask (sdpa/eager) a row's attention costs O(L^2), not sum of l_i^2, so
a long row full of short sequences wastes attention work: keep `micro_batch_tokens` modest on CPU (a 128-hidden,
3-layer model with 128 sequences of ~18 tokens: one 4096-token row 1.39 s per step, 256-token rows 0.55 s).
Flash-attention (position_ids only, no dense mask) has no such cost.

NOTE: the row holds no padding, and positions restart per sequence (per segment, as trie depths, with shared
prefixes); that is what makes the packed log-probs equal to per-sequence log-probs (HF Llama takes positions from
`position_ids`, not from the mask).

Deliberately left out: splitting one long sequence over rows (context parallelism), padding to fixed shapes for
CUDA graphs, and sharing a prefix across different prompts (a common system prompt): the trie starts below the
group's exact prompt ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rollwise.types import Rollout


@dataclass(frozen=True)
class Segment:
    """One prompt shared by the completions of `seq_ids`, laid out at row offset `start` as a tree of
    `length` tokens: the prompt's `prompt_len` tokens (a chain), then the completions' trie in depth-first preorder.

    `parent[j]` is the segment-local index of token j's parent (-1 for the first prompt token; j - 1 inside the
    prompt; the prompt's last token for a completion's first token), so `parent[j] < j` and a token's position is
    its depth. `comp_lens[i]` is the completion length of sequence `seq_ids[i]` (its tokens may be shared)."""

    start: int
    prompt_len: int
    seq_ids: tuple[int, ...]
    comp_lens: tuple[int, ...]
    parent: tuple[int, ...]  # [S]

    @property
    def length(self) -> int:
        return len(self.parent)

    def subtree_ends(self) -> list[int]:
        """[S]: one past the last token of each token's subtree (preorder: a subtree is the range [j, end[j]))."""
        n = self.length
        end = list(range(1, n + 1))
        for j in range(n - 1, 0, -1):  # children come after their parent: fold each subtree's end upwards
            p = self.parent[j]
            if end[j] > end[p]:
                end[p] = end[j]
        return end

    def mask(self) -> torch.Tensor:
        """[S, S] bool, True = may attend: ancestor-or-self. Causal in the prompt; a completion token sees the whole
        prompt, its trie ancestors and itself, never a token of another branch. In preorder, j is an ancestor-or-self
        of i exactly when j <= i < end[j]."""
        idx = torch.arange(self.length)
        end = torch.tensor(self.subtree_ends(), dtype=torch.long)
        return (idx[:, None] >= idx[None, :]) & (idx[:, None] < end[None, :])


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
    # shared-prefix rows only: the row's segments in order (they tile it); seq_index is -1 on tokens several
    # sequences share (the prompt, a common completion prefix)
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

    def scatter(self, values: torch.Tensor, width: int) -> torch.Tensor:
        """[N] per-target values (log-probs, a critic's values) -> [len(seq_ids), width] in the row's sequence order,
        completion-aligned, 0 elsewhere; differentiable."""
        local = {sid: r for r, sid in enumerate(self.seq_ids)}
        rows = torch.tensor([local[int(s)] for s in self.target_seq.tolist()], dtype=torch.long, device=values.device)
        out = torch.zeros(len(self.seq_ids), width, dtype=values.dtype, device=values.device)
        return out.index_put((rows, self.target_tok.to(values.device)), values)

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
    advantages: torch.Tensor  # [B] float32, one per sequence; or [B, T] per token (0 past each completion)
    completion_lens: torch.Tensor  # [B] long
    micro_batches: list[PackedMicroBatch]
    micro_batch_tokens: int
    weight_versions: list[list[int]] = field(default_factory=list)  # [B][T_i] engine weight version per token
    share_prompt: bool = True  # micro_batches hold shared-prompt segments (see the module docstring)

    @classmethod
    def from_rollouts(cls, rollouts: Sequence[Rollout], micro_batch_tokens: int, *, share_prompt: bool = True) -> TrainBatch:
        """Lay out `rollouts` (each with `advantage` set, or all with `token_advantages`: then `advantages` is
        [B, T]) and pack them into micro-batches (rollouts with identical prompt ids share one prompt and their
        common completion prefixes per segment unless `share_prompt=False`).

        Errors are one line and name the offending rollout: a missing advantage, per-token advantages on some
        rollouts only, lengths that disagree, or an empty prompt (the first completion token must be predicted from
        something).
        """
        if not rollouts:
            raise ValueError("TrainBatch.from_rollouts: no rollouts to train on")
        # An agent episode of several segments is several sequences sharing its advantage (`Rollout.sequences`).
        rollouts = [s for r in rollouts for s in r.sequences()]
        per_token = rollouts[0].token_advantages is not None
        tokens, prompt_lens, comps, lps, masks, advs, tok_advs = [], [], [], [], [], [], []
        for r in rollouts:
            who = f"rollout {r.group_id}/{r.sample_index}"
            n = len(r.completion_token_ids)
            if (r.token_advantages is not None) != per_token:
                first = f"rollout {rollouts[0].group_id}/{rollouts[0].sample_index}"
                raise ValueError(f"{who} {'has no' if per_token else 'has'} token_advantages but {first} "
                                 f"{'has' if per_token else 'has none'}: a batch takes per-token advantages on "
                                 "every rollout or on none")
            if r.token_advantages is not None:
                if len(r.token_advantages) != n:
                    raise ValueError(f"{who}: {n} completion tokens but {len(r.token_advantages)} token_advantages")
                tok_advs.append(r.token_advantages)
            elif r.advantage is None:
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
            advs.append(float(r.advantage) if r.advantage is not None else 0.0)
        t_max = max(max(comps), 1)
        b = len(rollouts)
        old = torch.zeros(b, t_max, dtype=torch.float32)  # [B, T]
        mask = torch.zeros(b, t_max, dtype=torch.float32)  # [B, T]
        adv = torch.zeros(b, t_max, dtype=torch.float32) if per_token else torch.tensor(advs, dtype=torch.float32)
        for i in range(b):
            if comps[i]:
                old[i, : comps[i]] = torch.tensor(lps[i], dtype=torch.float32)
                mask[i, : comps[i]] = torch.tensor(masks[i], dtype=torch.float32)
                if per_token:
                    adv[i, : comps[i]] = torch.tensor(tok_advs[i], dtype=torch.float32)
        # NOTE: a behaviour log-prob is only meaningful on policy tokens; zero it elsewhere (env tokens carry 0.0
        # by convention, and a stray value there must not reach a ratio).
        old = old * (mask > 0)
        return cls._build(tokens, prompt_lens, old, mask, adv,
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
        """Tokens the model actually runs on: the packed rows' lengths (with shared prefixes: each segment's prompt
        plus its distinct completion prefixes, the trie's nodes; fewer than num_tokens)."""
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
        adv = self.advantages[sel] if self.advantages.ndim == 1 else self.advantages[sel, :t_max]
        return self._build([self.tokens[i] for i in idx], [self.prompt_lens[i] for i in idx],
                           self.old_logprobs[sel, :t_max].clone(), self.loss_mask[sel, :t_max].clone(),
                           adv.clone(), self.completion_lens[sel].clone(), self.micro_batch_tokens,
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


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def _pack_segments(tokens: list[list[int]], prompt_lens: list[int], capacity: int) -> list[PackedMicroBatch]:
    """Group sequences by identical prompt ids into segments (prompt once + the completions' trie, at most
    `capacity` tokens unless a single sequence is longer), then first-fit-decreasing the segments into rows.

    NOTE: a group's sequences are taken in lexicographic order of their completions, so the sequences that share
    a prefix are neighbours (the longest prefix a completion shares with any earlier one is the one it shares with
    the one just before it), a split keeps them together where it can, and the trie comes out in preorder."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, t in enumerate(tokens):
        groups.setdefault(tuple(t[:prompt_lens[i]]), []).append(i)
    segs: list[tuple[int, list[int], int]] = []  # (prompt_len, seq ids in trie order, segment length)
    for key, ids in groups.items():
        p = len(key)
        cur: list[int] = []
        load = p
        prev: list[int] = []
        for i in sorted(ids, key=lambda i: (tokens[i][p:], i)):
            comp = tokens[i][p:]
            new = len(comp) - _lcp(prev, comp)  # trie nodes this sequence adds
            if cur and load + new > capacity:
                segs.append((p, cur, load))
                cur, load, new = [], p, len(comp)
            cur.append(i)
            load += new
            prev = comp
        segs.append((p, cur, load))
    rows = []
    for bin_ in pack_first_fit_decreasing([n for _, _, n in segs], capacity):
        rows.append(_pack_segment_row(tokens, [segs[b][:2] for b in bin_]))
    return rows


def _pack_segment_row(tokens: list[list[int]], segs: list[tuple[int, list[int]]]) -> PackedMicroBatch:
    """Lay out each segment (prompt, then its sequences' completions as a trie, in the given order) and index the
    targets. A trie node's `seq_index` is its sequence, or -1 when several sequences share it (as the prompt)."""
    row = _Row()
    seq_ids: list[int] = []
    segments: list[Segment] = []
    for p, ids in segs:
        start = row.tokens(tokens[ids[0]][:p], 0, -1)  # the shared prompt, owned by no single sequence
        parent = list(range(-1, p - 1))  # segment-local; the prompt is a chain
        prev: list[int] = []
        path: list[int] = []  # segment-local node of each completion token of the previous sequence
        for i in ids:
            comp = tokens[i][p:]
            shared = _lcp(prev, comp)
            for j in path[:shared]:
                row.seq[start + j] = -1  # a node of several sequences
            off = row.tokens(comp[shared:], p + shared, i) - start  # the new nodes: a chain below the shared prefix
            above = path[shared - 1] if shared else p - 1
            parent.extend([above] + list(range(off, off + len(comp) - shared - 1)) if len(comp) > shared else [])
            path = path[:shared] + list(range(off, off + len(comp) - shared))
            # completion token k is predicted by the logits of the node of its token k - 1: the prompt's last
            # position for k = 0; sequences sharing that prefix share the row
            for k, t in enumerate(comp):
                row.target(start + (path[k - 1] if k else p - 1), t, i, k)
            prev = comp
        seq_ids.extend(ids)
        segments.append(Segment(start=start, prompt_len=p, seq_ids=tuple(ids),
                                comp_lens=tuple(len(tokens[i]) - p for i in ids), parent=tuple(parent)))
    return row.build(seq_ids, segments)
