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
import threading
import time
from typing import Any

from rollwise.config import RunConfig
from rollwise.run.sync import DataOrder, Log, prepare_model
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
    from rollwise.control import make_controller
    from rollwise.engine.llm import LLM
    from rollwise.run.common import (advantages_and_filter, engine_kwargs, eval_before, eval_settings, finish_run,
                                     rollout_metrics, start_run)
    from rollwise.store.writer import RolloutStore
    from rollwise.train.batch import TrainBatch
    from rollwise.train.checkpoint import restore_checkpoint, save_checkpoint
    from rollwise.train.losses import LOSSES, LossConfig
    from rollwise.train.metrics import MetricsLogger
    from rollwise.train.trainer import Trainer

    rs = start_run(cfg, log)
    run_dir, seed, device, env, train_tasks, eval_tasks, ckpt = (
        rs.run_dir, rs.seed, rs.device, rs.env, rs.train_tasks, rs.eval_tasks, rs.ckpt)
    R, A = cfg.rollout, cfg.algo
    if A.tis_cap is None and not A.decoupled:
        log(f"async (K={K}): trained tokens may be up to {K} versions stale; algo.tis_cap or algo.decoupled corrects "
            "the loss for that")

    init_dir, warm_info = prepare_model(cfg, env, train_tasks, run_dir, log)
    engine = LLM(init_dir, device=device, dtype=cfg.model.dtype, tokenizer=None, **engine_kwargs(cfg, seed))
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
    eval_kw = eval_settings(cfg, seed)
    eval_b = eval_before(rs, engine, tokenizer, eval_kw)
    log(f"held-out accuracy before RL: {eval_b['accuracy']:.3f} sampled, {eval_b['accuracy_greedy']:.3f} "
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
            zero_var = advantages_and_filter(groups, A)
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
            acc = cs.accounting
            rm = rollout_metrics(all_r, len(groups), zero_var)
            rec = {
                **rm,
                "gen_tokens": acc.generated_tokens, "gen_tokens_per_s": acc.generated_tokens / max(acc.gen_s, 1e-9),
                "time_generate_s": acc.gen_s, "time_score_s": acc.score_s,
                "time_train_s": train_m.get("train_s", 0.0), "time_wait_rollouts_s": trainer_wait_s,
                "time_producer_wait_s": producer_wait_s,
                "logprob_mismatch_mean": train_m.get("logprob_diff_mean") if train_m else None,
                "logprob_mismatch_max": train_m.get("logprob_diff_max") if train_m else None,
                "kl": train_m.get("kl"), "entropy": train_m.get("entropy"), "grad_norm": train_m.get("grad_norm"),
                "loss": train_m.get("loss"), "clip_frac": train_m.get("clip_frac"), "lr": train_m.get("lr"),
                "score_errors": rm["rollouts"]["errored"], "weight_version": step, "async_staleness_bound": K,
                "step_s": time.perf_counter() - t_step, **control_m,
            }
            metrics.log(step, {k: v for k, v in rec.items() if v is not None})
            if (cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0) or step == cfg.train.steps:
                ckpt_dir = save_checkpoint(trainer, run_dir, step, tokenizer=tokenizer, keep=cfg.run.keep_checkpoints,
                                           data_position={**data_pos,
                                                          "wall_s": prev_wall + time.perf_counter() - rs.t_start})
    finally:
        weights.close()
        producer.join()
        metrics.close()
    if last < cfg.train.steps:
        return None

    engine.load_weights(trainer.state_dict_for_sync())
    return finish_run(cfg, rs, engine, tokenizer, eval_kw, eval_b, store, init_dir, ckpt_dir, prev_wall, warm_info,
                      log, extra={"async_staleness": K})
