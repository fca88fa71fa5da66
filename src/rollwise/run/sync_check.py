"""Prove that the engine samples from the trainer's policy: a probe after every weight sync, and the rollouts.

A reload route that answers 200 is not proof: the field's most reported weight-sync bugs are syncs that hang or
silently change nothing (LoRA especially), and on this machine an in-place vLLM reload of a tied-head model once
left log-probs 1.8e-2 away from the checkpoint's. So after every sync the engine is sent a probe: a few of the
run's own prompts, drawn afresh each time, with exactly the sampling params of the step the new weights will
generate (its n, max_tokens, stop tokens and seed). A server cannot tell it from that step's requests, so it
cannot answer the probe honestly and the rollouts otherwise. The first token of each sample is compared with the
trainer's next-token distribution for the same prompt, computed at the version just sent; the largest gap must
stay under `tol`, else the run stops with one line.

The same probe at start (version 0) refuses a server whose log-probs are of another kind (vLLM's default
`raw_logprobs` at a temperature other than 1) or whose model differs from the trainer's.

The probe sees the first token only. The rest of every trained rollout is proven by `RolloutCheck`: the trainer
already recomputes the log-prob of each rollout token in its update; for the rollouts generated at the trainer's
own weight version (asynchronous, partial and replayed ones are older by design, and excluded token by token), the
mean gap over one rollout must stay under a tolerance set by the precision of the engine and the trainer, else
the run stops with one line before the step is stored or synced.

Cost: one forward of the probe prompts in the trainer and one request per probe prompt: small next to a step.
The reference is computed when the weights are published (the trainer is at exactly that version then), so the
asynchronous source can check later, in its producer thread, without touching the trainer.

Deliberately left out: hiding when a probe is sent (right after a sync: a server that answers honestly only
then is caught by the rollout check); checking every parameter (vLLM's /weight_checker does checksums of its own
tensors, which cannot be compared with the trainer's without the same kernel layout); checking rollouts that did
not train (a zero-advantage group moves no weight, so the trainer never runs it).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from rollwise.control.context import sample_params
from rollwise.types import SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.cluster.trainer_handle import TrainerHandle
    from rollwise.engine.protocol import Engine

PROBE_PROMPTS = 2
"""Prompts per probe (each sampled n times, as the step's prompts are)."""
PROBE_POOL = 64
"""How many of the run's prompts the probe draws from."""


class WeightSyncError(RuntimeError):
    """The engine's log-probs do not match the trainer's weights: the sync did not land (or the engine samples
    from another distribution)."""


class RolloutMismatch(WeightSyncError):
    """Trained rollouts whose behaviour log-probs are not the trainer's at the version that made them: the engine
    made them up, or samples from other weights or another distribution."""


@dataclass(frozen=True)
class ProbeReference:
    """The trainer's processed next-token log-probs for each probe prompt at `version`: [P][V] floats, with the
    prompts and the sampling params the probe is sent with."""

    version: int
    logprobs: Any  # numpy [P, V] float32
    prompts: list[list[int]]
    params: list[SamplingParams]
    """Per prompt: the step's params as that step's own groups get them (`control.context.sample_params`)."""


@dataclass
class SyncCheck:
    """Compares an engine with the trainer on prompts drawn from `pool` (the run's own); `last_diff` is the gap at
    the last check."""

    pool: list[list[int]]
    tol: float = 1e-3
    engine_name: str = "the engine"
    count: int = PROBE_PROMPTS
    seed: int = 0
    """Seeds the draw of probe prompts (the requests' own seeds are the step's)."""
    first_group: int = 0
    """The group index of the first probe prompt (`rollout.prompts_per_step`: the probe's requests are seeded as the
    step's next groups would be, as extra groups of dynamic sampling are)."""
    last_diff: float | None = None

    def __post_init__(self) -> None:
        if not self.pool or any(not p for p in self.pool):
            raise ValueError("the weight-sync check needs at least one non-empty probe prompt")
        if self.tol <= 0 or self.count < 1:
            raise ValueError(f"sync check tolerance must be > 0 and count >= 1, got {self.tol} and {self.count}")
        self._rng = random.Random(self.seed)

    def reference(self, trainer: TrainerHandle, params: SamplingParams) -> ProbeReference:
        """The trainer's reference at its current version (call when its weights are the ones being sent), for a
        probe sent with `params`: the sampling params of the step these weights will generate."""
        import numpy as np

        prompts = self._rng.sample(self.pool, min(self.count, len(self.pool)))
        lp = trainer.probe_logprobs(prompts)
        arr = lp.numpy() if hasattr(lp, "numpy") else np.asarray(lp)
        base = dataclasses.replace(params, tree=None)
        per_prompt = [sample_params(base, self.first_group + i, 0, base.n) for i in range(len(prompts))]
        return ProbeReference(int(trainer.version), arr.astype(np.float32, copy=False), [list(p) for p in prompts],
                              per_prompt)

    def gap(self, engine: Engine, ref: ProbeReference) -> float:
        """The largest |engine log-prob - trainer log-prob| over the first token of every probe sample."""
        outs = engine.generate([list(p) for p in ref.prompts], ref.params)
        worst, seen = 0.0, 0
        for i, out in enumerate(outs):
            row = ref.logprobs[i]
            for o in out.outputs:
                if not o.token_ids:
                    continue
                if not o.logprobs:
                    raise WeightSyncError(f"{self.engine_name}: a sync probe sample came back without log-probs")
                t = o.token_ids[0]
                if not 0 <= t < len(row):
                    raise WeightSyncError(f"{self.engine_name}: the sync probe sampled token {t}, outside the "
                                          f"trainer's vocabulary of {len(row)}")
                want = float(row[t])
                d = abs(float(o.logprobs[0]) - want) if math.isfinite(want) else math.inf
                worst = max(worst, d)
                seen += 1
        if not seen:
            raise WeightSyncError(f"{self.engine_name}: the sync probe's {len(outs)} prompt(s) came back without a "
                                  "single token")
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


def probe_pool(encoded: Sequence[list[int]], size: int = PROBE_POOL) -> list[list[int]]:
    """The first `size` distinct non-empty encoded prompts, whole: real prompts of the run (the caller passes them
    in a random order), so a probe has the tokens, template and length the rollouts' prompts have."""
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for p in encoded:
        key = tuple(p)
        if key and key not in seen:
            seen.add(key)
            out.append(list(p))
        if len(out) == size:
            break
    return out


ROLLOUT_TOL_FLOAT32 = 0.05
"""`engine.rollout_check_tol: auto` when the engine and the trainer both compute in float32. Measured honest
worst per-rollout gaps: ~1e-5 (SmolLM2-135M, 48 rollouts; the built-in model: below 5e-5)."""
ROLLOUT_TOL_LOW_PRECISION = 1.0
"""`auto` when either computes in bfloat16, float16 or int8. Measured honest worst per-rollout gaps 0.03-0.16 nats
(SmolLM2-135M bf16 engine: 0.048, with bf16 training 0.058; the built-in model with bf16 training: up to 0.155),
single tokens up to 0.5; a made-up rollout is nats away."""


@dataclass(frozen=True)
class RolloutCheck:
    """Stops the run when a trained rollout's behaviour log-probs are not the trainer's (`Trainer.train_step`'s
    `logprob_diff_seq_max`: the largest per-rollout mean gap over tokens made at the trainer's version)."""

    tol: float
    precision: str
    """What set `tol`, for the message: 'float32', 'bfloat16', ... or 'engine.rollout_check_tol'."""
    engine_name: str = "the engine"

    def __post_init__(self) -> None:
        if not self.tol > 0:
            raise ValueError(f"the rollout check's tolerance must be > 0, got {self.tol}")

    def verify(self, step: int, train_m: Mapping[str, float]) -> None:
        """Raise RolloutMismatch when a step's fresh rollouts are further than `tol` from the trainer."""
        seqs = train_m.get("logprob_diff_seqs") or 0
        gap = train_m.get("logprob_diff_seq_max")
        if not seqs or gap is None or gap <= self.tol:
            return
        raise RolloutMismatch(
            f"the rollouts of step {step} are not the policy's: one of the {int(seqs)} checked rollouts is on average "
            f"{gap:.3g} nats per token from the trainer's log-probs at the version that generated it (tolerance "
            f"{self.tol:g} for {self.precision}; engine.rollout_check_tol); {self.engine_name} made them up or "
            "samples from other weights")


def rollout_check(setting: float | str, *, remote: bool, engine_dtype: str, trainer_bf16: bool,
                  engine_name: str = "the engine") -> RolloutCheck | None:
    """The rollout check `engine.rollout_check_tol` asks for: 'off' -> None; a number -> that tolerance, on every
    backend; 'auto' -> for an engine outside this process (`remote`: servers, Ray actors) only, at the tolerance
    of the looser of the engine's and the trainer's precision."""
    if setting == "off" or (setting == "auto" and not remote):
        return None
    if not isinstance(setting, str):
        return RolloutCheck(float(setting), "engine.rollout_check_tol", engine_name)
    low = engine_dtype != "float32" or trainer_bf16
    precision = engine_dtype if engine_dtype != "float32" else ("bf16 training" if trainer_bf16 else "float32")
    return RolloutCheck(ROLLOUT_TOL_LOW_PRECISION if low else ROLLOUT_TOL_FLOAT32, precision, engine_name)
