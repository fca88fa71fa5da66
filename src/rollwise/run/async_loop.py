"""Asynchronous RL loop with bounded staleness: generation runs ahead of training by at most K weight versions.

    producer thread (owns the engine)              main thread (owns the trainer)
    for step in steps:                             for step in steps:
        wait until trained version >= step-1-K         cs = queue.get()             # step's scored groups
        load the newest published weights              advantages, zero-variance filter, staleness
        cs = controller.run_step(...)                  trainer.train_step(...)      # version += 1
        queue.put(cs)                                  publish a copy of the weights
                                                       store, metrics, checkpoint

Batch `step` is trained by the policy of version step-1; it was sampled by a version >= step-1-K, so every
trained token is at most K versions stale (more with partial rollouts, whose carried samples age further; the
metrics show it). The loss corrects for the behaviour policy with `algo.tis_cap` / `algo.decoupled`. K = 0 is
the synchronous loop: `run_async` then simply runs `run_sync`.

NOTE on threads: only the producer touches the engine (weights included); only the main thread touches the
trainer. Weights cross as a cloned state dict under a lock, and the engine's weight version is set to the
trainer's version, so a token's recorded version is the number of updates behind the policy that sampled it.
The two sides overlap where torch releases the GIL (inside ops), i.e. on two devices or two CPU cores.

Deliberately left out: mid-run evaluation (the engine belongs to the producer; evaluation runs before and after)
and carrying generated-but-untrained batches across a resume (a resumed run regenerates from the checkpointed
data position of the last trained batch).
"""

from __future__ import annotations

import queue
import random
import threading
import time
from pathlib import Path
from typing import Any

from rollwise.config import RunConfig, config_hash, dump_config
from rollwise.run.sync import DataOrder, Log, _write_json_atomic, make_env, prepare_model, resolve_device
from rollwise.types import SamplingParams


class _Weights:
    """The newest trained weights, published by the trainer and picked up by the producer."""

    def __init__(self, version: int) -> None:
        self.cond = threading.Condition()
        self.version = version
        self.state: dict[str, Any] | None = None
        self.stop = False

    def publish(self, version: int, state: dict[str, Any]) -> None:
        with self.cond:
            self.version, self.state = version, state
            self.cond.notify_all()

    def wait_for(self, version: int) -> tuple[int, dict[str, Any] | None] | None:
        """Block until the trained version is >= `version`; (version, weights) or None when stopping."""
        with self.cond:
            self.cond.wait_for(lambda: self.stop or self.version >= version)
            return None if self.stop else (self.version, self.state)

    def close(self) -> None:
        with self.cond:
            self.stop = True
            self.cond.notify_all()


def run_async(cfg: RunConfig, log: Log = print, *, stop_after: int | None = None) -> dict[str, Any] | None:
    """Like `run_sync`, with generation in a background thread at most `control.async_staleness` versions ahead."""
    K = cfg.control.async_staleness
    if K == 0:
        from rollwise.run.sync import run_sync

        return run_sync(cfg, log, stop_after=stop_after)
    import numpy as np
    import torch

    from rollwise.control import make_controller
    from rollwise.engine.llm import LLM
    from rollwise.run.rollouts import ACCURACY_METHOD, evaluate
    from rollwise.store.card import build_rollout_card
    from rollwise.store.writer import RolloutStore
    from rollwise.train.advantages import assign_advantages
    from rollwise.train.batch import TrainBatch
    from rollwise.train.checkpoint import find_latest_checkpoint, load_checkpoint, restore_checkpoint, save_checkpoint
    from rollwise.train.losses import LOSSES, LossConfig
    from rollwise.train.metrics import MetricsLogger
    from rollwise.train.trainer import Trainer

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
    R, A = cfg.rollout, cfg.algo
    if A.tis_cap is None and not A.decoupled:
        log(f"async (K={K}): trained tokens may be up to {K} versions stale; algo.tis_cap or algo.decoupled corrects "
            "the loss for that")

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

    init_dir, warm_info = prepare_model(cfg, env, train_tasks, run_dir, log)
    E = cfg.engine
    engine = LLM(init_dir, device=device, dtype=cfg.model.dtype, tokenizer=None,
                 max_num_seqs=E.max_num_seqs, max_num_batched_tokens=E.max_num_batched_tokens,
                 max_model_len=E.max_model_len, block_size=E.block_size, num_kv_blocks=E.num_kv_blocks,
                 kv_cache_gb=E.kv_cache_gb, enable_prefix_caching=E.enable_prefix_caching, seed=seed)
    tokenizer = engine.tokenizer
    trainer = Trainer(init_dir, cfg.train, device=device, temperature=R.temperature if R.temperature > 0 else 1.0,
                      reference=A.kl_coef > 0, total_steps=cfg.train.steps)
    loss_fn = LOSSES[A.loss]
    loss_cfg = LossConfig.from_algo(A, max_length=R.max_tokens)
    controller = make_controller(cfg.control, env, tokenizer, seed=seed)
    order = DataOrder(len(train_tasks), seed)
    start_step, prev_wall = 0, 0.0
    if ckpt is not None:
        pos = restore_checkpoint(trainer, ckpt)
        order.epoch, order.index = int(pos.get("epoch", 0)), int(pos.get("index", 0))
        prev_wall = float(pos.get("wall_s", 0.0))
        start_step = ckpt.step
        engine.load_weights(trainer.state_dict_for_sync())
        log(f"resume: continuing after step {start_step} from {ckpt.path}")
    # NOTE: version numbering = updates trained so far, on both sides (see the module docstring).
    engine.engine.weight_version = start_step

    store = RolloutStore(run_dir, decode=(lambda ids: tokenizer.decode(ids)) if tokenizer is not None else None)
    store.truncate_after(start_step)
    metrics = MetricsLogger(run_dir, total_steps=cfg.train.steps, tensorboard=cfg.run.tensorboard,
                            resume_from_step=start_step)
    eval_kw = dict(temperature=R.temperature if R.temperature > 0 else 1.0, samples=4, max_tokens=R.max_tokens,
                   seed=seed + 7919)
    before_path = run_dir / "eval_before.json"
    if ckpt is not None and before_path.is_file():
        import json

        eval_before = json.loads(before_path.read_text())
    else:
        eval_before = evaluate(engine, tokenizer, env, eval_tasks, **eval_kw)
        _write_json_atomic(before_path, eval_before)
    log(f"held-out accuracy before RL: {eval_before['accuracy']:.3f} sampled, {eval_before['accuracy_greedy']:.3f} "
        f"greedy, on {len(eval_tasks)} problems; generation up to {K} versions ahead")

    last = cfg.train.steps if stop_after is None else min(cfg.train.steps, start_step + stop_after)
    weights = _Weights(start_step)
    batches: queue.Queue = queue.Queue()

    def produce() -> None:
        try:
            for step in range(start_step + 1, last + 1):
                t_wait = time.perf_counter()
                got = weights.wait_for(step - 1 - K)
                if got is None:
                    return
                wait_s = time.perf_counter() - t_wait
                version, state = got
                if state is not None and version > engine.weight_version:
                    engine.load_weights(state)
                    engine.engine.weight_version = version
                sp = SamplingParams(n=R.samples_per_prompt, temperature=R.temperature, top_p=R.top_p, top_k=R.top_k,
                                    max_tokens=R.max_tokens, seed=seed * 1_000_003 + step)
                cs = controller.run_step(engine, lambda k: [train_tasks[i] for i in order.take(k)], sp, step=step,
                                         batch_groups=R.prompts_per_step)
                batches.put((step, cs, order.state(), wait_s))
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread, where the run is reported
            batches.put(e)

    producer = threading.Thread(target=produce, name="rollwise-generate", daemon=True)
    producer.start()
    ckpt_dir = None
    try:
        for step in range(start_step + 1, last + 1):
            t_step = time.perf_counter()
            item = batches.get()
            if isinstance(item, BaseException):
                raise item
            got_step, cs, data_pos, producer_wait_s = item
            assert got_step == step, f"batch for step {got_step} arrived at step {step}"
            trainer_wait_s = time.perf_counter() - t_step
            groups = cs.groups
            assign_advantages(groups, A.advantage, eps=A.adv_eps, baseline=A.reinforce_baseline)
            zero_var = 0
            for g in groups:
                if g.zero_variance:
                    zero_var += 1
                    if A.skip_zero_variance:
                        for r in g.rollouts:
                            if r.status in ("kept", "truncated"):
                                r.status, r.status_reason = "filtered", "zero-variance group (no GRPO signal)"
            trainable = [r for g in groups for r in g.rollouts if r.status in ("kept", "truncated")]
            control_m = controller.finalize(cs, step - 1).metrics()
            train_m: dict[str, float] = {}
            if trainable:
                batch = TrainBatch.from_rollouts(trainable, cfg.train.micro_batch_tokens)
                train_m = trainer.train_step(batch, loss_fn, loss_cfg)
            # Publish even without an update, so the version count stays = steps and the producer never stalls.
            weights.publish(step, {k: v.detach().clone() for k, v in trainer.state_dict_for_sync().items()})
            all_r = [r for g in groups for r in g.rollouts]
            store.write_step(step, all_r)
            lens = [len(r.completion_token_ids) for r in all_r]
            acc = cs.accounting
            counts = {s: sum(r.status == s for r in all_r) for s in ("kept", "filtered", "errored", "truncated", "aborted")}
            rec = {
                "reward_mean": float(np.mean([r.reward if r.reward is not None else 0.0 for r in all_r])),
                "accuracy": float(np.mean([r.reward_parts.get("correct", r.reward or 0.0) >= 1.0 - 1e-9
                                           if r.status != "errored" else 0.0 for r in all_r])),
                "zero_var_frac": zero_var / len(groups),
                "resp_len_mean": float(np.mean(lens)), "resp_len_max": int(max(lens)),
                "truncation_rate": counts["truncated"] / len(all_r),
                "gen_tokens": acc.generated_tokens, "gen_tokens_per_s": acc.generated_tokens / max(acc.gen_s, 1e-9),
                "time_generate_s": acc.gen_s, "time_score_s": acc.score_s,
                "time_train_s": train_m.get("train_s", 0.0), "time_wait_rollouts_s": trainer_wait_s,
                "time_producer_wait_s": producer_wait_s,
                "logprob_mismatch_mean": train_m.get("logprob_diff_mean") if train_m else None,
                "logprob_mismatch_max": train_m.get("logprob_diff_max") if train_m else None,
                "kl": train_m.get("kl"), "entropy": train_m.get("entropy"), "grad_norm": train_m.get("grad_norm"),
                "loss": train_m.get("loss"), "clip_frac": train_m.get("clip_frac"), "lr": train_m.get("lr"),
                "score_errors": counts["errored"], "weight_version": step, "async_staleness_bound": K,
                "rollouts": counts, "step_s": time.perf_counter() - t_step, **control_m,
            }
            metrics.log(step, {k: v for k, v in rec.items() if v is not None})
            if (cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0) or step == cfg.train.steps:
                ckpt_dir = save_checkpoint(trainer, run_dir, step, tokenizer=tokenizer, keep=cfg.run.keep_checkpoints,
                                           data_position={**data_pos,
                                                          "wall_s": prev_wall + time.perf_counter() - t_start})
    finally:
        weights.close()
        producer.join()
        metrics.close()
    if last < cfg.train.steps:
        return None

    engine.load_weights(trainer.state_dict_for_sync())
    eval_after = evaluate(engine, tokenizer, env, eval_tasks, **eval_kw)
    log(f"held-out accuracy after RL:  {eval_after['accuracy']:.3f} sampled, {eval_after['accuracy_greedy']:.3f} greedy "
        f"({cfg.train.steps} steps, async K={K})")
    counts = store.counts_by_status()
    card = build_rollout_card(counts, config_hash=config_hash(cfg), seeds={"train": seed, "eval": eval_kw["seed"]},
                              accuracy_method=ACCURACY_METHOD,
                              checkpoints={"init": init_dir, **({"final": ckpt_dir} if ckpt_dir else {})})
    summary = {
        **card, "eval_before": eval_before, "eval_after": eval_after,
        "accuracy_gain": eval_after["accuracy"] - eval_before["accuracy"], "steps": cfg.train.steps,
        "wall_s": prev_wall + time.perf_counter() - t_start, "device": device, "warmup": warm_info,
        "run_dir": str(run_dir), "async_staleness": K,
    }
    _write_json_atomic(run_dir / "summary.json", summary)
    try:
        from rollwise.report import write_report

        write_report(run_dir)
    except Exception as e:  # noqa: BLE001 - the run is done and saved; a report failure must not hide that
        log(f"warning: report not written: {type(e).__name__}: {e}")
    return summary
