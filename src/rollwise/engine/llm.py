"""`LLM`: the batch API of ARCHITECTURE.md's public contract, a thin loop over `EngineCore`; implements
`engine.protocol.Engine` (and exposes the step-level `EngineCore` as `.engine`)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence as Seq

import torch

from rollwise.engine.core import EngineConfig, EngineCore
from rollwise.types import CompletionOutput, RequestOutput, SamplingParams


class LLM:
    """Offline generation engine.

    >>> llm = LLM("ckpt_dir", device="cpu", dtype="float32")
    >>> outs = llm.generate(["1+1="], SamplingParams(n=8, temperature=1.0, max_tokens=16, seed=0))
    """

    def __init__(self, model: str | Path, device: str = "cpu", dtype: str = "float32", tokenizer: Any = None,
                 **engine_kwargs: Any) -> None:
        """engine_kwargs: the sizing fields of `rollwise.config.EngineConfig` (same names and defaults as the run
        config's `engine` section), plus `seed` for requests submitted without one."""
        from pydantic import ValidationError

        seed = int(engine_kwargs.pop("seed", 0))
        try:
            cfg = EngineConfig(**engine_kwargs)
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            raise ValueError(f"LLM: bad engine argument {'.'.join(map(str, err['loc']))!r}: {err['msg']}") from None
        self.engine = EngineCore.from_pretrained(model, device=device, dtype=dtype, config=cfg, tokenizer=tokenizer,
                                                 seed=seed)
        self.model_dir = str(model)
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

    def load_weights(self, state_dict: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                     version: int | None = None) -> int:
        """Load HF-named weights (a full or partial state dict, e.g. a trainer's) as `version` (None: current + 1);
        returns the new `weight_version` (see `engine.protocol`)."""
        return self.engine.load_weights(state_dict, version)

    def abort(self, request_id: str) -> RequestOutput | None:
        return self.engine.abort(request_id)
