"""Per-segment attention for shared-prompt training rows, plugged into transformers' attention interface.

A shared-prompt row (`train.batch.Segment`) tiles one packed row with segments: a prompt once, then the
completions of every sample that has that prompt, as a trie (each common prefix once). Inside a segment a token
attends to its ancestors and itself (`Segment.mask`): a prompt token causally to the prompt, a completion token to
the whole prompt plus its own earlier tokens, wherever they sit in the trie. Across segments nothing is visible, so
attention runs segment by segment with a compact [S, S] mask each: sum of S_i^2 work instead of the L^2 of a dense
mask over the whole row.

How it plugs in: `enable_segment_attention(model)` switches an HF model whose attention implementation is 'sdpa' or
'eager' to a registered implementation 'rollwise_sdpa' / 'rollwise_eager'. The model still computes q, k, v and
RoPE (from `position_ids`) itself, for any architecture that goes through transformers' attention interface (Llama,
Qwen2/3, Mistral, ...). A forward that passes `rollwise_segments=[(start, end, mask), ...]` gets per-segment SDPA;
any other forward falls through to the original implementation unchanged.

Left out: batching equal-sized segments into one SDPA call, and flash-attention's varlen kernels (a CUDA model on
flash-attention keeps the unshared packed path, which it runs without dense masks anyway).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel

_PREFIX = "rollwise_"
_registered = False


def _segment_attention(base: str):
    def attn(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
             **kwargs: Any) -> tuple[torch.Tensor, None]:
        segs = kwargs.pop("rollwise_segments", None)
        if segs is None:
            return _base_function(base, module)(module, query, key, value, attention_mask, dropout=dropout,
                                                scaling=scaling, **kwargs)
        # query [1, H, L, D], key/value [1, Hkv, L, D]; segments tile the row in order
        gqa = query.shape[1] != key.shape[1]
        outs = []
        for start, end, mask in segs:
            outs.append(torch.nn.functional.scaled_dot_product_attention(
                query[:, :, start:end], key[:, :, start:end], value[:, :, start:end], attn_mask=mask,
                dropout_p=dropout, scale=scaling, enable_gqa=gqa))  # [1, H, S, D]
        out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]  # [1, H, L, D]
        return out.transpose(1, 2).contiguous(), None  # [1, L, H, D], as the interface expects

    return attn


def _base_function(base: str, module: torch.nn.Module):
    """The original implementation: sdpa from the interface; eager is each model file's `eager_attention_forward`."""
    if base == "eager":
        import sys

        fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        if fn is not None:
            return fn
        base = "sdpa"
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[base]


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    for base in ("sdpa", "eager"):
        AttentionInterface.register(_PREFIX + base, _segment_attention(base))
        AttentionMaskInterface.register(_PREFIX + base, ALL_MASK_ATTENTION_FUNCTIONS[base])
    _registered = True


def base_implementation(model: torch.nn.Module) -> str:
    """The model's attention implementation with our wrapper's prefix removed ('sdpa', 'eager', 'flash_attention_2')."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None) or "sdpa"
    return impl.removeprefix(_PREFIX)


def enable_segment_attention(model: PreTrainedModel) -> bool:
    """Switch `model` (an HF PreTrainedModel, before any PEFT wrapping) to the segment-aware implementation.
    True when done (or already done); False when its implementation is not sdpa/eager or it cannot be switched."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl is not None and impl.startswith(_PREFIX):
        return True
    if impl not in ("sdpa", "eager") or not hasattr(model, "set_attn_implementation"):
        return False
    _register()
    try:
        model.set_attn_implementation(_PREFIX + impl)
    except (ValueError, ImportError, NotImplementedError):
        return False
    return getattr(model.config, "_attn_implementation", None) == _PREFIX + impl


def segment_kwargs(segments, device: torch.device) -> list[tuple[int, int, torch.Tensor]]:
    """`Segment`s -> the `rollwise_segments` forward argument: (start, end, [S, S] bool mask on `device`)."""
    return [(sg.start, sg.start + sg.length, sg.mask().to(device)) for sg in segments]


def row_inputs(model: torch.nn.Module, mb: Any, device: torch.device, *, segments_ok: bool) -> dict[str, Any]:
    """The forward's keyword arguments for one packed row (`train.batch.PackedMicroBatch`): input_ids and
    position_ids [1, L], and the attention that keeps its sequences apart: per-segment attention for a shared-prompt
    row (`segments_ok`: the model was switched by `enable_segment_attention`), a block-diagonal causal mask for sdpa
    and eager, none for flash-attention & co (they detect packed sequences from the restarting position_ids)."""
    kw: dict[str, Any] = {"input_ids": mb.input_ids.to(device)[None], "position_ids": mb.position_ids.to(device)[None]}
    if mb.segments is not None:
        if not segments_ok:
            from rollwise.train.errors import TrainerError

            raise TrainerError("a shared-prompt batch reached a model without segment attention: repack it with "
                               "batch.with_layout(share_prompt=False)")
        kw["rollwise_segments"] = segment_kwargs(mb.segments, device)
        # a prepared 4D mask makes transformers skip building its own [L, L] mask; segment attention ignores it
        kw["attention_mask"] = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
        return kw
    impl = base_implementation(model)
    if impl == "sdpa":
        kw["attention_mask"] = mb.attention_mask().to(device)  # [1, 1, L, L] bool, True = attend
    elif impl == "eager":
        allowed = mb.attention_mask().to(device)
        neg = torch.finfo(torch.float32).min
        kw["attention_mask"] = torch.zeros(allowed.shape, dtype=torch.float32, device=device).masked_fill(~allowed, neg)
    else:
        kw["attention_mask"] = None
    return kw
