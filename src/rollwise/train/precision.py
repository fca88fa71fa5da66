"""The training forward's precision, chosen once at setup: float32, or bf16 autocast over float32 master weights.

Mixed precision here is `torch.autocast(dtype=bfloat16)`: the parameters, their gradients and AdamW's moments stay
float32 (the master weights), matmul inputs are rounded to bf16 inside the forward and its recomputation in
backward, and the log-softmax over the vocabulary runs in float32 (`train/logprobs.py` upcasts the logits). So the
update is a float32 update of a gradient computed at bf16 matmul precision.

Whether bf16 pays depends on the device and, on the CPU, on its instruction set: CUDA has bf16 tensor cores;
a CPU with AMX tiles or AVX512-BF16 (`vdpbf16ps`) runs oneDNN's bf16 matmul at two to three times the float32
rate (SmolLM2-135M GRPO step: 2.1x on 2 threads of an Intel Xeon with AMX, 2.7-3.0x on an AMD EPYC with
AVX512-BF16, docs/benchmarks.md); a CPU without them emulates bf16 and loses (0.84x). `train.bf16: auto` (the
default) is bf16 on CUDA, and on such a CPU when the engine samples below float32 (`model.dtype` bfloat16 or int8):
the loss then corrects the engine/trainer gap with TIS, and bf16 training learned as float32 did (the addition
recipe, 3 seeds each, bf16 engine: held-out greedy 61/64/68% against 60/62/70%). With a float32 engine 'auto'
keeps float32: there bf16 training is the only source of a gap nothing corrects, and over 3 seeds it ended a
median 7 points lower (one seed at 45%). `true` / `false` force it.
`ONEDNN_MAX_CPU_ISA` (oneDNN's own cap on the instruction set it may use) is honoured: capped below
AVX512_CORE_BF16, the CPU counts as one without native bf16.

Deliberately left out: float16 with loss scaling (no CPU runs it faster than bf16), and bf16 master weights or
optimiser state (their rounding swallows AdamW updates of lr 1e-6 on weights of order 1e-2).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Literal

import torch

from rollwise.cpu_features import CPU_BF16_FLAGS, cpu_bf16_support, cpu_flags

__all__ = ["CPU_BF16_FLAGS", "TrainPrecision", "cpu_bf16_support", "cpu_flags", "train_precision"]


@dataclass(frozen=True)
class TrainPrecision:
    """How the trainer's forward (and its recomputation in backward) runs. Parameters are float32 either way."""

    autocast_dtype: torch.dtype | None  # None = plain float32
    device_type: str  # 'cpu' | 'cuda'
    reason: str  # why this was chosen, for logs and benches: 'cpu avx512_bf16', 'train.bf16: false', ...

    @property
    def name(self) -> str:
        return "bf16-autocast" if self.autocast_dtype is not None else "float32"

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context every training / reference forward runs in."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)


def train_precision(setting: bool | Literal["auto"], device: torch.device,
                    flags: frozenset[str] | None = None, max_isa: str | None = None, *,
                    low_precision_rollouts: bool = False) -> TrainPrecision:
    """`train.bf16` resolved for `device`: True / False as given; 'auto' = bf16 on CUDA, and on CPUs with native
    bf16 dot products (`cpu_bf16_support`) when the rollouts are sampled below float32 (`low_precision_rollouts`);
    float32 elsewhere. `flags` / `max_isa` default to this machine's."""
    kind = device.type
    if setting is False:
        return TrainPrecision(None, kind, "train.bf16: false")
    if kind not in ("cpu", "cuda"):
        return TrainPrecision(None, kind, f"no bf16 autocast on {kind}")
    if setting is True:
        return TrainPrecision(torch.bfloat16, kind, "train.bf16: true")
    if os.environ.get("ROLLWISE_TRAIN_BF16_AUTO") == "0":  # 'auto' held to float32 (e.g. a test suite's runs)
        return TrainPrecision(None, kind, "train.bf16: auto, held to float32 by ROLLWISE_TRAIN_BF16_AUTO=0")
    if kind == "cuda":
        return TrainPrecision(torch.bfloat16, kind, "cuda")
    isa = cpu_bf16_support(cpu_flags() if flags is None else flags,
                           os.environ.get("ONEDNN_MAX_CPU_ISA") if max_isa is None else max_isa)
    if isa is None:
        return TrainPrecision(None, kind, "cpu without native bf16 (AMX / AVX512-BF16)")
    if low_precision_rollouts:
        return TrainPrecision(torch.bfloat16, kind, f"cpu {isa}, bf16 rollouts")
    # NOTE: a float32 engine: bf16 training would be the only, uncorrected, source of a gap (module docstring)
    return TrainPrecision(None, kind, f"cpu {isa} with a float32 engine: 'auto' keeps float32; train.bf16: true "
                                      "runs bf16 autocast")
