"""The four things the loop asks of a trainer, in-process or as a Ray actor.

`train_step(rollouts)`, `sync_weights()`, `save(step)` and `restore(checkpoint)`: the loop hands over plain
rollouts (dataclasses of lists), so the same call works across a process boundary; the `TrainBatch` with its
tensors is built where the model lives.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from rollwise.types import Rollout


class LocalTrainer:
    def __init__(self, trainer: Any, micro_batch_tokens: int, loss_name: str, loss_cfg: Any) -> None:
        self.trainer = trainer
        self.micro_batch_tokens = micro_batch_tokens
        self.loss_name = loss_name
        self.loss_cfg = loss_cfg

    def train_step(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        from rollwise.train.batch import TrainBatch
        from rollwise.train.losses import LOSSES

        batch = TrainBatch.from_rollouts(list(rollouts), self.micro_batch_tokens)
        return self.trainer.train_step(batch, LOSSES[self.loss_name], self.loss_cfg)

    def sync_weights(self) -> Any:
        return self.trainer.state_dict_for_sync()

    def save(self, run_dir: str | Path, step: int, data_position: dict[str, Any], keep: int | None,
             tokenizer: Any = None) -> Path:
        from rollwise.train.checkpoint import save_checkpoint

        return save_checkpoint(self.trainer, run_dir, step, data_position=data_position,
                               tokenizer=tokenizer if tokenizer is not None else self.trainer.tokenizer, keep=keep)

    def restore(self, ckpt_path: str | Path) -> dict[str, Any]:
        from rollwise.train.checkpoint import load_checkpoint, restore_checkpoint

        ckpt = load_checkpoint(ckpt_path)
        if ckpt is None:
            raise ValueError(f"no complete checkpoint at {ckpt_path}")
        return restore_checkpoint(self.trainer, ckpt)


class TrainerWorker:
    """A `LocalTrainer` in its own process (made a Ray actor by `RayTrainer`)."""

    def __init__(self, init_dir: str, train_cfg: Any, device: str, temperature: float, reference: bool,
                 total_steps: int, micro_batch_tokens: int, loss_name: str, loss_cfg: Any, threads: int | None) -> None:
        import torch
        from transformers.utils import logging as hf_logging

        from rollwise.train.trainer import Trainer

        if threads:
            torch.set_num_threads(threads)
        hf_logging.disable_progress_bar()
        tr = Trainer(init_dir, train_cfg, device=device, temperature=temperature, reference=reference,
                     total_steps=total_steps)
        self.local = LocalTrainer(tr, micro_batch_tokens, loss_name, loss_cfg)

    def pid(self) -> int:
        return os.getpid()

    def train_step(self, rollouts: list[Rollout]) -> dict[str, float]:
        return self.local.train_step(rollouts)

    def sync_weights(self) -> dict[str, Any]:
        return {k: v.detach().cpu().numpy() for k, v in self.local.sync_weights().items()}

    def save(self, run_dir: str, step: int, data_position: dict[str, Any], keep: int | None) -> str:
        return str(self.local.save(run_dir, step, data_position, keep))

    def restore(self, ckpt_path: str) -> dict[str, Any]:
        return self.local.restore(ckpt_path)


class RayTrainer:
    """Proxy with `LocalTrainer`'s methods over a `TrainerWorker` actor; every wait has a timeout.

    `sync_weights` returns an ObjectRef: the weights go from the trainer actor to the engine actors through the
    object store without passing through the driver.
    """

    def __init__(self, *args: Any, timeout_s: float = 600.0, num_gpus: float = 0, **kwargs: Any) -> None:
        import ray

        self._ray = ray
        self.timeout_s = timeout_s
        self.actor = ray.remote(max_restarts=0)(TrainerWorker).options(num_cpus=1, num_gpus=num_gpus).remote(*args, **kwargs)
        self.pid = self._get(self.actor.pid.remote(), "start")

    def _get(self, ref: Any, what: str) -> Any:
        try:
            return self._ray.get(ref, timeout=self.timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"the Ray trainer actor did not {what} within {self.timeout_s:.0f}s") from None

    def train_step(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        return self._get(self.actor.train_step.remote(list(rollouts)), "finish a train step")

    def sync_weights(self) -> Any:
        return self.actor.sync_weights.remote()

    def save(self, run_dir: str | Path, step: int, data_position: dict[str, Any], keep: int | None,
             tokenizer: Any = None) -> Path:
        return Path(self._get(self.actor.save.remote(str(run_dir), step, data_position, keep), "save a checkpoint"))

    def restore(self, ckpt_path: str | Path) -> dict[str, Any]:
        return self._get(self.actor.restore.remote(str(ckpt_path)), "restore a checkpoint")

    def shutdown(self) -> None:
        self._ray.kill(self.actor)
