"""What the synchronous and the asynchronous loop share: the start of a run, a step's advantages and rollout
metrics, held-out evaluation before and after, and the summary at the end.

Kept out of `sync.py` so each loop still reads top to bottom and differs only where the loops differ (who
generates when, and how weights travel).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from rollwise.config import RunConfig, config_hash, dump_config
from rollwise.types import Rollout, RolloutGroup

Log = Callable[[str], None]


@dataclass
class RunStart:
    """Everything fixed before the first model is built."""

    run_dir: Path
    seed: int
    device: str
    env: Any
    train_tasks: list
    eval_tasks: list
    ckpt: Any  # the checkpoint to resume from, or None
    t_start: float


def start_run(cfg: RunConfig, log: Log) -> RunStart:
    """Threads and seeds, the run directory, the environment's data, and the resume point (if any)."""
    import numpy as np
    import torch

    from rollwise.run.sync import make_env, resolve_device
    from rollwise.train.checkpoint import find_latest_checkpoint, load_checkpoint

    t_start = time.perf_counter()
    if cfg.run.cpu_threads:
        torch.set_num_threads(cfg.run.cpu_threads)
    run_dir = Path(cfg.run.out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    seed = cfg.train.seed
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    device = resolve_device(cfg.model.device)
    env = make_env(cfg)
    train_tasks = env.load("train", n=cfg.env.train_size, seed=seed)
    eval_tasks = env.load("test", n=cfg.run.eval_size or cfg.env.eval_size, seed=seed)
    if not train_tasks:
        raise ValueError(f"environment {cfg.env.name!r} returned no training tasks")
    ckpt = None
    if cfg.run.resume:
        latest = find_latest_checkpoint(run_dir)
        if latest is None:
            log(f"resume: no complete checkpoint in {run_dir}; starting from scratch")
        else:
            ckpt = load_checkpoint(latest)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return RunStart(run_dir, seed, device, env, train_tasks, eval_tasks, ckpt, t_start)


def engine_kwargs(cfg: RunConfig, seed: int) -> dict[str, Any]:
    """`LLM(...)` keyword arguments from the `engine` section."""
    E = cfg.engine
    return dict(max_num_seqs=E.max_num_seqs, max_num_batched_tokens=E.max_num_batched_tokens,
                max_model_len=E.max_model_len, block_size=E.block_size, num_kv_blocks=E.num_kv_blocks,
                kv_cache_gb=E.kv_cache_gb, enable_prefix_caching=E.enable_prefix_caching, seed=seed)


def eval_settings(cfg: RunConfig, seed: int) -> dict[str, Any]:
    """Held-out evaluation: sampled at the training temperature (4 per problem), and greedy."""
    t = cfg.rollout.temperature
    return dict(temperature=t if t > 0 else 1.0, samples=4, max_tokens=cfg.rollout.max_tokens, seed=seed + 7919)


def eval_before(rs: RunStart, engine: Any, tokenizer: Any, eval_kw: dict[str, Any]) -> dict[str, float]:
    """The pre-RL evaluation, computed once and kept in RUN_DIR/eval_before.json for resumed runs."""
    from rollwise.run.rollouts import evaluate
    from rollwise.run.sync import _write_json_atomic

    path = rs.run_dir / "eval_before.json"
    if rs.ckpt is not None and path.is_file():
        return json.loads(path.read_text())
    res = evaluate(engine, tokenizer, rs.env, rs.eval_tasks, **eval_kw)
    _write_json_atomic(path, res)
    return res


def advantages_and_filter(groups: Sequence[RolloutGroup], algo: Any) -> int:
    """Compute advantages in place; mark zero-variance groups' rollouts filtered when the algo says so.
    Returns the number of zero-variance groups."""
    from rollwise.train.advantages import assign_advantages

    assign_advantages(groups, algo.advantage, eps=algo.adv_eps, baseline=algo.reinforce_baseline)
    zero_var = 0
    for g in groups:
        if g.zero_variance:
            zero_var += 1
            if algo.skip_zero_variance:
                for r in g.rollouts:
                    if r.status in ("kept", "truncated"):
                        r.status, r.status_reason = "filtered", "zero-variance group (no GRPO signal)"
    return zero_var


def rollout_metrics(all_r: Sequence[Rollout], num_groups: int, zero_var: int) -> dict[str, Any]:
    """A step's reward, accuracy, lengths and counts by status (errored rollouts count as incorrect)."""
    import numpy as np

    lens = [len(r.completion_token_ids) for r in all_r]
    counts = {s: sum(r.status == s for r in all_r) for s in ("kept", "filtered", "errored", "truncated", "aborted")}
    return {
        "reward_mean": float(np.mean([r.reward if r.reward is not None else 0.0 for r in all_r])),
        "accuracy": float(np.mean([r.reward_parts.get("correct", r.reward or 0.0) >= 1.0 - 1e-9
                                   if r.status != "errored" else 0.0 for r in all_r])),
        "zero_var_frac": zero_var / num_groups,
        "resp_len_mean": float(np.mean(lens)), "resp_len_max": int(max(lens)),
        "truncation_rate": counts["truncated"] / len(all_r),
        "rollouts": counts,
    }


def finish_run(cfg: RunConfig, rs: RunStart, engine: Any, tokenizer: Any, eval_kw: dict[str, Any],
               before: dict[str, float], store: Any, init_dir: Path, ckpt_dir: Path | None, prev_wall: float,
               warm_info: dict[str, Any], log: Log, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Evaluate after training, write summary.json (with the rollout card) and report.html."""
    from rollwise.run.rollouts import ACCURACY_METHOD, evaluate
    from rollwise.run.sync import _write_json_atomic
    from rollwise.store.card import build_rollout_card

    after = evaluate(engine, tokenizer, rs.env, rs.eval_tasks, **eval_kw)
    log(f"held-out accuracy after RL:  {after['accuracy']:.3f} sampled, {after['accuracy_greedy']:.3f} greedy "
        f"({cfg.train.steps} steps)")
    card = build_rollout_card(store.counts_by_status(), config_hash=config_hash(cfg),
                              seeds={"train": rs.seed, "eval": eval_kw["seed"]}, accuracy_method=ACCURACY_METHOD,
                              checkpoints={"init": init_dir, **({"final": ckpt_dir} if ckpt_dir else {})})
    summary = {
        **card, "eval_before": before, "eval_after": after,
        "accuracy_gain": after["accuracy"] - before["accuracy"], "steps": cfg.train.steps,
        "wall_s": prev_wall + time.perf_counter() - rs.t_start, "device": rs.device, "warmup": warm_info,
        "run_dir": str(rs.run_dir), **(extra or {}),
    }
    _write_json_atomic(rs.run_dir / "summary.json", summary)
    try:
        from rollwise.report import write_report

        write_report(rs.run_dir)
    except Exception as e:  # noqa: BLE001 - the run is done and saved; a report failure must not hide that
        log(f"warning: report not written: {type(e).__name__}: {e}")
    return summary
