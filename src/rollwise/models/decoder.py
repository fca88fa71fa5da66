"""Decoder-only transformer for the Llama family (Llama, Qwen2, Qwen3), reading and writing a paged KV cache.

One module covers the three architectures; they differ only in small switches, kept in `ArchSpec`:
Qwen2 puts a bias on q/k/v, Qwen3 RMS-normalises q and k per head, Llama may bias everything
(`attention_bias`). Grouped-query attention, RoPE with every scaling variant transformers knows (the
inverse frequencies come from transformers' own rope init functions, so configs mean the same thing), tied
or untied embeddings.

The forward takes a flat token batch (no padding) plus `AttnMetadata` saying where each token's K/V goes
in the cache (`slot_mapping`) and which cache blocks each sequence reads (`block_tables`). Projections are
fused (qkv, gate+up) to cut per-step kernel launches and Python overhead; the loader splits HF weights.

Left out: sliding-window attention, MoE, multimodal heads. A checkpoint that needs them fails at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ArchSpec:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    max_position_embeddings: int


@dataclass
class AttnMetadata:
    """Where the tokens of one forward pass sit in the paged KV cache."""

    is_prefill: bool
    slot_mapping: torch.Tensor  # [N] int64: flat cache slot (block * block_size + offset) of each token
    block_size: int
    # prefill: one entry per sequence (q_start, q_len, num_cached, block_table as a tensor)
    prefill_seqs: list[tuple[int, int, int, torch.Tensor]] | None = None
    # decode: one query token per sequence
    block_tables: torch.Tensor | None = None  # [B * max_blocks] int64, flattened (padded with block 0)
    num_seqs: int = 0
    decode_mask: torch.Tensor | None = None  # [1, B, 1, max_blocks * block_size] bool: key is inside the context
    # CPU path: the same mask as an additive bias laid out for batched matmuls, [kvh * B, g, L] float (0 / -inf).
    # NOTE: on CPU, baddbmm + softmax + bmm beats SDPA's flash kernel 1.5-3x at decode shapes (one query per
    # sequence, short contexts), where SDPA pays per-call setup and mask expansion.
    decode_bias: torch.Tensor | None = None
    # CPU float32 fast path: the fused paged kernel (engine/cpu_kernels.py) reads K/V through the block table
    # directly, with no gather; it needs the un-flattened tables and the context lengths.
    decode_kernel: Any = None
    block_tables_2d: torch.Tensor | None = None  # [B, max_blocks] int64
    context_lens: torch.Tensor | None = None  # [B] int64
    # CPU float32 decode: fused per-layer ops (`engine.cpu_kernels.layer_ops()`): the residual add with the RMSNorm
    # after it, SiLU x up, and RoPE with the K/V cache write, each one pass instead of 3-12 torch ops.
    fused: Any = None
    # Reusable flat gather buffers for K and V (shared by all layers), viewed as [kvh, B * max_blocks, bs, d].
    # NOTE: on CPU a fresh multi-MB tensor per layer per step costs more in page faults than the copy itself.
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None


class Linear(nn.Linear):
    """nn.Linear with an optional engine-side fast path: `fast` (set by the engine's model runner, e.g. a packed
    low-precision weight from `engine.cpu_linear`) computes x @ W^T + b instead of F.linear. The parameters keep
    their HF names and float dtype, so loading and `load_weights` see an ordinary Linear; the runner rebuilds `fast`
    after every weight load."""

    fast: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fast is not None:
            return self.fast(x)
        return F.linear(x, self.weight, self.bias)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        """The same product in whatever dtype the fast path's kernel writes (bfloat16 from oneDNN's bf16 matmul,
        else float32), for consumers that widen on load (the fused decode kernels, the CPU sampler)."""
        native = getattr(self.fast, "native", None)
        return native(x) if native is not None else self.forward(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Same arithmetic as transformers: normalise in float32, cast back, then scale.
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, spec: ArchSpec) -> None:
        super().__init__()
        self.h, self.kvh, self.d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size, self.kv_size = self.h * self.d, self.kvh * self.d
        self.qkv_proj = Linear(spec.hidden_size, self.q_size + 2 * self.kv_size, bias=spec.qkv_bias)
        self.o_proj = Linear(self.q_size, spec.hidden_size, bias=spec.o_bias)
        self.q_norm = RMSNorm(self.d, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(self.d, spec.rms_norm_eps) if spec.qk_norm else None
        self.scale = self.d**-0.5
        # [2, kvh, num_blocks, block_size, d], set by the runner. Head-major so that a decode gather yields
        # [kvh, B, L, d] contiguous, which SDPA consumes without a copy (kv heads as its batch dimension).
        self.kv_cache: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        n = x.shape[0]  # x: [N, hidden]
        if meta.fused is not None and not meta.is_prefill and self.q_norm is None:
            q = meta.fused.rope_store(self.qkv_proj.forward_native(x), cos, sin, self.kv_cache, meta.slot_mapping,
                                      self.h, self.kvh)
            return self.o_proj.forward_native(self._decode(q, meta).reshape(n, self.q_size))
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n, self.h, self.d)
        k = k.view(n, self.kvh, self.d)
        v = v.view(n, self.kvh, self.d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [N, 1, d]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        cache = self.kv_cache
        assert cache is not None, "KV cache not allocated"
        flat = cache.view(2, self.kvh, -1, self.d)  # [2, kvh, num_blocks * block_size, d]
        # NOTE: the cache may be held in a lower precision than the activations (engine.kv_cache_dtype): K/V are
        # rounded on the way in and widened on the way out; a prefill attends to its own fresh K/V (as vLLM does)
        flat[0].index_copy_(1, meta.slot_mapping, k.transpose(0, 1).to(cache.dtype))
        flat[1].index_copy_(1, meta.slot_mapping, v.transpose(0, 1).to(cache.dtype))
        if meta.is_prefill:
            out = self._prefill(q, k, v, meta)
        else:
            out = self._decode(q, meta)
        return self.o_proj(out.reshape(n, self.q_size))

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        outs = []
        bs = meta.block_size
        assert meta.prefill_seqs is not None
        for q_start, q_len, num_cached, table in meta.prefill_seqs:
            qi = q[q_start : q_start + q_len].transpose(0, 1).unsqueeze(0)  # [1, h, q_len, d]
            if num_cached == 0:
                ki = k[q_start : q_start + q_len].transpose(0, 1).unsqueeze(0)
                vi = v[q_start : q_start + q_len].transpose(0, 1).unsqueeze(0)
                o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=self.scale, enable_gqa=True)
            else:
                ctx = num_cached + q_len
                kv = self.kv_cache[:, :, table].reshape(2, self.kvh, -1, self.d)[:, :, :ctx].to(q.dtype)  # [2, kvh, ctx, d]
                ki = kv[0].unsqueeze(0)
                vi = kv[1].unsqueeze(0)
                qpos = torch.arange(num_cached, ctx, device=q.device)
                mask = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None]  # [q_len, ctx]
                o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=self.scale, enable_gqa=True)
            outs.append(o.squeeze(0).transpose(0, 1))  # [q_len, h, d]
        del bs
        return torch.cat(outs, 0) if len(outs) > 1 else outs[0]

    def _decode(self, q: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        b = meta.num_seqs
        if meta.decode_kernel is not None:
            return meta.decode_kernel(q.contiguous(), self.kv_cache[0], self.kv_cache[1], meta.block_tables_2d,
                                      meta.context_lens, self.scale)  # [B, h, d]
        bt = meta.block_tables
        assert bt is not None and meta.decode_mask is not None and meta.workspace is not None
        n = self.kvh * bt.shape[0] * meta.block_size * self.d
        shape = (self.kvh, bt.shape[0], meta.block_size, self.d)
        kbuf, vbuf = (w[:n].view(shape) for w in meta.workspace)
        k = torch.index_select(self.kv_cache[0], 1, bt, out=kbuf).view(self.kvh, b, -1, self.d)  # [kvh, B, L, d]
        v = torch.index_select(self.kv_cache[1], 1, bt, out=vbuf).view(self.kvh, b, -1, self.d)
        if k.dtype != q.dtype:  # a lower-precision cache (engine.kv_cache_dtype) on the torch path: widen the gather
            k, v = k.to(q.dtype), v.to(q.dtype)
        g = self.h // self.kvh
        qg = q.view(b, self.kvh, g, self.d).transpose(0, 1)  # [kvh, B, g, d]: a group's query heads share keys
        if meta.decode_bias is not None:
            L = k.shape[2]
            kk = k.reshape(self.kvh * b, L, self.d)
            scores = torch.baddbmm(meta.decode_bias, qg.reshape(self.kvh * b, g, self.d), kk.transpose(1, 2),
                                   alpha=self.scale)  # [kvh * B, g, L]
            o = torch.bmm(torch.softmax(scores, dim=-1), v.reshape(self.kvh * b, L, self.d)).view(self.kvh, b, g, self.d)
        else:
            o = F.scaled_dot_product_attention(qg, k, v, attn_mask=meta.decode_mask, scale=self.scale)  # [kvh, B, g, d]
        return o.transpose(0, 1).reshape(b, self.h, self.d)


class MLP(nn.Module):
    def __init__(self, spec: ArchSpec) -> None:
        super().__init__()
        self.inter = spec.intermediate_size
        self.gate_up_proj = Linear(spec.hidden_size, 2 * spec.intermediate_size, bias=spec.mlp_bias)
        self.down_proj = Linear(spec.intermediate_size, spec.hidden_size, bias=spec.mlp_bias)

    def forward(self, x: torch.Tensor, fused: Any = None) -> torch.Tensor:
        if fused is not None:  # the fused kernels read a bfloat16 projection output as it comes
            return self.down_proj.forward_native(fused.silu_mul(self.gate_up_proj.forward_native(x)))
        gu = self.gate_up_proj(x)
        gate, up = gu.split(self.inter, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ArchSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MLP(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderLM(nn.Module):
    def __init__(self, spec: ArchSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.cos_cached: torch.Tensor = torch.empty(0)
        self.sin_cached: torch.Tensor = torch.empty(0)

    def init_rope(self, inv_freq: torch.Tensor, attention_scaling: float, max_len: int) -> None:
        """RoPE tables in float32 (as transformers computes them), indexed by absolute position."""
        device = self.embed_tokens.weight.device
        t = torch.arange(max_len, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq.float().cpu())
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos_cached = (emb.cos() * attention_scaling).to(device)
        self.sin_cached = (emb.sin() * attention_scaling).to(device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        """input_ids, positions: [N] -> hidden states [N, hidden] (final norm applied)."""
        x = self.embed_tokens(input_ids)
        cos = self.cos_cached[positions].to(x.dtype)
        sin = self.sin_cached[positions].to(x.dtype)
        if meta.fused is not None and not meta.is_prefill:
            return self._forward_fused(x, cos, sin, meta)
        for layer in self.layers:
            x = layer(x, cos, sin, meta)
        return self.norm(x)

    def _forward_fused(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        """The same layers with each residual add done in one pass with the RMSNorm after it (the next layer's
        input norm, or the final norm), in place on the residual stream."""
        ops = meta.fused
        layers = self.layers
        h = layers[0].input_layernorm(x)
        for i, layer in enumerate(layers):
            post = layer.post_attention_layernorm
            nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.norm
            h = ops.add_rmsnorm_(x, layer.self_attn(h, cos, sin, meta), post.weight, post.eps)
            h = ops.add_rmsnorm_(x, layer.mlp(h, ops), nxt.weight, nxt.eps)
        return h

    def logits(self, hidden: torch.Tensor, native: bool = False) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] float32, or with `native` in the LM head kernel's own dtype (bfloat16 from
        oneDNN's bf16 matmul: for the CPU sampler, which widens on load)."""
        return self.lm_head.forward_native(hidden) if native else self.lm_head(hidden).float()
