"""Generation on N Ray actors behind the engine protocol (`engine.protocol.Engine`: `generate`,
`load_weights(state, version)`, `abort`, `weight_version`, `tokenizer`).

Ray stays at the edge: `EngineWorker` is a plain class; `ray.remote` and its resources are applied here, at
launch. Weights cross the process boundary as numpy arrays through the object store, put once per update and
read by every actor.

Fault handling: actors restart on death (`max_restarts=-1`). A generate chunk whose actor died is re-queued
on the restarted actor after it has been given the current weights, so nothing is lost or duplicated; because
sampling is seeded per request (counter-based), the re-run chunk produces exactly what the dead actor would
have. Every wait has a timeout, so a hung actor ends the run with a message instead of blocking forever.

The trainer runs in its own actor (`cluster/trainer_handle.py`), scoring in `ScoringWorker` actors
(`cluster/ray_scoring.py`). Deliberately left out (not built yet): torch.distributed weight broadcast on GPU.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

from rollwise.types import RequestOutput, SamplingParams, Tokenizer


class EngineWorker:
    """One in-process engine; plain class, made a Ray actor by `RayEngines`."""

    def __init__(self, model_dir: str, device: str, dtype: str, engine_kwargs: dict[str, Any], threads: int | None) -> None:
        import torch
        from transformers.utils import logging as hf_logging

        from rollwise.engine.llm import LLM

        if threads:
            torch.set_num_threads(threads)
        hf_logging.disable_progress_bar()
        self.llm = LLM(model_dir, device=device, dtype=dtype, **engine_kwargs)

    def pid(self) -> int:
        return os.getpid()

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[RequestOutput]:
        return self.llm.generate(prompts, params)

    def load_weights(self, weights: dict[str, Any], version: int) -> int:
        import torch

        return self.llm.load_weights({k: torch.from_numpy(v) for k, v in weights.items()}, version)


class RayEngines:
    """`n` engine actors; prompts of a `generate` call are split into contiguous chunks, one per actor."""

    def __init__(self, n: int, model_dir: str, *, device: str = "cpu", dtype: str = "float32",
                 engine_kwargs: dict[str, Any] | None = None, address: str | None = None, timeout_s: float = 600.0,
                 threads: int | None = 1, tokenizer: Tokenizer | None = None, num_cpus_per_engine: float = 1.0,
                 gpus_per_engine: float | None = None) -> None:
        import ray

        if n < 1:
            raise ValueError(f"run.num_engines must be >= 1, got {n}")
        if not ray.is_initialized():
            kw: dict[str, Any] = {} if address else {"num_cpus": int(n * num_cpus_per_engine) + 3}
            ray.init(address=address, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False, **kw)
        self._ray = ray
        self.timeout_s = timeout_s
        self.tokenizer = tokenizer
        self.weight_version = 0
        self.requeued = 0  # chunks re-run because their actor died
        self.restarts = 0  # actor deaths noticed and handled (restart + current weights)
        self._weights_ref: Any = None  # a Ray ObjectRef to the current weights (numpy), once there are any
        remote = ray.remote(max_restarts=-1, max_task_retries=0)(EngineWorker)
        gpus = gpus_per_engine if gpus_per_engine is not None else (1 if device.startswith("cuda") else 0)
        # NOTE: actor handles are typed Any: their methods are called through `.remote`, which Ray's annotations
        # do not describe for a class wrapped at run time.
        self.actors: list[Any] = [remote.options(num_cpus=num_cpus_per_engine, num_gpus=gpus).remote(
            model_dir, device, dtype, engine_kwargs or {}, threads) for _ in range(n)]
        self.pids = self._get([a.pid.remote() for a in self.actors], "start")

    def _get(self, refs: Any, what: str) -> Any:
        try:
            return self._ray.get(refs, timeout=self.timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"Ray engine actors did not {what} within {self.timeout_s:.0f}s "
                               "(raise run.ray_timeout_s, or check the actors' logs)") from None

    def _revive(self, i: int) -> None:
        """Wait for actor i's restart and bring it to the current weights."""
        self.restarts += 1
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                self.pids[i] = self._get(self.actors[i].pid.remote(), "restart")
                if self._weights_ref is not None:
                    self._get(self.actors[i].load_weights.remote(self._weights_ref, self.weight_version), "reload")
                return
            except self._ray.exceptions.RayActorError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Ray engine actor {i} did not come back within {self.timeout_s:.0f}s") from None
                time.sleep(0.5)

    def generate(self, prompts: Sequence[str] | Sequence[list[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Token-id prompts only: the actors hold no tokenizer of the driver's."""
        if any(isinstance(p, str) for p in prompts):
            raise TypeError("RayEngines.generate takes token-id prompts (encode text prompts first)")
        params = sampling_params if sampling_params is not None else SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        n = len(self.actors)
        size = -(-len(prompts) // n) if prompts else 0
        chunks = [(i, list(range(i * size, min(len(prompts), (i + 1) * size)))) for i in range(n)]
        chunks = [(i, idx) for i, idx in chunks if idx]
        pending = {i: self.actors[i].generate.remote([list(prompts[j]) for j in idx], [plist[j] for j in idx])
                   for i, idx in chunks}
        results: dict[int, list[RequestOutput]] = {}
        deadline = time.monotonic() + self.timeout_s
        while pending:
            ready, _ = self._ray.wait(list(pending.values()), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RuntimeError(f"Ray engine actors did not finish generating within {self.timeout_s:.0f}s")
            ref = ready[0]
            i = next(k for k, v in pending.items() if v == ref)
            try:
                outs = self._ray.get(ref)
                del pending[i]
                stale = any(v != self.weight_version for o in outs for c in o.outputs for v in c.weight_versions)
                if not stale:
                    results[i] = outs
                    continue
                # NOTE: an actor that died between calls restarts with the initial weights; its outputs
                # carry an old weight version. Give it the current weights and run the chunk again.
                self.requeued += 1
                self._revive(i)
                idx = dict(chunks)[i]
                pending[i] = self.actors[i].generate.remote([list(prompts[j]) for j in idx], [plist[j] for j in idx])
            except self._ray.exceptions.RayActorError:
                # The actor died mid-chunk: re-queue the whole chunk on its restarted self.
                self.requeued += 1
                self._revive(i)
                idx = dict(chunks)[i]
                pending[i] = self.actors[i].generate.remote([list(prompts[j]) for j in idx], [plist[j] for j in idx])
        return [o for i, _ in chunks for o in results[i]]

    def load_weights(self, state_dict: Any, version: int | None = None) -> int:
        """Broadcast HF-named weights through the object store as `version` (None: current + 1); returns it.
        Takes a state dict, or an ObjectRef to a dict of numpy arrays (a trainer actor's `weights()`)."""
        self.weight_version = self.weight_version + 1 if version is None else version
        if isinstance(state_dict, self._ray.ObjectRef):
            self._weights_ref = state_dict
        else:
            self._weights_ref = self._ray.put({k: v.detach().cpu().numpy() for k, v in state_dict.items()})
        refs = [a.load_weights.remote(self._weights_ref, self.weight_version) for a in self.actors]
        for i, r in enumerate(refs):
            try:
                self._get(r, "load weights")
            except self._ray.exceptions.RayActorError:
                self._revive(i)  # the restarted actor gets the weights there
        return self.weight_version

    def counters(self) -> dict[str, int]:
        """`requeued`: generate chunks re-run because their actor died; `restarts`: actor deaths handled."""
        return {"requeued": self.requeued, "restarts": self.restarts}

    def abort(self, request_id: str) -> RequestOutput | None:
        """Chunks run as synchronous actor calls inside `generate`: no request is in flight between calls."""
        return None

    def shutdown(self) -> None:
        for a in self.actors:
            self._ray.kill(a)
        self.actors = []
