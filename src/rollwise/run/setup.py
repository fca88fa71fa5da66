"""Everything a run needs before its first step, built from the config: the variants the loop is handed.

`build_run(cfg)` returns a `RunParts`: the environment and its tasks, the resume point, the initial model, the
engine (`engine.backend`: local, remote or ray, all behind `engine.protocol`), the scorer, the trainer handle
(in-process, or a Ray actor with the ray backend), the rollout controller (always; `uniform` by default) and
the rollout source (synchronous, or asynchronous with staleness K). `run/loop.py` then runs the steps without
asking which variants it got.

Deliberately left out: anything per step (that is the loop) and config validation (config.py refuses a
combination that cannot work before anything here runs).
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rollwise.config import RunConfig, dump_config
from rollwise.types import Score, Task

Log = Callable[[str], None]


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"model.device={device!r} but CUDA is not available on this machine")
    return device


SCORE_TIMEOUT_S = 30.0
"""The longest one reward call may take (a TRL-style batch call counts as one) before it scores errored."""
SCORE_WORKERS = 8
"""Concurrent per-sample reward calls."""


def make_env(env_cfg: Any) -> Any:
    """The environment an `env` config section names, with the user's reward(s) when it names them."""
    from rollwise.envs.build import make_env as build

    return build(env_cfg.name, env_cfg.kwargs, reward=env_cfg.reward, rewards=env_cfg.rewards, module=env_cfg.module,
                 reward_timeout_s=SCORE_TIMEOUT_S, reward_workers=SCORE_WORKERS)


def prompt_encoder(env_cfg: Any, tokenizer: Any) -> Callable[[Task], list[int]]:
    """`encode(task)`: the task's prompt as the model expects it (`env.chat_template`, `env.system_prompt`); the
    same in train, eval and generate."""
    from rollwise.models.prompting import PromptFormat

    return PromptFormat(env_cfg.chat_template, env_cfg.system_prompt).task_encoder(tokenizer)


def engine_kwargs(engine_cfg: Any, seed: int) -> dict[str, Any]:
    """`LLM(...)` keyword arguments: the sizing fields of the `engine` section, and the seed."""
    sizing = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "num_kv_blocks", "kv_cache_gb",
              "enable_prefix_caching")
    return {**{k: getattr(engine_cfg, k) for k in sizing}, "seed": seed}


def make_engine(cfg: RunConfig, model_dir: Path, device: str, tokenizer: Any, seed: int) -> Any:
    """The engine `engine.backend` names, loaded with the model in `model_dir` (remote servers get it at the first
    weight sync)."""
    E = cfg.engine
    if E.backend == "local":
        from rollwise.engine.llm import LLM

        return LLM(model_dir, device=device, dtype=cfg.model.dtype, tokenizer=tokenizer, **engine_kwargs(E, seed))
    if E.backend == "remote":
        from rollwise.engine.remote import MultiEngine, RemoteEngine

        key = os.environ.get(E.remote_api_key_env) or None
        engines = [RemoteEngine(url, api_key=key, timeout_s=E.remote_timeout_s, backend=E.remote_server,
                                tokenizer=tokenizer) for url in E.remote_urls]
        return engines[0] if len(engines) == 1 else MultiEngine(engines)
    from rollwise.run.ray_engines import RayEngines

    return RayEngines(E.num_engines, str(model_dir), device=device, dtype=cfg.model.dtype,
                      engine_kwargs=engine_kwargs(E, seed), address=cfg.run.ray_address,
                      timeout_s=cfg.run.ray_timeout_s, threads=cfg.run.cpu_threads, tokenizer=tokenizer)


def make_trainer(cfg: RunConfig, model_dir: Path, device: str) -> Any:
    """The trainer handle: in-process, or in a Ray actor with the ray backend."""
    from rollwise.run.trainer_handle import LocalTrainer, RayTrainer
    from rollwise.train.losses import LossConfig

    R, A = cfg.rollout, cfg.algo
    loss_cfg = LossConfig.from_algo(A, max_length=R.max_tokens)
    temp = R.temperature
    # The trainer's log-probs use the truncation the engine sampled under (top-k, then top-p), so the importance
    # ratio is exactly 1 at the behaviour policy.
    if cfg.engine.backend == "ray":
        return RayTrainer(str(model_dir), cfg.train, device, temp, A.kl_coef > 0, cfg.train.steps,
                          cfg.train.micro_batch_tokens, A.loss, loss_cfg, cfg.run.cpu_threads, R.top_p, R.top_k,
                          timeout_s=cfg.run.ray_timeout_s, num_gpus=1 if device.startswith("cuda") else 0)
    from rollwise.train.trainer import Trainer

    tr = Trainer(model_dir, cfg.train, device=device, temperature=temp, top_p=R.top_p, top_k=R.top_k,
                 reference=A.kl_coef > 0, total_steps=cfg.train.steps, tokenizer_path=cfg.model.tokenizer)
    return LocalTrainer(tr, cfg.train.micro_batch_tokens, A.loss, loss_cfg)


def make_scorer(cfg: RunConfig, env: Any) -> tuple[Callable[[list[tuple[Task, str]]], list[Score]] | None, Any]:
    """(scorer, handle to shut down): Ray scoring actors with the ray backend, else (None, None) = in-process."""
    if cfg.engine.backend != "ray":
        return None, None
    from rollwise.run.ray_scoring import RayScorer

    sc = RayScorer(env, cfg.run.num_scorers, timeout_s=cfg.run.ray_timeout_s)
    return sc, sc


def prepare_model(cfg: RunConfig, env: Any, train_tasks: list, run_dir: Path, log: Log) -> tuple[Path, dict[str, Any]]:
    """The initial policy checkpoint directory (the built-in model is built and warmed up into RUN_DIR)."""
    if cfg.model.path != "builtin:tiny":
        from rollwise.models.convert import resolve_model

        p = Path(resolve_model(cfg.model.path))  # a directory, a .gguf, 'smollm2-135m' or a hub id
        if not (p / "config.json").is_file():
            raise ValueError(f"model.path {cfg.model.path!r} is not an HF checkpoint directory (no config.json)")
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


def make_episode_runner(cfg: RunConfig, env: Any, tokenizer: Any, encode: Callable[[Task], list[int]]) -> Any:
    """Episodes of a multi-turn environment: replies as chat turns when the prompts use the chat template."""
    from rollwise.control.episodes import EpisodeRunner, chat_reply_formatter
    from rollwise.models.prompting import PromptFormat

    E = cfg.env
    templated = tokenizer is not None and PromptFormat(E.chat_template, E.system_prompt).uses_template(tokenizer)
    budget = E.max_episode_tokens or cfg.engine.max_model_len or 1024
    return EpisodeRunner(env, tokenizer, encode, chat_reply_formatter(tokenizer, templated), max_turns=E.max_turns,
                         max_total_tokens=budget, turn_timeout_s=E.turn_timeout_s)


@dataclass
class RunParts:
    """What `build_run` made; `close()` releases actors and servers' connections."""

    cfg: RunConfig
    run_dir: Path
    seed: int
    device: str
    env: Any
    train_tasks: list[Task]
    eval_tasks: list[Task]
    ckpt: Any
    """The checkpoint to resume from, or None."""
    init_dir: Path
    warm_info: dict[str, Any]
    engine: Any
    tokenizer: Any
    encode: Callable[[Task], list[int]]
    stop_token_ids: list[int]
    """Generation ends at these (the generation config's eos ids and the chat template's end-of-turn token)."""
    scorer: Callable[[list[tuple[Task, str]]], list[Score]] | None
    episodes: Any
    """`control.episodes.EpisodeRunner` when the environment is multi-turn, else None."""
    trainer: Any
    controller: Any
    t_start: float
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for c in reversed(self.closers):
            c()
        self.closers.clear()


def build_run(cfg: RunConfig, log: Log) -> RunParts:
    """Threads and seeds, the run directory, data, resume point, model, engine, scorer, trainer and controller."""
    import numpy as np
    import torch

    from rollwise.control import make_controller
    from rollwise.engine.core import load_tokenizer
    from rollwise.models.prompting import stop_token_ids
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
    env = make_env(cfg.env)
    from rollwise.control.episodes import is_multi_turn

    multi_turn = is_multi_turn(env)
    if multi_turn and cfg.control.policy in ("early_stop", "partial"):
        raise ValueError(f"control.policy '{cfg.control.policy}' works on single-turn environments only; env "
                         f"{cfg.env.name!r} is multi-turn (its episodes are not aborted or carried mid-way)")
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
            from rollwise.store.writer import RolloutStore

            # Before any model is loaded: a corrupt or truncated shard of the steps being kept stops the resume
            # with one line naming it, instead of surfacing after more training and checkpoints.
            RolloutStore(run_dir).verify(steps=range(1, ckpt.step + 1))
    resolved = cfg.model_copy(deep=True)
    resolved.run.resume = False  # how this invocation started is not part of the run's config
    (run_dir / "config.yaml").write_text(dump_config(resolved))
    init_dir, warm_info = prepare_model(cfg, env, train_tasks, run_dir, log)
    tok_dir = Path(cfg.model.tokenizer) if cfg.model.tokenizer else init_dir
    tokenizer = load_tokenizer(tok_dir)
    if tokenizer is None and cfg.model.tokenizer:
        raise ValueError(f"model.tokenizer {str(tok_dir)!r} holds no tokenizer files")
    parts = RunParts(cfg, run_dir, seed, device, env, train_tasks, eval_tasks, ckpt, init_dir, warm_info,
                     engine=None, tokenizer=tokenizer, encode=prompt_encoder(cfg.env, tokenizer),
                     stop_token_ids=stop_token_ids(tokenizer, init_dir), scorer=None, episodes=None, trainer=None,
                     controller=None, t_start=t_start)
    if multi_turn:
        parts.episodes = make_episode_runner(cfg, env, tokenizer, parts.encode)
    try:
        parts.engine = make_engine(cfg, init_dir, device, tokenizer, seed)
        for name in ("shutdown", "close"):
            if callable(getattr(parts.engine, name, None)):
                parts.closers.append(getattr(parts.engine, name))
                break
        from rollwise.run.prompt_fit import check_prompts_fit, engine_context

        # A prompt the model's context cannot hold fails here naming its row, not at the first request.
        check_prompts_fit(train_tasks + eval_tasks, parts.encode, engine_context(parts.engine) or cfg.engine.max_model_len)
        parts.scorer, sc = make_scorer(cfg, env)
        if sc is not None:
            parts.closers.append(sc.shutdown)
        parts.trainer = make_trainer(cfg, init_dir, device)
        parts.closers.append(parts.trainer.shutdown)
        from rollwise.control.drafts import DraftStore

        parts.controller = make_controller(cfg.control, env, tokenizer, seed=seed, encode=parts.encode,
                                           scorer=parts.scorer, episodes=parts.episodes,
                                           drafts=DraftStore.from_config(cfg.rollout.speculative))
    except BaseException:
        parts.close()
        raise
    return parts
