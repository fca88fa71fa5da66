"""Supervised warm-up of the built-in model on *noisy* demonstrations, cached by config.

Why noisy: a random tiny model never produces a correct answer, so its GRPO groups are all zero reward
and nothing learns. Imitating demonstrations where a fraction of answers are off by a small amount gives a
model that often samples a wrong answer but puts real mass on the right one: the regime where a verifier
plus RL visibly helps (sampled accuracy about 30% -> about 75%).

The warmed-up checkpoint is cached under a key of everything that determines it, so later runs (and the
tests) skip this phase. Determinism: a fixed step count gives the same model on the same machine; a time
budget (`seconds`) stops early on a slow machine; such a partial model is used but not cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rollwise.cache_dir import rollwise_cache
from rollwise.envs.base import Task
from rollwise.models.builtin import build_builtin_model, builtin_kwargs

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.config import BuiltinModelConfig, WarmupConfig

CACHE_VERSION = 1


def noisy_answer(answer: int, rng: random.Random, noise_fraction: float) -> int:
    """The answer, or with probability `noise_fraction` the answer off by 1 or 2 either way."""
    if rng.random() < noise_fraction:
        return answer + rng.choice((-2, -1, 1, 2))
    return answer


def warmup_cache_key(charset: str, builtin_cfg: BuiltinModelConfig, warmup_cfg: WarmupConfig, env_sig: str,
                     seed: int) -> str:
    blob = json.dumps({
        "v": CACHE_VERSION, "charset": charset, "model": builtin_kwargs(builtin_cfg), "env": env_sig, "seed": seed,
        "steps": warmup_cfg.steps, "lr": warmup_cfg.lr,
        "batch_size": warmup_cfg.batch_size, "noise": warmup_cfg.noise_fraction,
    }, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    return rollwise_cache("warmup")


def supervised_warmup(model_dir: Path, tasks: list[Task], *, steps: int | None, seconds: float, lr: float,
                      batch_size: int, noise_fraction: float, seed: int,
                      log: Callable[[str], None] = print) -> dict[str, float]:
    """Train the checkpoint in `model_dir` in place on (prompt, noisy answer + EOS) pairs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not tasks:
        raise ValueError("warm-up needs training tasks, got none")
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    enc = {t.id: tok.encode(t.prompt, add_special_tokens=False) for t in tasks}
    t0 = time.perf_counter()
    step = 0
    loss_ema = None
    while True:
        if steps is not None and step >= steps:
            break
        if time.perf_counter() - t0 >= seconds:
            break
        batch = [tasks[rng.randrange(len(tasks))] for _ in range(batch_size)]
        rows, labels = [], []
        for t in batch:
            p = enc[t.id]
            a = tok.encode(str(noisy_answer(int(t.answer), rng, noise_fraction)), add_special_tokens=False) + [eos]
            rows.append(p + a)
            labels.append([-100] * len(p) + a)
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
        att = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        lv = float(loss.detach())
        loss_ema = lv if loss_ema is None else 0.95 * loss_ema + 0.05 * lv
        if step % 200 == 0:
            log(f"warm-up step {step}: loss {loss_ema:.3f} ({time.perf_counter() - t0:.0f}s)")
    model.save_pretrained(model_dir)
    return {"warmup_steps": float(step), "warmup_s": time.perf_counter() - t0, "warmup_loss": float(loss_ema or 0.0)}


def prepare_builtin_model(dest: Path, charset: str, tasks: list[Task], builtin_cfg: BuiltinModelConfig,
                          warmup_cfg: WarmupConfig,
                          env_sig: str, seed: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build (and warm up, unless disabled) the built-in model into `dest`, through the cache."""
    dest = Path(dest)
    if not warmup_cfg.enabled:
        build_builtin_model(dest, charset, seed=seed, **builtin_kwargs(builtin_cfg))
        return {"warmup": "disabled"}
    key = warmup_cache_key(charset, builtin_cfg, warmup_cfg, env_sig, seed)
    cache_root = Path(warmup_cfg.cache_dir) if warmup_cfg.cache_dir else default_cache_dir()
    cached = cache_root / key
    if warmup_cfg.cache and (cached / "warmup.json").is_file():
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(cached, dest)
        info = json.loads((cached / "warmup.json").read_text())
        log(f"warm-up: using cached model {cached} ({info.get('warmup_steps', 0):.0f} steps)")
        return {**info, "warmup_cache": str(cached), "warmup_cached": True}
    build_builtin_model(dest, charset, seed=seed, **builtin_kwargs(builtin_cfg))
    log(f"warm-up: supervised phase on noisy demonstrations (up to {warmup_cfg.seconds:.0f}s"
        + (f" / {warmup_cfg.steps} steps" if warmup_cfg.steps else "") + ")")
    info = supervised_warmup(dest, tasks, steps=warmup_cfg.steps, seconds=warmup_cfg.seconds, lr=warmup_cfg.lr,
                             batch_size=warmup_cfg.batch_size, noise_fraction=warmup_cfg.noise_fraction, seed=seed,
                             log=log)
    (dest / "warmup.json").write_text(json.dumps(info))
    finished = warmup_cfg.steps is None or info["warmup_steps"] >= warmup_cfg.steps
    if not finished:
        log(f"warm-up: stopped by the {warmup_cfg.seconds:.0f}s budget after {info['warmup_steps']:.0f} of "
            f"{warmup_cfg.steps} steps (slow machine?); not caching this partial model")
    if warmup_cfg.cache and finished:
        tmp = cache_root / f".{key}.tmp{os.getpid()}"
        cache_root.mkdir(parents=True, exist_ok=True)
        shutil.copytree(dest, tmp, dirs_exist_ok=True)
        try:
            os.replace(tmp, cached)
        except OSError:  # another run cached it first
            shutil.rmtree(tmp, ignore_errors=True)
    return {**info, "warmup_cached": False}
