"""How the trainer's ranks share one update: a `GradSync` chosen once when the trainer is built.

- `Single`: one process, nothing to share (world size 1; every call is a no-op).
- `Replicated` (DDP): every rank holds the whole model and optimiser; after a mini-batch's backward passes the
  gradients are summed over the ranks in flat buckets (one all-reduce per ~25 MB), so every rank clips and steps
  on the same gradient and the replicas stay equal. This is DistributedDataParallel's reduction, done once per
  mini-batch instead of from autograd hooks: a rank may run fewer micro-batches than another (even none), and
  no rank has to run a dummy forward for the hooks' sake.
- `Sharded` (FSDP2, `torch.distributed.fsdp.fully_shard` on each decoder layer and on the model): parameters,
  gradients and optimiser state are split over the ranks; a layer's weights are gathered for its forward and
  backward, and gradients are reduce-scattered. Those collectives run inside the forward and backward, so every
  rank must run the same number of them (`lockstep`): a rank with fewer micro-batches runs zero-weighted dummy
  ones. Checkpoints gather full (unsharded) weights and optimiser state, so a checkpoint does not depend on the
  world size it was saved at.

NOTE on normalisation: the ranks' gradients are SUMMED, never averaged: each rank's loss is already divided by
the whole mini-batch's counts (`train/rank_split.py`). FSDP2 averages: its ranks scale their loss by the world size.

Deliberately left out: tensor and pipeline parallelism, overlapping the all-reduce with backward (the buckets
run after it), hybrid sharding across nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import torch

from rollwise.train.causal_lm import HasDecoder

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.checkpoint.state_dict import OptimizerStateType, StateDictOptions, ValueType

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

BUCKET_ELEMS = 1 << 23
"""Gradient elements per all-reduce bucket (32 MB of float32): few calls, bounded extra memory."""


@dataclass
class CollectiveClock:
    """Seconds spent in the collectives rollwise calls (gradient all-reduce, counts, norm, metrics, full-state
    gathers). FSDP2's own all-gathers and reduce-scatters inside forward and backward are not counted."""

    seconds: float = 0.0
    calls: int = 0

    def take(self) -> tuple[float, int]:
        out = (self.seconds, self.calls)
        self.seconds, self.calls = 0.0, 0
        return out


@dataclass
class Single:
    """World size 1: the trainer as it always was."""

    name: str = "single"
    rank: int = 0
    world_size: int = 1
    lockstep: bool = False
    clock: CollectiveClock = field(default_factory=CollectiveClock)

    @property
    def loss_scale(self) -> float:
        """What each rank's loss is multiplied by before backward so that the reduction yields the SUM of gradients."""
        return 1.0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Nothing to reduce; when no backward ran at all, the gradient is exactly zero (AdamW still steps)."""
        if all(p.grad is None for p in params):
            for p in params:
                p.grad = torch.zeros_like(p)

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm).item())

    def max_count(self, n: int) -> int:
        return n

    def gather(self, obj: T) -> list[T]:
        return [obj]

    def full_model_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in model.state_dict().items()}

    def full_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        optimizer.load_state_dict(state)

    def load_model_state(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        live = model.state_dict()
        with torch.no_grad():
            for k, v in state.items():
                live[k].copy_(v.to(live[k].dtype))


@dataclass
class Replicated(Single):
    """DDP: whole replicas, gradients summed over the ranks once per mini-batch."""

    name: str = "ddp"

    def _timed(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self.clock.seconds += time.perf_counter() - t0
        self.clock.calls += 1
        return out

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        import torch.distributed as dist

        # The replicas must start equal: rank 0's weights win (a nondeterministic init elsewhere cannot split them).
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                self._timed(dist.broadcast, t.data, src=0)
        return model

    def reduce_grads(self, params: list[torch.nn.Parameter]) -> None:

        grads: list[torch.Tensor] = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        bucket: list[torch.Tensor] = []
        size = 0
        for g in grads:
            bucket.append(g)
            size += g.numel()
            if size >= BUCKET_ELEMS:
                self._all_reduce_bucket(bucket)
                bucket, size = [], 0
        if bucket:
            self._all_reduce_bucket(bucket)

    def _all_reduce_bucket(self, bucket: list[torch.Tensor]) -> None:
        """Sum `bucket`'s gradients over the ranks in one flat all-reduce, in place."""
        import torch.distributed as dist

        flat = torch.cat([g.reshape(-1) for g in bucket])
        self._timed(dist.all_reduce, flat, op=dist.ReduceOp.SUM)
        off = 0
        for g in bucket:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    def max_count(self, n: int) -> int:
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.long, device=self._device())
        self._timed(dist.all_reduce, t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def gather(self, obj: T) -> list[T]:
        """`obj` from every rank, in rank order (pickled: any picklable value)."""
        import torch.distributed as dist

        out = [obj] * self.world_size  # placeholders, each replaced by that rank's object
        self._timed(dist.all_gather_object, out, obj)
        return out

    @staticmethod
    def _device() -> torch.device:
        import torch.distributed as dist

        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


@dataclass
class Sharded(Replicated):
    """FSDP2: parameters, gradients and optimiser state sharded over the ranks; full state gathered to save."""

    name: str = "fsdp2"
    lockstep: bool = True

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self._device().type, (self.world_size,))
        layers = getattr(model.get_decoder(), "layers", None) if isinstance(model, HasDecoder) else None
        for layer in layers or []:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    @property
    def loss_scale(self) -> float:
        """FSDP2's reduce-scatter averages over the ranks (a divide factor of 1 needs PREMUL_SUM, which gloo lacks):
        each rank's loss is multiplied by the world size, so the average is the sum (exact for a power of 2)."""
        return float(self.world_size)

    def reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Already reduce-scattered by FSDP's backward hooks; a parameter no backward reached gets zeros."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        gn = self._timed(torch.nn.utils.clip_grad_norm_, params, max_norm)  # sharded grads: global norm (a collective)
        return float((gn.full_tensor() if hasattr(gn, "full_tensor") else gn).item())

    def _options(self) -> StateDictOptions:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, cpu_offload=True)

    def full_model_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Every rank must call it (a gather); rank 0 gets the full CPU tensors, the others an empty dict."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = self._timed(get_model_state_dict, model, options=self._options())
        tensors: dict[str, torch.Tensor] = {}
        for k, v in state.items():  # full_state_dict: plain tensors, never DTensor / ShardedTensor
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"full model state: {k!r} is a {type(v).__name__}, not a tensor")
            tensors[k] = v
        return tensors

    def full_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The gathered state in `optimizer.state_dict()`'s own layout (parameters by index, not by name), so a
        single-process or DDP trainer loads it as it is. Every rank calls it; rank 0 gets it, others {}."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        full = self._timed(get_optimizer_state_dict, model, optimizer, options=self._options())
        if self.rank != 0:
            return {}
        names = _param_names(model, optimizer)
        index = {n: i for i, n in enumerate(names)}
        state, param_groups = full["state"], full["param_groups"]
        if not isinstance(state, dict) or not isinstance(param_groups, list):
            raise TypeError("full optimizer state: expected a 'state' dict and a 'param_groups' list")
        groups = []
        for g in param_groups:
            params = g["params"]
            if not isinstance(params, list):
                raise TypeError("full optimizer state: a param group's 'params' is not a list of names")
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": [index[str(n)] for n in params]})
        return {"state": {index[n]: s for n, s in state.items()}, "param_groups": groups}

    def load_optimizer_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        names = _param_names(model, optimizer)
        by_name: OptimizerStateType = {
            "state": {names[int(i)]: s for i, s in state["state"].items()},
            "param_groups": [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[int(i)] for i in g["params"]]}
                             for g in state["param_groups"]],
        }
        set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))

    def load_model_state(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        full: dict[str, ValueType] = dict(state)
        live = set(model.state_dict())
        for k in live - set(full):  # tied weights are saved once (lm_head <-> embed_tokens)
            alias = "model.embed_tokens.weight" if k == "lm_head.weight" else None
            if alias in full:
                full[k] = full[alias]
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, strict=False))


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimiser's index order (the order the trainer built it with)."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for g in optimizer.param_groups for p in g["params"]]


STRATEGIES: dict[str, type[Single]] = {"single": Single, "ddp": Replicated, "fsdp2": Sharded}


def make_sync(strategy: str, rank: int, world_size: int) -> Single:
    """The `GradSync` for `train.parallel` (already resolved from 'auto'); world size 1 is always `Single`."""
    if world_size == 1:
        return Single()
    if strategy not in ("ddp", "fsdp2"):
        raise ValueError(f"train.parallel must be ddp or fsdp2 with world_size > 1, got {strategy!r}")
    return STRATEGIES[strategy](rank=rank, world_size=world_size)


def resolve_strategy(strategy: str, device: str) -> str:
    """'auto' -> FSDP2 on CUDA (memory is what more GPUs are for), DDP on CPU (no per-layer gathers: cheaper
    where memory is plentiful and collectives go through gloo)."""
    if strategy != "auto":
        return strategy
    return "fsdp2" if str(device).startswith("cuda") else "ddp"
