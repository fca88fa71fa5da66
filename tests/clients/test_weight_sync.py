"""Weight syncs go through each server's own API in the right order, and a sync that fails stops loudly with
the server resumed (a paused vLLM would hang every later request)."""

from __future__ import annotations

import os
import time

import pytest
import torch
from fake_server import FakeServer
from safetensors.torch import load_file

from rollwise.clients.remote import RemoteEngine, RemoteEngineError

STATE = {"model.embed_tokens.weight": torch.arange(12.0).reshape(4, 3), "lm_head.weight": None,
         "model.norm.weight": torch.ones(3)}
STATE["lm_head.weight"] = STATE["model.embed_tokens.weight"]  # tied: shares storage, as in SmolLM2


def _routes(srv: FakeServer) -> list[str]:
    return [p for p in srv.paths() if not p.startswith("/v1/models")]


def test_vllm_sync_is_pause_load_reset_version_resume(tmp_path):
    seen: dict[str, dict] = {}

    def load(path, body):
        if body["method"] == "rollwise_load_weights":
            d = body["kwargs"]["path"]
            seen["tensors"] = load_file(os.path.join(d, "model.safetensors"))
            return 200, {"results": [{"loaded": len(seen["tensors"]), "reprocessed": ["lm_head"]}]}
        return 200, {"results": [{"version": 1}]}

    srv = FakeServer(routes={"/collective_rpc": load}).start()
    try:
        eng = RemoteEngine(srv.url, backend="vllm", weights_dir=tmp_path)
        assert eng.load_weights(STATE, version=3) == 3 == eng.weight_version
        assert _routes(srv) == ["/collective_rpc", "/pause?mode=wait", "/collective_rpc", "/reset_prefix_cache",
                                "/update_weight_version", "/resume", "/weight_info"]
        assert srv.calls[-3][1] == {"new_version": "3"}
        assert torch.equal(seen["tensors"]["lm_head.weight"], STATE["model.embed_tokens.weight"])
        assert eng.last_sync.detail["reprocessed"] == ["lm_head"] and eng.last_sync.detail["extension"] is True
        eng.load_weights(STATE, version=4)  # the previous sync's folder is removed once the server moved on
        assert len([d for d in next(tmp_path.iterdir()).iterdir() if d.is_dir()]) == 1  # beside its owner record
        eng.close()
        assert list(tmp_path.iterdir()) == []
    finally:
        srv.stop()


def test_a_sync_folder_is_removed_even_without_close(tmp_path):
    """A run that dies between syncs (or code that forgets close()) must not leave a model-sized folder behind."""
    import gc

    from rollwise.clients.weight_sync import VLLMSync

    sync = VLLMSync(tmp_path)
    (next(tmp_path.iterdir()) / "v1").mkdir()
    assert len(list(tmp_path.iterdir())) == 1
    del sync
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_vllm_without_the_extension_falls_back_to_reload_weights(tmp_path):
    def rpc(path, body):
        if body["method"] == "rollwise_extension_version":
            return 500, {"error": "AttributeError: no method rollwise_extension_version"}
        return 200, {"results": [None]}

    srv = FakeServer(routes={"/collective_rpc": rpc}).start()
    try:
        eng = RemoteEngine(srv.url, backend="vllm", weights_dir=tmp_path)
        eng.load_weights(STATE, version=1)
        body = [b for p, b in srv.calls if p == "/collective_rpc"][-1]
        assert body["method"] == "reload_weights" and os.path.isfile(
            os.path.join(body["kwargs"]["weights_path"], "model.safetensors"))
        assert eng.last_sync.detail["extension"] is False
    finally:
        srv.stop()


def test_a_failed_load_still_resumes_the_server_and_changes_no_version(tmp_path):
    def rpc(path, body):
        if body["method"] == "rollwise_load_weights":
            return 500, {"error": "RuntimeError: shape mismatch for model.norm.weight"}
        return 200, {"results": [{}]}

    srv = FakeServer(routes={"/collective_rpc": rpc}).start()
    try:
        eng = RemoteEngine(srv.url, backend="vllm", weights_dir=tmp_path)
        with pytest.raises(RemoteEngineError, match="HTTP 500: RuntimeError: shape mismatch"):
            eng.load_weights(STATE, version=1)
        assert _routes(srv)[-2:] == ["/resume", "/is_paused"] and eng.weight_version == 0
        assert [d for d in next(tmp_path.iterdir()).iterdir() if d.is_dir()] == []  # the failed sync's folder is gone
    finally:
        srv.stop()


class _Pausable:
    """vLLM's pause state as its engine keeps it: /pause sets it at once, then waits `drain_s` for in-flight requests
    before it answers; /resume clears it (the first `ignored_resumes` of them are answered 200 and do nothing)."""

    def __init__(self, drain_s: float = 0.0, ignored_resumes: int = 0) -> None:
        self.is_paused, self.drain_s, self.ignored = False, drain_s, ignored_resumes

    def pause(self, path, body):
        self.is_paused = True
        time.sleep(self.drain_s)
        return 200, {"status": "paused"}

    def resume(self, path, body):
        if self.ignored:
            self.ignored -= 1
        else:
            self.is_paused = False
        return 200, {"status": "resumed"}

    def routes(self, **more):
        return {"/pause": self.pause, "/resume": self.resume,
                "/is_paused": lambda p, b: (200, {"is_paused": self.is_paused}), **more}


@pytest.mark.parametrize("kind", ["vllm", "lora"])
def test_a_pause_slower_than_the_deadline_leaves_the_server_resumed(tmp_path, kind):
    state = _Pausable(drain_s=1.2)  # in-flight requests take longer to drain than the sync's whole deadline
    srv = FakeServer(routes=state.routes()).start()
    try:
        eng = RemoteEngine(srv.url, backend="vllm", weights_dir=tmp_path, timeout_s=0.5, lora_adapters=kind == "lora")
        if kind == "lora":
            eng.bind_trainer(_AdapterTrainer())
        with pytest.raises(RemoteEngineError, match=r"/pause\?mode=wait: timed out after 0.5s") as e:
            eng.load_weights(STATE, version=1)
        assert "\n" not in str(e.value)
        assert "/resume" in _routes(srv) and not state.is_paused and eng.weight_version == 0
    finally:
        srv.stop()


def test_a_resume_that_did_not_take_is_sent_again_after_a_failed_load(tmp_path):
    def rpc(path, body):
        if body["method"] == "rollwise_load_weights":
            return 500, {"error": "out of memory"}
        return 200, {"results": [{}]}

    state = _Pausable(ignored_resumes=1)
    srv = FakeServer(routes=state.routes(**{"/collective_rpc": rpc})).start()
    try:
        eng = RemoteEngine(srv.url, backend="vllm", weights_dir=tmp_path, timeout_s=5)
        with pytest.raises(RemoteEngineError, match="HTTP 500: out of memory"):
            eng.load_weights(STATE, version=1)
        assert not state.is_paused and _routes(srv).count("/resume") == 2
    finally:
        srv.stop()


def test_a_server_that_stays_paused_is_named_in_the_failed_syncs_line(tmp_path):
    def rpc(path, body):
        return (500, {"error": "boom"}) if body["method"] == "rollwise_load_weights" else (200, {"results": [{}]})

    state = _Pausable(ignored_resumes=10**6)
    srv = FakeServer(routes=state.routes(**{"/collective_rpc": rpc})).start()
    try:
        eng = RemoteEngine(srv.url, backend="vllm", weights_dir=tmp_path, timeout_s=0.4)
        with pytest.raises(RemoteEngineError, match=r"HTTP 500: boom; then resuming it failed, so it may be left "
                                                    r"paused: .* is still paused 0.4s after /resume") as e:
            eng.load_weights(STATE, version=1)
        assert "\n" not in str(e.value)
    finally:
        srv.stop()


def test_vllm_without_dev_mode_is_one_clear_line(tmp_path):
    srv = FakeServer(routes={"/collective_rpc": lambda p, b: (404, {"detail": "Not Found"})}).start()
    try:
        eng = RemoteEngine(srv.url, backend="vllm", weights_dir=tmp_path)
        with pytest.raises(RemoteEngineError, match="VLLM_SERVER_DEV_MODE=1"):
            eng.load_weights(STATE, version=1)
    finally:
        srv.stop()


def test_a_server_that_does_not_adopt_the_version_is_refused(tmp_path):
    srv = FakeServer(routes={"/update_weight_version": lambda p, b: (200, {"success": True})}).start()
    try:  # it answers 200 but /weight_info still says 0: the sync did not take
        eng = RemoteEngine(srv.url, backend="vllm", weights_dir=tmp_path)
        with pytest.raises(RemoteEngineError, match="reports weight version .* after loading version 2"):
            eng.load_weights(STATE, version=2)
    finally:
        srv.stop()


def test_sglang_sync_loads_from_disk_then_flushes(tmp_path):
    srv = FakeServer().start()
    try:
        eng = RemoteEngine(srv.url, backend="sglang", weights_dir=tmp_path)
        assert eng.load_weights(STATE, version=5) == 5
        assert _routes(srv) == ["/update_weights_from_disk", "/flush_cache"]
        assert srv.calls[-2][1]["weight_version"] == "5"
        srv.routes["/update_weights_from_disk"] = lambda p, b: (200, {"success": False, "message": "bad dtype"})
        with pytest.raises(RemoteEngineError, match="refused the weights: bad dtype"):
            eng.load_weights(STATE, version=6)
        assert eng.weight_version == 5
    finally:
        srv.stop()


class _AdapterTrainer:
    def __init__(self) -> None:
        self.saved: list[str] = []

    def save_adapter(self, path: str) -> None:
        from safetensors.torch import save_file

        save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(2, 3)},
                  os.path.join(path, "adapter_model.safetensors"))
        with open(os.path.join(path, "adapter_config.json"), "w") as f:
            f.write('{"r": 2, "peft_type": "LORA"}')
        self.saved.append(path)


def test_lora_runs_send_the_adapter_in_place_and_requests_name_it(tmp_path):
    srv = FakeServer().start()
    try:
        eng = RemoteEngine(srv.url, backend="vllm", weights_dir=tmp_path, lora_adapters=True)
        with pytest.raises(RemoteEngineError, match="no trainer to take the adapter from"):
            eng.load_weights(STATE, version=0)
        tr = _AdapterTrainer()
        eng.bind_trainer(tr)
        assert eng.load_weights(STATE, version=0) == 0 and eng.model == "rollwise-lora"
        eng.load_weights(STATE, version=1)
        loads = [b for p, b in srv.calls if p == "/v1/load_lora_adapter"]
        assert [b["load_inplace"] for b in loads] == [False, True]  # first load, then in place under one name
        assert {b["lora_name"] for b in loads} == {"rollwise-lora"} and loads[1]["lora_path"] == tr.saved[1]
        routes = [p for p in srv.paths() if p not in ("/v1/models",)]
        assert routes[-5:] == ["/pause?mode=wait", "/v1/load_lora_adapter", "/reset_prefix_cache",
                               "/update_weight_version", "/resume"]
        eng.generate([[1, 2]], __import__("rollwise").SamplingParams(max_tokens=2))
        assert [b for p, b in srv.calls if p == "/v1/completions"][-1]["model"] == "rollwise-lora"
    finally:
        srv.stop()


def test_one_chooser_picks_every_servers_strategy_from_the_config_values(tmp_path):
    """`make_server_sync` is where a run's config turns into each server's weight sync: disk per server kind, LoRA
    adapters for vLLM, and the NCCL transfer (one rendezvous port per server) for vLLM only."""
    from rollwise.clients.vllm.nccl import VLLMNcclSync
    from rollwise.clients.weight_sync import (RollwiseServeSync, SGLangSync, SyncChoice, VLLMLoraSync, VLLMSync,
                                              make_server_sync)

    def pick(choice: SyncChoice, server: int = 0):
        sync = make_server_sync(choice, server)
        sync.close()
        return sync

    assert isinstance(pick(SyncChoice("rollwise")), RollwiseServeSync)
    assert isinstance(pick(SyncChoice("sglang", tmp_path)), SGLangSync)
    assert isinstance(pick(SyncChoice("vllm", tmp_path)), VLLMSync)
    assert isinstance(pick(SyncChoice("vllm", tmp_path, lora_adapters=True)), VLLMLoraSync)
    nccl = SyncChoice("vllm", transfer="nccl", nccl_address="10.0.0.5", nccl_port=29600, server_world_size=2)
    second = pick(nccl, server=1)
    assert isinstance(second, VLLMNcclSync)
    assert (second.master_address, second.master_port, second.world_size) == ("10.0.0.5", 29601, 3)
    # engine.vllm.* applies to a vLLM server only: another kind keeps its own route
    assert isinstance(pick(SyncChoice("rollwise", transfer="nccl")), RollwiseServeSync)
    assert isinstance(pick(SyncChoice("sglang", tmp_path, lora_adapters=True)), SGLangSync)
    with pytest.raises(ValueError, match="unknown remote server kind"):
        SyncChoice("triton")


def _child_holding_a_sync_folder(base):
    """A process that makes a vLLM sync folder under `base` (with a weights file in it) and then waits: its pid."""
    import subprocess
    import sys

    code = ("import sys, time; from pathlib import Path; from rollwise.clients.weight_sync import VLLMSync; "
            "s = VLLMSync(sys.argv[1]); (s._root / 'v1').mkdir(); (s._root / 'v1' / 'model.safetensors')"
            ".write_bytes(b'0' * 4096); print('ready', flush=True); time.sleep(60)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", code, str(base)], stdout=subprocess.PIPE, env=env, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p.pid, p


def test_a_killed_runs_sync_folder_is_swept_by_the_next_run(tmp_path):
    """SIGKILL (or the OOM killer) skips every finalizer: the folder must go when the next run starts."""
    import signal

    from rollwise.clients.weight_sync import VLLMSync

    pid, proc = _child_holding_a_sync_folder(tmp_path)
    left = [d for d in tmp_path.iterdir()]
    assert len(left) == 1 and (left[0] / "v1" / "model.safetensors").is_file()
    alive = VLLMSync(tmp_path)  # while the owner lives, its folder stays
    assert left[0].is_dir()
    os.kill(pid, signal.SIGKILL)
    proc.wait()
    assert left[0].is_dir()  # nothing ran in the killed process to remove it
    fresh = VLLMSync(tmp_path)
    assert not left[0].exists() and alive._root.is_dir() and fresh._root.is_dir()
    alive.close()
    fresh.close()


def test_the_sweep_removes_only_rollwise_folders_whose_owner_is_gone(tmp_path):
    import json

    from rollwise.clients.sync_dirs import OWNER_FILE, PREFIX, _owner, sweep_dead

    me = _owner()
    dead_pid = 2 ** 22 + 12345  # above the kernel's default pid_max: never a live process

    def folder(name: str, record: dict | None):
        d = tmp_path / name
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x")
        if record is not None:
            (d / OWNER_FILE).write_text(json.dumps(record))
        return d

    gone = folder(PREFIX + "gone", {**me, "pid": dead_pid})
    reused = folder(PREFIX + "reused", {**me, "start": "1"})  # this pid now, but a process that started earlier
    keep = [
        folder(PREFIX + "alive", me),
        folder(PREFIX + "no-record", None),
        folder(PREFIX + "other-host", {**me, "pid": dead_pid, "host": "gpu-node-7"}),
        folder(PREFIX + "other-boot", {**me, "pid": dead_pid, "boot_id": "not-this-boot"}),
        folder(PREFIX + "garbage", {"pid": "x"}),
        folder("my-weights", {**me, "pid": dead_pid}),  # not a rollwise folder
    ]
    target = folder("elsewhere", {**me, "pid": dead_pid})
    (tmp_path / (PREFIX + "link")).symlink_to(target)  # a link named like ours is not followed
    assert sorted(sweep_dead(tmp_path)) == sorted([gone, reused])
    assert not gone.exists() and not reused.exists()
    assert all(d.is_dir() for d in keep) and (target / "model.safetensors").is_file()
