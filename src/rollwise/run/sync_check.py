"""Prove that a weight sync landed: the engine's log-probs of a probe against the trainer's, after every sync.

A reload route that answers 200 is not proof: the field's most reported weight-sync bugs are syncs that hang or
silently change nothing (LoRA especially), and on this machine an in-place vLLM reload of a tied-head model once
left log-probs 1.8e-2 away from the checkpoint's. So after every sync the engine samples one token from each
of a few fixed probe prompts (n samples each, the rollouts' temperature and truncation) and reports its
behaviour log-probs; the trainer's next-token distribution for the same prompts, computed at the version just
sent, gives the reference. The largest gap must stay under `tol`, else the run stops with one line.

The same probe at start (version 0) refuses a server whose log-probs are of another kind (vLLM's default
`raw_logprobs` at a temperature other than 1) or whose model differs from the trainer's.

Cost: one forward of the probe prompts in the trainer and a one-token request per prompt: milliseconds next to
a step. The reference is computed when the weights are published (the trainer is at exactly that version then),
so the asynchronous source can check later, in its producer thread, without touching the trainer.

Deliberately left out: checking every parameter (vLLM's /weight_checker does checksums of its own tensors, which
cannot be compared with the trainer's without the same kernel layout).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from rollwise.types import SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.cluster.trainer_handle import TrainerHandle
    from rollwise.engine.protocol import Engine

PROBE_SEED = 20_261_201


class WeightSyncError(RuntimeError):
    """The engine's log-probs do not match the trainer's weights: the sync did not land (or the engine samples
    from another distribution)."""


@dataclass(frozen=True)
class ProbeReference:
    """The trainer's processed next-token log-probs for each probe prompt at `version`: [P][V] floats."""

    version: int
    logprobs: Any  # numpy [P, V] float32


@dataclass
class SyncCheck:
    """Compares an engine with the trainer on `prompts`; `last_diff` is the gap at the last check."""

    prompts: list[list[int]]
    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    tol: float = 1e-3
    samples: int = 4
    engine_name: str = "the engine"
    last_diff: float | None = None

    def __post_init__(self) -> None:
        if not self.prompts or any(not p for p in self.prompts):
            raise ValueError("the weight-sync check needs at least one non-empty probe prompt")
        if self.tol <= 0 or self.samples < 1:
            raise ValueError(f"sync check tolerance must be > 0 and samples >= 1, got {self.tol} and {self.samples}")

    def reference(self, trainer: TrainerHandle) -> ProbeReference:
        """The trainer's reference at its current version (call when its weights are the ones being sent)."""
        import numpy as np

        lp = trainer.probe_logprobs(self.prompts)
        arr = lp.numpy() if hasattr(lp, "numpy") else np.asarray(lp)
        return ProbeReference(int(trainer.version), arr.astype(np.float32, copy=False))

    def params(self) -> SamplingParams:
        return SamplingParams(n=self.samples, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_tokens=1, seed=PROBE_SEED, ignore_eos=True)

    def gap(self, engine: Engine, ref: ProbeReference) -> float:
        """The largest |engine log-prob - trainer log-prob| over the probe's sampled tokens."""
        outs = engine.generate([list(p) for p in self.prompts], self.params())
        worst = 0.0
        for i, out in enumerate(outs):
            row = ref.logprobs[i]
            for o in out.outputs:
                if len(o.token_ids) != 1 or len(o.logprobs) != 1:
                    raise WeightSyncError(f"{self.engine_name}: the sync probe asked for 1 token and got "
                                          f"{len(o.token_ids)}")
                t = o.token_ids[0]
                if not 0 <= t < len(row):
                    raise WeightSyncError(f"{self.engine_name}: the sync probe sampled token {t}, outside the "
                                          f"trainer's vocabulary of {len(row)}")
                want = float(row[t])
                d = abs(float(o.logprobs[0]) - want) if math.isfinite(want) else math.inf
                worst = max(worst, d)
        return worst

    def verify(self, engine: Engine, ref: ProbeReference, *, first: bool = False) -> float:
        """Raise WeightSyncError when the engine's log-probs are more than `tol` from `ref`; returns the gap."""
        d = self.gap(engine, ref)
        self.last_diff = d
        if d > self.tol:
            if first:
                raise WeightSyncError(
                    f"{self.engine_name} does not sample from the trainer's distribution at the start (version "
                    f"{ref.version}): its log-probs are {d:.2e} from the trainer's (tolerance {self.tol:g}); check it "
                    "serves the same model and dtype, with vLLM's --logprobs-mode processed_logprobs")
            raise WeightSyncError(
                f"weight sync to version {ref.version} did not land on {self.engine_name}: its log-probs are {d:.2e} "
                f"from the trainer's (tolerance {self.tol:g}; engine.sync_check_tol)")
        return d


def probe_prompts(encoded: Sequence[list[int]], count: int = 2, max_len: int = 256) -> list[list[int]]:
    """The first `count` distinct encoded prompts (their last `max_len` tokens): real prompts of the run, so the
    probe exercises the same tokens and template the rollouts do."""
    out: list[list[int]] = []
    for p in encoded:
        q = list(p)[-max_len:]
        if q and q not in out:
            out.append(q)
        if len(out) == count:
            break
    return out
