"""`LLM`: the batch API of the public contract (docs/architecture.md), a thin loop over `EngineCore`; implements
`engine.protocol.Engine` (and exposes the step-level `EngineCore` as `.engine`).

Thread safety: `generate`, `load_weights` and `abort` may be called from many threads at once (an `LLMJudge`
under `score_many`, a server's handlers). One lock guards the engine; whichever caller holds it runs one engine
step for *everyone*, files the finished requests under their owners and lets go, so concurrent callers' requests
are batched into the same forward passes instead of queueing behind each other (a plain lock around a whole
`generate` would serialise them: 8 judges, 8 separate batches). Callers that arrive during a step are let in to
add their requests before the next step (`_arriving`), so they join the running batch at once.

Left out: a background engine thread and async API (the rollout controller drives `EngineCore` directly).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence as Seq

import torch

from rollwise.engine.core import EngineConfig, EngineCore
from rollwise.engine.protocol import Engine, params_list, prompt_list
from rollwise.engine.speculative import DraftSpec
from rollwise.models.convert import resolve_model
from rollwise.types import CompletionOutput, RequestOutput, SamplingParams, Tokenizer


class LLM:
    """Offline generation engine.

    `model`: an HF checkpoint directory, a .gguf file, "smollm2-135m" or a hub id (`models.convert.resolve_model`).

    >>> llm = LLM("ckpt_dir", device="cpu", dtype="float32")
    >>> outs = llm.generate(["1+1="], SamplingParams(n=8, temperature=1.0, max_tokens=16, seed=0))
    """

    def __init__(self, model: str | Path, device: str = "cpu", dtype: str = "float32",
                 tokenizer: Tokenizer | None = None, **engine_kwargs: Any) -> None:
        """engine_kwargs: the sizing fields of `rollwise.config.EngineConfig` (same names and defaults as the run
        config's `engine` section), plus `seed` for requests submitted without one."""
        from pydantic import ValidationError

        seed = int(engine_kwargs.pop("seed", 0))
        try:
            cfg = EngineConfig(**engine_kwargs)
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            raise ValueError(f"LLM: bad engine argument {'.'.join(map(str, err['loc']))!r}: {err['msg']}") from None
        model_dir = resolve_model(model)  # the checkpoint directory (converted and cached for a .gguf or a known name)
        self.engine = EngineCore.from_pretrained(model_dir, device=device, dtype=dtype, config=cfg, tokenizer=tokenizer,
                                                 seed=seed)
        self.model_dir = str(model_dir)
        self._ids = itertools.count()
        # NOTE invariants: the engine is touched only under `_cv`; `_done` holds finished outputs of requests some
        # generate call is waiting for (`_wanted`), until that call takes them.
        self._cv = threading.Condition()
        self._gate = threading.Lock()  # guards `_arriving` only
        self._arriving = 0  # callers waiting to add requests; a stepping caller lets them in first
        self._wanted: set[str] = set()
        self._done: dict[str, RequestOutput] = {}

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.engine.tokenizer

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def describe(self) -> str:
        """What computes a step (kernels, KV-cache dtype), in one line: `ModelRunner.describe`."""
        return self.engine.runner.describe()

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"{self.model_dir} has no tokenizer files: pass prompts as lists of token ids")
            return list(self.tokenizer.encode(prompt, add_special_tokens=False))
        return list(prompt)

    def generate(self, prompts: Seq[str] | Seq[list[int]] | str,
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 partial: Seq[list[CompletionOutput] | None] | None = None,
                 drafts: Seq[DraftSpec | Seq[Seq[int]] | None] | None = None, *, draft_k: int = 8,
                 ngram_drafts: bool = True) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. `partial[i]` resumes prompt i's aborted samples.

        `drafts[i]`: speculative decoding for prompt i (engine/speculative.py): past continuations of that prompt
        as token-id lists (an empty list: n-gram drafts only), a `DraftSpec`, or None (off). Up to `draft_k` draft
        tokens are verified per sample per step; `ngram_drafts` adds drafts from the prompt and the other samples.
        The output distribution is unchanged (and with the same seed, so is the output)."""
        batch = prompt_list(prompts)
        plist = params_list(sampling_params, len(batch))
        specs = None
        if drafts is not None:
            if len(drafts) != len(batch):
                raise ValueError(f"{len(drafts)} draft lists for {len(batch)} prompts")
            specs = [DraftSpec.make(d, draft_k, ngram_drafts) for d in drafts]
        with self._turn():
            rids = self._add_all(batch, plist, partial, specs)
        try:
            results = self._drive([rid for rid, _ in rids])
        finally:
            with self._cv:
                for rid, _ in rids:
                    self._wanted.discard(rid)
                    self._done.pop(rid, None)
                    if rid in self.engine.requests:  # an error left it unfinished: take it out of the batch
                        self.engine.abort(rid)
        outs = []
        for rid, text in rids:
            o = results[rid]
            o.prompt = text
            outs.append(o)
        return outs

    def _add_all(self, prompts: list[str | list[int]], plist: list[SamplingParams],
                 partial: Seq[list[CompletionOutput] | None] | None,
                 specs: list[DraftSpec | None] | None = None) -> list[tuple[str, str | None]]:
        """Queue every prompt (all or none: on a bad prompt the ones already queued are aborted). Under `_cv`."""
        rids: list[tuple[str, str | None]] = []
        try:
            for i, (p, sp) in enumerate(zip(prompts, plist)):
                rid = f"gen-{next(self._ids)}"
                ids = self._encode(p)
                self.engine.add_request(rid, ids, sp, partial=partial[i] if partial is not None else None,
                                        drafts=specs[i] if specs is not None else None)
                rids.append((rid, p if isinstance(p, str) else None))
                self._wanted.add(rid)
        except BaseException:
            for rid, _ in rids:
                self._wanted.discard(rid)
                self.engine.abort(rid)
            raise
        return rids

    def _drive(self, mine: list[str]) -> dict[str, RequestOutput]:
        """Step the shared engine until all of `mine` are finished (other callers' requests ride along)."""
        while True:
            with self._cv:
                while self._arriving:  # let callers that came in during the last step join this batch
                    self._cv.wait(timeout=0.001)
                if all(rid in self._done for rid in mine):
                    return {rid: self._done.pop(rid) for rid in mine}
                finished = self.engine.step()
                for out in finished:
                    if out.request_id in self._wanted:
                        self._done[out.request_id] = out
                if not finished and not self.engine.has_unfinished():
                    missing = [rid for rid in mine if rid not in self._done]
                    if missing:
                        raise RuntimeError(f"engine went idle with unfinished requests {missing[:3]}")

    def load_weights(self, state_dict: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                     version: int | None = None) -> int:
        """Load HF-named weights (a full or partial state dict, e.g. a trainer's) as `version` (None: current + 1);
        returns the new `weight_version` (see `engine.protocol`)."""
        with self._turn():
            return self.engine.load_weights(state_dict, version)

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """Hold the engine lock as a caller from outside the step loop: announced in `_arriving`, so the thread
        driving the steps lets us in before its next step (a plain re-acquire by the driver would starve us)."""
        with self._gate:
            self._arriving += 1
        try:
            with self._cv:
                yield
        finally:
            with self._gate:
                self._arriving -= 1

    def running_request_ids(self) -> list[str]:
        """Ids of the requests in the engine now (any caller's)."""
        with self._turn():
            return list(self.engine.requests)

    def counters(self) -> dict[str, int]:
        """Nothing to count: the engine lives and dies with this process."""
        return {}

    def abort(self, request_id: str) -> RequestOutput | None:
        """End a request now; a `generate` call waiting for it gets its partial output (finish_reason 'abort')."""
        with self._turn():
            out = self.engine.abort(request_id)
            if out is not None and request_id in self._wanted:
                self._done[request_id] = out
            return out


if TYPE_CHECKING:  # pragma: no cover - read by mypy only: `LLM` must keep implementing the engine protocol
    def _implements_engine(llm: LLM) -> Engine:
        return llm
