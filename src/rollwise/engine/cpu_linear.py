"""Pre-packed linear layers for the CPU engine: float32, bfloat16 and int8 (weight-only) weights, one pass over the
weights per call, the work split across threads by output columns.

Why: a decode step at small batch (8-16 rows, the long tail of every RL step) reads every weight for a few rows, so
it is bound by memory, and torch's sgemm at [8, 576] x [576, 3072] moves its weights at 4-5 GB/s here (it repacks
the weight panel on every call, and splits a small M badly across threads). These kernels keep each weight
pre-packed once (at load and at every `load_weights`) in tiles of 16 output columns, contiguous along k, so a
thread streams its share of the columns straight from memory once per call whatever the number of rows; rows are
taken 8 at a time against a pair of tiles (16 accumulators in registers), and rows beyond 192 are blocked so the
activations stay in L2 during a prefill.

Formats (`PackedWeight.kind`):
- `float32`: exact float32 arithmetic (fused multiply-adds, a different summation order from MKL's: float32
  rounding differences only). Tiles [M/16, K, 16].
- `bfloat16`: weights rounded to bfloat16; the activations are rounded to bfloat16 at the matmul input and the dot
  products accumulate in float32 (AVX512-BF16 `vdpbf16ps`, 2x the float32 rate, half the bytes). Everything else
  (residual stream, norms, attention, KV cache, logits, sampling) stays float32. Tiles [M/16, K/2, 16, 2].
- `int8`: symmetric per-output-channel int8 weights (scale = max|w| / 127), a quarter of the float32 bytes. A thread
  expands its current tile pair into a bfloat16 scratch (int8 values are exact in bfloat16), runs the bfloat16
  kernel on it, and applies the channel scale to the float32 result. Activations are bfloat16 as above.

Left out: int8 activations (VNNI `vpdpbusd`), per-group scales, AMX tiles. Without AVX-512 (or without a compiler)
the kernels are not used: `available()` is False and the model keeps torch's `F.linear` (the low-precision modes then
fall back to weights dequantized to float32, same numbers as the packed path up to float32 summation order).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from rollwise.engine.inline_ext import InlineExtension

import torch

if TYPE_CHECKING:
    from rollwise.cpu_features import BF16Isa

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cstdint>
#include <cstring>
#include <vector>
#include <algorithm>
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define RW_HAVE_AVX512 1
#else
#define RW_HAVE_AVX512 0
#endif

bool has_avx512() { return RW_HAVE_AVX512 != 0; }

#if RW_HAVE_AVX512
// Software prefetch distance in k steps (1 KB ahead per tile for bf16, 1 KB for float32): at 8 rows the hardware
// prefetcher alone left the float32 LM head at ~8 GB/s, with it ~10.5 GB/s (this machine's copy bandwidth).
#define RW_PF 16
// ---- float32: rows [R] x 32 columns (two tiles of 16), k from 0 to K; w0, w1: [K, 16] floats each.
template <int R>
static inline void mk_f32(const float* x, int64_t ldx, const float* w0, const float* w1, int64_t K, float* y,
                          int64_t ldy, const float* bias, int64_t c0) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) { acc[r][0] = _mm512_setzero_ps(); acc[r][1] = _mm512_setzero_ps(); }
  for (int64_t k = 0; k < K; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(w0 + (k + RW_PF) * 16), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w1 + (k + RW_PF) * 16), _MM_HINT_T0);
    const __m512 b0 = _mm512_loadu_ps(w0 + k * 16), b1 = _mm512_loadu_ps(w1 + k * 16);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * ldx + k]);
      acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  const __m512 bb0 = bias ? _mm512_loadu_ps(bias + c0) : _mm512_setzero_ps();
  const __m512 bb1 = bias ? _mm512_loadu_ps(bias + c0 + 16) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(y + r * ldy + c0, _mm512_add_ps(acc[r][0], bb0));
    _mm512_storeu_ps(y + r * ldy + c0 + 16, _mm512_add_ps(acc[r][1], bb1));
  }
}

// ---- bfloat16: x [R, 2 * P] bf16 (as uint16), w0, w1: [P, 16, 2] bf16 (k pairs); y = scale * acc + bias.
template <int R>
static inline void mk_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w0, const uint16_t* w1, int64_t P,
                           float* y, int64_t ldy, const float* scale, const float* bias, int64_t c0) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) { acc[r][0] = _mm512_setzero_ps(); acc[r][1] = _mm512_setzero_ps(); }
  for (int64_t p = 0; p < P; ++p) {
    _mm_prefetch(reinterpret_cast<const char*>(w0 + (p + RW_PF) * 32), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w1 + (p + RW_PF) * 32), _MM_HINT_T0);
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(w0 + p * 32);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(w1 + p * 32);
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * ldx + 2 * p, 4);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
    }
  }
  const __m512 s0 = scale ? _mm512_loadu_ps(scale + c0) : _mm512_set1_ps(1.f);
  const __m512 s1 = scale ? _mm512_loadu_ps(scale + c0 + 16) : _mm512_set1_ps(1.f);
  const __m512 bb0 = bias ? _mm512_loadu_ps(bias + c0) : _mm512_setzero_ps();
  const __m512 bb1 = bias ? _mm512_loadu_ps(bias + c0 + 16) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(y + r * ldy + c0, _mm512_fmadd_ps(acc[r][0], s0, bb0));
    _mm512_storeu_ps(y + r * ldy + c0 + 16, _mm512_fmadd_ps(acc[r][1], s1, bb1));
  }
}

// int8 [n] -> bf16 [n] (exact), n a multiple of 32.
static inline void i8_to_bf16(const int8_t* q, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 32) {
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(q + i))));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(q + i + 16))));
    _mm512_storeu_si512(out + i, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

// float32 [n] -> bf16 [n], round to nearest even; n any.
static inline void f32_to_bf16(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i*)(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    const __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
    _mm256_mask_storeu_epi16(out + i, m, v);
  }
}

#define RW_DISPATCH(R, CALL) switch (R) { \
  case 8: CALL(8); break; case 7: CALL(7); break; case 6: CALL(6); break; case 5: CALL(5); break; \
  case 4: CALL(4); break; case 3: CALL(3); break; case 2: CALL(2); break; default: CALL(1); break; }
#endif

static constexpr int64_t ROW_BLOCK = 192;  // rows whose activations stay in L2 while a thread walks its columns

// x [N, K] float32 contiguous; w: packed (see the Python side); kind 0 float32, 1 bfloat16, 2 int8.
// Returns y [N, Mp] float32 (Mp = padded columns, a multiple of 32).
torch::Tensor packed_linear(torch::Tensor x, torch::Tensor w, int64_t kind, int64_t K, int64_t Mp,
                            c10::optional<torch::Tensor> scale, c10::optional<torch::Tensor> bias) {
#if RW_HAVE_AVX512
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2 && x.size(1) == K,
              "x: contiguous [N, K] float32");
  TORCH_CHECK(w.is_contiguous() && Mp % 32 == 0, "packed weight");
  const int64_t N = x.size(0);
  auto y = torch::empty({N, Mp}, x.options());
  if (N == 0) return y;
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float* sp = scale.has_value() ? scale->data_ptr<float>() : nullptr;
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const int64_t ntp = Mp / 32;  // tile pairs
  if (kind == 0) {
    const float* wp = w.data_ptr<float>();
    at::parallel_for(0, ntp, 1, [&](int64_t tb, int64_t te) {
      for (int64_t r0 = 0; r0 < N; r0 += ROW_BLOCK) {
        const int64_t r1 = std::min(N, r0 + ROW_BLOCK);
        for (int64_t tp = tb; tp < te; ++tp) {
          const float* w0 = wp + (2 * tp) * K * 16;
          const float* w1 = w0 + K * 16;
          for (int64_t r = r0; r < r1; r += 8) {
            const int64_t R = std::min<int64_t>(8, r1 - r);
#define RW_CALL_F32(RR) mk_f32<RR>(xp + r * K, K, w0, w1, K, yp + r * Mp, Mp, bp, tp * 32)
            RW_DISPATCH(R, RW_CALL_F32)
#undef RW_CALL_F32
          }
        }
      }
    });
    return y;
  }
  const int64_t Kp = (K + 1) / 2 * 2, P = Kp / 2;
  // activations -> bf16 once per call, rows padded to Kp (a zero pair at the end when K is odd)
  auto xb = torch::zeros({N, Kp}, torch::dtype(torch::kInt16));
  uint16_t* xbp = reinterpret_cast<uint16_t*>(xb.data_ptr<int16_t>());
  at::parallel_for(0, N, 16, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) f32_to_bf16(xp + n * K, xbp + n * Kp, K);
  });
  const uint16_t* wb = kind == 1 ? reinterpret_cast<const uint16_t*>(w.data_ptr<int16_t>()) : nullptr;
  const int8_t* wq = kind == 2 ? w.data_ptr<int8_t>() : nullptr;
  at::parallel_for(0, ntp, 1, [&](int64_t tb, int64_t te) {
    std::vector<uint16_t> scratch(kind == 2 ? 2 * P * 32 : 0);
    for (int64_t r0 = 0; r0 < N; r0 += ROW_BLOCK) {
      const int64_t r1 = std::min(N, r0 + ROW_BLOCK);
      for (int64_t tp = tb; tp < te; ++tp) {
        const uint16_t *w0, *w1;
        if (kind == 1) {
          w0 = wb + (2 * tp) * P * 32;
          w1 = w0 + P * 32;
        } else {
          i8_to_bf16(wq + (2 * tp) * P * 32, scratch.data(), 2 * P * 32);
          w0 = scratch.data();
          w1 = w0 + P * 32;
        }
        for (int64_t r = r0; r < r1; r += 8) {
          const int64_t R = std::min<int64_t>(8, r1 - r);
#define RW_CALL_BF16(RR) mk_bf16<RR>(xbp + r * Kp, Kp, w0, w1, P, yp + r * Mp, Mp, sp, bp, tp * 32)
          RW_DISPATCH(R, RW_CALL_BF16)
#undef RW_CALL_BF16
        }
      }
    }
  });
  return y;
#else
  TORCH_CHECK(false, "rollwise packed linear: built without AVX-512 BF16");
  return x;
#endif
}
"""

KINDS = {"float32": 0, "bfloat16": 1, "int8": 2}
PACKED_MAX_ROWS_AMX = 16
"""With AMX (oneDNN may use it): bfloat16 and int8 rows up to this run the packed tiles; more rows run oneDNN's bf16
matmul on prepacked weights (AMX tiles: 3-5x the AVX512-BF16 kernel at 64 rows on an Intel Xeon).
NOTE: a single [8, 576] x [576, 3072] call is faster through oneDNN (255 against 303 us there), but in the engine at
8 rows the packed tiles win (2 threads: 3.84 s against 4.70 s for 8 x 128 tokens, 1 thread: level): they split the
output columns over the threads, while oneDNN at a few rows does not scale past one."""
PACKED_MAX_ROWS_AVX512 = 256
"""Without AMX (AVX512-BF16 only, or oneDNN capped below AMX): oneDNN's bf16 matmul runs the same `vdpbf16ps` as
the packed tiles, and the tiles win up to here (SmolLM2-135M's linear layers, 2 threads, AMD EPYC: 1.66x at 16 rows,
1.39x at 64, 1.23x at 128 and 256; bench/linear_kernels.py); oneDNN's blocking takes over for prefills beyond."""


def packed_max_rows(isa: BF16Isa | Literal["machine"] | None = "machine") -> int:
    """The most rows the packed bf16 / int8 tiles take before oneDNN's bf16 matmul does, for this CPU (`isa`: a
    `cpu_features.cpu_bf16_support` value, None for no native bf16; default "machine": this machine's under
    `ONEDNN_MAX_CPU_ISA`). Read once per weight load (`make_fast`), never per step."""
    from rollwise.cpu_features import machine_bf16_support

    isa = machine_bf16_support() if isa == "machine" else isa
    return PACKED_MAX_ROWS_AMX if isa == "amx_bf16" else PACKED_MAX_ROWS_AVX512


_EXT = InlineExtension("rollwise_cpu_linear_v2", _SOURCE, ["packed_linear", "has_avx512"], "packed CPU linear kernels",
                       "torch's F.linear", check=lambda m: None if m.has_avx512() else "this CPU or compiler has no AVX-512 BF16")


def _load() -> ModuleType | None:
    """The compiled module, or None when unavailable (`_EXT.failed` says why)."""
    return _EXT.get()


def available() -> bool:
    """Whether the packed kernels can run here (AVX-512 BF16, a compiler, not switched off)."""
    return _load() is not None


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: w [M, K] -> (q [M, K] int8, scale [M] float32), w ~ q * scale[:, None]."""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


@dataclass
class PackedWeight:
    """One linear layer's weight in the packed layout, plus what `forward` needs. Plain data; rebuilt by `pack`."""

    kind: str  # float32 | bfloat16 | int8
    data: torch.Tensor  # packed tiles (see the module docstring)
    out_features: int  # M
    in_features: int  # K
    padded_out: int  # Mp, a multiple of 32
    scale: torch.Tensor | None  # [Mp] float32 per-channel scales (int8 only)
    bias: torch.Tensor | None  # [Mp] float32
    wide: torch.Tensor | None = None  # int8 only: the integers as a bf16 [M, K] matrix (exact, prepacked) for many rows
    max_rows: int = PACKED_MAX_ROWS_AMX  # int8 only: more rows than this run `_int8_wide` (`packed_max_rows`)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] float32 -> [..., M] float32."""
        m = _load()
        assert m is not None, "packed weights need the kernels"
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != torch.float32 or not x2.is_contiguous():
            x2 = x2.float().contiguous()
        if self.kind == "int8" and x2.shape[0] > self.max_rows:
            return self._int8_wide(x2).reshape(*shape[:-1], self.out_features)
        y = m.packed_linear(x2, self.data, KINDS[self.kind], self.in_features, self.padded_out, self.scale, self.bias)
        if self.padded_out != self.out_features:
            y = y[:, : self.out_features]
        return y.reshape(*shape[:-1], self.out_features)

    def _int8_wide(self, x: torch.Tensor) -> torch.Tensor:
        """Many rows (a prefill, a large decode batch): torch's bf16 matmul (oneDNN; AMX where the CPU has it) on the
        integers held as bf16 (exact), then the channel scales: the int8 mode's numbers at the bf16 mode's speed.
        NOTE: expanding the int8 tiles per call instead costs a pass over every weight per step (measured here: 2x
        slower than float32 at 64 rows), and the AVX512-BF16 kernel with a per-tile scratch is 3-4x slower than AMX
        at 64 rows; holding the bf16 copy makes the int8 mode 3 bytes a weight in memory (float32: 4)."""
        M = self.out_features
        assert self.wide is not None and self.scale is not None
        y = bf16_matmul(x, self.wide).mul_(self.scale[:M])
        return y if self.bias is None else y.add_(self.bias[:M])

    def dequantized(self) -> torch.Tensor:
        """The [M, K] float32 weight these tiles compute with (for tests and the torch fallback)."""
        M, K, Mp = self.out_features, self.in_features, self.padded_out
        if self.kind == "float32":
            return self.data.view(Mp // 16, K, 16).permute(0, 2, 1).reshape(Mp, K)[:M].clone()
        Kp = (K + 1) // 2 * 2
        t = self.data.view(Mp // 16, Kp // 2, 16, 2).permute(0, 2, 1, 3).reshape(Mp, Kp)[:M, :K]
        if self.kind == "bfloat16":
            return t.view(torch.bfloat16).float() if t.dtype == torch.int16 else t.float()
        assert self.scale is not None
        return t.float() * self.scale[:M, None]


def pack(weight: torch.Tensor, bias: torch.Tensor | None, kind: str, max_rows: int | None = None) -> PackedWeight:
    """Pack a [M, K] weight (any float dtype) into `kind`'s tiles. `max_rows` (int8): the most rows the tiles take
    (default `packed_max_rows()`, this CPU's)."""
    if kind not in KINDS:
        raise ValueError(f"unknown packed weight kind {kind!r}; use one of {', '.join(KINDS)}")
    w = weight.detach().float()
    M, K = w.shape
    Mp = -(-M // 32) * 32
    scale = None
    if kind == "int8":
        q, s = quantize_int8(w)
        scale = torch.zeros(Mp, dtype=torch.float32)
        scale[:M] = s
        src: torch.Tensor = q
    elif kind == "bfloat16":
        src = w.to(torch.bfloat16)
    else:
        src = w
    if Mp != M:
        src = torch.cat([src, src.new_zeros(Mp - M, K)], 0)
    if kind == "float32":
        data = src.view(Mp // 16, 16, K).permute(0, 2, 1).contiguous()  # [M/16, K, 16]
    else:
        Kp = (K + 1) // 2 * 2
        if Kp != K:
            src = torch.cat([src, src.new_zeros(Mp, Kp - K)], 1)
        data = src.view(Mp // 16, 16, Kp // 2, 2).permute(0, 2, 1, 3).contiguous()  # [M/16, K/2, 16, 2]
        if kind == "bfloat16":
            data = data.view(torch.int16)
    b = None
    if bias is not None:
        b = torch.zeros(Mp, dtype=torch.float32)
        b[:M] = bias.detach().float()
    wide = prepack_bf16(q.to(torch.bfloat16)) if kind == "int8" else None
    return PackedWeight(kind, data, M, K, Mp, scale, b, wide, packed_max_rows() if max_rows is None else max_rows)


@dataclass
class Bf16Dual:
    """bfloat16 at every batch size: the packed AVX512-BF16 tiles up to `max_rows` rows (`packed_max_rows`: the decode
    tail, or every decode batch without AMX), torch's bf16 matmul (oneDNN, AMX where present) above. Both give bf16 inputs
    with float32 accumulation; the oneDNN path also rounds its result to bf16. Holds both layouts (2 x the bf16
    bytes: the float32 size)."""

    packed: PackedWeight
    wide: "Bf16Weight"
    max_rows: int = PACKED_MAX_ROWS_AMX

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        return self.packed(x) if rows <= self.max_rows else self.wide(x)

    def native(self, x: torch.Tensor) -> torch.Tensor:
        """The same product in the dtype its kernel writes: float32 from the packed tiles, bfloat16 from oneDNN."""
        rows = x.numel() // x.shape[-1]
        return self.packed(x) if rows <= self.max_rows else self.wide.native(x)


@dataclass
class Bf16Weight:
    """bfloat16 weights through torch's bf16 matmul (oneDNN; on CPUs with AMX it uses the tiles), on weights prepacked
    in oneDNN's layout (`prepack_bf16`): activations rounded to bfloat16, the result back in float32. Used above
    `Bf16Dual.max_rows` rows, and at every batch size where the packed kernels cannot run."""

    weight: torch.Tensor  # [M, K] bfloat16, plain or `prepack_bf16`'s
    bias: torch.Tensor | None  # [M] float32

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = bf16_matmul(x, self.weight)
        return y if self.bias is None else y.add_(self.bias)

    def native(self, x: torch.Tensor) -> torch.Tensor:
        """The product as oneDNN writes it, rounded to bfloat16 (with a bias: float32, added before rounding would
        differ from `__call__`). For consumers that widen on load (the fused decode kernels, the sampler): the same
        numbers as `__call__` without a float32 copy of the output."""
        if self.bias is not None:
            return self(x)
        return bf16_matmul(x, self.weight, widen=False)


def bucket_rows(n: int) -> int:
    """Rows padded to a bucket (a multiple of 16 up to 256, of 128 above) before a oneDNN call.
    NOTE: oneDNN JIT-compiles a kernel per new shape (measured here: 8.7 ms a call for unseen row counts against
    3.8 ms for seen ones at [~48, 576] x [576, 3072]); a decode batch shrinks one row at a time and every prefill has
    its own token count, so unpadded rows would compile all the time."""
    return -(-n // 16) * 16 if n <= 256 else -(-n // 128) * 128


_ONEDNN_PREPACK = (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
                   and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def prepack_bf16(w: torch.Tensor) -> torch.Tensor:
    """A [M, K] bfloat16 weight in oneDNN's own blocked layout (an opaque mkldnn tensor) for `bf16_matmul`; the plain
    tensor where torch has no oneDNN.
    NOTE: F.linear on a plain bf16 weight reorders the weight into that layout on every call. Prepacked once, a call
    only multiplies: measured here at 64 rows and 2 threads, 1.3-2.1x faster per projection (the LM head 8.4 ms ->
    4.0 ms), results bitwise identical (tests/engine/test_cpu_linear.py)."""
    w = w.detach().to(torch.bfloat16).contiguous()
    if not _ONEDNN_PREPACK:
        return w
    return torch.ops.mkldnn._reorder_linear_weight(w, 64)  # 64: the decode batch the layout is tuned for


def bf16_matmul(x: torch.Tensor, w: torch.Tensor, widen: bool = True) -> torch.Tensor:
    """x [..., K] float -> x_bf16 @ w^T in float32 ([..., M]; bfloat16, as oneDNN writes it, with `widen=False`),
    rows bucketed (`bucket_rows`). `w`: a plain [M, K] bfloat16 tensor or `prepack_bf16`'s.
    NOTE: widening is a full pass over the output (measured on an Intel Xeon with AMX, 2 threads: 60 us on the 275 us
    of a [64, 576] x [576, 3072] product, and the LM head's [64, 49152] logits every step); consumers that can read
    bfloat16 take the narrow result."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    n = x2.shape[0]
    nb = bucket_rows(n)
    if nb == n:
        xb = x2.to(torch.bfloat16)
    else:
        xb = torch.empty(nb, shape[-1], dtype=torch.bfloat16)
        xb[:n] = x2
        xb[n:].zero_()
    if w.is_mkldnn:
        y = torch.ops.mkldnn._linear_pointwise(xb, w, None, "none", [], "")
    else:
        y = torch.nn.functional.linear(xb, w)
    y = y[:n] if nb != n else y
    return (y.float() if widen else y).reshape(*shape[:-1], w.shape[0])


@dataclass
class DequantWeight:
    """The torch fallback for `int8` when the packed kernels cannot run: the int8 weights dequantized to float32 once,
    activations rounded to bfloat16 as the kernel rounds them (same numbers up to float32 summation order)."""

    weight: torch.Tensor  # [M, K] float32 = q * scale
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x.to(torch.bfloat16).float(), self.weight, self.bias)


# NOTE: which format runs at which batch size is decided here, once per weight load, never per step.
# float32 uses the packed kernel at every row count (measured here at 8, 64, 300, 512 and 2048 rows: at or above
# MKL's sgemm, 2x at 8 rows); bfloat16 and int8 use the packed kernels up to `packed_max_rows()` rows (chosen by
# the CPU: 16 with AMX, 256 without) and oneDNN's bf16 matmul on prepacked weights above.
def make_fast(weight: torch.Tensor, bias: torch.Tensor | None, kind: str,
              max_rows: int | None = None) -> PackedWeight | Bf16Dual | Bf16Weight | DequantWeight | None:
    """The `Linear.fast` callable for one weight in `kind` (float32 | bfloat16 | int8); None = plain F.linear.
    `max_rows`: the packed tiles' row limit for bfloat16 / int8 (default `packed_max_rows()`, this CPU's)."""
    rows = packed_max_rows() if max_rows is None else max_rows
    if kind == "bfloat16":
        wide = Bf16Weight(prepack_bf16(weight), None if bias is None else bias.detach().float().clone())
        return Bf16Dual(pack(weight, bias, kind, rows), wide, rows) if available() else wide
    if available():
        return pack(weight, bias, kind, rows)
    if kind == "int8":
        q, s = quantize_int8(weight)
        return DequantWeight(q.float() * s[:, None], None if bias is None else bias.detach().float().clone())
    return None


def describe(kind: str) -> str:
    """Which linear kernels a `kind` engine runs on this CPU, in one phrase (for the run log and the benches)."""
    from rollwise.cpu_features import machine_bf16_support

    isa = machine_bf16_support() or "no native bf16"
    if not available():
        why = _EXT.failed or "switched off"
        if kind == "float32":
            return f"linear layers: torch F.linear (MKL) (packed kernels unavailable: {why})"
        if kind == "int8":
            return f"linear layers: int8 dequantized to float32, torch F.linear (packed kernels unavailable: {why})"
        return f"linear layers: oneDNN bf16 matmul at every batch size ({isa}; packed kernels unavailable: {why})"
    if kind == "float32":
        return "linear layers: packed float32 tiles (AVX-512) at every batch size"
    rows = packed_max_rows()
    return (f"linear layers: packed {kind} tiles (AVX512-BF16) up to {rows} rows, oneDNN bf16 matmul above "
            f"({isa})")


def prepare_linears(model: torch.nn.Module, kind: str) -> int:
    """Set `fast` on every engine `Linear` of `model` (rebuilt from its current weights); returns how many."""
    from rollwise.models.decoder import Linear

    n = 0
    rows = packed_max_rows()
    for mod in model.modules():
        if isinstance(mod, Linear):
            mod.fast = None
            mod.fast = make_fast(mod.weight, mod.bias, kind, rows)
            n += 1
    return n


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step reads for the linear layers' weights in their engine format (for bandwidth figures)."""
    from rollwise.models.decoder import Linear

    total = 0
    for mod in model.modules():
        if isinstance(mod, Linear):
            f = mod.fast.packed if isinstance(mod.fast, Bf16Dual) else mod.fast
            t = f.data if isinstance(f, PackedWeight) else f.weight if f is not None else mod.weight
            total += t.numel() * t.element_size()
    return total
