"""The CUDA paths in one run, for a machine with a GPU: bf16 training (autocast over float32 master weights) against
float32, the engine in bf16 against a float32 trainer, and the engine's KV cache in each dtype.

Models are random-initialised in the shapes of SmolLM2-135M (`--smollm2-config`: its config.json and tokenizer,
so no weights travel) and Qwen2.5-0.5B; the figures are speed and numerical gaps, not accuracy.

1. Training step: 64 rollouts (8 prompts of 64 tokens x 8 completions of 32-512 tokens, random ids), GRPO loss,
   AdamW; float32 and bf16 autocast alternate on the same batch (`--repeats` pairs after one warm-up step each):
   median step seconds, median per-pair ratio (min-max), peak memory.
2. Engine/trainer gap: rollwise's CUDA engine in bf16 samples 8 x 8 completions of up to 128 tokens from the model;
   the trainer's log-probs of those tokens in float32 and under bf16 autocast against the engine's:
   mean and max |gap| (the loop's logprob_diff_mean / _max), as on the CPU (bench/train_precision.py).
3. Engine KV cache: the same requests with `kv_cache_dtype` bfloat16 (auto on a bf16 model) and float32: tokens per
   second and the log-prob gap between the two.

    python bench/gpu_checks.py --smollm2-config DIR [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

DEVICE = "cuda"
IDS = 49000  # prompt and completion ids below every tokenizer used here


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def empty_cache() -> None:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def reset_peak() -> None:
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else float("nan")


def make_model(kind: str, out: Path, smollm2_config: Path | None, layers: int | None = None) -> Path:
    """A random-initialised checkpoint of `kind` (smollm2 | qwen05b) with a tokenizer, saved under `out`; `layers`
    shrinks it (a smoke test of this script on a CPU)."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

    path = out / kind
    torch.manual_seed(0)
    if kind == "smollm2":
        assert smollm2_config is not None, "--smollm2-config DIR (config.json + tokenizer files)"
        cfg = AutoConfig.from_pretrained(smollm2_config)
        if layers:
            cfg.num_hidden_layers = layers
        model = AutoModelForCausalLM.from_config(cfg)
        model.save_pretrained(path)
        for f in smollm2_config.iterdir():
            if f.name.startswith(("tokenizer", "chat_template", "generation_config", "special_tokens")):
                (path / f.name).write_bytes(f.read_bytes())
    else:
        cfg = Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                          intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768,
                          tie_word_embeddings=True, rope_theta=1e6, bos_token_id=151643, eos_token_id=151645)
        if layers:
            cfg.num_hidden_layers = layers
        AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
        if smollm2_config is not None:  # a tokenizer for the engine (ids only: the vocabulary differs, unused here)
            for f in smollm2_config.iterdir():
                if f.name.startswith("tokenizer"):
                    (path / f.name).write_bytes(f.read_bytes())
    return path


def random_rollouts(vocab: int, seed: int = 0):
    from rollwise.types import Rollout

    rng = random.Random(seed)
    ros = []
    for g in range(8):
        prompt = [rng.randrange(100, min(vocab, IDS)) for _ in range(64)]
        for k in range(8):
            n = rng.randint(32, 512)
            ros.append(Rollout(prompt_id=str(g), group_id=str(g), sample_index=k, prompt_token_ids=prompt,
                               completion_token_ids=[rng.randrange(100, min(vocab, IDS)) for _ in range(n)],
                               logprobs=[-11.0] * n, weight_versions=[0] * n, loss_mask=[1] * n,
                               advantage=float(k % 2) - 0.5))
    return ros


def train_steps(path: Path, vocab: int, repeats: int) -> dict:
    from rollwise.config import TrainConfig
    from rollwise.train.batch import TrainBatch
    from rollwise.train.losses import LOSSES, LossConfig
    from rollwise.train.trainer import Trainer

    batch = TrainBatch.from_rollouts(random_rollouts(vocab), 16384)
    trainers = {p: Trainer(path, TrainConfig(lr=1e-6, bf16=(p == "bf16")), device=DEVICE)
                for p in ("float32", "bf16")}
    times: dict[str, list[float]] = {p: [] for p in trainers}
    peak: dict[str, float] = {}
    for p, tr in trainers.items():  # warm-up: allocates AdamW's state
        tr.train_step(batch, LOSSES["grpo"], LossConfig())
    for _ in range(repeats):
        for p, tr in trainers.items():
            sync()
            reset_peak()
            t = time.perf_counter()
            tr.train_step(batch, LOSSES["grpo"], LossConfig())
            sync()
            times[p].append(time.perf_counter() - t)
            peak[p] = peak_gib()
    ratio = [a / b for a, b in zip(times["float32"], times["bf16"])]
    tokens = sum(len(r.completion_token_ids) for r in random_rollouts(vocab))
    del trainers
    empty_cache()
    return {"completion_tokens": tokens, "precision": {p: {"median_s": statistics.median(v), "runs": v,
                                                          "peak_gib": peak[p]} for p, v in times.items()},
            "bf16_speedup": {"median": statistics.median(ratio), "min": min(ratio), "max": max(ratio)}}


def engine_rollouts(path: Path, vocab: int, kv: str):
    from rollwise import LLM, SamplingParams

    llm = LLM(str(path), device=DEVICE, dtype="bfloat16", kv_cache_dtype=kv, kv_cache_gb=4.0, max_model_len=1024)
    rng = random.Random(1)
    prompts = [[rng.randrange(100, min(vocab, IDS)) for _ in range(64)] for _ in range(8)]
    sp = SamplingParams(n=8, temperature=1.0, max_tokens=128, seed=3, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=4))
    sync()
    t = time.perf_counter()
    outs = llm.generate(prompts, sp)
    sync()
    s = time.perf_counter() - t
    toks = sum(len(o.token_ids) for q in outs for o in q.outputs)
    del llm
    empty_cache()
    return prompts, outs, {"tokens": toks, "seconds": s, "tok_s": toks / s}


def gaps(path: Path, prompts, outs) -> dict:
    """|trainer - engine| per token, trainer in float32 and in bf16 autocast."""
    from rollwise.config import TrainConfig
    from rollwise.train.batch import TrainBatch
    from rollwise.train.trainer import Trainer
    from rollwise.types import Rollout

    ros = []
    for i, q in enumerate(outs):
        for k, o in enumerate(q.outputs):
            n = len(o.token_ids)
            ros.append(Rollout(prompt_id=str(i), group_id=str(i), sample_index=k, prompt_token_ids=prompts[i],
                               completion_token_ids=list(o.token_ids), logprobs=list(o.logprobs),
                               weight_versions=[0] * n, loss_mask=[1] * n, advantage=0.0))
    batch = TrainBatch.from_rollouts(ros, 16384)
    res = {}
    for p in ("float32", "bf16"):
        tr = Trainer(path, TrainConfig(bf16=(p == "bf16")), device=DEVICE)
        lp = tr.compute_logprobs(batch)
        d = (lp - batch.old_logprobs.to(lp.device)).abs()[batch.loss_mask.to(lp.device).bool()]
        res[p] = {"logprob_diff_mean": float(d.mean()), "logprob_diff_max": float(d.max())}
        del tr
        empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2-config", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default="smollm2,qwen05b")
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (with --layers 2)")
    ap.add_argument("--layers", type=int, default=None)
    a = ap.parse_args()
    global DEVICE
    DEVICE = a.device
    assert DEVICE == "cpu" or torch.cuda.is_available(), "needs a CUDA GPU"
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32
    res: dict = {"gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu", "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in a.models.split(","):
            path = make_model(kind, Path(tmp), a.smollm2_config, a.layers)
            vocab = json.loads((path / "config.json").read_text())["vocab_size"]
            r: dict = {}
            r["train_step"] = train_steps(path, vocab, a.repeats)
            print(kind, "train", json.dumps(r["train_step"]["bf16_speedup"]), flush=True)
            prompts, outs, r["engine_bf16"] = engine_rollouts(path, vocab, "auto")
            r["gap_vs_bf16_engine"] = gaps(path, prompts, outs)
            print(kind, "gap", json.dumps(r["gap_vs_bf16_engine"]), flush=True)
            _, outs32, r["engine_bf16_kv_float32"] = engine_rollouts(path, vocab, "float32")
            same = [(x, y) for q1, q2 in zip(outs, outs32) for o1, o2 in zip(q1.outputs, q2.outputs)
                    if o1.token_ids == o2.token_ids for x, y in zip(o1.logprobs, o2.logprobs)]
            r["kv_dtype_identical_samples"] = sum(o1.token_ids == o2.token_ids for q1, q2 in zip(outs, outs32)
                                                  for o1, o2 in zip(q1.outputs, q2.outputs))
            r["kv_dtype_logprob_gap_max"] = max((abs(x - y) for x, y in same), default=None)
            print(kind, "engine", json.dumps({k: r[k] for k in ("engine_bf16", "engine_bf16_kv_float32",
                                                                "kv_dtype_identical_samples",
                                                                "kv_dtype_logprob_gap_max")}), flush=True)
            res[kind] = r
            if a.json:
                Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
