"""`LLM`: the batch API of ARCHITECTURE.md's public contract, a thin loop over `EngineCore`."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence as Seq

import torch

from rollwise.engine.core import EngineConfig, EngineCore
from rollwise.models.convert import resolve_model
from rollwise.types import CompletionOutput, RequestOutput, SamplingParams


class LLM:
    """Offline generation engine.

    `model`: an HF checkpoint directory, a .gguf file, "smollm2-135m" or a hub id (`models.convert.resolve_model`).

    >>> llm = LLM("ckpt_dir", device="cpu", dtype="float32")
    >>> outs = llm.generate(["1+1="], SamplingParams(n=8, temperature=1.0, max_tokens=16, seed=0))
    """

    def __init__(self, model: str | Path, device: str = "cpu", dtype: str = "float32", tokenizer: Any = None,
                 **engine_kwargs: Any) -> None:
        model_dir = resolve_model(model)  # the checkpoint directory (converted and cached for a .gguf or a known name)
        self.engine = EngineCore.from_pretrained(model_dir, device=device, dtype=dtype,
                                                 config=EngineConfig(**engine_kwargs), tokenizer=tokenizer)
        self.model_dir = str(model_dir)
        self._ids = itertools.count()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"{self.model_dir} has no tokenizer files: pass prompts as lists of token ids")
            return list(self.tokenizer.encode(prompt, add_special_tokens=False))
        return list(prompt)

    def generate(self, prompts: Seq[str] | Seq[list[int]] | str,
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 partial: Seq[list[CompletionOutput] | None] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. `partial[i]` resumes prompt i's aborted samples."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = sampling_params or SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(plist)} sampling params for {len(prompts)} prompts")
        rids = []
        for i, (p, sp) in enumerate(zip(prompts, plist)):
            rid = f"gen-{next(self._ids)}"
            ids = self._encode(p)
            self.engine.add_request(rid, ids, sp, partial=partial[i] if partial is not None else None)
            rids.append((rid, p if isinstance(p, str) else None))
        results: dict[str, RequestOutput] = {}
        while len(results) < len(rids):
            finished = self.engine.step()
            for out in finished:
                results[out.request_id] = out
            if not finished and not self.engine.has_unfinished():
                missing = [rid for rid, _ in rids if rid not in results]
                raise RuntimeError(f"engine went idle with unfinished requests {missing[:3]}")
        outs = []
        for rid, text in rids:
            o = results[rid]
            o.prompt = text
            outs.append(o)
        return outs

    def load_weights(self, state_dict: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load HF-named weights (a full or partial state dict, e.g. a trainer's); returns the new
        `weight_version` (the same as `RemoteEngine.load_weights`)."""
        self.engine.load_weights(state_dict)
        return self.engine.weight_version

    def abort(self, request_id: str) -> RequestOutput | None:
        return self.engine.abort(request_id)
