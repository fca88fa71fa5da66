"""Fused CPU kernels for the decode step, compiled on first use with torch's C++ extension loader.

Why: a decode step on a CPU is a handful of matmuls plus many passes over small or wide tensors, and those
passes are what separates the step from the matmul limit.
- `paged_decode_attention`: in pure torch, decode attention over a paged KV cache must first gather each
  sequence's blocks into a dense tensor (a full copy of the context, every layer, every step) and then read it
  again in the matmuls. This kernel walks the block table directly: one pass over K (scores), a softmax, one pass
  over V, per (sequence, kv head), with the query heads of a GQA group sharing each K/V read, the next block
  prefetched while the current one is used, and head dims 64 and 128 compiled as constants.
- `sample_rows`: inverse-CDF sampling over the vocabulary in two passes per row (max; exp and per-chunk sums of
  256 entries), then a walk over the chunk sums and one chunk, where the torch path runs eight full passes
  (divide, log-softmax, exp, float64 copy, cumsum, argmax, ...) over [B, V]. Same draw (`uniform_from_counter`),
  same distribution (logits / T), same processed log-prob, to float32 rounding: about 1 draw in 10,000 lands on a
  neighbouring token where the two paths round the CDF differently (measured on [64, 49152] logits), as any two
  float32 implementations would.
- per-layer ops (`layer_ops()`): the residual add fused with the RMSNorm after it, SiLU x up, and RoPE fused with
  the K/V cache write. A decode layer on a 64-row batch was ~30 small torch ops at 5-30 us each (launch, a fresh
  output, one pass each); with these it is 4 calls besides the matmuls and the attention.

All use `exp_nonpos`, an exp written as plain arithmetic (2^k times a degree-7 polynomial, relative error under
1e-7) so that the compiler vectorises the loops that call it; libm's scalar exp was half of the attention time.

They compute in float32 (the KV cache may be held in bfloat16: `rope_store` rounds to it, the attention widens from
it, half the bytes per decode step; a bf16 engine's projections and logits come in bfloat16 from oneDNN and are widened
on load, which saved 6% of the SmolLM2 recipe's bf16 rollout phase on an Intel Xeon with AMX) and are optional: if no compiler or ninja is available, or
`ROLLWISE_CPU_KERNELS=0`, the engine uses the torch paths, with the same results to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

from rollwise.engine.inline_ext import InlineExtension

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>
#include <algorithm>

#include <cstdint>
#include <cstring>
// exp(x) for x <= 0 (0 below -87): 2^k * p(r), r = x - k ln2 in [-ln2/2, ln2/2], degree-7 Taylor (rel. error < 1e-7).
// Written as plain arithmetic so the compiler vectorizes loops that call it; no libm call per element.
static inline float exp_nonpos(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
  const float kf = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (xc - kf * 0.693145751953125f) - kf * 1.428606765330187045e-06f;
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(kf) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x < -87.0f ? 0.f : p * scale;
}

// One 16-token K or V block is one 4 KB page (float32), where the hardware prefetcher stops: ask for the next block.
template <typename T>
static inline void prefetch_block(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t o = 0; o < n * static_cast<int64_t>(sizeof(T)); o += 64) __builtin_prefetch(c + o);
}

// KV-cache elements: float32, or bfloat16 held as its 16 bits (upper half of a float32: widening is a shift, which
// the compiler vectorises inside the dot products; rounding to it is round-to-nearest-even, as torch rounds).
static inline float kv_load(const float* p, int64_t i) { return p[i]; }
static inline float kv_load(const uint16_t* p, int64_t i) {
  const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
static inline void kv_store(float* p, int64_t i, float x) { p[i] = x; }
static inline void kv_store(uint16_t* p, int64_t i, float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) { p[i] = static_cast<uint16_t>((bits >> 16) | 0x40u); return; }  // NaN stays NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  p[i] = static_cast<uint16_t>(bits >> 16);
}

template <int DC, typename T>
static void attn_rows(const float* qp, const T* kp, const T* vp, const int64_t* bt, const int64_t* cl,
                      float* op, int64_t begin, int64_t end, int64_t H, int64_t KVH, int64_t NB, int64_t BS,
                      int64_t MB, int64_t Drt, float sc) {
  const int64_t D = DC > 0 ? DC : Drt;
  const int64_t G = H / KVH;
  std::vector<float> s, qs(G * D);
  for (int64_t idx = begin; idx < end; ++idx) {
    const int64_t b = idx / KVH, kh = idx % KVH;
    const int64_t ctx = cl[b];
    s.resize(G * ctx);
    const float* qb = qp + (b * H + kh * G) * D;
    for (int64_t i = 0; i < G * D; ++i) qs[i] = qb[i] * sc;
    const int64_t* table = bt + b * MB;
    const int64_t nblk = (ctx + BS - 1) / BS;
    for (int64_t bi = 0; bi < nblk; ++bi) {
      const T* kblk = kp + (kh * NB + table[bi]) * BS * D;
      if (bi + 1 < nblk) prefetch_block(kp + (kh * NB + table[bi + 1]) * BS * D, BS * D);
      const int64_t t0 = bi * BS, n = std::min(BS, ctx - t0);
      for (int64_t j = 0; j < n; ++j) {
        const T* __restrict__ kt = kblk + j * D;
        for (int64_t g = 0; g < G; ++g) {
          const float* __restrict__ qg = qs.data() + g * D;
          float acc = 0.f;
#pragma omp simd reduction(+ : acc)
          for (int64_t d = 0; d < D; ++d) acc += qg[d] * kv_load(kt, d);
          s[g * ctx + t0 + j] = acc;
        }
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      float* sg = s.data() + g * ctx;
      float m = -INFINITY;
      for (int64_t t = 0; t < ctx; ++t) m = std::max(m, sg[t]);
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t t = 0; t < ctx; ++t) { sg[t] = exp_nonpos(sg[t] - m); sum += sg[t]; }
      const float inv = 1.f / sum;
      for (int64_t t = 0; t < ctx; ++t) sg[t] *= inv;
    }
    float* ob = op + (b * H + kh * G) * D;
    for (int64_t bi = 0; bi < nblk; ++bi) {
      const T* vblk = vp + (kh * NB + table[bi]) * BS * D;
      if (bi + 1 < nblk) prefetch_block(vp + (kh * NB + table[bi + 1]) * BS * D, BS * D);
      const int64_t t0 = bi * BS, n = std::min(BS, ctx - t0);
      for (int64_t g = 0; g < G; ++g) {
        float* __restrict__ og = ob + g * D;
        const float* __restrict__ sg = s.data() + g * ctx + t0;
        for (int64_t j = 0; j < n; ++j) {
          const float w = sg[j];
          const T* __restrict__ vt = vblk + j * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) og[d] += w * kv_load(vt, d);
        }
      }
    }
  }
}

template <typename T>
static void paged_attention_all(const float* qp, const T* kp, const T* vp, const int64_t* bt, const int64_t* cl,
                                float* op, int64_t B, int64_t H, int64_t KVH, int64_t NB, int64_t BS, int64_t MB,
                                int64_t D, float sc) {
  at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
    if (D == 64) attn_rows<64, T>(qp, kp, vp, bt, cl, op, begin, end, H, KVH, NB, BS, MB, D, sc);
    else if (D == 128) attn_rows<128, T>(qp, kp, vp, bt, cl, op, begin, end, H, KVH, NB, BS, MB, D, sc);
    else attn_rows<0, T>(qp, kp, vp, bt, cl, op, begin, end, H, KVH, NB, BS, MB, D, sc);
  });
}

// q [B, H, D] float32; k_cache, v_cache [KVH, NB, BS, D] float32 or bfloat16 (the same dtype).
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale) {
  const bool bf16 = k_cache.dtype() == torch::kBFloat16;
  TORCH_CHECK(q.dtype() == torch::kFloat32 && (bf16 || k_cache.dtype() == torch::kFloat32) &&
              v_cache.dtype() == k_cache.dtype(), "q float32, caches float32 or bfloat16");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous inputs");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KVH = k_cache.size(0), NB = k_cache.size(1), BS = k_cache.size(2);
  const int64_t MB = block_tables.size(1);
  auto out = torch::zeros_like(q);
  const float* qp = q.data_ptr<float>();
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  const int64_t* cl = context_lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  if (bf16) {
    const uint16_t* kp = reinterpret_cast<const uint16_t*>(k_cache.data_ptr());
    const uint16_t* vp = reinterpret_cast<const uint16_t*>(v_cache.data_ptr());
    paged_attention_all<uint16_t>(qp, kp, vp, bt, cl, op, B, H, KVH, NB, BS, MB, D, sc);
  } else {
    paged_attention_all<float>(qp, k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), bt, cl, op, B, H, KVH, NB,
                               BS, MB, D, sc);
  }
  return out;
}

// logits [B, V] float32 or bfloat16 (widened exactly on load), temperature [B] float32 (<= 0: greedy), u [B] float64
// -> (tokens [B] int64, logprobs [B] float32).
// Row b: p_i = exp((x_i - max) / T); the token is the first i whose running sum exceeds u * sum(p) (the sums run over
// 256-entry chunks, then inside the chosen chunk, in float64); its log-prob is log(p_i / sum(p)). Greedy rows (T <= 0)
// take the first argmax and log_softmax(x) at it, as the torch path does. Non-finite logits give token V - 1 and a
// NaN log-prob, as the torch path does.
template <typename T>
static void sample_all(const T* lp, const float* tp, const double* up, int64_t* tok, float* lo, int64_t B, int64_t V) {
  constexpr int64_t CH = 256;
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> csum((V + CH - 1) / CH);
    for (int64_t b = begin; b < end; ++b) {
      const T* x = lp + b * V;
      const bool greedy = !(tp[b] > 0.f);
      const float inv = greedy ? 1.f : 1.f / tp[b];
      float m = -INFINITY;
#pragma omp simd reduction(max : m)
      for (int64_t i = 0; i < V; ++i) m = std::max(m, kv_load(x, i));
      if (!std::isfinite(m)) { tok[b] = V - 1; lo[b] = NAN; continue; }  // as the torch path: NaN/inf logits
      double total = 0.0;
      for (int64_t c = 0; c * CH < V; ++c) {
        const int64_t e = std::min(V, (c + 1) * CH);
        float cs = 0.f;
#pragma omp simd reduction(+ : cs)
        for (int64_t i = c * CH; i < e; ++i) cs += exp_nonpos((kv_load(x, i) - m) * inv);
        csum[c] = cs;
        total += cs;
      }
      if (!std::isfinite(total)) { tok[b] = V - 1; lo[b] = NAN; continue; }
      int64_t t = 0;
      if (greedy) {
        while (kv_load(x, t) != m) ++t;
      } else {
        const double target = up[b] * total;
        double cum = 0.0;
        int64_t c = 0;
        const int64_t nc = (V + CH - 1) / CH;
        while (c + 1 < nc && cum + csum[c] <= target) cum += csum[c++];
        const int64_t e = std::min(V, (c + 1) * CH);
        t = -1;
        int64_t last = c * CH;
        for (int64_t i = c * CH; i < e; ++i) {
          const float p = exp_nonpos((kv_load(x, i) - m) * inv);
          if (p > 0.f) last = i;
          cum += p;
          if (cum > target) { t = i; break; }
        }
        if (t < 0) t = last;  // rounding put the target at the very top of this chunk
      }
      tok[b] = t;
      lo[b] = static_cast<float>((kv_load(x, t) - m) * inv - std::log(total));
    }
  });
}

std::vector<torch::Tensor> sample_rows(torch::Tensor logits, torch::Tensor temperature, torch::Tensor u) {
  const bool bf16 = logits.dtype() == torch::kBFloat16;
  TORCH_CHECK((bf16 || logits.dtype() == torch::kFloat32) && logits.is_contiguous() && logits.dim() == 2,
              "logits: contiguous [B, V] float32 or bfloat16");
  TORCH_CHECK(temperature.dtype() == torch::kFloat32 && temperature.is_contiguous() && temperature.numel() == logits.size(0),
              "temperature: [B] float32");
  TORCH_CHECK(u.dtype() == torch::kFloat64 && u.is_contiguous() && u.numel() == logits.size(0), "u: [B] float64");
  const int64_t B = logits.size(0), V = logits.size(1);
  auto tokens = torch::empty({B}, torch::kInt64);
  auto lps = torch::empty({B}, torch::kFloat32);
  const float* tp = temperature.data_ptr<float>();
  const double* up = u.data_ptr<double>();
  if (bf16) sample_all(reinterpret_cast<const uint16_t*>(logits.data_ptr()), tp, up, tokens.data_ptr<int64_t>(),
                       lps.data_ptr<float>(), B, V);
  else sample_all(logits.data_ptr<float>(), tp, up, tokens.data_ptr<int64_t>(), lps.data_ptr<float>(), B, V);
  return {tokens, lps};
}

// ---- fused per-layer elementwise ops (float32 arithmetic, contiguous rows); each replaces several torch ops and
// passes. A projection's output may come in bfloat16 (oneDNN's bf16 matmul writes it): they widen it on load, exactly
// as `.float()` would, so the results are those on its float32 copy (up to a norm's summation order) without the copy.

template <typename T>
static void add_rmsnorm_rows(float* xp, const T* rp, const float* wp, float* op, int64_t N, int64_t C, float e) {
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      float* xr = xp + n * C;
      const T* rr = rp + n * C;
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < C; ++i) { xr[i] += kv_load(rr, i); ss += xr[i] * xr[i]; }
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(C) + e);
      float* o = op + n * C;
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) o[i] = wp[i] * (xr[i] * inv);
    }
  });
}

// x [N, C] float32 += r (float32 or bfloat16, in place); returns rmsnorm(x) * w, transformers' RMSNorm in float32.
torch::Tensor add_rmsnorm_(torch::Tensor x, torch::Tensor r, torch::Tensor w, double eps) {
  const bool bf16 = r.dtype() == torch::kBFloat16;
  TORCH_CHECK(x.dtype() == torch::kFloat32 && (bf16 || r.dtype() == torch::kFloat32) && w.dtype() == torch::kFloat32,
              "x, w float32; r float32 or bfloat16");
  TORCH_CHECK(x.is_contiguous() && r.is_contiguous() && w.is_contiguous() && x.sizes() == r.sizes() && x.dim() == 2,
              "x, r: contiguous [N, C] of the same shape");
  const int64_t N = x.size(0), C = x.size(1);
  auto out = torch::empty_like(x);
  const float e = static_cast<float>(eps);
  if (bf16) add_rmsnorm_rows(x.data_ptr<float>(), reinterpret_cast<const uint16_t*>(r.data_ptr()), w.data_ptr<float>(),
                             out.data_ptr<float>(), N, C, e);
  else add_rmsnorm_rows(x.data_ptr<float>(), r.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(), N, C, e);
  return out;
}

template <typename T>
static void silu_mul_rows(const T* gp, float* op, int64_t N, int64_t I) {
  at::parallel_for(0, N, 8, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const T* g = gp + n * 2 * I;
      const T* u = g + I;
      float* o = op + n * I;
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) {
        const float x = kv_load(g, i);
        const float ex = exp_nonpos(x < 0.f ? x : -x);  // exp(-|x|): silu(x) = x / (1 + exp(-x)), stable both ways
        const float sig = x < 0.f ? ex / (1.f + ex) : 1.f / (1.f + ex);
        o[i] = x * sig * kv_load(u, i);
      }
    }
  });
}

// gu [N, 2I] float32 or bfloat16 (gate then up, as the fused projection writes them) -> silu(gate) * up [N, I] float32.
torch::Tensor silu_mul(torch::Tensor gu) {
  const bool bf16 = gu.dtype() == torch::kBFloat16;
  TORCH_CHECK((bf16 || gu.dtype() == torch::kFloat32) && gu.is_contiguous() && gu.dim() == 2 && gu.size(1) % 2 == 0,
              "gu: contiguous [N, 2I] float32 or bfloat16");
  const int64_t N = gu.size(0), I = gu.size(1) / 2;
  auto out = torch::empty({N, I}, gu.options().dtype(torch::kFloat32));
  if (bf16) silu_mul_rows(reinterpret_cast<const uint16_t*>(gu.data_ptr()), out.data_ptr<float>(), N, I);
  else silu_mul_rows(gu.data_ptr<float>(), out.data_ptr<float>(), N, I);
  return out;
}

// RoPE on the q and k parts of qkv [N, (H + 2 KVH) * D] (rotate-half layout, cos/sin [N, D]); the rotated k and the v
// are written to the cache ([2, KVH, S, D] viewed flat, S = blocks * block_size; float32 or bfloat16) at slots [N];
// returns q [N, H, D].
template <typename X, typename T>
static void rope_store_rows(const X* xp, const float* cp, const float* sp, const int64_t* sl, float* qp, T* kc,
                            int64_t N, int64_t H, int64_t KVH, int64_t D, int64_t W, int64_t S) {
  const int64_t half = D / 2;
  T* vc = kc + KVH * S * D;
  at::parallel_for(0, N, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> kr(D);
    for (int64_t n = begin; n < end; ++n) {
      const X* x = xp + n * W;
      const float* c = cp + n * D;
      const float* s = sp + n * D;
      const int64_t slot = sl[n];
      for (int64_t h = 0; h < H + KVH; ++h) {
        const X* xi = x + h * D;
        float* o = h < H ? qp + (n * H + h) * D : kr.data();
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = kv_load(xi, i), b = kv_load(xi, i + half);
          o[i] = a * c[i] + (-b) * s[i];
          o[i + half] = b * c[i + half] + a * s[i + half];
        }
        if (h >= H) {
          T* kd = kc + ((h - H) * S + slot) * D;
          for (int64_t i = 0; i < D; ++i) kv_store(kd, i, kr[i]);
        }
      }
      for (int64_t h = 0; h < KVH; ++h) {
        const X* vi = x + (H + KVH + h) * D;
        T* o = vc + (h * S + slot) * D;
        for (int64_t i = 0; i < D; ++i) kv_store(o, i, kv_load(vi, i));
      }
    }
  });
}

torch::Tensor rope_store(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor cache,
                         torch::Tensor slots, int64_t H, int64_t KVH) {
  const bool bf16 = cache.dtype() == torch::kBFloat16, xbf16 = qkv.dtype() == torch::kBFloat16;
  TORCH_CHECK((xbf16 || qkv.dtype() == torch::kFloat32) && (bf16 || cache.dtype() == torch::kFloat32) &&
              cos.dtype() == torch::kFloat32, "qkv float32 or bfloat16, cache float32 or bfloat16");
  TORCH_CHECK(qkv.is_contiguous() && cos.is_contiguous() && sin.is_contiguous() && cache.is_contiguous() &&
              slots.is_contiguous(), "contiguous inputs");
  const int64_t N = qkv.size(0), D = cos.size(1), W = qkv.size(1);
  TORCH_CHECK(W == (H + 2 * KVH) * D && cache.size(0) == 2 && cache.size(1) == KVH, "qkv / cache shapes");
  const int64_t S = cache.numel() / (2 * KVH * D);
  auto q = torch::empty({N, H, D}, qkv.options().dtype(torch::kFloat32));
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t* sl = slots.data_ptr<int64_t>();
  float* qp = q.data_ptr<float>();
  uint16_t* cb = reinterpret_cast<uint16_t*>(cache.data_ptr());
  if (xbf16) {
    const uint16_t* xp = reinterpret_cast<const uint16_t*>(qkv.data_ptr());
    if (bf16) rope_store_rows(xp, cp, sp, sl, qp, cb, N, H, KVH, D, W, S);
    else rope_store_rows(xp, cp, sp, sl, qp, cache.data_ptr<float>(), N, H, KVH, D, W, S);
  } else {
    const float* xp = qkv.data_ptr<float>();
    if (bf16) rope_store_rows(xp, cp, sp, sl, qp, cb, N, H, KVH, D, W, S);
    else rope_store_rows(xp, cp, sp, sl, qp, cache.data_ptr<float>(), N, H, KVH, D, W, S);
  }
  return q;
}
"""

_EXT = InlineExtension("rollwise_cpu_kernels_v6", _SOURCE,
                       ["paged_decode_attention", "sample_rows", "add_rmsnorm_", "silu_mul", "rope_store"],
                       "CPU decode kernels", "the torch paths")


def _load() -> ModuleType | None:
    """The compiled module, or None when unavailable (`_EXT.failed` says why)."""
    return _EXT.get()


def paged_decode_kernel() -> Callable[..., torch.Tensor] | None:
    """paged_decode_attention(q [B, H, D], k_cache, v_cache [KVH, NB, BS, D], block_tables [B, MB],
    context_lens [B], scale) -> [B, H, D]; None when the kernels are unavailable."""
    m = _load()
    return None if m is None else m.paged_decode_attention


def sample_kernel() -> Callable[..., list[torch.Tensor]] | None:
    """sample_rows(logits [B, V] float32, temperature [B] float32, u [B] float64) -> [tokens [B], logprobs [B]]
    (processed log-probs, no top-k/top-p); None when the kernels are unavailable."""
    m = _load()
    return None if m is None else m.sample_rows


def layer_ops() -> ModuleType | None:
    """The fused per-layer ops for the float32 CPU decode path (`models.decoder.DecoderLM` uses them when its
    `AttnMetadata.fused` is set): add_rmsnorm_(x, r, w, eps), silu_mul(gu), rope_store(qkv, cos, sin, cache, slots,
    H, KVH); None when the kernels are unavailable."""
    return _load()
