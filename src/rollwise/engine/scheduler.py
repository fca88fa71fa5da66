"""Continuous-batching scheduler: decides which sequences run in the next forward pass.

NOTE on the scheduling algorithm (deliberately simple, after nano-vllm):
- Each step is either a *prefill* step or a *decode* step. Waiting sequences are prefilled as soon as
  they fit (sequence slots `max_num_seqs`, token budget `max_num_batched_tokens`, free KV blocks), so a
  finished sequence's slot is refilled at the very next step. Otherwise every running sequence decodes one
  token.
- A request with n samples is prefilled once (its leader); the siblings are forked right after, sharing
  the prompt's full blocks; the partial last block is copied (`SchedulerOutput.block_copies`).
- When decoding runs out of KV blocks, the most recently admitted running sequence is preempted: its blocks
  are freed and it goes back to the front of the queue, keeping the tokens it has generated; on
  readmission its prompt plus output is recomputed (prefix cache hits make that cheap). Its sampling stays
  reproducible because the sampler's noise depends on (seed, position) only.
- Speculative rollouts (engine/speculative.py): in a decode step, a sequence whose request carries drafts may get
  up to k draft tokens to verify; they ride in the same batch as extra rows (`SchedulerOutput.drafts`). Draft
  length follows the sample's acceptance rate and the batch size (`speculative.draft_length`): the fewer
  sequences are left, the longer the drafts. Drafts never preempt anyone: a draft gets KV slots only from free
  blocks, and the blocks past the accepted tokens are handed back after the step (`BlockManager.trim`).
- Chunked prefill: a prompt whose uncached tokens exceed the token budget is prefilled in chunks of at most
  `max_num_batched_tokens` tokens, one chunk per step and one such sequence at a time (`prefilling`); nothing is
  sampled until its last chunk, which is batched with other prompts like any prefill (and forks its siblings).
  While a long prompt is being chunked, prefill and decode steps alternate, so the running batch keeps producing
  tokens (a chunk delays each decode step by at most one chunk's forward). The KV of a chunk's full blocks is
  registered in the prefix cache only from the step that computes it.
- Tree rollouts (engine/tree.py): a tree request is admitted with sequence slots for all its samples, the ones not
  yet born included; children are forked by the engine mid-decode and join `running` directly.
- Left out on purpose: mixed prefill/decode batches (a chunk and the decode rows in one forward).

Pure bookkeeping: ids, counts and block ids; the model runner turns a `SchedulerOutput` into tensors.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rollwise.engine.block_manager import BlockManager
from rollwise.engine.sequence import Sequence, SeqStatus
from rollwise.engine.speculative import draft_length
from rollwise.types import FinishReason

if TYPE_CHECKING:  # pragma: no cover - the scheduler only counts a tree's unborn samples
    from rollwise.engine.tree import TreeState


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    """Most sequences in one forward pass (the decode batch size)."""
    max_num_batched_tokens: int = 8192
    """Token budget of one prefill step; a prompt longer than this is prefilled in chunks of this size."""
    max_model_len: int = 2048
    """Longest sequence (prompt + output) allowed; a sample reaching it ends with finish_reason 'length'."""
    spec_overhead_rows: float = 16.0
    """Speculation: the fixed cost of a decode step in units of one extra row (reading the weights once vs one
    more token through them; about 16 for a 135M model on a 2-core CPU, far more on a GPU). Larger = longer
    drafts at a given batch size."""

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"SchedulerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.spec_overhead_rows < 0:
            raise ValueError(f"SchedulerConfig.spec_overhead_rows must be >= 0, got {self.spec_overhead_rows}")


@dataclass
class SchedulerOutput:
    is_prefill: bool
    seqs: list[Sequence]
    """Sequences whose tokens are computed this step (prefill: tokens [num_cached_tokens, len); decode: the last)."""
    sample_seqs: list[Sequence]
    """Sequences that receive a sampled token this step, in order."""
    sample_rows: list[int]
    """For each of `sample_seqs`, the index into `seqs` whose last-token logits it samples from (forks share)."""
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    """(src, dst) KV block copies to run after the forward (copy-on-write of a forked partial block)."""
    num_batched_tokens: int = 0
    drafts: list[list[int]] | None = None
    """Decode only: per sequence of `seqs`, the draft tokens to verify after its last token (None: no drafts)."""
    prefill_ranges: list[tuple[int, int]] | None = None
    """Prefill only: per sequence of `seqs`, the token positions [start, end) computed this step (end < len for a
    chunk that is not the prompt's last: that sequence samples nothing this step)."""


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.bm = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # A sequence between chunks of its prefill: it holds its blocks, is neither waiting nor running.
        self.prefilling: Sequence | None = None
        self._chunk_last = False  # the last step computed a chunk: let the running batch decode next
        # Tree requests admitted (engine/tree.py): their samples not yet born hold sequence slots.
        self._trees: list[TreeState] = []

    # ------------------------------------------------------------------ queue
    def add(self, seq: Sequence) -> None:
        """Queue a sequence. A group leader carries its unforked siblings in `pending_forks`."""
        if len(seq) >= self.config.max_model_len:
            raise ValueError(f"prompt of {len(seq)} tokens leaves no room under max_model_len={self.config.max_model_len}")
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.prefilling is not None)

    @property
    def num_unfinished_seqs(self) -> int:
        pre = self.prefilling
        return (sum(1 + len(s.pending_forks) for s in self.waiting) + len(self.running)
                + (1 + len(pre.pending_forks) if pre is not None else 0))

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> SchedulerOutput | None:
        if self._chunk_last and self.running:  # a long prompt is being chunked: the batch decodes in between
            self._chunk_last = False
            out = self._schedule_decode()
            if out is not None:
                return out
        out = self._schedule_prefill()
        if out is not None:
            return out
        return self._schedule_decode()

    def _schedule_prefill(self) -> SchedulerOutput | None:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        seqs: list[Sequence] = []
        sample_seqs: list[Sequence] = []
        sample_rows: list[int] = []
        copies: list[tuple[int, int]] = []
        ranges: list[tuple[int, int]] = []
        tokens = 0
        self._trees = [t for t in self._trees if t.num_unborn]
        num_running = len(self.running) + sum(t.num_unborn for t in self._trees)
        self._chunk_last = False
        pre = self.prefilling
        if pre is not None:  # continue the chunked prompt first
            start = pre.num_cached_tokens
            end = min(len(pre), start + budget)
            self.bm.register_full_blocks(pre, end)  # their KV is computed in this very step
            if end < len(pre):
                return self._chunk(pre, start, end)
            self.prefilling = None
            tokens = end - start
        queue: list[Sequence] = ([pre] if pre is not None else [])
        while queue or self.waiting:
            resumed = bool(queue)
            seq = queue.pop() if resumed else self.waiting[0]
            tree = seq.tree[0] if seq.tree is not None else None
            new_tree = tree if tree is not None and tree not in self._trees else None  # its first sample admitted
            group = 1 + len(seq.pending_forks) + (new_tree.num_unborn if new_tree is not None else 0)
            if not resumed:
                if num_running + group > cfg.max_num_seqs:
                    break
                # Forked siblings each need one fresh block for the copied partial last block.
                partial = 1 if len(seq) % self.bm.block_size else 0
                extra = partial * len(seq.pending_forks)
                if not self.bm.can_allocate(seq, extra_blocks=extra):
                    break
                long_prompt = len(seq) > budget
                self.bm.allocate(seq, register=not long_prompt)
                new_tokens = len(seq) - seq.num_cached_tokens
                if seqs and tokens + new_tokens > budget:
                    self.bm.free_seq(seq)
                    break
                self.waiting.popleft()
                start = seq.num_cached_tokens
                if long_prompt:
                    end = min(len(seq), start + budget)
                    self.bm.register_full_blocks(seq, end)
                    if end < len(seq):  # only when it is the first of the step (see the check above)
                        return self._chunk(seq, start, end)
                tokens += new_tokens
            ranges.append((seq.num_cached_tokens, len(seq)))
            row = len(seqs)
            seqs.append(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            sample_seqs.append(seq)
            sample_rows.append(row)
            for child in seq.pending_forks:
                cp = self.bm.fork(seq, child)
                if cp is not None:
                    copies.append(cp)
                child.status = SeqStatus.RUNNING
                self.running.append(child)
                sample_seqs.append(child)
                sample_rows.append(row)
            seq.pending_forks = []
            num_running += group
            if new_tree is not None:
                self._trees.append(new_tree)
        if not seqs:
            if self.waiting and not self.running and self.prefilling is None:
                seq = self.waiting[0]
                raise RuntimeError(
                    f"request {seq.request_id!r} cannot be scheduled: it needs {self.bm.blocks_to_allocate(seq)}"
                    f" KV blocks (+ forks) and {1 + len(seq.pending_forks)} sequence slots, but the engine has"
                    f" {self.bm.num_blocks} blocks and max_num_seqs={cfg.max_num_seqs}; raise the KV cache size"
                )
            return None
        return SchedulerOutput(True, seqs, sample_seqs, sample_rows, copies, tokens, prefill_ranges=ranges)

    def _chunk(self, seq: Sequence, start: int, end: int) -> SchedulerOutput:
        """A prefill step computing tokens [start, end) of `seq`'s prompt and sampling nothing."""
        seq.num_cached_tokens = end  # the KV up to `end` is in the cache after this step
        self.prefilling = seq
        self._chunk_last = True
        return SchedulerOutput(True, [seq], [], [], [], end - start, prefill_ranges=[(start, end)])

    def _schedule_decode(self) -> SchedulerOutput | None:
        if not self.running:
            return None
        scheduled: list[Sequence] = []
        # Walk in admission order; preempt from the back (the most recently admitted) when blocks run out.
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            while not self.bm.can_append(seq):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                self.bm.append_slot(seq)
                scheduled.append(seq)
                i += 1
                continue
            break  # seq itself was preempted: everything after it is gone too
        if not scheduled:
            return None
        rows = list(range(len(scheduled)))
        drafts = self._propose_drafts(scheduled)
        n_rows = len(scheduled) + (sum(map(len, drafts)) if drafts else 0)
        return SchedulerOutput(False, scheduled, list(scheduled), rows, [], n_rows, drafts)

    def _propose_drafts(self, scheduled: list[Sequence]) -> list[list[int]] | None:
        """Draft tokens per scheduled sequence (see the module NOTE); None when no sequence speculates."""
        if not any(s.spec is not None for s in scheduled):
            return None
        cfg = self.config
        b = len(scheduled)
        budget = cfg.max_num_batched_tokens - b  # extra rows this step may take
        drafts: list[list[int]] = []
        for seq in scheduled:
            st = seq.spec
            d: list[int] = []
            if st is not None and budget > 0:
                # Rows past max_tokens / max_model_len would only feed tokens the stop check drops.
                k_max = min(st.drafter.spec.k, budget, seq.params.max_tokens - seq.num_output_tokens,
                            cfg.max_model_len - len(seq))
                k = draft_length(st.acceptance, b, cfg.spec_overhead_rows, k_max)
                if k > 0:
                    d = st.drafter.propose(seq, k)
                    while d and not self.bm.can_append(seq, len(d)):
                        d = d[: len(d) // 2]  # only free blocks: a draft never preempts anyone
                    if d:
                        self.bm.append_slot(seq, len(d))
                        budget -= len(d)
            drafts.append(d)
        return drafts

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free_seq(seq)
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    # ------------------------------------------------------------------ results
    def append_token(self, seq: Sequence, token_id: int, logprob: float, weight_version: int) -> None:
        seq.token_ids.append(token_id)
        seq.output_logprobs.append(logprob)
        seq.output_weight_versions.append(weight_version)
        bs = self.bm.block_size
        # The KV of all but the newest token is now in the cache; hash blocks that just filled up.
        computed = len(seq) - 1
        if computed % bs == 0 and computed > 0:
            self.bm.register_full_blocks(seq, computed)

    def check_stop(self, seq: Sequence) -> FinishReason | None:
        """Finish reason after the newest token, or None to keep going (stop strings are the engine's job)."""
        p = seq.params
        tok = seq.last_token
        if not p.ignore_eos and tok in seq.eos_token_ids:
            return "stop"
        if p.stop_token_ids and tok in p.stop_token_ids:
            return "stop"
        if seq.num_output_tokens >= p.max_tokens or len(seq) >= self.config.max_model_len:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End a sequence wherever it is (running, waiting, between prefill chunks, or a not-yet-forked sibling)."""
        if seq.status is SeqStatus.FINISHED:
            return
        if seq is self.prefilling:
            self.prefilling = None
            seq.status = SeqStatus.WAITING  # holds blocks and unforked siblings, as a waiting leader does
            self.waiting.appendleft(seq)
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self.bm.free_seq(seq)
        else:
            if seq in self.waiting:
                self.waiting.remove(seq)
                for child in seq.pending_forks:  # unforked siblings end with their leader
                    child.status = SeqStatus.FINISHED
                    child.finish_reason = reason
                seq.pending_forks = []
            self.bm.free_seq(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
