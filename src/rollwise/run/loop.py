"""The RL loop, top to bottom. One step:

    batch    = source.next_batch(step)        # select prompts -> generate -> score (the rollout controller)
    guard    = a reward that errored on every sample (first step, or run.max_all_errored_steps in a row) stops
               the run here, before the step trains (run/guard.py)
    rescue   = replay: past successes into all-failed groups (optional)
    advantages per group (GRPO & co), then the Filter room (rollwise/filter.py): zero-variance groups and
    overlong samples filtered and counted, trainable = what it selects (+ replayed ones, optional)
    metrics  = trainer.train_step(trainable)  # trainer.version += 1
    check    = the rollouts made at the trainer's version carry its log-probs, or the run stops here with one line
               (run/sync_check.py RolloutCheck), before anything of the step is synced or stored
    source.sync(trainer.weights(), trainer.version)   # weights -> engine(s), under the trainer's version
    evaluate when due; store.write_step(step, every rollout of the step, any status, its write-ahead log record)
    metrics.log(step, step_metrics(...)); checkpoint when due   # the step line: counts, and why nothing trained

The variants are objects built by `run/setup.py` from the config and handed in: the source (synchronous, or
asynchronous with staleness K), the engine behind it (local, remote servers, Ray actors), the scorer and the
trainer (in-process or a Ray actor). The loop never asks which one it has.

Everything the run writes lives in `RUN_DIR` (see docs/architecture.md). `run.resume` continues from the latest
complete checkpoint (model, optimiser, step, RNG, data position, weight version, replay buffer, partial-rollout
carry), then re-trains every later step whose rollouts are stored from its shard (the store is the write-ahead
log: run/resume.py), so a crash loses at most the step in flight and each completed step is stored exactly once.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollwise.config import RunConfig, config_hash
from rollwise.types import ROLLOUT_STATUSES, Rollout, RolloutGroup, SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.control.ledger import Accounting
    from rollwise.filter import FilterRules
    from rollwise.engine.protocol import Engine
    from rollwise.run.setup import RunParts
    from rollwise.run.sources import RolloutSource, StepBatch
    from rollwise.store.replay import ReplayBuffer
    from rollwise.store.writer import RolloutStore
    from rollwise.train.metrics import MetricsLogger

Log = Callable[[str], None]
"""Samples per held-out problem for the sampled accuracy (ACCURACY_METHOD states it)."""


def train(cfg: RunConfig, log: Log = print, *, stop_after: int | None = None) -> dict[str, Any] | None:
    """Run (or resume) RL training as `cfg` says; returns the summary written to RUN_DIR/summary.json.

    stop_after: end this invocation after that many steps as if interrupted (no final eval or summary;
    returns None). Used by the resume tests and by time-boxed jobs; `run.resume` continues later.
    A resume of a run that already finished says so in one line and returns its summary, doing nothing else
    (`run.resume.finished_run`). Raises `run.guard.RewardBroken` (one line) when the reward errors on every sample
    (`run.max_all_errored_steps`).
    """
    from rollwise.run.resume import finished_run
    from rollwise.run.setup import build_run

    done = finished_run(cfg)
    if done is not None:
        log(done.line())
        return done.summary
    run = build_run(cfg, log)
    try:
        return _run_steps(run, log, stop_after)
    finally:
        run.close()


def _run_steps(run: RunParts, log: Log, stop_after: int | None) -> dict[str, Any] | None:
    """Restore, evaluate before, run the steps, evaluate after and write the summary."""
    from rollwise.run.resume import restore
    from rollwise.run.sources import DataOrder, make_source
    from rollwise.store.writer import RolloutStore
    from rollwise.train.metrics import MetricsLogger, prepare_resume

    cfg, trainer, engine, tok = run.cfg, run.trainer, run.engine, run.tokenizer
    store = RolloutStore(run.run_dir, decode=(lambda ids: tok.decode(list(ids))) if tok is not None else None)
    order = DataOrder(len(run.train_tasks), run.seed)
    replay = _replay_buffer(cfg, run.seed)
    point = restore(run.resume, trainer, store, run.ckpt, order=order, replay=replay, controller=run.controller,
                    tasks={t.id: t for t in run.train_tasks}, tokenizer=tok, log=log)
    if point.step > 0 or not run.engine_holds_policy:  # a server may hold other weights: send ours
        engine.load_weights(trainer.weights(), trainer.version)
    if run.sync_check is not None:  # the engine samples from the trainer's distribution, or the run stops here
        ref = run.sync_check.reference(trainer, _params_for(run)(trainer.version + 1))
        run.sync_check.verify(engine, ref, first=True)
    for note in prepare_resume(run.run_dir, point.step, point.metrics):
        log(note)
    metrics = MetricsLogger(run.run_dir, total_steps=cfg.train.steps, loggers=cfg.run.loggers,
                            resume_from_step=point.step, run_config=run.resume.config,
                            project=cfg.run.project, run_name=cfg.run.run_name, line_every=cfg.run.log_every,
                            line=log)
    held_out = _held_out(run)
    eval_base = _eval_base(run, held_out, log, metrics.phase) if run.base_dir is not None and cfg.sft.eval_base else None
    eval_b = _eval_before(run, engine, held_out, metrics.phase, resumed=point.step > 0)
    R, K = cfg.rollout, cfg.control.async_staleness
    log(f"held-out accuracy before RL: {eval_b['accuracy']:.3f} sampled (T={R.temperature}), "
        f"{eval_b['accuracy_greedy']:.3f} greedy, on {len(run.eval_tasks)} problems"
        + (f"; generation up to {K} versions ahead" if K else ""))
    last = cfg.train.steps if stop_after is None else min(cfg.train.steps, point.step + stop_after)
    source = make_source(run.controller, engine, run.train_tasks, order, _params_for(run), R.prompts_per_step,
                         staleness=K, first_step=point.step + 1, last_step=last, trained_version=trainer.version,
                         sync_check=run.sync_check, trainer=trainer)
    steps = _Steps(run, source, store, metrics, replay, held_out, log, prev_wall=point.wall_s)
    ckpt_dir = point.checkpoint
    metrics.phase(f"step {point.step + 1}: generating rollouts")
    try:
        try:
            for step in range(point.step + 1, last + 1):
                ckpt_dir = steps.run_step(step) or ckpt_dir
        finally:
            source.close()
            requeued = engine.counters().get("requeued")
            if requeued is not None:
                log(f"ray: {requeued} generate chunk(s) re-queued after an engine actor died")
        if last < cfg.train.steps:
            return None
        metrics.phase(f"evaluating after RL on {len(run.eval_tasks)} held-out problems", echo=True)
        with source.exclusive() as eng:
            after = held_out(eng)
        metrics.phase_done()
    finally:
        metrics.close()
    return _finish(run, eval_b, after, store, ckpt_dir, point.wall_s, log, eval_base)


def _replay_buffer(cfg: RunConfig, seed: int) -> ReplayBuffer | None:
    """The replay buffer `replay` describes, or None when it is off."""
    from rollwise.store.replay import ReplayBuffer, ReplayConfig

    P = cfg.replay
    if not P.enabled:
        return None
    return ReplayBuffer(ReplayConfig(capacity=P.capacity, max_age=P.max_age, max_reuse=P.max_reuse, seed=seed,
                                     success_threshold=cfg.env.pass_threshold))


def _held_out(run: RunParts) -> Callable[[Engine], dict[str, float]]:
    """Held-out accuracy on the run's eval tasks (sampled at the training temperature, and greedy)."""
    from rollwise.run.evaluate import evaluate

    cfg, R = run.cfg, run.cfg.rollout

    def held_out(eng: Engine) -> dict[str, float]:
        return evaluate(eng, run.encode, run.env, run.eval_tasks, temperature=R.temperature,
                        samples=cfg.run.eval_samples, max_tokens=R.max_tokens, seed=run.seed + 7919,
                        scorer=run.scorer, stop_token_ids=run.stop_token_ids, pass_threshold=cfg.env.pass_threshold,
                        episodes=run.episodes)

    return held_out


def _params_for(run: RunParts) -> Callable[[int], SamplingParams]:
    """`params(step)`: the step's sampling params (its own seed; tree rollouts when `rollout.tree` is on)."""
    R, seed, stop = run.cfg.rollout, run.seed, run.stop_token_ids
    tree = R.tree.spec()  # tree rollouts (engine/tree.py), or None

    def params(step: int) -> SamplingParams:
        return SamplingParams(n=R.samples_per_prompt, temperature=R.temperature, top_p=R.top_p, top_k=R.top_k,
                              max_tokens=R.max_tokens, seed=seed * 1_000_003 + step, stop_token_ids=stop or None,
                              tree=tree)

    return params


@dataclass
class _Learned:
    """What one step trained on, and how."""

    groups: list[RolloutGroup]
    zero_var: int
    trainable: list[Rollout]
    """What the trainer got: the Filter room's selection, then replayed copies."""
    replayed: list[Rollout]
    books: Accounting
    train_m: dict[str, float]
    rng_before: dict[str, Any]
    """The RNG just before the update (the write-ahead log re-trains the step under it)."""
    no_signal: str | None
    """Why the update moved nothing (`filter.no_signal`), or None."""


class _Steps:
    """One RL step at a time: learn from a batch, sync, evaluate when due, store, log, checkpoint."""

    def __init__(self, run: RunParts, source: RolloutSource, store: RolloutStore, metrics: MetricsLogger,
                 replay: ReplayBuffer | None, held_out: Callable[[Engine], dict[str, float]], log: Log, *,
                 prev_wall: float) -> None:
        from rollwise.run.guard import ErroredSteps
        from rollwise.train.overlong import overlong_options

        self.run, self.source, self.store, self.metrics, self.replay = run, source, store, metrics, replay
        self.held_out, self.log, self.prev_wall = held_out, log, prev_wall
        self.overlong = overlong_options(run.cfg.algo)  # DAPO's overlong filtering / soft punishment
        self.rules = run.controller.rules  # the Filter room's rules, built once at setup (control uses the same)
        self.all_errored = ErroredSteps(run.cfg.run.max_all_errored_steps, run.run_dir)  # a broken reward stops here

    def run_step(self, step: int) -> Path | None:
        """Run `step`; the checkpoint written after it, if one was due."""
        from rollwise.run.resume import loop_state, step_record, trained_refs
        from rollwise.store.replay import is_replayed

        run, trainer, cfg = self.run, self.run.trainer, self.run.cfg
        t_step, cpu_step = time.perf_counter(), time.process_time()
        batch = self.source.next_batch(step)  # select prompts -> generate -> score
        t_got = time.perf_counter()
        self.all_errored.observe(step, [r for g in batch.result.groups for r in g.rollouts])  # before it trains
        learned = self._learn(step, batch)
        sync_s = self.source.sync(trainer.weights(), trainer.version)
        own = [r for g in learned.groups for r in g.rollouts if not is_replayed(r)]  # this step's own rollouts
        extra = self._extras(own, learned)
        eval_s, eval_cpu_s = self._eval_when_due(step, extra)
        rec = step_metrics(own, len(learned.groups), learned.zero_var, learned.books, learned.train_m,
                           gen_wait_s=t_got - t_step, producer_wait_s=batch.wait_s, sync_s=sync_s,
                           step_s=time.perf_counter() - t_step - eval_s,
                           cpu_s=time.process_time() - cpu_step - eval_cpu_s, weight_version=trainer.version,
                           staleness_bound=self.source.staleness_bound, engine_counters=run.engine.counters(),
                           useful=_useful_tokens(learned.trainable, is_replayed, self.rules),
                           pass_threshold=cfg.env.pass_threshold)
        if learned.no_signal:
            rec["no_signal"] = learned.no_signal
        wall = self.prev_wall + time.perf_counter() - run.t_start
        state = loop_state(batch.data_position, batch.policy_state, self.replay, wall)
        # NOTE: the shard and its record land in one rename, before the metrics line: a crash between the two
        # leaves a shard whose record restores the line (train/metrics.py prepare_resume).
        self.store.write_step(step, own, journal=step_record(
            step, trained_refs(learned.trainable, is_replayed), learned.rng_before, state, {**rec, **extra},
            run.resume.config))
        self.metrics.log(step, {**rec, **extra})
        if not run.resume.due(step):
            return None
        return trainer.save(run.run_dir, step, {**batch.data_position, "wall_s": wall, "loop": state,
                                                "run": run.resume.run_info()}, run.resume.keep_checkpoints,
                            tokenizer=run.tokenizer)

    def _learn(self, step: int, batch: StepBatch) -> _Learned:
        """Rescue, shape, advantages, the Filter room's selection, reuse; then the update (a lost trainer is
        brought back to step - 1 from its checkpoint and the store, and trains the step again)."""
        from rollwise.cluster.trainer_handle import TrainerLost
        from rollwise.filter import no_signal, select
        from rollwise.run.resume import recover_trainer, rng_state, set_rng_state
        from rollwise.store.replay import rescue_groups, reuse_rollouts
        from rollwise.train.advantages import assign_advantages
        from rollwise.train.overlong import shape_overlong

        run, trainer, replay = self.run, self.run.trainer, self.replay
        R, A, P = run.cfg.rollout, run.cfg.algo, run.cfg.replay
        groups = batch.result.groups
        policy_version = trainer.version  # the policy this step's gradient is taken at
        replayed: list[Rollout] = []
        if replay is not None and P.rescue:  # past successes for groups that all failed
            replayed += rescue_groups(replay, groups, policy_version, P.rescue_k)
        if self.overlong.punish:  # the soft length penalty joins the reward the advantages see
            shape_overlong(groups, max_length=R.max_tokens, cache_len=self.overlong.cache_for(R.max_tokens))
        assign_advantages(groups, A.advantage, rules=self.rules, eps=A.adv_eps, baseline=A.reinforce_baseline)
        selection = select(groups, self.rules)  # zero-variance groups, overlong samples; what trains
        trainable = list(selection.trainable)
        if replay is not None and P.reuse_per_step:  # train again on recent informative rollouts
            reused = reuse_rollouts(replay, P.reuse_per_step, policy_version)
            trainable += reused
            replayed += reused
        # useful tokens, staleness of what trains
        books = run.controller.finalize(batch.result, policy_version, selection.trainable)
        rng_before = rng_state()  # the write-ahead log re-trains this step under the same RNG
        try:
            train_m = trainer.train_step(trainable)
        except TrainerLost as lost:  # a trainer process died: back to step - 1 from checkpoint + store
            recover_trainer(trainer, self.store, step, run.resume, self.log, lost)
            set_rng_state(rng_before)
            train_m = trainer.train_step(trainable)
        if run.rollout_check is not None:  # rollouts made at this version carry its log-probs, or the run stops here
            run.rollout_check.verify(step, train_m)
        return _Learned(groups, selection.zero_variance_groups, trainable, replayed, books, train_m, rng_before,
                        no_signal(groups, trainable, self.rules))

    def _extras(self, own: list[Rollout], learned: _Learned) -> dict[str, Any]:
        """The replay buffer's books and the last sync's log-prob gap, beside the step's metrics."""
        extra: dict[str, Any] = {}
        if self.replay is not None:
            self.replay.add(own)
            self.replay.evict_stale(self.run.trainer.version)
            extra = {"replay_used": len(learned.replayed), **self.replay.stats(self.run.trainer.version)}
        check = self.run.sync_check
        if check is not None and check.last_diff is not None:
            extra["sync_logprob_gap"] = check.last_diff
        return extra

    def _eval_when_due(self, step: int, extra: dict[str, Any]) -> tuple[float, float]:
        """A mid-run held-out evaluation every `run.eval_every` steps (into `extra`); its wall and CPU seconds."""
        cfg = self.run.cfg
        if not (cfg.run.eval_every and step % cfg.run.eval_every == 0 and step < cfg.train.steps):
            return 0.0, 0.0
        t_eval, cpu_eval = time.perf_counter(), time.process_time()
        self.metrics.phase(f"step {step}: evaluating on {len(self.run.eval_tasks)} held-out problems", echo=True)
        with self.source.exclusive() as eng:
            ev = self.held_out(eng)
        extra["eval_accuracy"], extra["eval_accuracy_greedy"] = ev["accuracy"], ev["accuracy_greedy"]
        eval_s, eval_cpu_s = time.perf_counter() - t_eval, time.process_time() - cpu_eval
        extra["time_eval_s"] = eval_s
        return eval_s, eval_cpu_s


def _useful_tokens(trainable: Sequence[Rollout], is_replayed: Callable[[Rollout], bool], rules: FilterRules) -> int:
    from rollwise.filter import carries_signal

    return sum(r.completion_len for r in trainable if carries_signal(r, rules) and not is_replayed(r))


def step_metrics(rollouts: Sequence[Rollout], num_groups: int, zero_var: int, books: Accounting,
                 train_m: dict[str, float],
                 *, gen_wait_s: float, producer_wait_s: float, sync_s: float, step_s: float, cpu_s: float | None = None,
                 weight_version: int,
                 staleness_bound: int, engine_counters: dict[str, int], useful: int,
                 pass_threshold: float = 1.0) -> dict[str, Any]:
    """One step's metrics.jsonl record; a value that does not exist this step is left out (never NaN or 0).

    step_s and cpu_s (this process's CPU seconds, every thread) leave out a mid-run held-out evaluation (its own
    time_eval_s), so summing step_s over a run gives its training wall-clock. reward_mean is over rollouts that
    have a reward (errored and aborted ones have none); accuracy (pass rate:
    reward >= env.pass_threshold) is over finished rollouts (not aborted), errored ones counting as incorrect;
    score_errors counts errored rollouts; judge_calls / judge_cache_hits / judge_cache_hit_rate count the samples an
    LLM judge or reward model computed or found in its cache (`rewards.cached`). TRL GRPOTrainer's names for the same values are added beside rollwise's
    (`train.metrics.trl_metrics`: `reward`, `completions/mean_length`, `rewards/<name>/mean`, ...)."""
    import numpy as np

    from rollwise.rewards.cached import judge_metrics

    counts = {s: sum(r.status == s for r in rollouts) for s in ROLLOUT_STATUSES}
    rewards = [r.reward for r in rollouts if r.reward is not None]
    finished = [r for r in rollouts if r.status != "aborted"]
    lens = [r.completion_len for r in rollouts]
    gen_tokens = books.generated_tokens
    rec: dict[str, Any] = {
        "reward_mean": float(np.mean(rewards)) if rewards else None,
        "accuracy": float(np.mean([r.reward is not None and r.reward >= pass_threshold - 1e-9
                                   for r in finished])) if finished else None,
        "zero_var_frac": zero_var / num_groups if num_groups else None,
        "resp_len_mean": float(np.mean(lens)) if lens else None, "resp_len_max": int(max(lens)) if lens else None,
        "truncation_rate": counts["truncated"] / len(rollouts) if rollouts else None,
        "rollouts": counts, "score_errors": counts["errored"],
        "gen_tokens": gen_tokens, "gen_tokens_per_s": gen_tokens / books.gen_s if books.gen_s > 0 else None,
        "gen_tokens_per_useful_token": gen_tokens / useful if useful else None,
        "time_generate_s": books.gen_s, "time_score_s": books.score_s, "time_wait_rollouts_s": gen_wait_s,
        "time_train_s": train_m.get("train_s", 0.0), "time_sync_s": sync_s, "step_s": step_s, "cpu_s": cpu_s,
        "tokens_per_s": gen_tokens / step_s if step_s > 0 else None,
        "logprob_mismatch_mean": train_m.get("logprob_diff_mean"), "logprob_mismatch_max": train_m.get("logprob_diff_max"),
        "logprob_mismatch_seq_max": train_m.get("logprob_diff_seq_max") if train_m.get("logprob_diff_seqs") else None,
        "tis_clip_frac": train_m.get("tis_clip_frac"),  # with algo.tis_cap (on by default for a low-precision engine)
        # with a masking algo.correction (token_mask, icepop, sequence_mask): what it left out of the loss
        "masked_token_frac": train_m.get("masked_token_frac"), "masked_seq_frac": train_m.get("masked_seq_frac"),
        "kl": train_m.get("kl"), "entropy": train_m.get("entropy"), "grad_norm": train_m.get("grad_norm"),
        # with algo.distill: the reverse KL to the teacher per policy token, the teacher's mean log-prob, its forward
        "distill_reverse_kl": train_m.get("distill_reverse_kl"),
        "distill_teacher_logprob": train_m.get("distill_teacher_logprob"), "time_teacher_s": train_m.get("teacher_s"),
        "loss": train_m.get("loss"), "clip_frac": train_m.get("clip_frac"), "lr": train_m.get("lr"),
        "weight_version": weight_version, "async_staleness_bound": staleness_bound,
        **{f"engine_{k}": v for k, v in engine_counters.items()},  # e.g. Ray actors' requeued / restarts
        **{k: v for k, v in train_m.items() if k.startswith("critic/")},  # algo.advantage gae: the value model's
    }
    if staleness_bound:
        rec["time_producer_wait_s"] = producer_wait_s
    rec.update(books.metrics())  # control_* books; staleness_mean / staleness_max of the trained tokens
    rec.update(episode_metrics(rollouts))
    rec.update(judge_metrics(r.env_info for r in rollouts))  # LLM judge / reward model calls and cache hits
    rec = {k: v for k, v in rec.items() if v is not None}
    from rollwise.train.advantages import SHAPING_PARTS
    from rollwise.train.metrics import trl_metrics

    rec.update({k: v for k, v in trl_metrics(rec, rollouts, SHAPING_PARTS).items() if k not in rec})  # TRL's names too
    return rec


EPISODE_KEYS = ("turns", "tool_calls", "tool_errors", "agent_calls", "agent_segments")
"""Per-episode counts a multi-turn environment records in `env_info`; each step logs their means."""


def episode_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """`{key}_mean` over the rollouts whose env_info has the key (multi-turn episodes; empty otherwise)."""
    out = {}
    for key in EPISODE_KEYS:
        vals = [float(r.env_info[key]) for r in rollouts if isinstance(r.env_info.get(key), (int, float))]
        if vals:
            out[f"{key}_mean"] = sum(vals) / len(vals)
    return out


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def _eval_base(run: RunParts, held_out: Callable[[Engine], dict[str, float]], log: Log,
               phase: Callable[..., None]) -> dict[str, float]:
    """The model before SFT, evaluated once on an in-process engine (kept in RUN_DIR/eval_base.json)."""
    path = run.run_dir / "eval_base.json"
    if path.is_file():
        return json.loads(path.read_text())
    phase(f"evaluating the base model (before SFT) on {len(run.eval_tasks)} held-out problems", echo=True)
    from rollwise.engine.llm import LLM
    from rollwise.run.setup import engine_kwargs

    assert run.base_dir is not None, "the base model is evaluated only when SFT ran first"
    llm = LLM(run.base_dir, device=run.device, dtype=run.cfg.model.dtype, tokenizer=run.tokenizer,
              **engine_kwargs(run.cfg.engine, run.seed))
    try:
        res = held_out(llm)
    finally:
        del llm
    log(f"held-out accuracy of the base model (before SFT): {res['accuracy']:.3f} sampled, "
        f"{res['accuracy_greedy']:.3f} greedy")
    _write_json_atomic(path, res)
    return res


def _eval_before(run: RunParts, engine: Engine, held_out: Callable[[Engine], dict[str, float]],
                 phase: Callable[..., None], *, resumed: bool) -> dict[str, float]:
    """The pre-RL evaluation, computed once and kept in RUN_DIR/eval_before.json for resumed runs; `phase` labels
    the progress bar while it runs (`MetricsLogger.phase`)."""
    path = run.run_dir / "eval_before.json"
    if resumed and path.is_file():
        return json.loads(path.read_text())
    phase(f"evaluating before RL on {len(run.eval_tasks)} held-out problems", echo=True)
    res = held_out(engine)
    _write_json_atomic(path, res)
    return res


def _finish(run: RunParts, before: dict[str, float], after: dict[str, float], store: RolloutStore,
            ckpt_dir: Path | None,
            prev_wall: float, log: Log, base: dict[str, float] | None = None) -> dict[str, Any]:
    """summary.json (with the rollout card) and report.html."""
    from rollwise.run.evaluate import ACCURACY_METHOD
    from rollwise.store.card import build_rollout_card

    cfg = run.cfg
    log(f"held-out accuracy after RL:  {after['accuracy']:.3f} sampled, {after['accuracy_greedy']:.3f} greedy "
        f"({cfg.train.steps} steps)")
    card = build_rollout_card(store.counts_by_status(), config_hash=config_hash(cfg),
                              seeds={"train": run.seed, "eval": run.seed + 7919}, accuracy_method=ACCURACY_METHOD,
                              checkpoints={"init": run.init_dir, **({"final": ckpt_dir} if ckpt_dir else {})})
    from rollwise.sandbox import isolation_in_use

    sandboxes = isolation_in_use()  # how untrusted code was run for scoring (empty: none was)
    for sb in sandboxes:
        if sb.get("warning"):
            log(f"WARNING: {sb['warning']}")
    summary = {
        **card, "sandbox": sandboxes, "eval_before": before, "eval_after": after, "accuracy_gain": after["accuracy"] - before["accuracy"],
        "steps": cfg.train.steps, "wall_s": prev_wall + time.perf_counter() - run.t_start, "device": run.device,
        "warmup": run.warm_info, "run_dir": str(run.run_dir), "engine_backend": cfg.engine.backend,
        "async_staleness": cfg.control.async_staleness, "control_policy": cfg.control.policy,
    }
    if run.base_dir is not None:  # SFT ran first: eval_before is the SFT model's, eval_base the model before it
        summary.update(eval_base=base, sft=run.sft_info, sft_model=str(run.init_dir), base_model=str(run.base_dir))
    _write_json_atomic(run.run_dir / "summary.json", summary)
    try:
        from rollwise.report import write_report

        write_report(run.run_dir)
    except Exception as e:  # noqa: BLE001 - the run is done and saved; a report failure must not hide that
        log(f"warning: report not written: {type(e).__name__}: {e}")
    return summary
