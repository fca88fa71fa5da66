"""How new weights reach a remote server: one strategy per server kind, chosen once when the engine is built.

    rollwise   POST /admin/load_weights?weight_version=V with the safetensors bytes as the body (no shared disk)
    sglang     safetensors into a directory the server reads -> POST /update_weights_from_disk -> /flush_cache
    vllm-lora  LoRA runs on a vLLM with LoRA on: the adapter (PEFT format) reloaded in place under one name
    vllm       safetensors into a directory the server reads, then vLLM's own RL API in order:
               /pause?mode=wait -> /collective_rpc rollwise_load_weights (the worker extension in
               clients/vllm/plugin; vLLM's plain reload_weights when the server runs without it) ->
               /reset_prefix_cache -> /update_weight_version -> /resume (the pair always closed: clients/paused.py)

Why a directory for vLLM and SGLang: both load from a path on their own filesystem (one machine, or a shared
filesystem between trainer and servers). The NCCL path for vLLM on GPUs (`clients/vllm/nccl.py`) sends no files; it
is chosen here too (`SyncChoice.transfer`), so a run's config decides every server's strategy in one place.

NOTE: none of these proves the weights landed: a reload can answer 200 and change nothing (the field's most
reported weight-sync bug). `run.sync_check` compares the server's log-probs with the trainer's after every sync.

Deliberately left out: retries (a failed sync fails the run loudly: training on with stale weights is worse).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Protocol

from rollwise.clients.http_client import HttpClient
from rollwise.clients.paused import paused
from rollwise.clients.remote_check import RemoteEngineError
from rollwise.clients.sync_dirs import make_sync_root
from rollwise.clients.sync_report import ServerSync, SyncReport

__all__ = ["SERVER_KINDS", "AdapterSource", "RollwiseServeSync", "SGLangSync", "ServerSync", "SyncChoice", "SyncReport",
           "VLLMLoraSync", "VLLMSync", "make_server_sync"]


class AdapterSource(Protocol):
    """What a LoRA adapter sync takes its adapter from: a trainer (any of the run's trainer handles) that writes its
    adapter, PEFT format, into a directory."""

    def save_adapter(self, path: str) -> None: ...


def cpu_tensors(state: Mapping[str, Any]) -> dict[str, Any]:
    """Contiguous CPU copies (safetensors refuses shared storage, e.g. tied embeddings, and strided views);
    numpy arrays (from a Ray trainer actor) become tensors."""
    import numpy as np
    import torch

    out = {}
    for k, v in state.items():
        t = torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v.detach()
        out[k] = t.to("cpu").contiguous().clone()
    return out


class RollwiseServeSync:
    """`rollwise serve`: the bytes in the request body; the reply must name the version asked for."""

    route = "/admin/load_weights"

    def push(self, http: HttpClient, tensors: Mapping[str, Any], version: int, deadline_s: float) -> SyncReport:
        from safetensors.torch import save

        t0 = time.perf_counter()
        r = http.request("POST", f"{self.route}?weight_version={version}", save(cpu_tensors(tensors)),
                         deadline_s=deadline_s, content_type="application/octet-stream")
        return self._check(http, r.status, r.json(), r.body, version, t0)

    def push_dir(self, http: HttpClient, path: str, version: int, deadline_s: float) -> SyncReport:
        t0 = time.perf_counter()
        r = http.request("POST", self.route, json.dumps({"path": path, "weight_version": version}).encode(),
                         deadline_s=deadline_s)
        return self._check(http, r.status, r.json(), r.body, version, t0)

    def _check(self, http: HttpClient, status: int, data: Any, raw: bytes, version: int, t0: float) -> SyncReport:
        from rollwise.clients.http_client import error_message

        if status >= 400:
            raise RemoteEngineError(f"POST {http.base_url}{self.route} -> HTTP {status}: {error_message(data, raw)}")
        served = data.get("weight_version") if isinstance(data, dict) else None
        if served != version:
            raise RemoteEngineError(f"{http.base_url} reports weight version {served!r} after loading version {version} "
                                    "(an older rollwise serve, or a reply to another caller)")
        return SyncReport(version, time.perf_counter() - t0, self.route)

    def close(self) -> None:
        """Nothing on disk."""


class _DirSync:
    """Writes the tensors as `model.safetensors` into a fresh folder under `weights_dir`; removes the folder of the
    sync before once the server has moved on (the server may read lazily until its reload returns). The run's
    folder goes at close or exit; a killed run's is swept by the next run (`clients/sync_dirs.py`)."""

    route = ""

    def __init__(self, weights_dir: str | os.PathLike[str] | None) -> None:
        base = Path(weights_dir) if weights_dir is not None else None
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        # NOTE: the folders that killed runs left here are swept first (clients/sync_dirs.py: only rollwise's own,
        # only when their owner process is gone)
        self._root = make_sync_root(base)
        self._last: Path | None = None
        # A run that ends without close() (an exception on the way out, a test that forgets) must not leave a
        # model-sized folder behind: the folder goes with this object or at interpreter exit, whichever is first.
        self._remove = weakref.finalize(self, shutil.rmtree, str(self._root), True)

    def _write(self, d: Path, tensors: Mapping[str, Any]) -> None:
        """What the server will read from folder `d`: the weights as one safetensors file."""
        from safetensors.torch import save_file

        save_file(cpu_tensors(tensors), str(d / "model.safetensors"))

    def push(self, http: HttpClient, tensors: Mapping[str, Any], version: int, deadline_s: float) -> SyncReport:
        t0 = time.perf_counter()
        d = self._root / f"v{version}-{time.monotonic_ns()}"
        d.mkdir()
        self._write(d, tensors)
        write_s = time.perf_counter() - t0
        try:
            rep = self.push_dir(http, str(d), version, deadline_s)
        except BaseException:
            shutil.rmtree(d, ignore_errors=True)
            raise
        if self._last is not None:
            shutil.rmtree(self._last, ignore_errors=True)
        self._last = d
        rep.detail["write_s"] = write_s
        rep.seconds = time.perf_counter() - t0
        return rep

    def push_dir(self, http: HttpClient, path: str, version: int, deadline_s: float) -> SyncReport:
        raise NotImplementedError  # each server kind below defines it

    def close(self) -> None:
        self._remove()


class SGLangSync(_DirSync):
    route = "/update_weights_from_disk"

    def push_dir(self, http: HttpClient, path: str, version: int, deadline_s: float) -> SyncReport:
        t0 = time.perf_counter()
        data = http.json("POST", self.route, {"model_path": path, "weight_version": str(version)}, deadline_s=deadline_s)
        if isinstance(data, dict) and data.get("success") is False:
            raise RemoteEngineError(f"SGLang at {http.base_url} refused the weights: {data.get('message')}")
        http.json("POST", "/flush_cache", None, deadline_s=deadline_s)
        return SyncReport(version, time.perf_counter() - t0, self.route)


class VLLMSync(_DirSync):
    """vLLM's RL routes, in the order its docs give; the server is resumed even when a step in between fails."""

    route = "/collective_rpc"
    EXTENSION_METHOD = "rollwise_load_weights"

    def __init__(self, weights_dir: str | os.PathLike[str] | None) -> None:
        super().__init__(weights_dir)
        self.extension: bool | None = None  # None: not probed yet

    def _has_extension(self, http: HttpClient, deadline_s: float) -> bool:
        if self.extension is None:
            try:
                http.json("POST", self.route, {"method": "rollwise_extension_version"}, deadline_s=deadline_s)
                self.extension = True
            except RemoteEngineError as e:
                if "404" in str(e):
                    raise RemoteEngineError(f"vLLM at {http.base_url} has no /collective_rpc: start it with "
                                            "VLLM_SERVER_DEV_MODE=1 (engine.vllm.launch does)") from None
                self.extension = False
        return self.extension

    def push_dir(self, http: HttpClient, path: str, version: int, deadline_s: float) -> SyncReport:
        t0 = time.perf_counter()
        ext = self._has_extension(http, deadline_s)
        times: dict[str, Any] = {}
        with paused(http, deadline_s):
            times["pause_s"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            if ext:
                got = http.json("POST", self.route, {"method": self.EXTENSION_METHOD, "kwargs": {"path": path}},
                                deadline_s=deadline_s)
                res = (got or {}).get("results") if isinstance(got, dict) else None
                if not isinstance(res, list) or not res or not all(isinstance(r, dict) and r.get("loaded") for r in res):
                    raise RemoteEngineError(f"vLLM at {http.base_url}: {self.EXTENSION_METHOD} loaded nothing: {got!r:.200}")
                times["reprocessed"] = res[0].get("reprocessed", [])
            else:
                http.json("POST", self.route, {"method": "reload_weights", "kwargs": {"weights_path": path}},
                          deadline_s=deadline_s)
            times["load_s"] = time.perf_counter() - t1
            http.json("POST", "/reset_prefix_cache", None, deadline_s=deadline_s)
            http.json("POST", "/update_weight_version", {"new_version": str(version)}, deadline_s=deadline_s)
        served = http.json("GET", "/weight_info", deadline_s=deadline_s)
        if not isinstance(served, dict) or str(served.get("weight_version")) != str(version):
            raise RemoteEngineError(f"vLLM at {http.base_url} reports weight version {served!r:.80} after loading "
                                    f"version {version}")
        times["extension"] = ext
        return SyncReport(version, time.perf_counter() - t0, self.route, times)


class VLLMLoraSync(_DirSync):
    """LoRA runs on a vLLM with LoRA on (`--enable-lora`, `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`): each sync writes the
    trainer's adapter (PEFT format, a few MB instead of the whole model) and reloads it in place under one name,
    between a pause and a prefix-cache reset; requests then name the adapter as their model (`detail["model"]`).

    `write_adapter(dir)` is the trainer's `save_adapter`, bound after the trainer exists (`bind_trainer`)."""

    route = "/v1/load_lora_adapter"
    NAME = "rollwise-lora"

    def __init__(self, weights_dir: str | os.PathLike[str] | None) -> None:
        super().__init__(weights_dir)
        self.write_adapter: Callable[[str], None] | None = None
        self._loaded = False

    def bind_trainer(self, trainer: AdapterSource) -> None:
        self.write_adapter = trainer.save_adapter

    def _write(self, d: Path, tensors: Mapping[str, Any]) -> None:
        """The trainer's adapter, not the merged `tensors` it was handed."""
        if self.write_adapter is None:
            raise RemoteEngineError("LoRA adapter sync has no trainer to take the adapter from (bind_trainer)")
        self.write_adapter(str(d))

    def push_dir(self, http: HttpClient, path: str, version: int, deadline_s: float) -> SyncReport:
        t0 = time.perf_counter()
        if not (Path(path) / "adapter_config.json").is_file():
            raise RemoteEngineError(f"{path} is not a PEFT adapter directory (no adapter_config.json)")
        with paused(http, deadline_s):
            http.ok("POST", self.route, {"lora_name": self.NAME, "lora_path": path, "load_inplace": self._loaded},
                    deadline_s=deadline_s)
            self._loaded = True
            http.json("POST", "/reset_prefix_cache", None, deadline_s=deadline_s)
            http.json("POST", "/update_weight_version", {"new_version": str(version)}, deadline_s=deadline_s)
        return SyncReport(version, time.perf_counter() - t0, self.route, {"model": self.NAME, "adapter": path})


SERVER_KINDS = ("rollwise", "vllm", "sglang")
"""The server kinds `RemoteEngine` speaks to (`engine.remote_server`)."""


@dataclass(frozen=True)
class SyncChoice:
    """Everything that decides how weights reach a run's servers, as the run config gives it (`engine.remote_server`,
    `engine.remote_weights_dir`, `engine.vllm.lora_adapters`, `engine.vllm.weight_transfer` and its NCCL
    rendezvous). `make_server_sync` turns it into one strategy per server, once, when the engine is built.

    The vLLM options apply to a vLLM server only (as `engine.vllm.*` does); other kinds ignore them."""

    backend: str = "rollwise"
    weights_dir: str | os.PathLike[str] | None = None
    """vllm/sglang over disk: where syncs write their safetensors (None: a temporary directory here)."""
    lora_adapters: bool = False
    """vLLM: send the trainer's LoRA adapter instead of merged weights."""
    transfer: Literal["disk", "nccl"] = "disk"
    """vLLM: 'nccl' broadcasts the trainer's CUDA tensors (`clients/vllm/nccl.py`) instead of writing files."""
    nccl_address: str = "127.0.0.1"
    nccl_port: int = 29600
    """The rendezvous port of server 0; server i uses nccl_port + i."""
    server_world_size: int = 1

    def __post_init__(self) -> None:
        if self.backend not in SERVER_KINDS:
            raise ValueError(f"unknown remote server kind {self.backend!r} (rollwise, vllm or sglang)")
        if self.transfer not in ("disk", "nccl"):
            raise ValueError(f"weight transfer must be 'disk' or 'nccl', got {self.transfer!r}")

    @property
    def nccl(self) -> bool:
        """Whether the servers get the NCCL transfer (vLLM only)."""
        return self.backend == "vllm" and self.transfer == "nccl"


def make_server_sync(choice: SyncChoice, server: int = 0) -> ServerSync:
    """The one chooser of how weights reach a server: the strategy `choice` names, for server number `server` of the
    run (under the NCCL transfer each server has its own rendezvous port)."""
    if choice.nccl:
        from rollwise.clients.vllm.nccl import VLLMNcclSync

        return VLLMNcclSync(choice.nccl_address, choice.nccl_port + server, choice.server_world_size)
    if choice.backend == "rollwise":
        return RollwiseServeSync()
    if choice.backend == "sglang":
        return SGLangSync(choice.weights_dir)
    return VLLMLoraSync(choice.weights_dir) if choice.lora_adapters else VLLMSync(choice.weights_dir)
