"""The NCCL weight-transfer path against a faked exchange: vLLM's trainer API is stood in for (no GPU, no NCCL
here), so what is checked is rollwise's side of the contract: the init info, the order of the RL routes around
`send_weights`, and that the source offers every tensor once, in the order its metadata declares."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from fake_server import FakeServer

from rollwise.config import ConfigError, load_config
from rollwise.clients.remote import RemoteEngine, RemoteEngineError
from rollwise.clients.vllm.nccl import TrainerAPI, VLLMNcclSync


@dataclass
class ParamMeta:
    name: str
    dtype: torch.dtype
    shape: tuple


class Source:  # stands in for vllm.distributed.weight_transfer.base.WeightSource
    pass


@dataclass
class InitInfo:
    master_address: str
    master_port: int
    world_size: int


class Client:
    def __init__(self, base_url, timeout=300):
        self.base_url, self.calls = base_url, []


class FakeEngine:
    """Plays NCCLTrainerWeightTransferEngine: trainer_init once, send_weights per round (start/update/finish)."""

    made: list["FakeEngine"] = []

    def __init__(self, info, client, source):
        self.info, self.client, self.source, self.rounds, self.shut = info, client, source, [], False

    @classmethod
    def trainer_init(cls, info, *, client, source):
        e = cls(info, client, source)
        cls.made.append(e)
        return e

    def send_weights(self):
        meta = self.source.metadata()
        sent = list(self.source)
        assert [m.name for m in meta] == [n for n, _ in sent]  # iteration agrees with metadata, element by element
        assert all(tuple(t.shape) == m.shape and t.dtype == m.dtype for (_, t), m in zip(sent, meta))
        self.client.calls += ["start_weight_update", "update_weights", "finish_weight_update"]
        self.rounds.append({n: t.clone() for n, t in sent})

    def shutdown(self):
        self.shut = True


class CudaLike(torch.Tensor):
    """A CPU tensor that says it is on CUDA (the path refuses CPU tensors; this machine has no GPU)."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def _state(scale: float) -> dict:
    emb = (torch.arange(12.0).reshape(4, 3) * scale).as_subclass(CudaLike)
    return {"model.embed_tokens.weight": emb, "lm_head.weight": emb, "model.norm.weight": torch.ones(3).as_subclass(CudaLike)}


def test_nccl_sync_drives_vllms_trainer_api_in_order():
    FakeEngine.made.clear()
    api = TrainerAPI(FakeEngine, InitInfo, Client, Source, ParamMeta)
    srv = FakeServer().start()
    try:
        eng = RemoteEngine(srv.url, backend="vllm", sync=VLLMNcclSync("10.0.0.5", 29600, server_world_size=2, api=api))
        assert eng.load_weights(_state(1.0), version=1) == 1
        assert eng.load_weights(_state(2.0), version=2) == 2
        assert len(FakeEngine.made) == 1  # the NCCL group is opened once
        fe = FakeEngine.made[0]
        assert (fe.info.master_address, fe.info.master_port, fe.info.world_size) == ("10.0.0.5", 29600, 3)
        assert fe.client.base_url == srv.url
        assert [list(r) for r in fe.rounds] == [["model.embed_tokens.weight", "model.norm.weight"]] * 2  # tied once
        assert torch.equal(fe.rounds[1]["model.embed_tokens.weight"], torch.arange(12.0).reshape(4, 3) * 2)
        routes = [p for p in srv.paths() if not p.startswith("/v1/models")]
        assert routes == ["/pause?mode=wait", "/reset_prefix_cache", "/update_weight_version", "/resume"] * 2
        assert eng.last_sync.detail == {"transport": "nccl"} and eng.weight_version == 2
        eng.close()
        assert fe.shut
    finally:
        srv.stop()


def test_nccl_refuses_cpu_tensors_and_a_cpu_trainer():
    api = TrainerAPI(FakeEngine, InitInfo, Client, Source, ParamMeta)
    srv = FakeServer().start()
    try:
        eng = RemoteEngine(srv.url, backend="vllm", sync=VLLMNcclSync("127.0.0.1", 29601, api=api))
        with pytest.raises(RemoteEngineError, match="sends CUDA tensors; the trainer's are on cpu"):
            eng.load_weights({"w": torch.ones(2)}, version=1)
        assert eng.weight_version == 0
    finally:
        srv.stop()
    with pytest.raises(ConfigError, match="weight_transfer 'nccl' sends CUDA tensors: it needs model.device cuda"):
        load_config(None, ["engine.backend=remote", "engine.remote_server=vllm", "engine.remote_urls=[http://h:1]",
                           "engine.vllm.weight_transfer=nccl", "model.device=cpu"])


def test_a_runs_nccl_settings_give_each_server_its_own_rendezvous_port(tmp_path):
    """`run.setup.make_engine` hands the config's values to the one sync chooser: server i meets the trainer on
    engine.vllm.nccl_port + i, in a world of the trainer plus the server's workers."""
    from rollwise.clients.remote import MultiEngine
    from rollwise.run import setup

    servers = [FakeServer().start(), FakeServer().start()]
    try:
        urls = ",".join(s.url for s in servers)
        cfg = load_config(None, ["engine.backend=remote", "engine.remote_server=vllm", f"engine.remote_urls=[{urls}]",
                                 "engine.vllm.weight_transfer=nccl", "engine.vllm.nccl_address=10.0.0.5",
                                 "engine.vllm.nccl_port=29700", "engine.vllm.server_world_size=2", "model.device=cuda"])
        eng = setup.make_engine(cfg, tmp_path, "cuda", None, seed=0)
        assert isinstance(eng, MultiEngine)
        syncs = [e._sync for e in eng.engines]
        assert all(isinstance(s, VLLMNcclSync) for s in syncs)
        assert [(s.master_address, s.master_port, s.world_size) for s in syncs] == [("10.0.0.5", 29700, 3),
                                                                                   ("10.0.0.5", 29701, 3)]
        eng.close()
    finally:
        for s in servers:
            s.stop()
