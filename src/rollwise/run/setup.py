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
from typing import TYPE_CHECKING, Any, Callable

from rollwise.config import EngineConfig, EnvConfig, ModelConfig, RunConfig, WarmupConfig, dump_config
from rollwise.run.resume import ResumeSpec
from rollwise.types import Scorer, Task, Tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.clients.vllm.launch import VLLMServers
    from rollwise.cluster.trainer_handle import TrainerHandle, TrainerSpec
    from rollwise.control.controller import RolloutController
    from rollwise.control.episodes import EpisodeRunner, EpisodeSource
    from rollwise.engine.protocol import Engine
    from rollwise.envs.base import Environment, MultiTurnEnvironment
    from rollwise.models.prompting import PromptFormat
    from rollwise.run.sync_check import RolloutCheck, SyncCheck
    from rollwise.train.checkpoint import Checkpoint

Log = Callable[[str], None]


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"model.device={device!r} but CUDA is not available on this machine")
    return device


BUILTIN_DIR = "init_model"
"""The built-in model's directory in RUN_DIR (warmed up there; a judge's 'builtin:tiny' loads it)."""

SCORE_TIMEOUT_S = 30.0
"""The longest one reward call may take (a TRL-style batch call counts as one) before it scores errored."""
SCORE_WORKERS = 8
"""Concurrent per-sample reward calls."""


def make_env(env_cfg: EnvConfig, builtin_dir: Path | None = None) -> Environment:
    """The environment an `env` config section names, with the user's reward(s) when it names them. `builtin_dir`:
    where the run's built-in model will be (what a judge's 'builtin:tiny' loads), when model.path is builtin:tiny."""
    from rollwise.envs.build import make_env as build
    from rollwise.in_memory import unwrap
    from rollwise.rewards.model_rewards import ModelPlaces

    places = ModelPlaces(builtin_dir=builtin_dir)

    # Objects given through the Python API (`rollwise.in_memory`) are handed over as themselves.
    kwargs = {k: unwrap(v) for k, v in env_cfg.kwargs.items()}
    rewards = ([{**r, "fn": unwrap(r["fn"])} if "fn" in r else r for r in env_cfg.rewards] if env_cfg.rewards
               else env_cfg.rewards)
    if env_cfg.agent is not None:
        from rollwise.envs.user_agent import UserAgentEnv, load_agent

        if env_cfg.environment is not None:
            raise ValueError("env.agent and env.environment both name what runs an episode; set one of them")
        agent = unwrap(env_cfg.agent)
        data = build(env_cfg.name, kwargs, reward=unwrap(env_cfg.reward), rewards=rewards, module=env_cfg.module,
                     reward_timeout_s=SCORE_TIMEOUT_S, reward_workers=SCORE_WORKERS, places=places)
        return UserAgentEnv(data, load_agent(agent), agent if isinstance(agent, str) else getattr(agent, "__name__", "agent"))
    environment = env_cfg.environment
    environment = ({k: unwrap(v) for k, v in environment.items()} if isinstance(environment, dict)
                   else unwrap(environment))
    return build(env_cfg.name, kwargs, reward=unwrap(env_cfg.reward), rewards=rewards, module=env_cfg.module,
                 reward_timeout_s=SCORE_TIMEOUT_S, reward_workers=SCORE_WORKERS, places=places, environment=environment,
                 environment_api=env_cfg.environment_api, tool_timeout_s=env_cfg.tool_timeout_s,
                 max_tool_calls=env_cfg.max_tool_calls, turn_budget_s=max(env_cfg.turn_timeout_s - 1.0, 0.5),
                 tool_isolation=env_cfg.tool_isolation)


def prompt_format(env_cfg: EnvConfig, env: Environment | None = None) -> PromptFormat:
    """The `PromptFormat` of the `env` section (with the tools of a tool class, `envs.agent.ToolEnv`)."""
    from rollwise.models.prompting import PromptFormat

    return PromptFormat(env_cfg.chat_template, env_cfg.system_prompt, tools=getattr(env, "tools", None) or None)


def prompt_encoder(env_cfg: EnvConfig, tokenizer: Tokenizer | None,
                   env: Environment | None = None) -> Callable[[Task], list[int]]:
    """`encode(task)`: the task's prompt as the model expects it (`env.chat_template`, `env.system_prompt`, the
    environment's tools); the same in train, eval and generate. With several tool classes (`envs.agent.ToolEnv`
    over a dict), each task's prompt offers only its own class's tools, as TRL's."""
    from rollwise.models.prompting import PromptFormat

    tool_sets = getattr(env, "tool_sets", None)
    environment_of = getattr(env, "environment_of", None)
    if not isinstance(tool_sets, dict) or len(tool_sets) < 2 or not callable(environment_of):
        return prompt_format(env_cfg, env).task_encoder(tokenizer)
    encoders = {name: PromptFormat(env_cfg.chat_template, env_cfg.system_prompt, tools=tools or None
                                   ).task_encoder(tokenizer) for name, tools in tool_sets.items()}
    return lambda task: encoders[environment_of(task)](task)


def check_served_template(env_cfg: EnvConfig, env: Environment, engine: Engine, tokenizer: Tokenizer | None, log: Log,
                          *, vllm: bool) -> None:
    """Each remote server's rendering of the run's probe conversation against rollwise's (`clients.template_check`):
    a difference is logged, one line per server (rollwise's own rollouts send token ids and stay exact)."""
    from rollwise.clients.template_check import served_template_problem

    fmt = prompt_format(env_cfg, env)
    if tokenizer is None or not fmt.uses_template(tokenizer):
        return
    for e in getattr(engine, "engines", None) or [engine]:
        http = getattr(e, "http", None)
        if http is None:
            continue
        checked, problem = served_template_problem(http, getattr(e, "model", None), tokenizer, fmt,
                                                   tool_turns=bool(fmt.tools))
        if problem:
            log(f"chat template: {http.base_url} renders chat messages otherwise than the template rollwise trains "
                f"with ({problem}); rollouts are unaffected (rollwise sends token ids), but a client sending this "
                "server messages gets other tokens than training used")
        elif not checked and vllm:
            log(f"chat template: {http.base_url} did not render the probe conversation (POST /tokenize); its "
                "template is not compared with rollwise's")


def engine_kwargs(engine_cfg: EngineConfig, seed: int) -> dict[str, Any]:
    """`LLM(...)` keyword arguments: the sizing fields of the `engine` section, and the seed."""
    sizing = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "num_kv_blocks", "kv_cache_gb",
              "kv_cache_dtype", "enable_prefix_caching")
    return {**{k: getattr(engine_cfg, k) for k in sizing}, "seed": seed}


def _vocab_size(model_dir: Path) -> int | None:
    """The model's vocabulary size from its config.json (remote token ids must be below it)."""
    try:
        v = json.loads((Path(model_dir) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError):
        return None
    return v if isinstance(v, int) and v > 0 else None


def launch_vllm(cfg: RunConfig, model_dir: Path, run_dir: Path, log: Log) -> VLLMServers:
    """`engine.vllm.launch`: start the servers on `model_dir` and wait for them (`engine.vllm_launch`)."""
    from rollwise.clients.vllm.launch import VLLMLaunchSpec, VLLMServers, free_port

    V = cfg.engine.vllm
    dtype = cfg.model.dtype if V.dtype == "auto" else V.dtype
    log_dir = Path(V.log_dir) if V.log_dir else run_dir / "vllm"
    specs, port = [], V.port
    for i in range(V.num_servers):
        port = free_port(V.host, port)
        extra: tuple[str, ...] = ("--weight-transfer-config", '{"backend": "nccl"}') if V.weight_transfer == "nccl" else ()
        if V.lora_adapters:
            extra += ("--enable-lora", "--max-lora-rank", str(V.max_lora_rank), "--max-loras", "1")
        specs.append(VLLMLaunchSpec(python=V.python, model=str(model_dir), port=port, host=V.host, dtype=dtype,
                                    max_model_len=V.max_model_len or cfg.engine.max_model_len or 2048,
                                    kv_cache_gb=V.kv_cache_gb, cpu_threads=V.cpu_threads, args=(*extra, *V.args),
                                    log_path=str(log_dir / f"server-{i}.log"), seed=cfg.train.seed))
        port += 1
    if V.placement == "ray":
        from rollwise.clients.vllm.ray_placement import RayVLLMServers

        servers: Any = RayVLLMServers(specs, address=cfg.run.ray_address, gpus_per_server=V.gpus_per_server,
                                      timeout_s=V.startup_timeout_s + 60)
    else:
        servers = VLLMServers(specs)
    log(f"vllm: starting {len(specs)} server(s) with {V.python} ({V.placement}; logs in {log_dir})")
    took = servers.start(V.startup_timeout_s)
    log(f"vllm: {', '.join(servers.urls)} ready after {', '.join(f'{t:.0f}s' for t in took)}")
    return servers


def make_engine(cfg: RunConfig, model_dir: Path, device: str, tokenizer: Tokenizer | None, seed: int,
                launched: VLLMServers | None = None) -> Engine:
    """The engine `engine.backend` names, loaded with the model in `model_dir` (remote servers get it at the first
    weight sync); `launched`: the `VLLMServers` rollwise started, when it did."""
    E = cfg.engine
    if E.backend == "local":
        from rollwise.engine.llm import LLM

        return LLM(model_dir, device=device, dtype=cfg.model.dtype, tokenizer=tokenizer, **engine_kwargs(E, seed))
    if E.backend == "remote":
        from rollwise.clients.remote import MultiEngine, RemoteEngine
        from rollwise.clients.weight_sync import SyncChoice, make_server_sync

        key = os.environ.get(E.remote_api_key_env) or None
        urls = launched.urls if launched is not None else list(E.remote_urls)
        vocab = _vocab_size(model_dir)
        V = E.vllm
        choice = SyncChoice(E.remote_server, E.remote_weights_dir, lora_adapters=V.lora_adapters,
                            transfer=V.weight_transfer, nccl_address=V.nccl_address, nccl_port=V.nccl_port,
                            server_world_size=V.server_world_size)
        engines = [RemoteEngine(url, api_key=key, timeout_s=E.remote_timeout_s, backend=E.remote_server,
                                tokenizer=tokenizer, vocab_size=vocab, sync=make_server_sync(choice, server=i))
                   for i, url in enumerate(urls)]
        return engines[0] if len(engines) == 1 else MultiEngine(engines)
    from rollwise.cluster.ray_engines import RayEngines

    from rollwise.cluster.ray_resources import ENGINE_CPUS, ensure_ray, gpus_each, ray_demands

    # A cluster too small for the config is refused here, before any actor waits.
    ensure_ray(ray_demands(cfg, device), cfg.run.ray_address)
    return RayEngines(E.num_engines, str(model_dir), device=device, dtype=cfg.model.dtype,
                      engine_kwargs=engine_kwargs(E, seed), address=cfg.run.ray_address,
                      timeout_s=cfg.run.ray_timeout_s, threads=cfg.run.cpu_threads, tokenizer=tokenizer,
                      num_cpus_per_engine=ENGINE_CPUS, gpus_per_engine=gpus_each(cfg.run.ray_gpus_per_engine, device))


RANK_CALL_TIMEOUT_S = 3600.0
"""Longest one call to local trainer ranks may take (a dead rank is noticed at once: its process is polled)."""


def trainer_spec(cfg: RunConfig, model_dir: Path, device: str) -> TrainerSpec:
    """The one typed object every trainer variant is built from (`run.trainer_handle.TrainerSpec`)."""
    from rollwise.cluster.trainer_handle import TrainerSpec
    from rollwise.train.critic import CriticSpec
    from rollwise.train.distill import DistillOptions
    from rollwise.train.losses import LossConfig

    R, A = cfg.rollout, cfg.algo
    # PPO with GAE: the critic starts from algo.critic.model, or from the policy's initial model (after warm-up/SFT)
    critic = CriticSpec(A.critic.model or str(model_dir), A.critic, A.gae) if A.advantage == "gae" else None
    # The trainer's log-probs use the truncation the engine sampled under (top-k, then top-p), so the importance
    # ratio is exactly 1 at the behaviour policy.
    return TrainerSpec(model_path=str(model_dir), train=cfg.train, loss_name=A.loss,
                       loss_cfg=LossConfig.from_algo(A, max_length=R.max_tokens), device=device,
                       temperature=R.temperature, top_p=R.top_p, top_k=R.top_k, reference=A.kl_coef > 0,
                       total_steps=cfg.train.steps, tokenizer_path=cfg.model.tokenizer, threads=cfg.run.cpu_threads,
                       world_size=cfg.train.world_size, parallel=cfg.train.parallel, critic=critic,
                       distill=DistillOptions.from_config(A.distill), low_precision_rollouts=cfg.model.dtype != "float32")


def training_precision(cfg: RunConfig, device: str) -> str:
    """What `train.bf16` resolves to on this machine and why ('bf16-autocast (cpu avx512_bf16)'): the trainer
    resolves it the same way when it is built (`train.precision`)."""
    import torch

    from rollwise.train.precision import train_precision

    p = train_precision(cfg.train.bf16, torch.device(device), low_precision_rollouts=cfg.model.dtype != "float32")
    return f"{p.name} ({p.reason})"


def make_trainer(cfg: RunConfig, model_dir: Path, device: str) -> TrainerHandle:
    """The trainer handle: in-process (one rank), local rank processes (train.world_size > 1), or Ray actors
    (engine.backend 'ray', any world size)."""
    spec = trainer_spec(cfg, model_dir, device)
    if cfg.engine.backend == "ray":
        from rollwise.cluster.ray_resources import TRAINER_CPUS, gpus_each
        from rollwise.cluster.trainer_handle import RayTrainer

        return RayTrainer(spec, timeout_s=cfg.run.ray_timeout_s, cpus_per_rank=TRAINER_CPUS,
                          gpus_per_rank=gpus_each(cfg.run.ray_gpus_per_trainer_rank, device))
    if spec.world_size > 1:
        from rollwise.cluster.ranks import LocalRanks

        return LocalRanks(spec, timeout_s=RANK_CALL_TIMEOUT_S)
    return spec.build()


def _engine_name(cfg: RunConfig) -> str:
    """The engine as the checks' one-line errors name it: its servers, or its kind."""
    E = cfg.engine
    where = ", ".join(E.remote_urls) if E.backend == "remote" and E.remote_urls else f"the {E.backend} engine"
    if E.backend == "remote" and E.remote_server == "vllm" and E.vllm.launch:
        where = "the launched vLLM server(s)"
    return where


def make_sync_check(cfg: RunConfig, encode: Callable[[Task], list[int]], tasks: list[Task]) -> SyncCheck | None:
    """The weight-sync check (`run.sync_check`) drawing its probes from the run's own prompts, or None when it is
    off."""
    E = cfg.engine
    on = E.sync_check is True or (E.sync_check == "auto" and E.backend != "local")
    if not on:
        return None
    import random

    from rollwise.run.sync_check import PROBE_POOL, SyncCheck, probe_pool

    rng = random.Random(cfg.train.seed * 7_919 + 17)
    picked = rng.sample(tasks, min(len(tasks), 2 * PROBE_POOL))
    return SyncCheck(probe_pool([encode(t) for t in picked]), tol=E.sync_check_tol, engine_name=_engine_name(cfg),
                     seed=rng.randrange(1 << 62), first_group=cfg.rollout.prompts_per_step)


def make_rollout_check(cfg: RunConfig) -> RolloutCheck | None:
    """The check that every trained rollout made at the trainer's version carries the trainer's log-probs
    (`run.sync_check.RolloutCheck`), at the tolerance `engine.rollout_check_tol` gives, or None when it is off."""
    from rollwise.run.sync_check import rollout_check

    E = cfg.engine
    dtype = E.vllm.dtype if E.backend == "remote" and E.remote_server == "vllm" and E.vllm.dtype != "auto" \
        else cfg.model.dtype
    # NOTE: bf16 training counts whenever it may be on (true or auto): the looser tolerance never stops an honest run
    return rollout_check(E.rollout_check_tol, remote=E.backend != "local", engine_dtype=dtype,
                         trainer_bf16=cfg.train.bf16 is not False, engine_name=_engine_name(cfg))


def make_scorer(cfg: RunConfig, env: Environment) -> tuple[Scorer | None, Callable[[], None] | None]:
    """(scorer, handle to shut down): Ray scoring actors with the ray backend, else (None, None) = in-process."""
    if cfg.engine.backend != "ray":
        return None, None
    from rollwise.cluster.ray_scoring import RayScorer

    sc = RayScorer(env, cfg.run.num_scorers, timeout_s=cfg.run.ray_timeout_s)
    return sc, sc.shutdown


@dataclass(frozen=True)
class ModelSource:
    """Where the initial policy comes from: the `model` and `warmup` sections, and what the built-in model's
    warm-up is keyed on (the environment and its data)."""

    model: ModelConfig
    warmup: WarmupConfig
    env_name: str
    env_signature: str
    """`name:kwargs:train_size` of the environment the built-in model warms up on."""
    seed: int

    @classmethod
    def of(cls, cfg: RunConfig) -> ModelSource:
        kwargs = cfg.env.model_dump(mode="json")["kwargs"]  # an in-memory dataset as its placeholder (its hash)
        sig = f"{cfg.env.name}:{json.dumps(kwargs, sort_keys=True)}:{cfg.env.train_size}"
        return cls(cfg.model, cfg.warmup, cfg.env.name, sig, cfg.train.seed)


def prepare_model(src: ModelSource, env: Environment, train_tasks: list[Task], run_dir: Path,
                  log: Log) -> tuple[Path, dict[str, Any]]:
    """The initial policy checkpoint directory (the built-in model is built and warmed up into RUN_DIR)."""
    if src.model.path != "builtin:tiny":
        from rollwise.models.convert import resolve_model

        p = Path(resolve_model(src.model.path))  # a directory, a .gguf, 'smollm2-135m' or a hub id
        if not (p / "config.json").is_file():
            raise ValueError(f"model.path {src.model.path!r} is not an HF checkpoint directory (no config.json)")
        return p, {}
    from rollwise.run.warmup import prepare_builtin_model

    charset = getattr(env, "charset", None)
    if not charset:
        raise ValueError(f"the built-in model needs an environment with a `charset` (env {src.env_name!r} has none); "
                         "set model.path to an HF checkpoint instead")
    dest = run_dir / BUILTIN_DIR
    if (dest / "config.json").is_file() and (dest / "warmup.json").is_file() or (
            (dest / "config.json").is_file() and not src.warmup.enabled):
        return dest, {}
    info = prepare_builtin_model(dest, charset, train_tasks, src.model.builtin, src.warmup, src.env_signature,
                                 src.seed, log)
    return dest, info


def make_agent_episodes(env_cfg: EnvConfig, max_model_len: int | None, env: Environment,
                        tokenizer: Tokenizer | None, encode: Callable[[Task], list[int]]) -> EpisodeSource:
    """The user's agent function's episodes (`envs.user_agent`), over a loopback endpoint that lives as long as the
    run (its closer goes with the engine's)."""
    from rollwise.envs.agent_endpoint import AgentEndpoint
    from rollwise.envs.user_agent import AgentEpisodes, UserAgentEnv

    E = env_cfg
    if tokenizer is None:
        raise ValueError("env.agent: the agent's calls need the model's tokenizer (the model directory has none; set "
                         "model.tokenizer)")
    assert isinstance(env, UserAgentEnv)
    endpoint = AgentEndpoint(tokenizer, prompt_format(E))
    return AgentEpisodes(env, endpoint, encode, timeout_s=E.agent_timeout_s, max_calls=E.agent_max_calls,
                         max_total_tokens=E.max_episode_tokens or max_model_len or 1024, concurrency=E.agent_concurrency)


def make_episode_runner(env_cfg: EnvConfig, max_model_len: int | None, env: MultiTurnEnvironment,
                        tokenizer: Tokenizer | None, encode: Callable[[Task], list[int]]) -> EpisodeRunner:
    """Episodes of a multi-turn environment: replies as chat turns when the prompts use the chat template."""
    from rollwise.control.episodes import EpisodeRunner, chat_reply_formatter
    from rollwise.models.tool_calls import CALL_CLOSE
    from rollwise.models.turns import ChatTurns

    E = env_cfg
    if tokenizer is None:
        raise ValueError(f"env {E.name!r} is multi-turn: its episodes need the model's tokenizer (the model directory "
                         "has none; set model.tokenizer)")
    turns = ChatTurns(tokenizer, prompt_format(E, env))
    templated = turns.templated
    budget = E.max_episode_tokens or max_model_len or 1024
    # Tool classes: a turn ends at the template's end-of-turn token and the tool turns follow it; without a
    # template, at a call's closing tag.
    tool_class = E.environment is not None
    return EpisodeRunner(env, tokenizer, encode, chat_reply_formatter(tokenizer, templated), max_turns=E.max_turns,
                         max_total_tokens=budget, turn_timeout_s=E.turn_timeout_s,
                         turn_end_ids=frozenset(turns.turn_end_ids) if templated and tool_class else frozenset(),
                         stop=(CALL_CLOSE,) if tool_class and not templated else ())


@dataclass
class RunParts:
    """What `build_run` made; `close()` releases actors and servers' connections."""

    cfg: RunConfig
    run_dir: Path
    seed: int
    device: str
    env: Environment
    train_tasks: list[Task]
    eval_tasks: list[Task]
    ckpt: Checkpoint | None
    """The checkpoint to resume from, or None."""
    init_dir: Path
    warm_info: dict[str, Any]
    engine: Engine
    tokenizer: Tokenizer | None
    encode: Callable[[Task], list[int]]
    stop_token_ids: list[int]
    """Generation ends at these (the generation config's eos ids and the chat template's end-of-turn token)."""
    scorer: Scorer | None
    episodes: EpisodeSource | None
    """The runner of a multi-turn environment's episodes, else None."""
    trainer: TrainerHandle
    controller: RolloutController
    resume: ResumeSpec
    """What resuming, re-training and checkpointing need of the config (taken from it once)."""
    t_start: float
    engine_holds_policy: bool = True
    """The engine was loaded with the initial policy (local, Ray); False for servers, which may hold other weights
    until the first sync sends the trainer's."""
    closers: list[Callable[[], None]] = field(default_factory=list)
    sync_check: SyncCheck | None = None
    """`run.sync_check.SyncCheck` when engine.sync_check is on for this backend, else None."""
    rollout_check: RolloutCheck | None = None
    """`run.sync_check.RolloutCheck` unless engine.rollout_check_tol is 'off'."""
    base_dir: Path | None = None
    """The model before SFT (when `sft.path` is set): evaluated as `eval_base`."""
    sft_info: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        for c in reversed(self.closers):
            c()
        self.closers.clear()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def build_run(cfg: RunConfig, log: Log) -> RunParts:
    """Everything a run needs (`_build_run`), with RUN_DIR locked to this run until `RunParts.close()`."""
    from rollwise.run.rundir import lock_run_dir

    run_dir = Path(cfg.run.out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = lock_run_dir(run_dir)  # before anything in it is read, moved or deleted
    try:
        parts = _build_run(cfg, log)
    except BaseException:
        lock.release()
        raise
    parts.closers.insert(0, lock.release)  # closers run last-first: the folder is released after everything else
    return parts


@dataclass
class _Prepared:
    """What is ready before any engine or trainer exists: data, the resume point, the initial model."""

    run_dir: Path
    device: str
    env: Environment
    train_tasks: list[Task]
    eval_tasks: list[Task]
    ckpt: Checkpoint | None
    init_dir: Path
    warm_info: dict[str, Any]
    tokenizer: Tokenizer | None
    encode: Callable[[Task], list[int]]
    resume: ResumeSpec
    episodes: EpisodeSource | None = None
    base_dir: Path | None = None
    sft_info: dict[str, Any] = field(default_factory=dict)


def _build_run(cfg: RunConfig, log: Log) -> RunParts:
    """Threads and seeds, the run directory, data, resume point, model; then engine, scorer, trainer, controller."""
    t_start = time.perf_counter()
    prep = _prepare(cfg, log)
    closers: list[Callable[[], None]] = []
    try:
        return _start_workers(cfg, prep, log, closers, t_start)
    except BaseException:
        for c in reversed(closers):
            c()
        raise


def _prepare(cfg: RunConfig, log: Log) -> _Prepared:
    """Everything before the engine and trainer: RUN_DIR made safe, seeds, data, the resume point, config.yaml, the
    initial model and tokenizer, the episode runner, and the SFT stage when `sft.path` is set."""
    from rollwise.envs.base import is_multi_turn
    from rollwise.envs.user_agent import is_agent_env
    from rollwise.models.prompting import with_template_kwargs

    run_dir = _seeded_run_dir(cfg)
    device = resolve_device(cfg.model.device)
    env = make_env(cfg.env, builtin_dir=run_dir / BUILTIN_DIR if cfg.model.path == "builtin:tiny" else None)
    if cfg.sft.path:  # a missing or broken demonstration file fails now, before any model loads
        from rollwise.train.sft import load_demos

        load_demos(cfg.sft.path)
    multi_turn = is_multi_turn(env) or is_agent_env(env)
    _check_episode_shape(cfg, multi_turn)
    train_tasks = env.load("train", n=cfg.env.train_size, seed=cfg.train.seed)
    eval_tasks = env.load("test", n=cfg.run.eval_size or cfg.env.eval_size, seed=cfg.train.seed)
    if not train_tasks:
        raise ValueError(f"environment {cfg.env.name!r} returned no training tasks")
    ckpt = _resume_checkpoint(cfg, run_dir, log)
    yaml_sha = _write_config(cfg, run_dir)
    init_dir, warm_info = prepare_model(ModelSource.of(cfg), env, train_tasks, run_dir, log)
    tokenizer = with_template_kwargs(_load_tokenizer(cfg.model, init_dir), cfg.env.chat_template_kwargs)
    if multi_turn:  # before any prompt is rendered: a template swapped for its known fix is used throughout
        from rollwise.models.template_check import ensure_prefix_preserving

        fmt = prompt_format(cfg.env, env)
        ensure_prefix_preserving(tokenizer, fmt, tool_turns=bool(fmt.tools), log=log)
    encode = prompt_encoder(cfg.env, tokenizer, env)
    if cfg.algo.distill.teacher is not None:  # before any model loads: a teacher with another tokenizer is refused
        check_teacher(cfg, env, tokenizer, encode, train_tasks)
    prep = _Prepared(run_dir, device, env, train_tasks, eval_tasks, ckpt, init_dir, warm_info, tokenizer, encode,
                     ResumeSpec.of(cfg, run_dir, yaml_sha))
    if is_agent_env(env):
        prep.episodes = make_agent_episodes(cfg.env, cfg.engine.max_model_len, env, tokenizer, encode)
    elif is_multi_turn(env):
        prep.episodes = make_episode_runner(cfg.env, cfg.engine.max_model_len, env, tokenizer, encode)
    if cfg.sft.path:  # supervised fine-tuning on demonstrations first: RL starts from its model
        _sft_first(cfg, prep, log)
    return prep


TEACHER_PROMPTS_CHECKED = 4
"""Training prompts rendered through both the policy's and the teacher's chat template by `check_teacher`."""


def check_teacher(cfg: RunConfig, env: Environment, tokenizer: Tokenizer | None, encode: Callable[[Task], list[int]],
                  tasks: list[Task]) -> Path:
    """The distillation teacher's checkpoint directory, once it is known to share the policy's tokenizer
    (`train.distill.tokenizer_mismatch`: vocabulary, special tokens, the first training prompts as each one's chat
    template renders them). One line otherwise: the teacher scores the policy's token ids, and another tokenizer's
    ids would be other text."""
    from rollwise.engine.core import load_tokenizer
    from rollwise.models.convert import ModelResolveError, resolve_model
    from rollwise.models.prompting import with_template_kwargs
    from rollwise.train.distill import tokenizer_mismatch

    name = cfg.algo.distill.teacher
    try:
        teacher_dir = resolve_model(str(name))
    except ModelResolveError as e:
        raise ValueError(f"algo.distill.teacher: {e}") from None
    if not (teacher_dir / "config.json").is_file():
        raise ValueError(f"algo.distill.teacher {name!r} is not an HF checkpoint directory (no config.json in "
                         f"{teacher_dir})")
    teacher_tok = with_template_kwargs(load_tokenizer(teacher_dir), cfg.env.chat_template_kwargs)
    if tokenizer is None or teacher_tok is None:
        whose = "the policy" if tokenizer is None else f"the teacher ({teacher_dir})"
        raise ValueError(f"algo.distill.teacher {name!r}: {whose} has no tokenizer files, so the two cannot be checked "
                         "to share one (the teacher scores the policy's token ids)")
    teacher_encode = prompt_encoder(cfg.env, teacher_tok, env)
    why = tokenizer_mismatch(tokenizer, teacher_tok,
                             [(encode(t), teacher_encode(t)) for t in tasks[:TEACHER_PROMPTS_CHECKED]])
    if why is not None:
        raise ValueError(f"algo.distill.teacher {name!r} does not share the policy's tokenizer: {why}; on-policy "
                         "distillation needs a teacher of the same tokenizer")
    return teacher_dir


def _seeded_run_dir(cfg: RunConfig) -> Path:
    """Threads and seeds set; RUN_DIR checked (no path of it leads outside) and cleaned of what crashed writers
    left (temp checkpoint folders, temp shards)."""
    import numpy as np
    import torch

    from rollwise.run.rundir import check_run_dir, clean_run_dir

    if cfg.run.cpu_threads:
        torch.set_num_threads(cfg.run.cpu_threads)
    run_dir = Path(cfg.run.out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    check_run_dir(run_dir)  # before anything is written or deleted
    clean_run_dir(run_dir)
    random.seed(cfg.train.seed)
    np.random.seed(cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    return run_dir


def _check_episode_shape(cfg: RunConfig, multi_turn: bool) -> None:
    """Refuse what works on single-turn environments only (episodes are not aborted, carried or forked mid-turn)."""
    if not multi_turn:
        return
    mid_way = [p for p in cfg.control.policies if p in ("early_stop", "partial")]
    if mid_way:
        raise ValueError(f"control.policy '{mid_way[0]}' works on single-turn environments only; env "
                         f"{cfg.env.name!r} is multi-turn (its episodes are not aborted or carried mid-way)")
    if cfg.rollout.tree.branch != "off":
        raise ValueError(f"rollout.tree works on single-turn environments only; env {cfg.env.name!r} is multi-turn "
                         "(its episodes are not forked mid-turn)")


def _resume_checkpoint(cfg: RunConfig, run_dir: Path, log: Log) -> Checkpoint | None:
    """A fresh run sets an earlier run aside; a resume finds its newest complete checkpoint and checks the config
    against it and the stored shards it keeps. The checkpoint to restore, or None."""
    from rollwise.train.checkpoint import CheckpointError, find_latest_checkpoint, load_checkpoint

    if not cfg.run.resume:
        from rollwise.run.rundir import set_aside_previous_run

        aside = set_aside_previous_run(run_dir)  # a fresh run in a used directory overwrites nothing
        if aside is not None:
            log(f"{run_dir} held an earlier run: its checkpoints and rollouts were moved to {aside}")
        return None
    latest = find_latest_checkpoint(run_dir)
    if latest is None:
        log(f"resume: no complete checkpoint in {run_dir}; starting from scratch")
        return None
    try:
        ckpt = load_checkpoint(latest)
    except CheckpointError as e:
        raise CheckpointError(f"{e}; to resume from the checkpoint before it, move {latest} out of the way "
                              "(the stored rollouts re-train the steps since)") from None
    if ckpt is None:  # found complete a moment ago: it went away since
        raise CheckpointError(f"{latest} is no longer a complete checkpoint")
    from rollwise.run.resume import check_resume_config
    from rollwise.store.writer import RolloutStore

    check_resume_config(ResumeSpec.of(cfg, run_dir), ckpt, log)  # the config it was trained under, key by key
    # Before any model is loaded: a corrupt or truncated shard of the steps being kept stops the resume
    # with one line naming it, instead of surfacing after more training and checkpoints.
    RolloutStore(run_dir).verify(steps=range(1, ckpt.step + 1))
    return ckpt


def _write_config(cfg: RunConfig, run_dir: Path) -> str:
    """RUN_DIR/config.yaml, the resolved config (without how this invocation started); its sha256."""
    import hashlib

    resolved = cfg.model_copy(deep=True)
    resolved.run.resume = False  # how this invocation started is not part of the run's config
    text = dump_config(resolved).encode()
    _write_atomic(run_dir / "config.yaml", text)
    return hashlib.sha256(text).hexdigest()


def _load_tokenizer(model_cfg: ModelConfig, init_dir: Path) -> Tokenizer | None:
    """`model.tokenizer` when set, else the tokenizer beside the initial weights."""
    from rollwise.engine.core import load_tokenizer

    tok_dir = Path(model_cfg.tokenizer) if model_cfg.tokenizer else init_dir
    tokenizer = load_tokenizer(tok_dir)
    if tokenizer is None and model_cfg.tokenizer:
        raise ValueError(f"model.tokenizer {str(tok_dir)!r} holds no tokenizer files")
    return tokenizer


def _sft_first(cfg: RunConfig, prep: _Prepared, log: Log) -> None:
    """The SFT stage (`run/sft.py`) on `prep`'s initial model; RL then starts from the model it ends with."""
    from rollwise.run.sft import SftStage, run_sft, set_aside

    if not cfg.run.resume and (aside := set_aside(prep.run_dir)) is not None:
        log(f"{prep.run_dir} held an earlier run's SFT stage: moved to {aside}")
    prep.base_dir = prep.init_dir
    final, prep.sft_info = run_sft(SftStage.of(cfg), prep.init_dir, prep.tokenizer,
                                   prompt_format(cfg.env, prep.env), prep.run_dir, prep.device, log)
    if final is None:  # only a stage stopped on purpose (`stop_after`) ends without a model
        raise RuntimeError("the SFT stage ended without a final model")
    prep.init_dir = final


def _start_workers(cfg: RunConfig, prep: _Prepared, log: Log, closers: list[Callable[[], None]],
                   t_start: float) -> RunParts:
    """The engine (vLLM servers started first when asked), the scorer, the trainer handle, the sync check and the
    controller; each one's release goes to `closers` as soon as it exists."""
    from rollwise.control import make_controller
    from rollwise.control.drafts import DraftStore
    from rollwise.filter import FilterRules
    from rollwise.models.prompting import stop_token_ids
    from rollwise.run.prompt_fit import check_prompts_fit, engine_context
    from rollwise.train.overlong import overlong_options

    E, seed = cfg.engine, cfg.train.seed
    if callable(getattr(prep.episodes, "close", None)):  # an agent's endpoint
        closers.append(prep.episodes.close)  # type: ignore[union-attr]
    launched = None
    if E.backend == "remote" and E.remote_server == "vllm" and E.vllm.launch:
        launched = launch_vllm(cfg, prep.init_dir, prep.run_dir, log)
        closers.append(launched.stop)
    engine = make_engine(cfg, prep.init_dir, prep.device, prep.tokenizer, seed, launched)
    describe = getattr(engine, "describe", None)
    if callable(describe):  # the in-process engine: which kernels run here
        log(f"engine: {describe()}")
    for name in ("shutdown", "close"):
        if callable(getattr(engine, name, None)):
            closers.append(getattr(engine, name))
            break
    if E.backend == "remote":
        check_served_template(cfg.env, prep.env, engine, prep.tokenizer, log, vllm=E.remote_server == "vllm")
    # A prompt the model's context cannot hold fails here naming its row, not at the first request.
    check_prompts_fit(prep.train_tasks + prep.eval_tasks, prep.encode, engine_context(engine) or E.max_model_len)
    fit = getattr(prep.episodes, "fit_context", None)
    if callable(fit) and (engine_context(engine) or E.max_model_len):  # an agent's calls: within the engine's context
        fit(engine_context(engine) or E.max_model_len)
    scorer, stop_scorer = make_scorer(cfg, prep.env)
    if stop_scorer is not None:
        closers.append(stop_scorer)
    trainer = make_trainer(cfg, prep.init_dir, prep.device)
    closers.append(trainer.shutdown)
    log(f"training forward: {training_precision(cfg, prep.device)}")
    bind = getattr(engine, "bind_trainer", None)
    if callable(bind):  # LoRA adapter syncs read the trainer directly
        bind(trainer)
    rules = FilterRules.from_config(cfg.algo, overlong_filter=overlong_options(cfg.algo).filter,
                                    max_tokens=cfg.rollout.max_tokens)  # the Filter room's, for control and loop
    controller = make_controller(cfg.control, prep.env, prep.tokenizer, seed=seed, encode=prep.encode, scorer=scorer,
                                 episodes=prep.episodes, drafts=DraftStore.from_config(cfg.rollout.speculative),
                                 rules=rules)
    return RunParts(cfg, prep.run_dir, seed, prep.device, prep.env, prep.train_tasks, prep.eval_tasks, prep.ckpt,
                    prep.init_dir, prep.warm_info, engine, prep.tokenizer, prep.encode,
                    stop_token_ids(prep.tokenizer, prep.init_dir), scorer, prep.episodes, trainer, controller,
                    prep.resume, t_start, engine_holds_policy=E.backend != "remote", closers=closers,
                    sync_check=make_sync_check(cfg, prep.encode, prep.train_tasks),
                    rollout_check=make_rollout_check(cfg), base_dir=prep.base_dir,
                    sft_info=prep.sft_info)
