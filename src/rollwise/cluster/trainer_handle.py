"""The trainer as the loop sees it: in-process (`LocalTrainer`), N local rank processes (`cluster/ranks.py`), or N Ray
actors (`RayTrainer`). Every variant is built from one typed `TrainerSpec`, so a Ray or rank trainer gets exactly
what the local one gets (tokenizer included).

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from rollwise.types import Rollout, Tokenizer

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from rollwise.config import TrainConfig
    from rollwise.train.critic import Critic, CriticSpec
    from rollwise.train.distill import DistillOptions
    from rollwise.train.losses import LossConfig
    from rollwise.train.parallel import Single
    from rollwise.train.trainer import Trainer


class TrainerLost(RuntimeError):
    """A trainer process or actor died (or a rank of it did). The loop restarts it from the last checkpoint and
    re-trains the steps since from the stored rollouts (`run/resume.py` `recover_trainer`)."""


@dataclass(frozen=True)
class TrainerSpec:
    """Everything a trainer is built from, in one picklable object (the local, rank and Ray trainers alike)."""

    model_path: str
    """The initial policy: an HF checkpoint dir (the run's resolved model)."""
    train: TrainConfig
    """The `train` config section (`config.TrainConfig`)."""
    loss_name: str
    """`algo.loss`: the key in `train.losses.LOSSES`."""
    loss_cfg: LossConfig
    """`train.losses.LossConfig` built from `algo`."""
    device: str = "cpu"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    reference: bool = False
    """Keep a frozen reference policy (algo.kl_coef > 0)."""
    total_steps: int | None = None
    tokenizer_path: str | None = None
    """`model.tokenizer`, when the tokenizer does not live beside the weights."""
    threads: int | None = None
    """torch threads in a trainer process (`run.cpu_threads`); None = torch's default."""
    world_size: int = 1
    parallel: str = "auto"
    """`train.parallel`: auto, ddp or fsdp2."""
    collective_timeout_s: float = 600.0
    """Longest wait in one collective before the rank gives up (a dead peer ends the wait sooner)."""
    critic: CriticSpec | None = None
    """`algo.advantage: gae`: the value model trained beside the policy (`train.critic`); None = no critic."""
    distill: DistillOptions | None = None
    """On-policy distillation: the frozen teacher every rank loads beside its policy (`algo.distill`)."""
    low_precision_rollouts: bool = False
    """model.dtype is not float32: `train.bf16: auto` trains in bf16 on CPUs with native bf16 (`train.precision`)."""

    @property
    def micro_batch_tokens(self) -> int:
        return int(self.train.micro_batch_tokens)

    def build(self, sync: Single | None = None, device: str | None = None) -> LocalTrainer:
        """The `LocalTrainer` this spec describes, in this process (`sync`: this rank's `train.parallel` object)."""
        from rollwise.train.trainer import Trainer

        tr = Trainer(self.model_path, self.train, device=device or self.device, temperature=self.temperature,
                     top_p=self.top_p, top_k=self.top_k, reference=self.reference, total_steps=self.total_steps,
                     tokenizer_path=self.tokenizer_path, sync=sync, distill=self.distill,
                     low_precision_rollouts=self.low_precision_rollouts)
        critic = None
        if self.critic is not None:
            from rollwise.train.critic import Critic

            critic = Critic(self.critic, device=tr.device, precision=tr.precision, seed=self.train.seed)
        return LocalTrainer(tr, self.micro_batch_tokens, self.loss_name, self.loss_cfg, critic)


class TrainerHandle(Protocol):
    """What the loop, the resume and the weight-sync check ask of a trainer, wherever its ranks run."""

    version: int
    restarts: int
    """Times `restart` brought the trainer back."""

    def train_step(self, rollouts: Sequence[Rollout]) -> dict[str, float]: ...

    def weights(self) -> Any: ...

    def probe_logprobs(self, prompts: list[list[int]]) -> np.ndarray:
        """[P, V] next-token log-probs as the engine samples them (the weight-sync check's reference)."""
        ...

    def save(self, run_dir: str | Path, step: int, data_position: dict[str, Any], keep: int | None,
             tokenizer: Tokenizer | None = None) -> Path: ...

    def restore(self, ckpt_path: str | Path) -> dict[str, Any]: ...

    def save_adapter(self, path: str) -> None:
        """Write the LoRA adapter alone (PEFT layout) where a vLLM server reads it."""
        ...

    def restart(self) -> bool:
        """Replace a trainer whose process died with a fresh one (initial weights; the caller restores a
        checkpoint); False, doing nothing, where the trainer cannot die apart from this process."""
        ...

    def shutdown(self) -> None: ...


class LocalTrainer:
    """A `train.trainer.Trainer` in this process, and with `algo.advantage: gae` its critic (`train.critic`)."""

    def __init__(self, trainer: Trainer, micro_batch_tokens: int, loss_name: str, loss_cfg: LossConfig,
                 critic: Critic | None = None) -> None:
        self.trainer = trainer
        self.micro_batch_tokens = micro_batch_tokens
        self.loss_name = loss_name
        self.loss_cfg = loss_cfg
        self.critic = critic
        self.version = 0
        self.restarts = 0

    def train_step(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        """One RL step on `rollouts` (none: no update, empty metrics); `version` goes up by one either way. The
        rollouts' tokens made at `version` (the weights trained now) are the ones whose log-prob gap is reported per
        sequence (`logprob_diff_seq_max`, `run.sync_check.RolloutCheck`). With a critic, the step computes the
        per-token GAE advantages from the rollouts' returns and trains the critic too (`train.critic`)."""
        from rollwise.train.batch import TrainBatch
        from rollwise.train.losses import LOSSES

        m: dict[str, float] = {}
        if rollouts:
            batch = TrainBatch.from_rollouts(list(rollouts), self.micro_batch_tokens)
            if self.critic is not None:
                from rollwise.train.critic import actor_critic_step

                m = actor_critic_step(self.trainer, self.critic, batch, rollouts, LOSSES[self.loss_name],
                                      self.loss_cfg, fresh_version=self.version)
            else:
                m = self.trainer.train_step(batch, LOSSES[self.loss_name], self.loss_cfg, fresh_version=self.version)
        self.version += 1
        return m

    def weights(self) -> Any:
        """The live HF-named state dict (LoRA merged); copy it before handing it to another thread."""
        return self.trainer.state_dict_for_sync()

    def probe_logprobs(self, prompts: list[list[int]]) -> np.ndarray:
        return self.trainer.probe_logprobs(prompts).numpy()

    def save_adapter(self, path: str) -> None:
        self.trainer.save_adapter(path)

    def save(self, run_dir: str | Path, step: int, data_position: dict[str, Any], keep: int | None,
             tokenizer: Tokenizer | None = None) -> Path:
        from rollwise.train.checkpoint import save_checkpoint

        return save_checkpoint(self.trainer, run_dir, step, data_position=data_position,
                               tokenizer=tokenizer if tokenizer is not None else self.trainer.tokenizer, keep=keep,
                               critic=self.critic)

    def restore(self, ckpt_path: str | Path) -> dict[str, Any]:
        """Model, optimiser, RNG, the critic and its optimiser, and `version` (= the checkpoint's step); returns its
        data position."""
        from rollwise.train.checkpoint import load_checkpoint, restore_checkpoint

        ckpt = load_checkpoint(ckpt_path)
        if ckpt is None:
            raise ValueError(f"no complete checkpoint at {ckpt_path}")
        pos = restore_checkpoint(self.trainer, ckpt, critic=self.critic)
        self.version = ckpt.step
        return pos

    def restart(self) -> bool:
        """In-process: the trainer dies with the run, so there is nothing to bring back."""
        return False

    def shutdown(self) -> None:
        """Nothing to release in-process."""


def free_tcp_port() -> int:
    """A TCP port nobody listens on now (the kernel's pick)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class TrainerWorker:
    """One trainer rank in its own process: a local rank process (`cluster/ranks.py`) or a Ray actor (`RayTrainer`).

    Built in two stages so that a Ray actor can say where it runs before the process group is formed:
    `address()` (this node's IP and a free port, asked of rank 0), then `setup(init_method)` on every rank.
    """

    def __init__(self, spec: TrainerSpec, rank: int = 0, device: str | None = None) -> None:
        self.spec, self.rank = spec, rank
        self.device = device or spec.device
        self.local: LocalTrainer | None = None

    def pid(self) -> int:
        return os.getpid()

    def address(self) -> tuple[str, int]:
        """This node's IP and a port free on it: where the other ranks find rank 0."""
        import socket

        try:
            ip = socket.gethostbyname(socket.gethostname())
        except OSError:
            ip = "127.0.0.1"
        return ip, free_tcp_port()

    def setup(self, init_method: str | None) -> int:
        """Join the process group (world size > 1) and build the trainer. Returns this process's pid."""
        from datetime import timedelta

        import torch
        from transformers.utils import logging as hf_logging

        from rollwise.train.parallel import make_sync, resolve_strategy

        spec = self.spec
        if spec.threads:
            torch.set_num_threads(spec.threads)
        hf_logging.disable_progress_bar()
        sync = None
        if spec.world_size > 1:
            import torch.distributed as dist

            cuda = self.device.startswith("cuda")
            if cuda:
                torch.cuda.set_device(torch.device(self.device))
            dist.init_process_group("nccl" if cuda else "gloo", init_method=init_method, rank=self.rank,
                                    world_size=spec.world_size, timeout=timedelta(seconds=spec.collective_timeout_s))
            sync = make_sync(resolve_strategy(spec.parallel, self.device), self.rank, spec.world_size)
        self.local = spec.build(sync=sync, device=self.device)
        return os.getpid()

    def _trainer(self) -> LocalTrainer:
        if self.local is None:
            raise RuntimeError("TrainerWorker.setup was not called")
        return self.local

    def train_step(self, rollouts: list[Rollout]) -> dict[str, float]:
        return self._trainer().train_step(rollouts)

    def weights(self) -> dict[str, Any]:
        """CPU tensors on rank 0 (every rank must call it: under FSDP2 it is a gather), {} on the others."""
        sd = self._trainer().weights()
        return {k: v.detach().cpu() for k, v in sd.items()} if self.rank == 0 else {}

    def weights_numpy(self) -> dict[str, Any]:
        """`weights()` as numpy arrays: what Ray's object store carries to the engine actors without a copy."""
        return {k: v.numpy() for k, v in self.weights().items()}

    def probe_logprobs(self, prompts: list[list[int]]) -> np.ndarray:
        return self._trainer().probe_logprobs(prompts)

    def save_adapter(self, path: str) -> None:
        self._trainer().save_adapter(path)

    def save(self, run_dir: str, step: int, data_position: dict[str, Any], keep: int | None) -> str:
        return str(self._trainer().save(run_dir, step, data_position, keep))

    def restore(self, ckpt_path: str) -> tuple[dict[str, Any], int]:
        pos = self._trainer().restore(ckpt_path)
        return pos, self._trainer().version

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


class RayTrainer:
    """`LocalTrainer`'s calls over `spec.world_size` `TrainerWorker` actors; every wait has a timeout.

    A call goes to every rank (the collectives need them all); the result is rank 0's. `weights()` returns rank
    0's ObjectRef: the weights go from the trainer actor to the engine actors through the object store without
    passing through the driver. A dead actor raises `TrainerLost`; `restart()` replaces every rank with fresh ones
    (the loop then restores the last checkpoint and re-trains the steps since).
    """

    def __init__(self, spec: TrainerSpec, *, timeout_s: float = 600.0, gpus_per_rank: float = 0,
                 cpus_per_rank: float = 1) -> None:
        import ray

        self._ray = ray
        self.spec = spec
        self.timeout_s = timeout_s
        self.gpus_per_rank, self.cpus_per_rank = gpus_per_rank, cpus_per_rank
        self.version = 0
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        ray = self._ray
        remote = ray.remote(max_restarts=0, max_task_retries=0)(TrainerWorker).options(
            num_cpus=self.cpus_per_rank, num_gpus=self.gpus_per_rank)
        self.actors = [remote.remote(self.spec, r) for r in range(self.spec.world_size)]
        init = None
        if self.spec.world_size > 1:
            ip, port = self._get(self.actors[0].address.remote(), "say its address")
            init = f"tcp://{ip}:{port}"
        self.pids = self._get([a.setup.remote(init) for a in self.actors], "start")
        self.pid = self.pids[0]

    def _get(self, ref: Any, what: str) -> Any:
        try:
            return self._ray.get(ref, timeout=self.timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"the Ray trainer actor did not {what} within {self.timeout_s:.0f}s") from None
        except self._ray.exceptions.RayActorError as e:
            raise TrainerLost(f"a Ray trainer actor died while it was to {what} "
                              f"({str(e).strip().splitlines()[0][:200]})") from None

    def _all(self, method: str, *args: Any, what: str) -> Any:
        refs = [getattr(a, method).remote(*args) for a in self.actors]
        try:
            return self._get(refs, what)[0]
        except self._ray.exceptions.RayTaskError as e:
            # NOTE: when a rank dies inside a collective, a survivor's call may fail first (gloo: "connection reset
            # by peer"), before Ray reports the dead actor: that is the death of a rank too, not a bug of the step.
            dead = self._dead_ranks()
            if not dead:
                raise
            raise TrainerLost(f"Ray trainer rank(s) {dead} died while the ranks were to {what} (a survivor: "
                              f"{str(e).strip().splitlines()[-1][:200]})") from None

    def _dead_ranks(self) -> list[int]:
        """Ranks whose actor does not answer (Ray says it died, or it stays silent for 30 s)."""
        dead = []
        for r, a in enumerate(self.actors):
            try:
                self._ray.get(a.pid.remote(), timeout=min(30.0, self.timeout_s))
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.GetTimeoutError):
                dead.append(r)
        return dead

    def train_step(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        m = self._all("train_step", list(rollouts), what="finish a train step")
        self.version += 1
        return m

    def weights(self) -> Any:
        refs = [a.weights_numpy.remote() for a in self.actors]
        return refs[0]

    def probe_logprobs(self, prompts: list[list[int]]) -> Any:
        return self._all("probe_logprobs", prompts, what="compute the sync probe")

    def save_adapter(self, path: str) -> None:
        self._get(self.actors[0].save_adapter.remote(path), "save its LoRA adapter")

    def save(self, run_dir: str | Path, step: int, data_position: dict[str, Any], keep: int | None,
             tokenizer: Tokenizer | None = None) -> Path:
        return Path(self._all("save", str(run_dir), step, data_position, keep, what="save a checkpoint"))

    def restore(self, ckpt_path: str | Path) -> dict[str, Any]:
        pos, self.version = self._all("restore", str(ckpt_path), what="restore a checkpoint")
        return pos

    def restart(self) -> bool:
        """Kill every rank (the survivors of a dead one are stuck in a collective) and start fresh ones from the
        initial model; the caller restores a checkpoint next."""
        for a in self.actors:
            self._ray.kill(a)
        self.restarts += 1
        self.version = 0
        self._start()
        return True

    def shutdown(self) -> None:
        for a in self.actors:
            self._ray.kill(a)
