"""`engine.vllm.launch`: servers start with the RL settings, are waited for, fail with their last log line, and
die with the run, SIGKILL of the run included. A stand-in interpreter plays vLLM (the live tier runs the real one)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rollwise.config import ConfigError, load_config
from rollwise.clients.vllm.launch import EXTENSION_CLS, PLUGIN_DIR, VLLMLaunchError, VLLMLaunchSpec, VLLMServers, free_port

FAKE = textwrap.dedent('''\
    #!{python}
    # Plays `python -m vllm.entrypoints.openai.api_server ...`: records its argv and env, serves /health.
    import json, os, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    with open(os.environ["FAKE_RECORD"] + f".{{port}}", "w") as f:
        json.dump({{"argv": args, "pid": os.getpid(), "env": {{k: os.environ.get(k) for k in
                   ("VLLM_SERVER_DEV_MODE", "VLLM_CPU_KVCACHE_SPACE", "PYTHONPATH")}}}}, f)
    if os.environ.get("FAKE_FAIL"):
        print("ValueError: unsupported model architecture", flush=True)
        sys.exit(3)
    time.sleep(float(os.environ.get("FAKE_DELAY", "0")))
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    HTTPServer((args[args.index("--host") + 1], port), H).serve_forever()
''')


@pytest.fixture()
def fake_python(tmp_path, monkeypatch):
    exe = tmp_path / "vllm-python"
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "record"))
    return exe


def _spec(exe: Path, tmp_path: Path, port: int, **kw) -> VLLMLaunchSpec:
    return VLLMLaunchSpec(python=str(exe), model="/models/m", port=port, log_path=str(tmp_path / f"s{port}.log"), **kw)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as dead
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_servers_start_with_the_rl_settings_and_stop(fake_python, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_DELAY", "1.0")
    p0 = free_port("127.0.0.1", 18500)
    servers = VLLMServers([_spec(fake_python, tmp_path, p0, dtype="float32", kv_cache_gb=1.5),
                           _spec(fake_python, tmp_path, free_port("127.0.0.1", p0 + 1))])
    took = servers.start(timeout_s=60)
    assert len(took) == 2 and all(t >= 1.0 for t in took)
    rec = json.loads((tmp_path / f"record.{p0}").read_text())
    argv = rec["argv"]
    assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert argv[argv.index("--worker-extension-cls") + 1] == EXTENSION_CLS
    assert argv[argv.index("--dtype") + 1] == "float32" and argv[argv.index("--model") + 1] == "/models/m"
    assert rec["env"]["VLLM_SERVER_DEV_MODE"] == "1" and rec["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1.5"
    assert rec["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(PLUGIN_DIR)
    assert (PLUGIN_DIR / "rollwise_vllm_ext.py").is_file()
    servers.stop()
    assert not _alive(rec["pid"])


def test_a_server_that_exits_while_starting_names_its_error(fake_python, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "1")
    servers = VLLMServers([_spec(fake_python, tmp_path, free_port("127.0.0.1", 18600))])
    with pytest.raises(VLLMLaunchError, match="exited with code 3 while starting: ValueError: unsupported model"):
        servers.start(timeout_s=60)


def test_a_server_that_never_gets_healthy_times_out_and_is_stopped(fake_python, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_DELAY", "30")
    port = free_port("127.0.0.1", 18700)
    servers = VLLMServers([_spec(fake_python, tmp_path, port)])
    with pytest.raises(VLLMLaunchError, match="not healthy after 2s"):
        servers.start(timeout_s=2)
    assert not _alive(json.loads((tmp_path / f"record.{port}").read_text())["pid"])


def test_servers_die_when_the_run_is_sigkilled(fake_python, tmp_path):
    port = free_port("127.0.0.1", 18800)
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f'''
        import time
        from rollwise.clients.vllm.launch import VLLMLaunchSpec, VLLMServers
        s = VLLMServers([VLLMLaunchSpec(python={str(fake_python)!r}, model="m", port={port})])
        s.start(60)
        print("ready", flush=True)
        time.sleep(600)
    '''))
    run = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=dict(os.environ))
    assert run.stdout.readline().strip() == b"ready"
    pid = json.loads((tmp_path / f"record.{port}").read_text())["pid"]
    assert _alive(pid)
    run.send_signal(signal.SIGKILL)
    run.wait()
    deadline = time.time() + 10
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the vLLM server outlived the run that started it"


def test_launch_config_is_checked_at_load():
    cfg = load_config(None, ["engine.backend=remote", "engine.remote_server=vllm", "engine.vllm.launch=true",
                             "engine.vllm.python=/opt/vllm/bin/python", "engine.vllm.num_servers=2"])
    assert cfg.engine.vllm.num_servers == 2 and cfg.engine.remote_urls == []
    with pytest.raises(ConfigError, match="engine.vllm.launch starts the servers itself: leave engine.remote_urls"):
        load_config(None, ["engine.backend=remote", "engine.remote_server=vllm", "engine.vllm.launch=true",
                           "engine.remote_urls=[http://h:1]"])
    with pytest.raises(ConfigError, match="engine.vllm.launch. is set but has no effect unless engine.backend is .remote."):
        load_config(None, ["engine.vllm.launch=true"])  # not a vLLM run: refused, not silently ignored


@pytest.mark.slow
def test_servers_in_ray_actors_report_their_node_url_and_stop(fake_python, tmp_path):
    ray = pytest.importorskip("ray")
    from rollwise.clients.vllm.ray_placement import RayVLLMServers

    started = ray.is_initialized()
    if not started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"FAKE_RECORD": os.environ["FAKE_RECORD"]}})
    try:
        with pytest.raises(VLLMLaunchError, match=r"need 4 GPU\(s\) and 2 CPU\(s\); the Ray cluster has 0 GPU\(s\)"):
            RayVLLMServers([_spec(fake_python, tmp_path, 18900)] * 2, gpus_per_server=2)
        servers = RayVLLMServers([_spec(fake_python, tmp_path, 18900)], cpus_per_server=1, timeout_s=120)
        servers.start(timeout_s=60)
        (url,) = servers.urls
        assert url.startswith("http://") and ":" in url.rsplit("/", 1)[-1]
        import urllib.request

        assert urllib.request.urlopen(url + "/health", timeout=5).status == 200
        port = int(url.rsplit(":", 1)[1])
        pid = json.loads((tmp_path / f"record.{port}").read_text())["pid"]
        servers.check_alive()
        servers.stop()
        deadline = time.time() + 10
        while _alive(pid) and time.time() < deadline:
            time.sleep(0.1)
        assert not _alive(pid)
    finally:
        if not started:
            ray.shutdown()
