"""The synchronous RL loop, top to bottom: generate -> score -> advantages -> train -> sync weights.

    for step in steps:
        tasks   = next prompts from a seeded, resumable data order
        groups  = engine samples n completions per prompt; the environment scores each (errors recorded)
        adv     = advantages within each group (GRPO & co); zero-variance groups are filtered, and counted
        metrics = trainer.train_step(batch of kept + truncated rollouts, loss)
        engine.load_weights(trainer weights)          # timed; the log-prob gap shows a broken sync at once
        store the step's rollouts (Parquet), log metrics, checkpoint every N steps

Everything the run writes lives in `RUN_DIR` (see ARCHITECTURE.md). `--resume` continues from the latest
complete checkpoint: model, optimiser, step, RNG and data position, and rewrites the rollouts and metrics of
any step after it, so each completed step is stored exactly once.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rollwise.config import RunConfig
from rollwise.types import SamplingParams

Log = Callable[[str], None]


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"model.device={device!r} but CUDA is not available on this machine")
    return device


def make_env(cfg: RunConfig) -> Any:
    from rollwise.envs import get_env
    from rollwise.envs.registry import load_object

    if cfg.env.module:
        spec = cfg.env.module
        if ":" in spec:
            load_object(spec)
        else:
            import importlib

            importlib.import_module(spec)
    return get_env(cfg.env.name, **cfg.env.kwargs)


@dataclass
class DataOrder:
    """A seeded permutation of the training tasks, reshuffled every epoch; its position is checkpointed."""

    n: int
    seed: int
    epoch: int = 0
    index: int = 0

    def _perm(self) -> list[int]:
        order = list(range(self.n))
        random.Random(f"{self.seed}/{self.epoch}").shuffle(order)
        return order

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        perm = self._perm()
        while len(out) < k:
            if self.index >= self.n:
                self.epoch, self.index = self.epoch + 1, 0
                perm = self._perm()
            out.append(perm[self.index])
            self.index += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}


def prepare_model(cfg: RunConfig, env: Any, train_tasks: list, run_dir: Path, log: Log) -> tuple[Path, dict[str, Any]]:
    """The initial policy checkpoint directory (the built-in model is built and warmed up into RUN_DIR)."""
    if cfg.model.path != "builtin:tiny":
        p = Path(cfg.model.path)
        if not (p / "config.json").is_file():
            raise ValueError(f"model.path {str(p)!r} is not an HF checkpoint directory (no config.json)")
        return p, {}
    from rollwise.run.warmup import prepare_builtin_model

    charset = getattr(env, "charset", None)
    if not charset:
        raise ValueError(f"the built-in model needs an environment with a `charset` (env {cfg.env.name!r} has none); "
                         "set model.path to an HF checkpoint instead")
    dest = run_dir / "init_model"
    if (dest / "config.json").is_file() and (dest / "warmup.json").is_file() or (
            (dest / "config.json").is_file() and not cfg.warmup.enabled):
        return dest, {}
    sig = f"{cfg.env.name}:{json.dumps(cfg.env.kwargs, sort_keys=True)}:{cfg.env.train_size}"
    info = prepare_builtin_model(dest, charset, train_tasks, cfg.model.builtin, cfg.warmup, sig, cfg.train.seed, log)
    return dest, info


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def run_sync(cfg: RunConfig, log: Log = print, *, stop_after: int | None = None) -> dict[str, Any] | None:
    """Run (or resume) RL training as `cfg` says; returns the summary written to RUN_DIR/summary.json.

    stop_after: end this invocation after that many steps as if interrupted (no final eval or summary;
    returns None). Used by the resume tests and by time-boxed jobs; `run.resume` continues later.
    """
    from rollwise.control import is_default

    if cfg.run.backend == "ray" and (not is_default(cfg.control) or cfg.control.async_staleness > 0):
        raise ValueError("run.backend 'ray' supports the uniform synchronous loop only; set control.policy to "
                         "uniform and control.async_staleness to 0, or use run.backend 'local'")
    if cfg.control.async_staleness > 0:  # generation runs ahead of training by at most K versions
        from rollwise.run.async_loop import run_async

        return run_async(cfg, log, stop_after=stop_after)
    from rollwise.control import make_controller
    from rollwise.engine.llm import LLM
    from rollwise.run.common import (advantages_and_filter, engine_kwargs, eval_before, eval_settings, finish_run,
                                     rollout_metrics, start_run)
    from rollwise.run.replay_step import is_replayed, rescue_groups, reuse_rollouts
    from rollwise.run.rollouts import evaluate, generate_and_score
    from rollwise.run.trainer_handle import LocalTrainer
    from rollwise.store.replay import ReplayBuffer, ReplayConfig
    from rollwise.store.writer import RolloutStore
    from rollwise.train.losses import LossConfig
    from rollwise.train.metrics import MetricsLogger
    from rollwise.train.trainer import Trainer

    # ---- environment, data, seeds, resume point
    rs = start_run(cfg, log)
    run_dir, seed, device, env, train_tasks, eval_tasks, ckpt = (
        rs.run_dir, rs.seed, rs.device, rs.env, rs.train_tasks, rs.eval_tasks, rs.ckpt)
    R, A = cfg.rollout, cfg.algo

    # ---- models: engine (generation) and trainer (updates), both from the initial checkpoint
    init_dir, warm_info = prepare_model(cfg, env, train_tasks, run_dir, log)
    ekw = engine_kwargs(cfg, seed)
    if cfg.run.backend == "ray":  # generation on engine actors
        from rollwise.engine.core import load_tokenizer
        from rollwise.run.ray_engines import RayEngines

        engine = RayEngines(cfg.run.num_engines, str(init_dir), device=device, dtype=cfg.model.dtype,
                            engine_kwargs=ekw, address=cfg.run.ray_address, timeout_s=cfg.run.ray_timeout_s,
                            threads=cfg.run.cpu_threads, tokenizer=load_tokenizer(init_dir))
    else:
        engine = LLM(init_dir, device=device, dtype=cfg.model.dtype, tokenizer=None, **ekw)
    scorer = None
    if cfg.run.backend == "ray":  # verifiers and sandboxes in scoring actors
        from rollwise.run.ray_scoring import RayScorer

        scorer = RayScorer(env, cfg.run.num_scorers, timeout_s=cfg.run.ray_timeout_s)
    tokenizer = engine.tokenizer
    loss_cfg = LossConfig.from_algo(A, max_length=R.max_tokens)
    train_temp = R.temperature if R.temperature > 0 else 1.0
    if cfg.run.backend == "ray":  # the trainer in its own actor; weights go actor -> object store -> engines
        from rollwise.run.trainer_handle import RayTrainer

        trainer = RayTrainer(str(init_dir), cfg.train, device, train_temp, A.kl_coef > 0, cfg.train.steps,
                             cfg.train.micro_batch_tokens, A.loss, loss_cfg, cfg.run.cpu_threads,
                             timeout_s=cfg.run.ray_timeout_s, num_gpus=1 if device.startswith("cuda") else 0)
    else:
        trainer = LocalTrainer(Trainer(init_dir, cfg.train, device=device, temperature=train_temp,
                                       reference=A.kl_coef > 0, total_steps=cfg.train.steps),
                               cfg.train.micro_batch_tokens, A.loss, loss_cfg)
    controller = None if is_default(cfg.control) else make_controller(cfg.control, env, tokenizer, seed=seed)
    order = DataOrder(len(train_tasks), seed)
    start_step = 0
    prev_wall = 0.0
    if ckpt is not None:
        pos = trainer.restore(ckpt.path)
        order.epoch, order.index = int(pos.get("epoch", 0)), int(pos.get("index", 0))
        prev_wall = float(pos.get("wall_s", 0.0))
        start_step = ckpt.step
        engine.load_weights(trainer.sync_weights())
        log(f"resume: continuing after step {start_step} from {ckpt.path}")

    store = RolloutStore(run_dir, decode=(lambda ids: tokenizer.decode(ids)) if tokenizer is not None else None)
    store.truncate_after(start_step)
    metrics = MetricsLogger(run_dir, total_steps=cfg.train.steps, tensorboard=cfg.run.tensorboard,
                            resume_from_step=start_step)
    eval_kw = eval_settings(cfg, seed)
    eval_b = eval_before(rs, engine, tokenizer, eval_kw)
    log(f"held-out accuracy before RL: {eval_b['accuracy']:.3f} sampled (T={eval_kw['temperature']}), "
        f"{eval_b['accuracy_greedy']:.3f} greedy, on {len(eval_tasks)} problems")

    replay = None
    if cfg.replay.enabled:  # NOTE: the buffer is not checkpointed; a resumed run starts it empty
        P = cfg.replay
        replay = ReplayBuffer(ReplayConfig(capacity=P.capacity, max_age=P.max_age, max_reuse=P.max_reuse, seed=seed))

    # ---- the loop
    ckpt_dir = None
    step = start_step
    try:
        for step in range(start_step + 1, cfg.train.steps + 1):
            if stop_after is not None and step > start_step + stop_after:
                return None
            t_step = time.perf_counter()
            sp = SamplingParams(n=R.samples_per_prompt, temperature=R.temperature, top_p=R.top_p, top_k=R.top_k,
                                max_tokens=R.max_tokens, seed=seed * 1_000_003 + step)
            if controller is None:
                tasks = [train_tasks[i] for i in order.take(R.prompts_per_step)]
                sr = generate_and_score(engine, tokenizer, env, tasks, sp, step=step, scorer=scorer)
            else:  # the rollout controller picks prompts, group sizes and when to stop (rollwise.control)
                cs = controller.run_step(engine, lambda k: [train_tasks[i] for i in order.take(k)], sp, step=step,
                                         batch_groups=R.prompts_per_step)
                sr = cs.step_rollouts()
            groups = sr.groups
            version = engine.weight_version  # the weights this step's rollouts were sampled with
            replayed: list = []
            if replay is not None and cfg.replay.rescue:  # past successes for groups that all failed
                replayed += rescue_groups(replay, groups, version, cfg.replay.rescue_k)
            zero_var = advantages_and_filter(groups, A)
            trainable = [r for g in groups for r in g.rollouts if r.status in ("kept", "truncated")]
            if replay is not None and cfg.replay.reuse_per_step:  # train again on recent informative rollouts
                reused = reuse_rollouts(replay, cfg.replay.reuse_per_step, version)
                trainable += reused
                replayed += reused
            control_m = controller.finalize(cs, engine.weight_version).metrics() if controller is not None else {}
            train_m: dict[str, float] = {}
            sync_s = 0.0
            if trainable:
                train_m = trainer.train_step(trainable)
                t_sync = time.perf_counter()
                engine.load_weights(trainer.sync_weights())
                sync_s = time.perf_counter() - t_sync
            all_r = [r for g in groups for r in g.rollouts if not is_replayed(r)]  # this step's own rollouts
            store.write_step(step, all_r)
            if replay is not None:
                replay.add(all_r, version=version)
                replay.evict_stale(engine.weight_version)
                control_m = {**control_m, "replay_used": len(replayed), **replay.stats(engine.weight_version)}
            scores = [s for gs in sr.scores for s in gs]
            useful = sum(len(r.completion_token_ids) for r in trainable
                         if abs(r.advantage or 0.0) > 0 and not is_replayed(r))
            rec = {
                **rollout_metrics(all_r, len(groups), zero_var),
                "gen_tokens": sr.gen_tokens, "gen_tokens_per_s": sr.gen_tokens / max(sr.gen_s, 1e-9),
                "gen_tokens_per_useful_token": sr.gen_tokens / max(useful, 1),
                "time_generate_s": sr.gen_s, "time_score_s": sr.score_s,
                "time_train_s": train_m.get("train_s", 0.0), "time_sync_s": sync_s,
                "staleness_mean": 0.0,
                "logprob_mismatch_mean": train_m.get("logprob_diff_mean", float("nan")) if train_m else None,
                "logprob_mismatch_max": train_m.get("logprob_diff_max") if train_m else None,
                "kl": train_m.get("kl"), "entropy": train_m.get("entropy"), "grad_norm": train_m.get("grad_norm"),
                "loss": train_m.get("loss"), "clip_frac": train_m.get("clip_frac"), "lr": train_m.get("lr"),
                "score_errors": sum(s.error is not None for s in scores),
                "weight_version": engine.weight_version,
                "engine_requeued": getattr(engine, "requeued", None),
                "engine_restarts": getattr(engine, "restarts", None),
                "step_s": time.perf_counter() - t_step,
                "tokens_per_s": sr.gen_tokens / max(time.perf_counter() - t_step, 1e-9),
            }
            rec.update(control_m)  # control_* books; staleness measured from the tokens' weight versions
            if cfg.run.eval_every and step % cfg.run.eval_every == 0 and step < cfg.train.steps:
                ev = evaluate(engine, tokenizer, env, eval_tasks, **eval_kw)
                rec["eval_accuracy"], rec["eval_accuracy_greedy"] = ev["accuracy"], ev["accuracy_greedy"]
            metrics.log(step, {k: v for k, v in rec.items() if v is not None})
            if (cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0) or step == cfg.train.steps:
                wall = prev_wall + time.perf_counter() - rs.t_start
                ckpt_dir = trainer.save(run_dir, step, {**order.state(), "wall_s": wall}, cfg.run.keep_checkpoints,
                                        tokenizer=tokenizer)
    finally:
        metrics.close()
        if cfg.run.backend == "ray":
            log(f"ray: {getattr(engine, 'requeued', 0)} generate chunk(s) re-queued after an engine actor died")
            trainer.shutdown()
            scorer.shutdown()

    summary = finish_run(cfg, rs, engine, tokenizer, eval_kw, eval_b, store, init_dir, ckpt_dir, prev_wall,
                         warm_info, log)
    if cfg.run.backend == "ray":
        engine.shutdown()
    return summary
