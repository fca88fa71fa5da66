"""The Ray resource check: the demands a config adds up to, and the one-line refusal (pure: no cluster)."""

from __future__ import annotations

from rollwise.config import load_config
from rollwise.cluster.ray_resources import ray_demands, shortfall, totals


def test_demands_follow_the_config():
    cfg = load_config(None, ["engine.backend=ray", "engine.num_engines=3", "train.world_size=2", "run.num_scorers=2"])
    assert totals(ray_demands(cfg, "cpu")) == (3 + 2 + 1.0, 0.0)
    assert totals(ray_demands(cfg, "cuda")) == (6.0, 5.0)  # a whole GPU per actor by default on CUDA
    cfg = load_config(None, ["engine.backend=ray", "engine.num_engines=1", "run.ray_gpus_per_engine=0.5", "run.ray_gpus_per_trainer_rank=0.5"])
    assert totals(ray_demands(cfg, "cuda"))[1] == 1.0  # one engine + one rank share one GPU


def test_shortfall_names_the_counts_and_the_keys():
    cfg = load_config(None, ["engine.backend=ray", "engine.num_engines=1"])
    d = ray_demands(cfg, "cuda")
    assert shortfall(d, {"CPU": 16, "GPU": 2}) is None
    msg = shortfall(d, {"CPU": 16, "GPU": 1})
    assert msg.startswith("the Ray cluster has 16 CPU(s) and 1 GPU(s); this config needs 3 CPU(s) and 2 GPU(s): ")
    assert "1 engine actor(s) (engine.num_engines) x 1 CPU + 1 GPU" in msg and "train.world_size" in msg
    assert "run.ray_gpus_per_engine" in msg and "\n" not in msg
    assert "add nodes" in shortfall(d, {"CPU": 2, "GPU": 4})
