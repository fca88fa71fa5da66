"""Paged KV-cache bookkeeping: which physical block holds which part of which sequence.

The idea (vLLM's PagedAttention, nano-vllm's block manager): the KV cache is a pool of fixed-size blocks;
a sequence owns a list of block ids (its block table). Blocks are reference counted so that

- the `n` samples of one prompt share the prompt's full blocks (fork), and only the last, partially filled
  prompt block is copied (copy-on-write, done once right after the prefill);
- identical prompt prefixes across requests are served from cache: every *full* block gets a hash chained
  from its predecessor, and a later sequence whose full blocks hash the same reuses them.

Freed blocks keep their hash and stay findable until the pool hands them out again (LRU order), so a
preempted sequence or a repeated prompt often finds its prefix still there. `reset_prefix_cache()` forgets
every hash: after a weight update the cached KV no longer matches what the new weights would compute.

Weight epochs: `reset_prefix_cache()` also starts a new epoch, and every block remembers the epoch its KV was
written in. A sequence that was running across the reset keeps its old-epoch KV (it continues under the new
weights), and even the blocks it fills afterwards attend to that old KV, so a block is registered only when it
and every block before it in the sequence were written in the current epoch.

NOTE invariants: a block with ref_count > 1 is always full, so no shared block is ever written; a block in
the free list has ref_count 0; `hash_to_block[h] == b` implies `block_hash[b] == h` and
`block_epoch[b] == epoch` (only KV of the current weights is ever findable).

Pure bookkeeping: no torch.
"""

from __future__ import annotations

from collections import OrderedDict

from rollwise.engine.sequence import Sequence


class NoFreeBlocksError(RuntimeError):
    pass


def chain_hash(prev: int, tokens: list[int]) -> int:
    """Hash of a full block given its predecessor's hash: equal chains mean equal prefixes."""
    return hash((prev, tuple(tokens)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"BlockManager needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_token_ids: list[tuple[int, ...] | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        self.epoch = 0  # bumped by reset_prefix_cache (a weight load)
        self.block_epoch = [0] * num_blocks  # epoch in which each block's KV was (or is being) written
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.num_prefix_hits = 0  # blocks served from the prefix cache (for metrics)
        self.num_prefix_queries = 0

    # ------------------------------------------------------------------ queries
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def _lookup(self, h: int, tokens: list[int]) -> int | None:
        b = self.hash_to_block.get(h)
        if b is None or self.block_token_ids[b] != tuple(tokens):
            return None
        return b

    def blocks_to_allocate(self, seq: Sequence) -> int:
        """Fresh blocks `allocate(seq)` would take from the pool (prefix hits on free blocks count too)."""
        n = seq.num_blocks_needed(self.block_size)
        if not self.enable_prefix_caching:
            return n
        hits = self._prefix_hits(seq)
        # A hit on a block that sits in the free list still removes it from the pool.
        return n - sum(1 for b in hits if self.ref_count[b] > 0)

    def can_allocate(self, seq: Sequence, extra_blocks: int = 0) -> bool:
        return self.blocks_to_allocate(seq) + extra_blocks <= self.num_free_blocks

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        bs = self.block_size
        # Never serve the whole sequence from cache: the last token must be computed to get logits.
        max_full = (len(seq) - 1) // bs
        hits: list[int] = []
        h = 0
        for i in range(max_full):
            toks = seq.block_tokens(i, bs)
            h = chain_hash(h, toks)
            b = self._lookup(h, toks)
            if b is None:
                break
            hits.append(b)
        return hits

    # ------------------------------------------------------------------ mutation
    def _take_free_block(self) -> int:
        if not self.free:
            raise NoFreeBlocksError("KV cache has no free block")
        b, _ = self.free.popitem(last=False)
        old = self.block_hash[b]
        if old is not None and self.hash_to_block.get(old) == b:
            del self.hash_to_block[old]
        self.block_hash[b] = None
        self.block_token_ids[b] = None
        self.block_epoch[b] = self.epoch  # its KV is written from now on, under the current weights
        self.ref_count[b] = 1
        return b

    def _ref(self, b: int) -> None:
        if self.ref_count[b] == 0:
            del self.free[b]
        self.ref_count[b] += 1

    def _register(self, b: int, h: int, tokens: list[int]) -> None:
        assert self.block_epoch[b] == self.epoch, "registering KV computed under older weights"
        self.block_hash[b] = h
        self.block_token_ids[b] = tuple(tokens)
        self.hash_to_block[h] = b

    def allocate(self, seq: Sequence, register: bool = True) -> None:
        """Give `seq` a block table covering all its tokens, reusing cached full blocks of its prefix.

        register: hash its new full blocks now (their KV is computed in this very step). False for a prompt that is
        prefilled in chunks: the scheduler registers each chunk's blocks in the step that computes them."""
        assert not seq.block_table, "sequence already has blocks"
        bs = self.block_size
        hits = self._prefix_hits(seq) if self.enable_prefix_caching else []
        if self.enable_prefix_caching:
            self.num_prefix_queries += (len(seq) - 1) // bs
            self.num_prefix_hits += len(hits)
        need = seq.num_blocks_needed(bs) - sum(1 for b in hits if self.ref_count[b] > 0)
        if need > self.num_free_blocks:
            raise NoFreeBlocksError(f"need {need} blocks, {self.num_free_blocks} free")
        h = 0
        for i in range(seq.num_blocks_needed(bs)):
            toks = seq.block_tokens(i, bs)
            full = len(toks) == bs
            if full:
                h = chain_hash(h, toks)
            if i < len(hits):
                self._ref(hits[i])
                seq.block_table.append(hits[i])
                continue
            b = self._take_free_block()
            if full and register and self.enable_prefix_caching:
                # Its KV is computed in this very step, before anyone else can read it.
                self._register(b, h, toks)
            seq.block_table.append(b)
        seq.num_cached_tokens = len(hits) * bs

    def fork(self, parent: Sequence, child: Sequence) -> tuple[int, int] | None:
        """Make `child` share `parent`'s blocks. Returns a (src, dst) block copy to run after the
        parent's prefill when the last block is partial (copy-on-write), else None."""
        assert not child.block_table and len(child) == len(parent)
        bs = self.block_size
        n_full = len(parent) // bs
        for b in parent.block_table[:n_full]:
            self._ref(b)
            child.block_table.append(b)
        child.num_cached_tokens = parent.num_cached_tokens
        if len(parent.block_table) > n_full:
            dst = self._take_free_block()
            self.block_epoch[dst] = self.block_epoch[parent.block_table[n_full]]  # a copy of the parent's KV
            child.block_table.append(dst)
            return (parent.block_table[n_full], dst)
        return None

    def can_append(self, seq: Sequence, extra: int = 0) -> bool:
        """Whether the token about to be computed for `seq` (its last one), and `extra` draft positions after it,
        have slots."""
        return self.blocks_to_append(seq, extra) <= self.num_free_blocks

    def blocks_to_append(self, seq: Sequence, extra: int = 0) -> int:
        """Fresh blocks `append_slot(seq, extra)` would take."""
        bs = self.block_size
        return max(0, -(-(len(seq) + extra) // bs) - len(seq.block_table))

    def append_slot(self, seq: Sequence, extra: int = 0) -> None:
        """Ensure the block table covers all tokens of `seq` plus `extra` draft positions (once per decode step).

        NOTE: draft positions land in the sequence's own partial last block or in fresh blocks (a shared block is
        always full, so never written); the KV of rejected positions is overwritten when those positions are
        computed for real, and `trim` hands back blocks left beyond the sequence."""
        bs = self.block_size
        while len(seq.block_table) * bs < len(seq) + extra:
            seq.block_table.append(self._take_free_block())

    def trim(self, seq: Sequence) -> None:
        """Free the blocks past the ones covering `seq`'s tokens (left over from rejected draft positions). They are
        the sequence's own, unshared and unregistered (registration stops at computed tokens)."""
        keep = seq.num_blocks_needed(self.block_size)
        while len(seq.block_table) > keep:
            b = seq.block_table.pop()
            assert self.ref_count[b] == 1 and self.block_hash[b] is None, "trimming a shared or registered block"
            self.ref_count[b] = 0
            self.free[b] = None

    def register_full_blocks(self, seq: Sequence, upto_tokens: int) -> None:
        """Hash blocks that became full by decoding, so a preempted or resumed sequence finds them.

        Stops at the first block written before the current epoch: it and everything after it in this
        sequence hold (or attended to) KV of older weights."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        n_full = min(upto_tokens // bs, len(seq.block_table))
        h = 0
        for i in range(n_full):
            toks = seq.block_tokens(i, bs)
            h = chain_hash(h, toks)
            b = seq.block_table[i]
            if self.block_epoch[b] != self.epoch:
                return
            if self.block_hash[b] is None and h not in self.hash_to_block:
                self._register(b, h, toks)

    def free_seq(self, seq: Sequence) -> None:
        for b in reversed(seq.block_table):
            self.ref_count[b] -= 1
            assert self.ref_count[b] >= 0
            if self.ref_count[b] == 0:
                self.free[b] = None
        seq.block_table = []
        seq.num_cached_tokens = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix and start a new weight epoch (after a weight update). Blocks in use stay
        valid for their owners but are never registered again."""
        self.epoch += 1
        self.hash_to_block.clear()
        self.block_hash = [None] * self.num_blocks
        self.block_token_ids = [None] * self.num_blocks
