"""What a Ray run asks of the cluster, checked before any actor starts.

Ray queues an actor whose resources no node has and waits; on a one-GPU machine a config that asks a whole GPU
for each engine actor and each trainer rank would sit there until `run.ray_timeout_s` and then fail with a
timeout that does not say why. So the demands are added up from the config first and compared with
`ray.cluster_resources()`: a shortfall stops the run at start with one line naming the counts and the keys that
set them. `shortfall` is pure (tested with hand-made numbers); `ensure_ray` starts or joins the cluster.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.config import RunConfig

ENGINE_CPUS = 1.0
"""CPUs per engine actor (cluster/ray_engines.py)."""
TRAINER_CPUS = 1.0
"""CPUs per trainer rank actor (cluster/trainer_handle.py RayTrainer)."""
SCORER_CPUS = 0.5
"""CPUs per scoring actor (cluster/ray_scoring.py)."""


@dataclass(frozen=True)
class Demand:
    """`count` actors of one kind, each asking `cpus` CPUs and `gpus` GPUs; `key` is the config key of the count."""

    what: str
    key: str
    count: int
    cpus: float
    gpus: float


def gpus_each(setting: float | None, device: str) -> float:
    """A per-actor GPU setting: as given, or 1 on CUDA and 0 on CPU when unset."""
    if setting is not None:
        return float(setting)
    return 1.0 if str(device).startswith("cuda") else 0.0


def ray_demands(cfg: RunConfig, device: str) -> list[Demand]:
    """The actors an `engine.backend: ray` run starts."""
    return [
        Demand("engine actor", "engine.num_engines", cfg.engine.num_engines, ENGINE_CPUS,
               gpus_each(cfg.run.ray_gpus_per_engine, device)),
        Demand("trainer rank", "train.world_size", cfg.train.world_size, TRAINER_CPUS,
               gpus_each(cfg.run.ray_gpus_per_trainer_rank, device)),
        Demand("scorer", "run.num_scorers", cfg.run.num_scorers, SCORER_CPUS, 0.0),
    ]


def totals(demands: list[Demand]) -> tuple[float, float]:
    return (sum(d.count * d.cpus for d in demands), sum(d.count * d.gpus for d in demands))


def shortfall(demands: list[Demand], have: Mapping[str, float]) -> str | None:
    """One line when the cluster lacks CPUs or GPUs for `demands`, else None."""
    need_cpu, need_gpu = totals(demands)
    have_cpu, have_gpu = float(have.get("CPU", 0.0)), float(have.get("GPU", 0.0))
    if need_cpu <= have_cpu + 1e-9 and need_gpu <= have_gpu + 1e-9:
        return None
    parts = ", ".join(f"{d.count} {d.what}(s) ({d.key}) x {d.cpus:g} CPU" + (f" + {d.gpus:g} GPU" if d.gpus else "")
                      for d in demands if d.count)
    hint = (" lower the counts, or give the actors fractions of a GPU (run.ray_gpus_per_engine, "
            "run.ray_gpus_per_trainer_rank)" if need_gpu > have_gpu + 1e-9 else " lower the counts or add nodes")
    return (f"the Ray cluster has {have_cpu:g} CPU(s) and {have_gpu:g} GPU(s); this config needs {need_cpu:g} CPU(s) "
            f"and {need_gpu:g} GPU(s): {parts};{hint}")


def ensure_ray(demands: list[Demand], address: str | None) -> None:
    """Start (or join `address`, `run.ray_address`) the cluster and refuse the run when it cannot hold `demands`
    (`ray_demands`)."""
    import ray

    need_cpu, _ = totals(demands)
    local_cpus = max(int(math.ceil(need_cpu)) + 1, os.cpu_count() or 1)  # logical CPUs: scheduling tokens
    if ray.is_initialized() and not address and ray.cluster_resources().get("CPU", 0) < need_cpu:
        ray.shutdown()  # a local cluster an earlier run in this process started smaller: start it again, larger
    if not ray.is_initialized():
        kw: dict[str, Any] = {} if address else {"num_cpus": local_cpus}
        ray.init(address=address, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False,
                 **kw)
    msg = shortfall(demands, ray.cluster_resources())
    if msg:
        raise ValueError(msg)
