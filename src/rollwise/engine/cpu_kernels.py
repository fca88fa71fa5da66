"""A fused paged-attention decode kernel for CPU, compiled on first use with torch's C++ extension loader.

Why: in pure torch, decode attention over a paged KV cache must first gather each sequence's blocks into a
dense tensor (a full copy of the context, every layer, every step) and then read it again in the matmuls.
On a CPU that copy is memory traffic the size of the whole KV cache per step. This kernel walks the block
table directly: one pass over K (scores), a softmax, one pass over V, per (sequence, kv head), with the
query heads of a GQA group sharing each K/V read.

It is float32-only and optional: if no compiler or ninja is available, or `ROLLWISE_CPU_KERNELS=0`, the
engine uses the torch path (gather + baddbmm), with the same results to float32 rounding.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>
#include <algorithm>

// q: [B, H, D]; k_cache, v_cache: [KVH, NB, BS, D]; block_tables: [B, MB] int64; context_lens: [B] int64.
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && k_cache.dtype() == torch::kFloat32, "float32 only");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous inputs");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KVH = k_cache.size(0), NB = k_cache.size(1), BS = k_cache.size(2);
  const int64_t MB = block_tables.size(1);
  const int64_t G = H / KVH;
  auto out = torch::zeros_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  const int64_t* cl = context_lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s;
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t b = idx / KVH, kh = idx % KVH;
      const int64_t ctx = cl[b];
      s.assign(G * ctx, 0.f);
      const float* qb = qp + (b * H + kh * G) * D;
      for (int64_t t = 0; t < ctx; ++t) {
        const int64_t blk = bt[b * MB + t / BS];
        const float* kt = kp + ((kh * NB + blk) * BS + t % BS) * D;
        for (int64_t g = 0; g < G; ++g) {
          const float* qg = qb + g * D;
          float acc = 0.f;
          #pragma omp simd reduction(+:acc)
          for (int64_t d = 0; d < D; ++d) acc += qg[d] * kt[d];
          s[g * ctx + t] = acc * sc;
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        float* sg = s.data() + g * ctx;
        float m = -INFINITY;
        for (int64_t t = 0; t < ctx; ++t) m = std::max(m, sg[t]);
        float sum = 0.f;
        for (int64_t t = 0; t < ctx; ++t) { sg[t] = std::exp(sg[t] - m); sum += sg[t]; }
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < ctx; ++t) sg[t] *= inv;
      }
      float* ob = op + (b * H + kh * G) * D;
      for (int64_t t = 0; t < ctx; ++t) {
        const int64_t blk = bt[b * MB + t / BS];
        const float* vt = vp + ((kh * NB + blk) * BS + t % BS) * D;
        for (int64_t g = 0; g < G; ++g) {
          const float w = s[g * ctx + t];
          float* og = ob + g * D;
          #pragma omp simd
          for (int64_t d = 0; d < D; ++d) og[d] += w * vt[d];
        }
      }
    }
  });
  return out;
}
"""

_lock = threading.Lock()
_module: Any = None
_failed: str | None = None


def paged_decode_kernel() -> Any | None:
    """The compiled kernel function, or None when unavailable (the reason is warned about once)."""
    global _module, _failed
    if os.environ.get("ROLLWISE_CPU_KERNELS", "1") == "0":
        return None
    if _module is not None:
        return _module.paged_decode_attention
    if _failed is not None:
        return None
    with _lock:
        if _module is None and _failed is None:
            try:
                from torch.utils.cpp_extension import load_inline

                _module = load_inline(
                    name="rollwise_cpu_kernels_v1", cpp_sources=[_SOURCE], functions=["paged_decode_attention"],
                    extra_cflags=["-O3", "-march=native", "-fopenmp"], verbose=False,
                )
            except Exception as e:  # noqa: BLE001 - no compiler/ninja: fall back to the torch path, loudly once
                _failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                warnings.warn(f"rollwise: CPU decode kernel unavailable ({_failed}); using the torch path",
                              RuntimeWarning, stacklevel=2)
                return None
    return _module.paged_decode_attention if _module is not None else None
