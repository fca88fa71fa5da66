"""Weight sync to vLLM over NCCL (GPUs): the trainer broadcasts its tensors straight into the servers' workers.

Written against vLLM's trainer-side weight-transfer API (`vllm.distributed.weight_transfer`): the trainer opens
the NCCL group with `NCCLTrainerWeightTransferEngine.trainer_init(NCCLTrainerInitInfo(...), client=..., source=...)`
(the servers, started with `--weight-transfer-config '{"backend": "nccl"}'`, join it through their
`/init_weight_transfer_engine` route), and each sync is

    /pause?mode=wait -> send_weights() [start_weight_update -> update_weights + broadcast -> finish_weight_update]
    -> /reset_prefix_cache -> /update_weight_version -> /resume

with rollwise's state dict as the `WeightSource` (re-iterated every round, in one fixed order that its metadata
declares). No file is written and nothing leaves the GPUs.

NOTE: this needs vLLM importable in the trainer's own interpreter and CUDA on both sides. It was NOT run live:
this project's machines have either vLLM (CPU only, where NCCL does not exist) or a GPU (without vLLM). It is
unit-tested against a faked exchange (tests/clients/test_vllm_nccl.py) that checks the order of calls, the init
info, and that every tensor is offered in metadata order. The disk path (`clients.weight_sync.VLLMSync`) is the
one tested against a real vLLM.

Deliberately left out: multi-rank trainers (the FSDP/Megatron sources vLLM also accepts) and CUDA IPC.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from rollwise.clients.http_client import HttpClient
from rollwise.clients.paused import paused
from rollwise.clients.remote_check import RemoteEngineError
from rollwise.clients.sync_report import SyncReport


@dataclass(frozen=True)
class TrainerAPI:
    """The pieces of vLLM's trainer-side API this path uses (injected in tests; vLLM's own by default)."""

    engine_cls: Any
    init_info_cls: Any
    client_cls: Any
    source_base: Any
    param_meta: Any

    @classmethod
    def from_vllm(cls) -> "TrainerAPI":
        try:
            from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
            from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
            from vllm.distributed.weight_transfer.nccl_engine import (NCCLTrainerInitInfo,
                                                                      NCCLTrainerWeightTransferEngine)
        except ImportError as e:
            raise RemoteEngineError(f"engine.vllm.weight_transfer 'nccl' needs vLLM importable in the trainer's "
                                    f"interpreter (and CUDA): {e}") from None
        return cls(NCCLTrainerWeightTransferEngine, NCCLTrainerInitInfo, HTTPVLLMWeightSyncClient, WeightSource,
                   ParamMeta)


def state_source(api: TrainerAPI, holder: "VLLMNcclSync") -> Any:
    """A `WeightSource` over the tensors of the current sync (`holder.tensors`), in sorted-name order; tied
    duplicates (the LM head sharing the embedding) are sent once, as vLLM's loader skips the tied name."""

    class _StateSource(api.source_base):  # type: ignore[name-defined]
        def _names(self) -> list[str]:
            seen: set[int] = set()
            out = []
            for k in sorted(holder.tensors, key=lambda n: (n.startswith("lm_head"), n)):  # keep the embedding
                ptr = holder.tensors[k].data_ptr()
                if ptr in seen:
                    continue
                seen.add(ptr)
                out.append(k)
            return out

        def metadata(self) -> list[Any]:
            return [api.param_meta(k, holder.tensors[k].dtype, tuple(holder.tensors[k].shape)) for k in self._names()]

        def __iter__(self) -> Iterator[tuple[str, Any]]:
            for k in self._names():
                yield k, holder.tensors[k]

    return _StateSource()


class VLLMNcclSync:
    """`ServerSync` over NCCL for one vLLM server (its world: this trainer as rank 0 + the server's workers)."""

    route = "/update_weights (nccl)"

    def __init__(self, master_address: str, master_port: int, server_world_size: int = 1,
                 api: TrainerAPI | None = None) -> None:
        self.master_address, self.master_port = master_address, master_port
        self.world_size = 1 + server_world_size
        self._api = api
        self._engine: Any = None
        self.tensors: dict[str, Any] = {}

    def _open(self, http: HttpClient, deadline_s: float) -> Any:
        if self._engine is None:
            api = self._api or TrainerAPI.from_vllm()
            info = api.init_info_cls(master_address=self.master_address, master_port=self.master_port,
                                     world_size=self.world_size)
            client = api.client_cls(http.base_url, timeout=deadline_s)
            self._engine = api.engine_cls.trainer_init(info, client=client, source=state_source(api, self))
        return self._engine

    def push(self, http: HttpClient, tensors: Mapping[str, Any], version: int, deadline_s: float) -> SyncReport:
        t0 = time.perf_counter()
        devices = {str(getattr(t, "device", "cpu")) for t in tensors.values()}
        if not any(d.startswith("cuda") for d in devices):
            raise RemoteEngineError("the NCCL weight transfer sends CUDA tensors; the trainer's are on "
                                    f"{', '.join(sorted(devices))} (use engine.vllm.weight_transfer: disk)")
        self.tensors = dict(tensors)
        engine = self._open(http, deadline_s)
        try:
            with paused(http, deadline_s):
                engine.send_weights()
                http.json("POST", "/reset_prefix_cache", None, deadline_s=deadline_s)
                http.json("POST", "/update_weight_version", {"new_version": str(version)}, deadline_s=deadline_s)
        finally:
            self.tensors = {}
        return SyncReport(version, time.perf_counter() - t0, self.route, {"transport": "nccl"})

    def push_dir(self, http: HttpClient, path: str, version: int, deadline_s: float) -> SyncReport:
        raise RemoteEngineError("the NCCL weight transfer sends the trainer's tensors, not a directory")

    def close(self) -> None:
        if self._engine is not None:
            try:
                self._engine.shutdown()
            finally:
                self._engine = None
