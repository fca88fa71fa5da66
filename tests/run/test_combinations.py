"""Every policy x rollout source x replay on/off: a 2-step tiny run, or refused at config load with one line.

Sources: the in-process engine (local), the same with generation one version ahead (async K=1), Ray engine
actors (ray), and a `rollwise serve` server started here (remote, and remote with async K=1). docs/loop.md has the
resulting table.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from rollwise.config import ConfigError
from rollwise.run.loop import train
from rollwise.store.writer import RolloutStore
from rollwise.types import ROLLOUT_STATUSES

POLICIES = {
    "uniform": [],
    "dynamic": ["control.policy=dynamic", "control.max_rounds=2"],
    "adaptive": ["control.policy=adaptive"],
    "early_stop": ["control.policy=early_stop", "control.confidence=0.6"],
    "partial": ["control.policy=partial", "control.over_provision=1.0", "algo.tis_cap=2.0"],
}
SOURCES = ["local", "async", "ray", "remote", "remote_async"]
REFUSED = {("early_stop", "ray"), ("partial", "ray")}  # remote servers stream and abort; Ray actors do not
KEY = "combo-admin-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tiny_model):
    """`rollwise serve` on the tiny model, as a user would start it; its URL."""
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "rollwise.cli.main", "serve", "--model", str(tiny_model),
                             "--port", str(port), "--admin-key", KEY], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise RuntimeError(f"rollwise serve did not start: {proc.stderr.read().decode()[-500:]}") from None
            time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    yield
    if ray.is_initialized():
        ray.shutdown()


def _source_overrides(source: str, request) -> list[str]:
    if source == "local":
        return []
    if source == "async":
        return ["control.async_staleness=1", "algo.tis_cap=2.0"]
    if source == "ray":
        request.getfixturevalue("ray_cluster")
        return ["engine.backend=ray", "engine.num_engines=1", "run.num_scorers=1", "run.ray_timeout_s=300"]
    remote = ["engine.backend=remote", f"engine.remote_urls=[{request.getfixturevalue('served')}]"]
    if source == "remote_async":
        return [*remote, "control.async_staleness=1", "algo.tis_cap=2.0"]
    return remote


@pytest.mark.slow
@pytest.mark.parametrize("replay", [False, True], ids=["noreplay", "replay"])
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("policy", list(POLICIES))
def test_policy_source_replay(policy, source, replay, tmp_path, run_cfg, request, monkeypatch):
    extra = POLICIES[policy] + (["replay.enabled=true", "replay.reuse_per_step=4"] if replay else [])
    if (policy, source) in REFUSED:
        with pytest.raises(ConfigError) as e:
            run_cfg(tmp_path, *extra, "engine.backend=ray")
        msg = str(e.value)
        assert "\n" not in msg and f"control.policy '{policy}' needs engine.backend 'local' or 'remote'" in msg
        return
    monkeypatch.setenv("ROLLWISE_ADMIN_KEY", KEY)
    out = tmp_path / "run"
    summary = train(run_cfg(out, "train.steps=2", *extra, *_source_overrides(source, request)), log=lambda s: None)
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert [m["weight_version"] for m in lines] == [1, 2]  # the trainer's count, whatever the engine
    rows = RolloutStore(out).read()
    c = summary["rollouts"]
    assert c["total"] == len(rows) == sum(c[s] for s in ROLLOUT_STATUSES) > 0
    assert all(r.status in ROLLOUT_STATUSES and len(r.weight_versions) == len(r.completion_token_ids) for r in rows)
    assert all(v <= r.step - 1 for r in rows for v in r.weight_versions)  # sampled before that step's update
    for m in lines:
        assert m["control_generated_tokens"] == m["gen_tokens"]
        if "logprob_mismatch_mean" in m and policy != "partial" and not source.endswith("async"):
            assert m["logprob_mismatch_mean"] < 1e-3  # the engine had the trainer's weights
        if replay:
            assert "replay_used" in m
    assert summary["engine_backend"] == {"async": "local", "remote_async": "remote"}.get(source, source)
    ev = summary["eval_after"]
    assert ev["errored"] == 0 and ev["accuracy"] == ev["reward_mean"]  # arithmetic's 0/1 reward: pass rate = mean
