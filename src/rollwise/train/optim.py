"""AdamW built with torch's fused kernel where it can run.

torch's default AdamW runs one small op per parameter and moment (`foreach` on CUDA, a Python loop per tensor on
the CPU): for SmolLM2-135M on 2 CPU threads one step took 0.67 s (0.39 s `foreach`), the fused kernel 0.087 s, in
a run where a whole training step of the addition recipe is 3-10 s. The fused kernel reads each parameter,
gradient and moment once and applies the same update up to float rounding.

Fused needs plain float tensors on CPU or CUDA; sharded parameters (FSDP2's DTensors) and other devices keep
torch's default implementation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["adamw", "fused_ok"]


def fused_ok(params: Sequence[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW can take `params`: float32/bf16/fp16 plain tensors, all on CPU or all on CUDA."""
    if not params:
        return False
    devices = {p.device.type for p in params}
    if len(devices) != 1 or devices.pop() not in ("cpu", "cuda"):
        return False
    return all(type(p.data) is torch.Tensor and p.is_floating_point() and p.dtype != torch.float64 for p in params)


def adamw(params: Sequence[torch.Tensor], **kwargs: object) -> torch.optim.AdamW:
    """`torch.optim.AdamW(params, **kwargs)`, fused where `fused_ok`."""
    params = list(params)
    return torch.optim.AdamW(params, fused=fused_ok(params) or None, **kwargs)  # type: ignore[arg-type]
