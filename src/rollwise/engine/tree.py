"""Tree rollouts in the engine: a request's `n` samples grow as a tree, sharing the KV of their common beginnings.

The plan (`TreeSpec.parents`) is fixed when the request arrives: slot j's parent slot, and which of the parent's
branch points gives birth to it (the parent's k-th branch point births its k-th chunk of `fanout - 1` children).
Only the roots are scheduled at first. Every time a tree sample is about to sample output position L, the engine
(`EngineCore._branch`) decides from that sample's own past whether L is its next branch point (`TreeSpec`: entropy at or over the
threshold inside the window, else the window's end). If it is, the chunk's children are forked right there: they
share the parent's full KV blocks and get a copy of its partial last block (`BlockManager.fork`, copy-on-write as
for a prompt's siblings), and each samples its own token at L from the same logits row with its own seed. That
token costs no forward row: a branch is free, and every shared token is computed once.

Why each sample is, marginally, an ordinary sample of the policy (tested by `test_every_leaf_is_an_ordinary_sample_of_the_policy`): which slot
forks from which is fixed in advance, and a branch position is a stopping time of the parent's own prefix (it
depends on nothing after it and on no other sample). The child's continuation from L is drawn from the policy given
the prefix, exactly as the parent's own continuation is, so the child has the parent's law, which is the policy's.
A parent that ends before a child's branch point hands the child a copy of itself (`tree_fork` = its length; no
generation): again the policy's law. Selecting *which* parent branches by comparing samples would break this, which
is why the plan is fixed.

Pure bookkeeping except `entropy` (a torch reduction over the step's logits rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rollwise.engine.sequence import Sequence
from rollwise.types import TreeSpec


def entropy(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Next-token entropy in nats of softmax(logits / T) per row. logits [R, V], temperature [R] (> 0) -> [R].

    The temperature-scaled distribution, before top-k / top-p: the branch rule asks how unsure the policy is,
    and truncation is a sampling choice made after that."""
    lp = torch.log_softmax(logits.float() / temperature[:, None].float(), dim=-1)  # [R, V]
    return -(lp.exp() * lp).sum(dim=-1)


@dataclass
class SlotState:
    """One sample of a tree request: where its current window starts and which of its children come next."""

    seq: Sequence
    parent: int | None
    chunks: list[list[int]]  # this slot's children, one chunk per branch point, in order
    next_chunk: int = 0
    window_start: int = 0  # output position of this slot's last branch (or birth); windows count from here
    first_window: bool = True  # a root's first window may branch at its very first token
    born: bool = False
    fork: int | None = None  # output position where its own tokens start (None for roots)


@dataclass(eq=False)
class TreeState:
    """The plan and progress of one tree request (`EngineCore` keeps one per request with `params.tree`)."""

    spec: TreeSpec
    slots: list[SlotState] = field(default_factory=list)

    @classmethod
    def plan(cls, spec: TreeSpec, seqs: list[Sequence]) -> TreeState:
        parents = spec.parents(len(seqs))
        slots = [SlotState(seq, p, []) for seq, p in zip(seqs, parents)]
        per_parent: dict[int, list[int]] = {}
        for j, p in enumerate(parents):
            if p is not None:
                per_parent.setdefault(p, []).append(j)
        step = spec.fanout - 1
        for p, kids in per_parent.items():
            slots[p].chunks = [kids[i:i + step] for i in range(0, len(kids), step)]
        for s in slots:
            s.born = s.parent is None
        st = cls(spec, slots)
        for j, s in enumerate(slots):
            s.seq.tree = (st, j)  # how the engine finds a sequence's tree and slot
        return st

    @property
    def roots(self) -> list[Sequence]:
        return [s.seq for s in self.slots if s.parent is None]

    @property
    def num_unborn(self) -> int:
        return sum(1 for s in self.slots if not s.born)

    # ------------------------------------------------------------------ the branch rule
    def wants_entropy(self, slot: int) -> bool:
        """Whether deciding this slot's next position needs the entropy of its logits row."""
        s = self.slots[slot]
        return self.spec.branch == "entropy" and s.next_chunk < len(s.chunks)

    def branches_at(self, slot: int, pos: int, ent: float | None) -> bool:
        """Whether the slot's output position `pos` (about to be sampled) is its next branch point."""
        s = self.slots[slot]
        if s.next_chunk >= len(s.chunks):
            return False
        seg = self.spec.segment_tokens
        if s.first_window and self.spec.first_segment_tokens is not None:
            seg = self.spec.first_segment_tokens
        end = s.window_start + seg
        if pos >= end:  # the window's end (also reached past it after a preemption: branch now)
            return True
        if self.spec.branch == "fixed":
            return False
        first = s.window_start if s.first_window else s.window_start + 1
        return pos >= first and ent is not None and ent >= self.spec.entropy_threshold

    def take_chunk(self, slot: int, pos: int) -> list[int]:
        """The children born at the slot's branch point `pos`; the parent's next window starts there too."""
        s = self.slots[slot]
        kids = s.chunks[s.next_chunk]
        s.next_chunk += 1
        s.window_start = pos
        s.first_window = False
        for k in kids:
            c = self.slots[k]
            c.born = True
            c.fork = pos
            c.window_start = pos
            c.first_window = False
        return kids

    def orphans(self, slot: int) -> list[int]:
        """The slot's children not yet born when it ended, and theirs, in slot order: they become copies of it."""
        s = self.slots[slot]
        out: list[int] = []
        for chunk in s.chunks[s.next_chunk:]:
            for k in chunk:
                if not self.slots[k].born:
                    out.append(k)
        s.next_chunk = len(s.chunks)
        return out

    def parent_of(self, slot: int) -> int | None:
        return self.slots[slot].parent

    def fork_of(self, slot: int) -> int | None:
        return self.slots[slot].fork
