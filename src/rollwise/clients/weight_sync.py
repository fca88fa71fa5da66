"""How new weights reach a remote server: one strategy per server kind, chosen once when the engine is built.

    rollwise   POST /admin/load_weights?weight_version=V with the safetensors bytes as the body (no shared disk)
    sglang     safetensors into a directory the server reads -> POST /update_weights_from_disk -> /flush_cache
    vllm-lora  LoRA runs on a vLLM with LoRA on: the adapter (PEFT format) reloaded in place under one name
    vllm       safetensors into a directory the server reads, then vLLM's own RL API in order:
               /pause?mode=wait -> /collective_rpc rollwise_load_weights (the worker extension in
               clients/vllm/plugin; vLLM's plain reload_weights when the server runs without it) ->
               /reset_prefix_cache -> /update_weight_version -> /resume

Why a directory for vLLM and SGLang: both load from a path on their own filesystem (one machine, or a shared
filesystem between trainer and servers). The NCCL path for GPUs (`engine.vllm_nccl`) is separate.

NOTE: none of these proves the weights landed: a reload can answer 200 and change nothing (the field's most
reported weight-sync bug). `run.sync_check` compares the server's log-probs with the trainer's after every sync.

Deliberately left out: retries (a failed sync fails the run loudly: training on with stale weights is worse).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol

from rollwise.clients.http_client import HttpClient
from rollwise.clients.remote_check import RemoteEngineError


@dataclass
class SyncReport:
    """What one weight sync did (kept on the engine as `last_sync`, logged per step)."""

    version: int
    seconds: float
    route: str
    detail: dict[str, Any] = field(default_factory=dict)


class ServerSync(Protocol):
    """Sends HF-named weights (torch tensors or numpy arrays, on any device: each strategy moves them where it
    needs them) or a checkpoint directory to one server as `version`."""

    route: str

    def push(self, http: HttpClient, tensors: Mapping[str, Any], version: int, deadline_s: float) -> SyncReport: ...

    def push_dir(self, http: HttpClient, path: str, version: int, deadline_s: float) -> SyncReport: ...

    def close(self) -> None: ...


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
    sync before once the server has moved on (the server may read lazily until its reload returns)."""

    route = ""

    def __init__(self, weights_dir: str | os.PathLike | None) -> None:
        base = Path(weights_dir) if weights_dir is not None else None
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        self._root = Path(tempfile.mkdtemp(prefix="rollwise-weights-", dir=base))
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

    def __init__(self, weights_dir: str | os.PathLike | None) -> None:
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
        http.json("POST", "/pause?mode=wait", None, deadline_s=deadline_s)
        times["pause_s"] = time.perf_counter() - t0
        try:
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
        finally:
            http.json("POST", "/resume", None, deadline_s=deadline_s)
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

    def __init__(self, weights_dir: str | os.PathLike | None) -> None:
        super().__init__(weights_dir)
        self.write_adapter: Any = None
        self._loaded = False

    def bind_trainer(self, trainer: Any) -> None:
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
        http.json("POST", "/pause?mode=wait", None, deadline_s=deadline_s)
        try:
            http.ok("POST", self.route, {"lora_name": self.NAME, "lora_path": path, "load_inplace": self._loaded},
                    deadline_s=deadline_s)
            self._loaded = True
            http.json("POST", "/reset_prefix_cache", None, deadline_s=deadline_s)
            http.json("POST", "/update_weight_version", {"new_version": str(version)}, deadline_s=deadline_s)
        finally:
            http.json("POST", "/resume", None, deadline_s=deadline_s)
        return SyncReport(version, time.perf_counter() - t0, self.route, {"model": self.NAME, "adapter": path})


def make_server_sync(backend: str, weights_dir: str | os.PathLike | None = None, *,
                     lora_adapters: bool = False) -> ServerSync:
    """The strategy for `backend` ('rollwise', 'vllm', 'sglang'); `lora_adapters`: vLLM gets LoRA adapters."""
    if backend == "rollwise":
        return RollwiseServeSync()
    if backend == "sglang":
        return SGLangSync(weights_dir)
    if backend == "vllm":
        return VLLMLoraSync(weights_dir) if lora_adapters else VLLMSync(weights_dir)
    raise ValueError(f"unknown remote server kind {backend!r} (rollwise, vllm or sglang)")
