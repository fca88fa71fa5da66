"""Checks on a weight upload before the engine sees it: all of an upload loads, or none of it does.

The engine copies tensors in as they come (`WeightMapper.load`, models/loader.py), so a bad tensor in the
middle of an upload used to be refused after the tensors before it were copied in: the outputs had changed
and the version had not. Here every tensor of an upload is checked first, on the handler's thread while the
engine keeps serving: its name and shape (the mapper's own rules, `WeightMapper.check`), a floating-point
dtype, and finite values once stored in the model's dtype (65536.0 is finite in float32 and inf in float16).
Only an upload that passes goes to the engine thread, which then copies it between two steps.

Left out on purpose: a rollback copy of the weights (it would double the memory). A failure while copying
itself (the device running out of memory mid-upload) can still leave a mix; it is reported as a 500.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollwise.serve.protocol import APIError


def check_upload(model: Any, tensors: Mapping[str, Any]) -> int:
    """Raise APIError(400) naming the first tensor of `tensors` (HF names) that `model` (a `DecoderLM`) cannot
    take; touches nothing. Returns how many tensors would be copied."""
    import torch

    from rollwise.models.loader import CheckpointError, WeightMapper

    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise APIError(400, f"cannot load these weights: {name!r} is not a tensor")
    try:
        stored = WeightMapper(model).check(tensors.items())
    except CheckpointError as e:
        raise APIError(400, f"cannot load these weights: {e}") from None
    if not stored:
        raise APIError(400, f"cannot load these weights: none of the {len(tensors)} tensors is a weight of this model")
    for name, dtype in stored.items():
        t = tensors[name]
        if not t.is_floating_point():
            raise APIError(400, f"cannot load these weights: {name!r} has dtype {str(t.dtype).removeprefix('torch.')}; "
                                "weights must be floating point")
        bad = int((~torch.isfinite(t.to(dtype))).sum())
        if bad:
            raise APIError(400, f"cannot load these weights: {name!r} has {bad} non-finite value(s) (NaN or inf) as "
                                f"{str(dtype).removeprefix('torch.')}")
    return len(stored)
