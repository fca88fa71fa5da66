"""The one torch-heavy part of the engine: turns a `SchedulerOutput` into tensors, runs the model, samples.

It owns the model weights and the paged KV cache ([2, kv_heads, num_blocks, block_size, head_dim] per layer, in
`kv_cache_dtype`). Everything it is told comes from the scheduler as ids and counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rollwise.engine.sampler import LogprobsMode, SamplingBatch, sample
from rollwise.engine.scheduler import SchedulerOutput
from rollwise.engine.sequence import Sequence
from rollwise.models.decoder import Attention, AttnMetadata, DecoderLM

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


ENGINE_DTYPES = ("float32", "bfloat16", "float16", "int8")


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(ENGINE_DTYPES)}")
    return DTYPES[dtype]


def engine_precision(dtype: str | torch.dtype, device: torch.device) -> tuple[torch.dtype, str | None]:
    """(the model's parameter dtype, the format of its linear weights on the CPU) for an engine `dtype`.

    On the CPU every mode keeps the parameters, activations, KV cache, norms, attention and sampling in float32 (the
    fused kernels of engine/cpu_kernels.py) and changes only the linear layers' weights (engine/cpu_linear.py):
    'float32' packed float32 tiles; 'bfloat16' bf16 weights with bf16 matmul inputs and float32 results; 'int8'
    per-channel int8 weights. 'float16' (CPU) and every GPU mode cast the whole model, as before."""
    if isinstance(dtype, torch.dtype):
        name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, str(dtype))
    else:
        name = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)
    if name not in ENGINE_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(ENGINE_DTYPES)}")
    if device.type == "cpu" and name in ("float32", "bfloat16", "int8"):
        return torch.float32, name
    if name == "int8":
        raise ValueError("dtype 'int8' (weight-only int8 linear layers) runs on the CPU only; use bfloat16 on a GPU")
    return DTYPES[name], None


KV_CACHE_DTYPES = ("auto", "float32", "bfloat16")


def kv_cache_dtype(setting: str, param_dtype: torch.dtype, linear_kind: str | None) -> torch.dtype:
    """The KV cache's dtype for `engine.kv_cache_dtype`: 'auto' = bfloat16 where the engine's matmuls already round
    to bfloat16 (the CPU's 'bfloat16' and 'int8' modes: the cache then costs no further precision class, and a decode
    step reads half the bytes), else the parameters' dtype (float32 stays exact; a GPU model cast to bf16 or fp16
    keeps its own); 'float32' / 'bfloat16' as given."""
    if setting not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown kv_cache_dtype {setting!r}; use one of {', '.join(KV_CACHE_DTYPES)}")
    if setting == "auto":
        return torch.bfloat16 if linear_kind in ("bfloat16", "int8") else param_dtype
    return DTYPES[setting]


Brancher = Callable[[SchedulerOutput, torch.Tensor], list[tuple[int, Sequence]]]
"""(step output, logits rows [len(sample_seqs), V]) -> [(row index, forked sequence)] (engine/tree.py)."""


@dataclass
class StepResult:
    token_ids: list[int]  # one per SchedulerOutput.sample_seqs; with drafts, one per row (1 + len(draft) per seq)
    logprobs: list[float]


class ModelRunner:
    def __init__(self, model: DecoderLM, num_blocks: int, block_size: int, device: torch.device,
                 logprobs_mode: LogprobsMode = "processed", linear_kind: str | None = None,
                 kv_dtype: torch.dtype | None = None) -> None:
        """linear_kind: the CPU linear-weight format (`engine_precision`); None = plain F.linear on the parameters.
        kv_dtype: the KV cache's dtype (`kv_cache_dtype`); None = the parameters'."""
        self.model = model
        self.linear_kind = linear_kind
        self.logprobs_mode = logprobs_mode
        self.device = device
        self.block_size = block_size
        self.num_blocks = num_blocks
        spec = model.spec
        dtype = model.embed_tokens.weight.dtype
        self.kv_caches = []
        self._workspace: tuple[torch.Tensor, torch.Tensor] | None = None
        self._per_block = spec.num_kv_heads * block_size * spec.head_dim
        self._dtype = dtype
        self.kv_dtype = dtype if kv_dtype is None else kv_dtype
        self._kernel = None
        self._layer_ops = None
        self._sample_kernel = None
        if device.type == "cpu":
            from rollwise.engine import cpu_kernels

            self._sample_kernel = cpu_kernels.sample_kernel()  # logits are float32 for every model dtype
            if dtype == torch.float32:
                self._kernel = cpu_kernels.paged_decode_kernel()
                self._layer_ops = cpu_kernels.layer_ops()
        self.refresh_weights()
        for layer in model.layers:
            cache = torch.zeros(2, spec.num_kv_heads, num_blocks, block_size, spec.head_dim, dtype=self.kv_dtype,
                                device=device)
            attn = layer.self_attn
            assert isinstance(attn, Attention)  # torch types a ModuleList's items as plain Modules
            attn.kv_cache = cache
            self.kv_caches.append(cache)

    def describe(self) -> str:
        """What computes a step here, in one line: the linear layers' kernels, the KV cache's dtype, the fused
        decode kernels (the run logs it at start; benches print it beside their figures)."""
        parts = [f"{self._dtype_name()} on {self.device.type}"]
        if self.linear_kind is not None:
            from rollwise.engine import cpu_linear

            parts.append(cpu_linear.describe(self.linear_kind))
        parts.append(f"KV cache {str(self.kv_dtype).removeprefix('torch.')}")
        if self.device.type == "cpu":
            from rollwise.engine import cpu_kernels

            parts.append("fused decode kernels" if self._kernel is not None else
                         f"torch decode paths ({cpu_kernels._EXT.failed or 'the fused kernels run on float32 models only'})")
        return "; ".join(parts)

    def _dtype_name(self) -> str:
        return self.linear_kind or str(self._dtype).removeprefix("torch.")

    def refresh_weights(self) -> None:
        """Rebuild the linear layers' engine-format weights from the parameters (at start and after every load)."""
        if self.linear_kind is not None:
            from rollwise.engine import cpu_linear

            cpu_linear.prepare_linears(self.model, self.linear_kind)

    @staticmethod
    def kv_bytes_per_block(spec, block_size: int, dtype: torch.dtype) -> int:
        return 2 * spec.num_layers * block_size * spec.num_kv_heads * spec.head_dim * torch.finfo(dtype).bits // 8

    # ------------------------------------------------------------------ inputs
    def _prefill_inputs(self, out: SchedulerOutput):
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        seq_meta = []
        last_idx: list[int] = []
        for i, seq in enumerate(out.seqs):
            # [start, end): a whole prompt past its cached prefix, or one chunk of a long one (scheduler.py NOTE)
            start, end = out.prefill_ranges[i] if out.prefill_ranges is not None else (seq.num_cached_tokens, len(seq))
            n = end - start
            q_start = len(ids)
            ids.extend(seq.token_ids[start:end])
            pos.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            seq_meta.append((q_start, n, start, torch.tensor(table, dtype=torch.long, device=self.device)))
            last_idx.append(q_start + n - 1)
        dev = self.device
        meta = AttnMetadata(True, torch.tensor(slots, dtype=torch.long, device=dev), bs, prefill_seqs=seq_meta)
        return (torch.tensor(ids, dtype=torch.long, device=dev), torch.tensor(pos, dtype=torch.long, device=dev),
                meta, torch.tensor(last_idx, dtype=torch.long, device=dev))

    def _decode_rows(self, out: SchedulerOutput) -> tuple[list[Sequence], list[int], list[int]]:
        """One row per computed token: each sequence's last token, then its draft tokens (verify rows).
        Returns (the sequence of each row, token ids, positions)."""
        if out.drafts is None:
            return out.seqs, [s.token_ids[-1] for s in out.seqs], [len(s) - 1 for s in out.seqs]
        row_seqs: list[Sequence] = []
        ids: list[int] = []
        pos: list[int] = []
        for s, d in zip(out.seqs, out.drafts):
            p0 = len(s) - 1
            row_seqs.extend([s] * (1 + len(d)))
            ids.append(s.token_ids[-1])
            ids.extend(d)
            pos.extend(range(p0, p0 + 1 + len(d)))
        return row_seqs, ids, pos

    def _decode_inputs(self, out: SchedulerOutput):
        # NOTE: a verify row is an ordinary decode row whose context ends at its own position; the draft tokens'
        # K/V are written to the cache before attention runs, so row j of a sequence sees the draft before it:
        # exact causal attention over the draft, with the decode kernels unchanged.
        bs = self.block_size
        seqs, ids, pos = self._decode_rows(out)
        slots = [s.block_table[p // bs] * bs + p % bs for s, p in zip(seqs, pos)]
        max_blocks = max(len(s.block_table) for s in seqs)
        flat: list[int] = []
        for s in seqs:
            flat.extend(s.block_table)
            flat.extend([0] * (max_blocks - len(s.block_table)))
        dev = self.device
        n = len(seqs)
        pos_t = torch.tensor(pos, dtype=torch.long, device=dev)
        bt = torch.tensor(flat, dtype=torch.long, device=dev)
        if self._kernel is not None:
            meta = AttnMetadata(False, torch.tensor(slots, dtype=torch.long, device=dev), bs, num_seqs=n,
                                decode_kernel=self._kernel, block_tables_2d=bt.view(n, max_blocks),
                                context_lens=pos_t + 1, fused=self._layer_ops)
            return torch.tensor(ids, dtype=torch.long, device=dev), pos_t, meta, None
        key_pos = torch.arange(max_blocks * bs, device=dev)
        mask = (key_pos[None, :] <= pos_t[:, None]).view(1, n, 1, -1)
        bias = None
        if dev.type == "cpu":
            spec = self.model.spec
            g = spec.num_heads // spec.num_kv_heads
            bias = torch.zeros(mask.shape, dtype=self._dtype, device=dev).masked_fill_(~mask, float("-inf"))
            bias = bias.expand(spec.num_kv_heads, n, g, -1).reshape(spec.num_kv_heads * n, g, -1)
        meta = AttnMetadata(False, torch.tensor(slots, dtype=torch.long, device=dev), bs,
                            block_tables=bt, num_seqs=n, decode_mask=mask, decode_bias=bias,
                            workspace=self._get_workspace(len(flat)))
        return torch.tensor(ids, dtype=torch.long, device=dev), pos_t, meta, None

    def _get_workspace(self, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat K and V gather buffers holding at least `num_blocks` blocks (grown by doubling, then reused)."""
        need = num_blocks * self._per_block
        ws = self._workspace
        if ws is None or ws[0].numel() < need:
            cap = max(need, 2 * (ws[0].numel() if ws is not None else 0))
            ws = (torch.empty(cap, dtype=self.kv_dtype, device=self.device),
                  torch.empty(cap, dtype=self.kv_dtype, device=self.device))
            self._workspace = ws
        return ws

    def _sampling_batch(self, out: SchedulerOutput) -> SamplingBatch:
        seqs = out.sample_seqs
        positions = [s.num_output_tokens for s in seqs]
        if out.drafts is not None:  # verify rows: row j of a sequence samples its output position + j
            seqs = [s for s, d in zip(out.seqs, out.drafts) for _ in range(1 + len(d))]
            positions = [s.num_output_tokens + j for s, d in zip(out.seqs, out.drafts) for j in range(1 + len(d))]
        temps = [s.params.temperature for s in seqs]
        top_p = [s.params.top_p for s in seqs]
        top_k = [s.params.top_k for s in seqs]
        dev = self.device
        return SamplingBatch(
            temperature=torch.tensor(temps, dtype=torch.float32, device=dev),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=dev),
            top_k=torch.tensor(top_k, dtype=torch.long, device=dev),
            seeds=torch.tensor([s.seed for s in seqs], dtype=torch.long, device=dev),
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            all_greedy=all(t <= 0 for t in temps),
            any_truncation=any(p < 1.0 for p in top_p) or any(k > 0 for k in top_k),
        )

    # ------------------------------------------------------------------ run
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks (src, dst) in every layer now: the copy-on-write of a sequence forked mid-decode."""
        for src, dst in pairs:
            for cache in self.kv_caches:
                cache[:, :, dst].copy_(cache[:, :, src])

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, branch: Brancher | None = None) -> StepResult:
        """Run one step. `branch` (tree rollouts): called with the step's output and its logits rows (one per
        `out.sample_seqs`) before sampling; it returns the sequences forked at this step, each with the index of the
        row it samples from, and they are sampled in the same step (appended to `out.sample_seqs`)."""
        if out.is_prefill:
            ids, pos, meta, last_idx = self._prefill_inputs(out)
        else:
            ids, pos, meta, last_idx = self._decode_inputs(out)
        hidden = self.model(ids, pos, meta)
        if last_idx is not None:
            hidden = hidden.index_select(0, last_idx)
        for src, dst in out.block_copies:
            for cache in self.kv_caches:
                cache[:, :, dst].copy_(cache[:, :, src])
        rows = out.sample_rows
        if out.drafts is None and rows != list(range(hidden.shape[0])):
            hidden = hidden.index_select(0, torch.tensor(rows, dtype=torch.long, device=self.device))
        if not out.sample_seqs:  # a chunk of a long prompt: its KV is written, nothing is sampled
            return StepResult([], [])
        # the CPU sampler reads bfloat16 logits as the LM head writes them; a brancher gets float32
        logits = self.model.logits(hidden, native=branch is None and self._sample_kernel is not None)
        if branch is not None:
            born = branch(out, logits)
            if born:
                idx = torch.tensor([r for r, _ in born], dtype=torch.long, device=logits.device)
                logits = torch.cat([logits, logits.index_select(0, idx)])
                for r, child in born:
                    out.sample_seqs.append(child)
                    out.sample_rows.append(out.sample_rows[r])
        tokens, logprobs = sample(logits, self._sampling_batch(out), self.logprobs_mode, self._sample_kernel)
        return StepResult(tokens.tolist(), logprobs.tolist())
