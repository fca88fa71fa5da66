"""A server that lies about its rollouts is caught by the rollouts themselves and by a probe it cannot tell apart
from them: each test is a whole RL run against a fake vLLM whose completions come from a real in-process engine
holding the weights the run syncs to it, and whose answers a liar then edits."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import pytest
from fake_server import FakeServer, choice

from rollwise import LLM, SamplingParams
from rollwise.run.loop import train
from rollwise.run.sync_check import RolloutMismatch, WeightSyncError

Lie = Callable[[dict[str, Any], list[int], list[float]], tuple[list[int], list[float]]]


def honest(body: dict[str, Any], ids: list[int], lps: list[float]) -> tuple[list[int], list[float]]:
    return ids, lps


def made_up_unless_a_probe(body: dict[str, Any], ids: list[int], lps: list[float]) -> tuple[list[int], list[float]]:
    """Honest on what the probe used to look like (max_tokens 1), confident made-up tokens on everything else."""
    if body["max_tokens"] == 1:
        return ids, lps
    return [7] * len(ids), [-0.05] * len(ids)


def honest_first_token_then_made_up(body: dict[str, Any], ids: list[int], lps: list[float]
                                    ) -> tuple[list[int], list[float]]:
    """Passes any first-token probe: the first token is the engine's, the rest is one confident made-up token."""
    return ids[:1] + [7] * (len(ids) - 1), lps[:1] + [-0.05] * (len(ids) - 1)


class BackedServer:
    """A fake vLLM answering /v1/completions from an in-process `LLM` (edited by `lie`) and loading the weights
    that rollwise's vLLM sync writes; every request body is kept."""

    def __init__(self, model_dir: Path, lie: Lie) -> None:
        self.llm = LLM(model_dir, block_size=4, max_model_len=64)
        self.lie = lie
        self.lock = threading.Lock()
        self.bodies: list[dict[str, Any]] = []
        self.srv = FakeServer(completion=self.complete, routes={"/collective_rpc": self.rpc}).start()

    def rpc(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if body.get("method") == "rollwise_load_weights":
            from safetensors.torch import load_file

            sd = load_file(str(Path(body["kwargs"]["path"]) / "model.safetensors"))
            with self.lock:
                self.llm.load_weights(sd)
            return 200, {"results": [{"loaded": len(sd)}]}
        return 200, {"results": [{"version": 1}]}

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        sp = SamplingParams(n=body["n"], temperature=body["temperature"], top_p=body["top_p"],
                            top_k=body.get("top_k", -1), max_tokens=body["max_tokens"], seed=body.get("seed"),
                            stop_token_ids=body.get("stop_token_ids"), ignore_eos=body["ignore_eos"])
        with self.lock:
            self.bodies.append(body)
            out = self.llm.generate([body["prompt"]], sp)[0]
        choices = []
        for j, o in enumerate(out.outputs):
            ids, lps = self.lie(body, list(o.token_ids), list(o.logprobs))
            choices.append(choice(j, ids, lps, reason=o.finish_reason))
        return {"choices": choices}

    def stop(self) -> None:
        self.srv.stop()


@pytest.fixture()
def served(tiny_model):
    servers: list[BackedServer] = []

    def start(lie: Lie) -> BackedServer:
        servers.append(BackedServer(tiny_model, lie))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def _remote(run_cfg, out: Path, srv: BackedServer, *extra: str):
    return run_cfg(out, "engine.backend=remote", f"engine.remote_urls=[{srv.srv.url}]", "engine.remote_server=vllm",
                   f"engine.remote_weights_dir={out.parent / 'w'}", "train.steps=2", *extra)


def test_an_honest_server_runs_to_the_end_with_its_gap_logged(run_cfg, served, tmp_path):
    srv = served(honest)
    out = tmp_path / "honest"
    train(_remote(run_cfg, out, srv), log=lambda s: None)
    assert (out / "summary.json").is_file()
    import json

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["logprob_mismatch_seq_max"] < 1e-3 for r in rows if "logprob_mismatch_seq_max" in r)
    # The probe is sent as the step it precedes is: the same n, max_tokens, stop tokens and seed as that step's
    # requests, on prompts of the run, so nothing tells it apart.
    # Seeds: the run's seed is 0, so step s's group g is seeded s * 1_000_003 + g (4 groups a step); the probes
    # after the start, step 1 and step 2 come as groups 4 and 5 of steps 1, 2 and 3 (like dynamic sampling's extra
    # groups), never with a seed of their own.
    train_bodies = [b for b in srv.bodies if b["seed"] < 7_919_000_000]  # evaluation is seeded apart
    assert sorted(b["seed"] for b in train_bodies) == sorted(
        [s * 1_000_003 + g for s in (1, 2) for g in range(6)] + [3 * 1_000_003 + g for g in (4, 5)])
    keys = ("n", "max_tokens", "temperature", "top_p", "stop_token_ids", "ignore_eos", "logprobs")
    assert len({tuple(str(b.get(k)) for k in keys) for b in train_bodies}) == 1


def test_a_server_that_answers_only_the_probe_honestly_is_stopped_at_start(run_cfg, served, tmp_path):
    srv = served(made_up_unless_a_probe)
    with pytest.raises(WeightSyncError, match="does not sample from the trainer's distribution at the start") as e:
        train(_remote(run_cfg, tmp_path / "liar", srv), log=lambda s: None)
    assert "\n" not in str(e.value) and srv.srv.url in str(e.value)


def test_made_up_rollouts_behind_an_honest_first_token_stop_the_run_with_one_line(run_cfg, served, tmp_path):
    srv = served(honest_first_token_then_made_up)
    out = tmp_path / "liar"
    with pytest.raises(RolloutMismatch, match=r"the rollouts of step 1 are not the policy's: .* nats per token .*"
                                              r"tolerance 0.05 for float32; engine.rollout_check_tol") as e:
        train(_remote(run_cfg, out, srv, "train.bf16=false"), log=lambda s: None)
    assert "\n" not in str(e.value) and srv.srv.url in str(e.value)
    assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip()


def test_the_rollout_check_can_be_set_or_turned_off(run_cfg, served, tmp_path):
    srv = served(honest_first_token_then_made_up)
    with pytest.raises(RolloutMismatch, match="tolerance 0.5 for engine.rollout_check_tol"):
        train(_remote(run_cfg, tmp_path / "a", srv, "engine.rollout_check_tol=0.5"), log=lambda s: None)
    train(_remote(run_cfg, tmp_path / "b", srv, "engine.rollout_check_tol=off"), log=lambda s: None)
