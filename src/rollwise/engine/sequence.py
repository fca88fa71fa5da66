"""One sample being generated: the unit the scheduler and block manager reason about.

A request with `n` samples becomes `n` Sequences. The first (the leader) is prefilled once; the others
are forked from it after the prefill, sharing its full KV blocks (prefix sharing inside a group).

Pure bookkeeping: token ids, counts and block ids. No torch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any

from rollwise.types import FinishReason, SamplingParams


class SeqStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


_seq_counter = itertools.count()


@dataclass(eq=False)
class Sequence:
    request_id: str
    sample_index: int
    token_ids: list[int]  # prompt + output, grows by one per decode step
    num_prompt_tokens: int
    params: SamplingParams
    seed: int  # 63-bit per-sample seed for the counter-based sampler
    eos_token_ids: frozenset[int] = frozenset()
    seq_id: int = field(default_factory=lambda: next(_seq_counter))
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at the last allocation
    output_logprobs: list[float] = field(default_factory=list)
    output_weight_versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_text_cut: int | None = None  # char offset where a stop string begins in the decoded output
    # Leader of a group whose siblings are not yet forked; they are forked right after its prefill.
    pending_forks: list["Sequence"] = field(default_factory=list)
    num_preemptions: int = 0
    # Untyped here because engine/speculative.py and engine/tree.py build on this module (naming their types would
    # be an import cycle); they set these fields and read them back.
    spec: Any = None  # engine.speculative.SpecState when the request speculates
    tree: Any = None  # (engine.tree.TreeState, slot) when the request grows as a tree

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def num_blocks_needed(self, block_size: int) -> int:
        return (len(self.token_ids) + block_size - 1) // block_size

    def block_tokens(self, i: int, block_size: int) -> list[int]:
        return self.token_ids[i * block_size : (i + 1) * block_size]
