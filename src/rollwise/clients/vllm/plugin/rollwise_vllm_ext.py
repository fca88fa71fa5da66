"""rollwise's vLLM worker extension: weight loads that land, run inside vLLM's worker processes.

Start vLLM with this file's directory on PYTHONPATH and
`--worker-extension-cls rollwise_vllm_ext.RollwiseWorkerExtension`; rollwise then calls
`POST /collective_rpc {"method": "rollwise_load_weights", "kwargs": {"path": DIR}}` (dev mode,
`VLLM_SERVER_DEV_MODE=1`) between `/pause` and `/resume`.

Why not vLLM's own `reload_weights(weights_path=DIR)`: it reloads every parameter in place and re-runs the
post-load processing of the layers it loaded, but a tied LM head (SmolLM2, Qwen2-0.5B, Llama-3.2-1B: `lm_head`
shares `embed_tokens.weight`) is never loaded by name, so the kernel-format copy its processing made at start
(on CPU: a packed / oneDNN weight) keeps the base model's head and the log-probs drift (measured 1.8e-2 after 20
GRPO steps on SmolLM2). `rollwise_load_weights` loads the tensors, then re-runs the post-load processing of every
module whose weight is shared with another module (the tied heads), and reports what it did, so the caller can
tell a load that landed from one that silently did nothing.

This file is imported by vLLM's interpreter (its own venv), so it imports nothing from rollwise: only torch,
safetensors and vLLM.
"""

from __future__ import annotations

import os
import time
from typing import Any


def _tied_modules(model: Any) -> list[tuple[str, Any]]:
    """(name, module) of every module that has a `quant_method` and whose `weight` is the same tensor storage as
    another module's weight: the post-load processing of these is not re-run by an in-place reload."""
    owners: dict[int, list[tuple[str, Any]]] = {}
    for name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if w is None or not hasattr(w, "data_ptr") or getattr(w, "is_meta", False) or w.numel() == 0:
            continue
        owners.setdefault(w.data_ptr(), []).append((name, mod))
    return [(n, m) for mods in owners.values() if len(mods) > 1 for n, m in mods
            if getattr(m, "quant_method", None) is not None and "embed" not in n]


class RollwiseWorkerExtension:
    """Mixed into vLLM's worker class (`--worker-extension-cls`); `self.model_runner` is the worker's."""

    def rollwise_load_weights(self, path: str) -> dict[str, Any]:
        """Load `path/model.safetensors` (HF names) into the served model; re-process tied heads. Returns
        {"loaded": tensors, "reprocessed": module names, "seconds": s}."""
        import torch
        from safetensors.torch import load_file

        t0 = time.perf_counter()
        f = os.path.join(path, "model.safetensors")
        if not os.path.isfile(f):
            raise FileNotFoundError(f"rollwise_load_weights: no model.safetensors in {path}")
        tensors = load_file(f)
        runner = self.model_runner  # type: ignore[attr-defined]
        model = runner.get_model()
        device = next(model.parameters()).device
        items = [(k, v.to(device)) for k, v in tensors.items()]
        with torch.no_grad():
            runner.reload_weights(weights_iterator=iter(items))
            redone = []
            for name, mod in _tied_modules(model):
                mod.quant_method.process_weights_after_loading(mod)
                redone.append(name)
        return {"loaded": len(items), "reprocessed": redone, "seconds": time.perf_counter() - t0}

    def rollwise_extension_version(self) -> dict[str, int]:
        """Answers only where this extension is loaded: how rollwise tells it from vLLM's plain reload (no work)."""
        return {"version": 1}
