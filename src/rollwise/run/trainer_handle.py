"""The trainer as the loop sees it, in-process (`LocalTrainer`) or in a Ray actor (`RayTrainer`).

Five calls: `train_step(rollouts)`, `weights()`, `save(...)`, `restore(path)`, `shutdown()`, plus `version`.
The loop hands over plain rollouts (dataclasses of lists), so the same call works across a process boundary;
the `TrainBatch` with its tensors is built where the model lives.

NOTE on `version`: the trainer owns the weight version. It is the number of RL steps trained (a step whose
batch was empty counts too: its weights equal the previous version's, and counting it keeps version == step in
every loop). The loop passes it to `engine.load_weights(weights, version)`, so every rollout token's recorded
version means the same thing on every engine (`engine.protocol`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol, Sequence

from rollwise.types import Rollout


class TrainerHandle(Protocol):
    version: int

    def train_step(self, rollouts: Sequence[Rollout]) -> dict[str, float]: ...

    def weights(self) -> Any: ...

    def probe_logprobs(self, prompts: list[list[int]]) -> Any:
        """[P, V] next-token log-probs as the engine samples them (the weight-sync check's reference)."""
        ...

    def save(self, run_dir: str | Path, step: int, data_position: dict[str, Any], keep: int | None,
             tokenizer: Any = None) -> Path: ...

    def restore(self, ckpt_path: str | Path) -> dict[str, Any]: ...

    def shutdown(self) -> None: ...


class LocalTrainer:
    """A `train.trainer.Trainer` in this process."""

    def __init__(self, trainer: Any, micro_batch_tokens: int, loss_name: str, loss_cfg: Any) -> None:
        self.trainer = trainer
        self.micro_batch_tokens = micro_batch_tokens
        self.loss_name = loss_name
        self.loss_cfg = loss_cfg
        self.version = 0

    def train_step(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        """One RL step on `rollouts` (none: no update, empty metrics); `version` goes up by one either way."""
        from rollwise.train.batch import TrainBatch
        from rollwise.train.losses import LOSSES

        m: dict[str, float] = {}
        if rollouts:
            batch = TrainBatch.from_rollouts(list(rollouts), self.micro_batch_tokens)
            m = self.trainer.train_step(batch, LOSSES[self.loss_name], self.loss_cfg)
        self.version += 1
        return m

    def weights(self) -> Any:
        """The live HF-named state dict (LoRA merged); copy it before handing it to another thread."""
        return self.trainer.state_dict_for_sync()

    def probe_logprobs(self, prompts: list[list[int]]) -> Any:
        return self.trainer.probe_logprobs(prompts).numpy()

    def save_adapter(self, path: str) -> None:
        self.trainer.save_adapter(path)

    def save(self, run_dir: str | Path, step: int, data_position: dict[str, Any], keep: int | None,
             tokenizer: Any = None) -> Path:
        from rollwise.train.checkpoint import save_checkpoint

        return save_checkpoint(self.trainer, run_dir, step, data_position=data_position,
                               tokenizer=tokenizer if tokenizer is not None else self.trainer.tokenizer, keep=keep)

    def restore(self, ckpt_path: str | Path) -> dict[str, Any]:
        """Model, optimiser, RNG and `version` (= the checkpoint's step); returns its data position."""
        from rollwise.train.checkpoint import load_checkpoint, restore_checkpoint

        ckpt = load_checkpoint(ckpt_path)
        if ckpt is None:
            raise ValueError(f"no complete checkpoint at {ckpt_path}")
        pos = restore_checkpoint(self.trainer, ckpt)
        self.version = ckpt.step
        return pos

    def shutdown(self) -> None:
        """Nothing to release in-process."""


class TrainerWorker:
    """A `LocalTrainer` in its own process (made a Ray actor by `RayTrainer`)."""

    def __init__(self, init_dir: str, train_cfg: Any, device: str, temperature: float, reference: bool,
                 total_steps: int, micro_batch_tokens: int, loss_name: str, loss_cfg: Any, threads: int | None,
                 top_p: float = 1.0, top_k: int = -1) -> None:
        import torch
        from transformers.utils import logging as hf_logging

        from rollwise.train.trainer import Trainer

        if threads:
            torch.set_num_threads(threads)
        hf_logging.disable_progress_bar()
        tr = Trainer(init_dir, train_cfg, device=device, temperature=temperature, top_p=top_p, top_k=top_k,
                     reference=reference, total_steps=total_steps)
        self.local = LocalTrainer(tr, micro_batch_tokens, loss_name, loss_cfg)

    def pid(self) -> int:
        return os.getpid()

    def train_step(self, rollouts: list[Rollout]) -> dict[str, float]:
        return self.local.train_step(rollouts)

    def weights(self) -> dict[str, Any]:
        return {k: v.detach().cpu().numpy() for k, v in self.local.weights().items()}

    def probe_logprobs(self, prompts: list[list[int]]) -> Any:
        return self.local.probe_logprobs(prompts)

    def save_adapter(self, path: str) -> None:
        self.local.save_adapter(path)

    def save(self, run_dir: str, step: int, data_position: dict[str, Any], keep: int | None) -> str:
        return str(self.local.save(run_dir, step, data_position, keep))

    def restore(self, ckpt_path: str) -> tuple[dict[str, Any], int]:
        pos = self.local.restore(ckpt_path)
        return pos, self.local.version


class RayTrainer:
    """`LocalTrainer`'s calls over a `TrainerWorker` actor; every wait has a timeout.

    `weights()` returns an ObjectRef: the weights go from the trainer actor to the engine actors through the
    object store without passing through the driver.
    """

    def __init__(self, *args: Any, timeout_s: float = 600.0, num_gpus: float = 0, **kwargs: Any) -> None:
        import ray

        self._ray = ray
        self.timeout_s = timeout_s
        self.version = 0
        self.actor = ray.remote(max_restarts=0)(TrainerWorker).options(num_cpus=1, num_gpus=num_gpus).remote(*args, **kwargs)
        self.pid = self._get(self.actor.pid.remote(), "start")

    def _get(self, ref: Any, what: str) -> Any:
        try:
            return self._ray.get(ref, timeout=self.timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"the Ray trainer actor did not {what} within {self.timeout_s:.0f}s") from None

    def train_step(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        m = self._get(self.actor.train_step.remote(list(rollouts)), "finish a train step")
        self.version += 1
        return m

    def weights(self) -> Any:
        return self.actor.weights.remote()

    def probe_logprobs(self, prompts: list[list[int]]) -> Any:
        return self._get(self.actor.probe_logprobs.remote(prompts), "compute the sync probe")

    def save_adapter(self, path: str) -> None:
        self._get(self.actor.save_adapter.remote(path), "save its LoRA adapter")

    def save(self, run_dir: str | Path, step: int, data_position: dict[str, Any], keep: int | None,
             tokenizer: Any = None) -> Path:
        return Path(self._get(self.actor.save.remote(str(run_dir), step, data_position, keep), "save a checkpoint"))

    def restore(self, ckpt_path: str | Path) -> dict[str, Any]:
        pos, self.version = self._get(self.actor.restore.remote(str(ckpt_path)), "restore a checkpoint")
        return pos

    def shutdown(self) -> None:
        self._ray.kill(self.actor)
