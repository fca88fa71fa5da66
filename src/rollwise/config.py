"""The run config: YAML in, typed and validated sections out, before any work starts.

One small pydantic model per component (`model`, `engine`, `env`, `rollout`, `algo`, `train`, `run`,
`warmup`), each field with a docstring; components are handed their own section, never the whole `RunConfig`.
Every model forbids unknown keys, so a typo fails at load time instead of being silently ignored an hour into a
run. Errors are one line and name the full dotted key plus the closest valid one:

    unknown config key 'train.lr_rate' (did you mean 'train.lr'?)
    bad value for config key 'rollout.temperature': Input should be greater than or equal to 0 (got -1)

`load_config(None, overrides)` starts from the embedded default (`rollwise/configs/default.yaml`, the built-in
tiny-model recipe); `load_config(path, overrides)` reads the user's YAML alone, with field defaults filling what
it leaves out. Overrides are `a.b=c` strings whose value is parsed as a YAML scalar (`1e-4`, `true`, `null`,
`[1, 2]`).

Deliberately no torch import here: the CLI parses and validates the config before any heavy import, and
registered names (advantages, losses) are spelled as Literals, kept in sync with the registries by a test.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
import difflib
import hashlib
import json
import math
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_serializer, field_validator,
                      model_validator)

from rollwise.config_rewards import MODEL_KINDS, ModelRewardConfig, Section, check_reward_item, judges_in
from rollwise.config_yaml import ConfigYAMLError, load_yaml
from rollwise.in_memory import InMemory, as_dataset, placeholders_in, plain, to_placeholders, wrap_object
from rollwise.trl_names import config_keys_for

__all__ = [
    "ConfigError",
    "ModelConfig",
    "BuiltinModelConfig",
    "EngineConfig",
    "EnvConfig",
    "RolloutConfig",
    "AlgoConfig",
    "GaeConfig",
    "CriticConfig",
    "LoraConfig",
    "TrainConfig",
    "RunOptions",
    "WarmupConfig",
    "ControlConfig",
    "RunConfig",
    "RESUME_MAY_DIFFER",
    "cross_section_problems",
    "inert_keys",
    "resume_conflicts",
    "load_config",
    "build_config",
    "dump_config",
    "config_hash",
    "default_config_path",
    "valid_keys",
    "field_of",
]


IN_MEMORY_CONTEXT = "in_memory"
"""Validation context key (`RunConfig.model_validate(data, context={IN_MEMORY_CONTEXT: True})`): the data comes
from the Python API (`build_config`), so rows may stand inline where the `dataset` environment takes a path."""


class ConfigError(ValueError):
    """A bad config file, key or value. The message is one line and names the dotted key."""


_Section = Section  # unknown keys refused, inf/nan refused for every float field (`rollwise.config_rewards.Section`)


class BuiltinModelConfig(_Section):
    """Shape of the built-in tiny Llama-style model (used when `model.path` is 'builtin:tiny')."""

    hidden_size: int = Field(128, ge=8)
    """Width of the residual stream."""
    num_layers: int = Field(3, ge=1)
    """Decoder layers."""
    num_heads: int = Field(4, ge=1)
    """Attention heads; must divide hidden_size."""
    num_kv_heads: int = Field(4, ge=1)
    """Key/value heads (grouped-query attention when < num_heads); must divide num_heads."""
    intermediate_size: int = Field(512, ge=1)
    """Width of the MLP."""
    max_position_embeddings: int = Field(256, ge=16)
    """Longest prompt + completion the model supports."""

    @model_validator(mode="after")
    def _heads_divide(self) -> BuiltinModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})")
        return self


class ModelConfig(_Section):
    """The policy model."""

    path: str = "builtin:tiny"
    """An HF causal-LM checkpoint directory, or 'builtin:tiny' for the built-in model trained from scratch."""
    dtype: Literal["float32", "bfloat16", "float16", "int8"] = "float32"
    """Engine weights dtype. The trainer keeps float32 master weights and uses bf16 autocast where it pays (train.bf16).
    On the CPU, 'bfloat16' and 'int8' (weight-only, per-channel scales) change only the engine's linear layers
    (activations, KV cache and sampling stay float32; engine/cpu_linear.py); 'int8' is CPU-only. The behaviour
    log-probs are the low-precision sampler's; when this is not float32 the loss corrects the engine/trainer gap
    with truncated importance sampling (algo.tis_cap 2.0) unless algo.tis_cap, algo.correction or algo.decoupled
    is set."""
    device: str = "auto"
    """'auto' (CUDA when available, else CPU), 'cpu', 'cuda' or 'cuda:N'."""
    tokenizer: str | None = None
    """Tokenizer directory when it is not next to the weights."""
    builtin: BuiltinModelConfig = Field(default_factory=BuiltinModelConfig)
    """Shape of the built-in model; ignored for a checkpoint path."""

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v in ("auto", "cpu", "cuda") or (v.startswith("cuda:") and v[5:].isdigit()):
            return v
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {v!r}")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if v.startswith("builtin:") and v != "builtin:tiny":
            raise ValueError(f"unknown built-in model {v!r}; the built-in model is 'builtin:tiny'")
        return v


class VLLMConfig(_Section):
    """vLLM servers rollwise starts and stops itself (`engine.backend: remote`, `engine.remote_server: vllm`).

    With `launch: true` there is no second terminal: rollwise starts `num_servers` OpenAI-compatible vLLM servers
    on the run's model (subprocesses of `python`, the interpreter of vLLM's own venv), with the RL settings it
    needs (processed log-probs, dev-mode RPC, rollwise's worker extension for weight loads), waits for their
    health, points `engine.remote_urls` at them, and stops them at exit, crash included."""

    launch: bool = False
    """Start the servers (else `engine.remote_urls` names servers someone else started)."""
    python: str = "python"
    """The Python interpreter of the venv vLLM is installed in (e.g. .venv-vllm/bin/python)."""
    num_servers: int = Field(1, ge=1)
    """Servers to start; the prompts of a step are split across them."""
    port: int = Field(8100, ge=1, le=65535)
    """First port; server i listens on port + i."""
    host: str = "127.0.0.1"
    """Address the servers listen on (and rollwise reaches them at)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The servers' dtype; 'auto' = model.dtype."""
    max_model_len: int | None = Field(None, ge=16)
    """vLLM's --max-model-len; None = engine.max_model_len, else 2048."""
    kv_cache_gb: float = Field(2.0, gt=0)
    """CPU servers: VLLM_CPU_KVCACHE_SPACE (GiB) per server."""
    cpu_threads: str | None = None
    """CPU servers: VLLM_CPU_OMP_THREADS_BIND per server, e.g. '0-1' (None: vLLM's default)."""
    startup_timeout_s: float = Field(600.0, gt=0)
    """How long to wait for a server's /health before the run fails (CPU start-up compiles for 1-2 minutes)."""
    args: list[str] = Field(default_factory=list)
    """Extra command-line arguments for every server (e.g. ['--enforce-eager'])."""
    log_dir: str | None = None
    """Where each server's output goes (default RUN_DIR/vllm/)."""
    placement: Literal["local", "ray"] = "local"
    """Where launched servers run: 'local' (subprocesses of this run) or 'ray' (one Ray actor per server, on any
    node of the cluster at run.ray_address with gpus_per_server GPUs; refused at start when the cluster is short)."""
    gpus_per_server: float = Field(0, ge=0)
    """placement 'ray': GPUs each server's actor asks Ray for (0 on CPU servers)."""
    lora_adapters: bool = False
    """LoRA runs (train.lora.enabled): send the adapter each sync (/v1/load_lora_adapter, in place) instead of the
    merged weights; the servers need LoRA on (--enable-lora, VLLM_ALLOW_RUNTIME_LORA_UPDATING=1: launch sets both)."""
    max_lora_rank: int = Field(16, ge=1)
    """lora_adapters with launch: vLLM's --max-lora-rank (at least train.lora.r)."""
    weight_transfer: Literal["disk", "nccl"] = "disk"
    """How weights reach the servers: 'disk' (safetensors in engine.remote_weights_dir, then vLLM's reload; one
    machine or a shared filesystem; tested live) or 'nccl' (GPU trainer and servers: vLLM's NCCL weight transfer,
    `engine.vllm_nccl`; needs vLLM in the trainer's interpreter; not run live here)."""
    nccl_address: str = "127.0.0.1"
    """weight_transfer 'nccl': the trainer's address as the servers reach it (NCCL rendezvous)."""
    nccl_port: int = Field(29600, ge=1, le=65535)
    """weight_transfer 'nccl': rendezvous port for server 0 (server i uses nccl_port + i)."""
    server_world_size: int = Field(1, ge=1)
    """weight_transfer 'nccl': GPU workers per server (its tensor x pipeline parallel size)."""


class EngineConfig(_Section):
    """The generation engine: where it runs (`backend`) and how the in-process engine is sized.

    This is the one definition of the engine's knobs: `rollwise.engine.core.EngineCore` and `rollwise.LLM` take
    this class (sizing fields), so a user's YAML and a direct `LLM(...)` get the same defaults.
    """

    backend: Literal["local", "remote", "ray"] = "local"
    """'local': an in-process engine; 'remote': OpenAI-compatible servers at `remote_urls` (rollwise serve, vLLM,
    SGLang); 'ray': `num_engines` engine actors (and scoring actors, and the trainer in an actor) on Ray."""
    remote_urls: list[str] = Field(default_factory=list)
    """backend 'remote': server base URLs, e.g. ['http://127.0.0.1:8000']; the prompts of a step are split across
    them. Weights reach them through their reload routes after every update."""
    remote_server: Literal["rollwise", "vllm", "sglang"] = "rollwise"
    """backend 'remote': which server speaks at `remote_urls` (decides the weight-reload route)."""
    remote_api_key_env: str = "ROLLWISE_ADMIN_KEY"
    """backend 'remote': name of the environment variable holding the servers' admin key (sent as a Bearer token
    with the weight-sync requests only, never with completions; the key itself never goes into config.yaml)."""
    remote_timeout_s: float = Field(600.0, gt=0)
    """backend 'remote': the longest one generation or weight-reload request may take, in total."""
    remote_weights_dir: str | None = None
    """backend 'remote' with vllm/sglang: where weight syncs write safetensors for the servers to read (a shared
    filesystem when they run elsewhere); None = a temporary directory on this machine."""
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    """backend 'remote', remote_server 'vllm': servers rollwise launches itself (`engine.vllm.launch`)."""
    sync_check: Literal["auto"] | bool = "auto"
    """After every weight sync (and at start), compare the engine's log-probs of a probe with the trainer's and
    stop the run on a gap over `sync_check_tol` (run.sync_check). 'auto' = true for remote and Ray engines, false for
    the in-process engine (its load is a tensor copy; the per-step log-prob gap metric covers it)."""
    sync_check_tol: float = Field(1e-3, gt=0)
    """The largest |engine - trainer| log-prob gap the sync check accepts (float32; bfloat16 rollouts need ~5e-2)."""
    rollout_check_tol: float | Literal["auto", "off"] = "auto"
    """The largest mean |trainer - engine| log-prob (nats per token) over one trained rollout's tokens generated at
    the trainer's own weight version (asynchronous, partial and replayed tokens are older and not checked) before
    the run stops with one line (run.sync_check.RolloutCheck): the rollouts themselves prove that the engine samples
    from the policy, whatever it answers to the probe. 'auto' = on for remote and Ray engines (as sync_check), at
    0.05 when the engine (model.dtype, or engine.vllm.dtype) and the trainer (train.bf16 false) both compute in
    float32 and 1.0 when either is in bfloat16, float16 or int8 (honest rollouts measured ~1e-5 in float32, up to
    0.16 in bfloat16; made-up ones are nats away); a number = that tolerance, on every backend; 'off' = never stop
    on it (the gap is still logged as logprob_mismatch_seq_max)."""
    num_engines: int = Field(2, ge=1)
    """backend 'ray': engine actors (the prompts of a step are split across them)."""
    max_num_seqs: int = Field(256, ge=1)
    """Most sequences decoded together in one forward pass."""
    max_num_batched_tokens: int = Field(8192, ge=16)
    """Token budget of one prefill step."""
    max_model_len: int | None = Field(None, ge=1)
    """Longest prompt + output; None = the model's limit (at most 4096)."""
    block_size: int = Field(16, ge=1)
    """Tokens per KV-cache block (the unit of prefix sharing)."""
    num_kv_blocks: int | None = Field(None, ge=1)
    """KV-cache blocks; None = enough for max_num_seqs full-length sequences, capped by kv_cache_gb."""
    kv_cache_gb: float = Field(4.0, gt=0)
    """Memory cap for the KV cache when num_kv_blocks is None."""
    kv_cache_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The in-process engine's KV-cache dtype (vLLM's `--kv-cache-dtype`). 'auto' = bfloat16 when model.dtype is
    bfloat16 or int8 on the CPU (K/V rounded once on the way in; a decode step reads half the cache bytes), else the
    model's dtype (float32 stays exact); 'float32' / 'bfloat16' as given."""
    enable_prefix_caching: bool = True
    """Share KV blocks between samples of one prompt (and repeated prefixes)."""
    logprobs_mode: Literal["processed", "raw"] = "processed"
    """Which log-probs the engine records: 'processed' = of the distribution sampled from (logits / T, top-k, top-p,
    renormalised: the behaviour policy RL needs); 'raw' = log_softmax(logits) (vLLM's `--logprobs-mode`; refused
    in RL runs, whose importance ratios need the processed ones)."""

    @field_validator("rollout_check_tol")
    @classmethod
    def _rollout_check_tol(cls, v: float | str) -> float | str:
        if isinstance(v, str) or (v > 0 and math.isfinite(v)):
            return v
        raise ValueError(f"rollout_check_tol must be a positive number, 'auto' or 'off', got {v!r}")


# apply_chat_template's own parameters: rollwise sets them per call, so a run-wide template variable may not.
_TEMPLATE_OWN_ARGS = frozenset({"conversation", "tools", "documents", "chat_template", "add_generation_prompt",
                                "continue_final_message", "tokenize", "padding", "truncation", "max_length",
                                "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})


def check_template_kwargs(kwargs: Any, where: str = "env.chat_template_kwargs") -> dict[str, Any]:
    """The dict itself when its keys are template variables (not apply_chat_template's own parameters)."""
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        raise ValueError(f"{where} must be a mapping of template variable names to values, got {str(kwargs)[:80]}")
    own = sorted(set(kwargs) & _TEMPLATE_OWN_ARGS)
    if own:
        raise ValueError(f"{where}: {', '.join(own)} is a parameter of apply_chat_template that rollwise sets itself, "
                         "not a template variable")
    return dict(kwargs)


class EnvConfig(_Section):
    """The task environment."""

    name: str = "arithmetic"
    """Registered environment name (see `rollwise.envs`)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the environment's constructor (free-form, validated by the environment). Through the
    Python API (`rollwise.train`) `path` / `test_path` of the `dataset` environment may be rows (a list of dicts, a
    `datasets.Dataset`) and any other value a Python object (`rollwise.in_memory`)."""
    train_size: int | None = Field(None, ge=1)
    """Training problems to load; None = all the environment offers."""
    eval_size: int = Field(200, ge=1)
    """Held-out problems to load for evaluation."""
    module: str | None = None
    """A user module (import name or path to a .py file) imported first, so it can register its own env."""
    reward: ModelRewardConfig | str | InMemory | None = Field(None, union_mode="left_to_right")
    """A user reward replacing the environment's own: "path/to/file.py:fn" or "module:fn" (through the Python API,
    the function itself). TRL's convention (fn(prompts=, completions=, completion_ids=, **columns) ->
    list[float | None], one call per batch, sync or async) or rollwise's per-sample fn(task, completion) ->
    Score | float; see `rollwise.rewards.user`. Or a reward computed by a model: {judge: {...}} (an LLM judge) or
    {reward_model: {...}} (a sequence-classification reward model), `rollwise.config_rewards`."""
    rewards: list[dict[str, Any]] | None = None
    """A weighted sum of rewards instead of `reward`: [{fn: "file.py:fn", weight: 1.0, name: optional}, ...], where an
    item may name a model instead of fn ({judge: {...}, weight: ...} or {reward_model: {...}, weight: ...}); each
    part's value is kept in the rollout's reward_parts."""
    pass_threshold: float = 1.0
    """A sample counts as correct (accuracy, pass rate) when its reward is >= this and scoring did not error."""
    chat_template: Literal["auto"] | bool = "auto"
    """Prompts through the tokenizer's chat template: 'auto' (when the tokenizer has one), true, or false (raw text
    with the tokenizer's default special tokens). See `rollwise.models.prompting`."""
    system_prompt: str | None = None
    """System message put before each task's prompt (needs the chat template)."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra variables for every rendering of the chat template (TRL's `chat_template_kwargs`), e.g.
    `{enable_thinking: false}` for Qwen3: prompts, tool and environment turns, demonstrations and template checks."""
    max_turns: int = Field(4, ge=1)
    """Multi-turn environments: most policy turns per episode (then the episode ends 'truncated')."""
    max_episode_tokens: int | None = Field(None, ge=2)
    """Multi-turn environments: most tokens per episode, prompt and environment replies included; None = the
    engine's max_model_len, or 1024 when that is not set."""
    turn_timeout_s: float = Field(30.0, gt=0)
    """Multi-turn environments: the longest one `env.step` may take; past it the episode ends errored."""
    environment: str | InMemory | dict[str, str | InMemory] | None = None
    """A class each episode instantiates, over the tasks of `env.name`: "path/to/file.py:Class" or "module:Class"
    (`rollwise.envs.agent`), or a dict of them by name, each row naming its class in an `environment` column. With
    environment_api 'tools', `reset(**row)`, every public method a tool, and an optional `get_reward()` that scores
    the episode (then env.reward is optional); rewards get `environments=`."""
    environment_api: Literal["tools", "gym"] = "tools"
    """How `env.environment` is used: 'tools' (TRL's environment_factory shape: public methods are tools) or 'gym'
    (`reset()` / `step(action) -> (observation, reward, done, info)`)."""
    tool_timeout_s: float = Field(10.0, gt=0)
    """Tool classes: the longest one tool call (or `get_reward`) may run; past it the call is stopped and the episode
    is errored with the reason."""
    tool_isolation: Literal["process", "thread"] = "process"
    """Tool and gym-style classes: where calls run. 'process': each episode's instance in a forked process of its
    own, killed at env.tool_timeout_s (a gym step: at the turn's time) even when a C call holds the GIL; its
    attributes come back for the rewards (class attributes and globals a tool changes do not). 'thread': in this process, where a call past its time cannot be stopped.
    'process' falls back to 'thread', with a warning, for a class whose instances' attributes cannot be pickled."""
    max_tool_calls: int = Field(4, ge=1)
    """Tool classes: most tool calls run per policy turn (more get an error result)."""
    agent: str | InMemory | None = None
    """The user's agent function run per episode over the tasks of `env.name`: "path/to/file.py:fn" or "module:fn"
    (through the Python API, the function itself). `fn(client, row)` gets an `openai.OpenAI` client on the current
    policy and the dataset row, and returns the completion (str), the reward (a number), a dict, or None
    (`rollwise.envs.user_agent`, docs/agents.md)."""
    agent_timeout_s: float = Field(120.0, gt=0)
    """Agent functions: the longest one episode may run; past it the episode is errored (scored as a wrong answer)."""
    agent_max_calls: int = Field(8, ge=1)
    """Agent functions: most model calls per episode; the call after the cap is refused and the episode errored."""
    agent_concurrency: int = Field(64, ge=1)
    """Agent functions: episodes run at once (each in a thread; their calls are batched into the engine)."""

    @field_validator("reward", "environment", "agent", mode="before")
    @classmethod
    def _object(cls, v: Any, info: ValidationInfo) -> Any:
        """A Python object given through `rollwise.train`, wrapped as `InMemory` (its placeholder in dumps)."""
        if v is None or isinstance(v, (str, InMemory, ModelRewardConfig)):
            return v
        if info.field_name == "reward" and isinstance(v, Mapping):  # a reward computed by a model
            return dict(v)
        if info.field_name == "environment" and isinstance(v, dict):  # several classes by name (TRL's dict)
            return {str(k): cls._object(x, info) for k, x in v.items()}
        what = {"reward": "reward function", "agent": "agent function"}.get(info.field_name or "", "environment class")
        if not callable(v):
            raise ValueError(f"must be \"file.py:attr\", \"module:attr\" or (through rollwise.train) a {what}; "
                             f"got a value of type {type(v).__name__}, which is not callable")
        return wrap_object(v, f"env.{info.field_name}")

    @model_validator(mode="before")
    @classmethod
    def _objects(cls, data: Any, info: ValidationInfo) -> Any:
        """Python objects in env.rewards and env.kwargs (given through `rollwise.train`) wrapped as `InMemory`, shown
        as placeholders in dumps; YAML never holds one (`load_config` refuses a placeholder read back, and rows
        written inline as the dataset's path: those come only through the API, `build_config`)."""
        if not isinstance(data, dict):
            return data
        api = bool(info.context and info.context.get(IN_MEMORY_CONTEXT))
        data = dict(data)
        rewards = data.get("rewards")
        if isinstance(rewards, (list, tuple)):
            items = []
            for i, item in enumerate(rewards):
                fn = item.get("fn") if isinstance(item, dict) else None
                if isinstance(item, dict) and fn is not None and not isinstance(fn, (str, InMemory)):
                    if not callable(fn):
                        raise ValueError(f"env.rewards[{i}].fn must be \"file.py:fn\", \"module:fn\" or (through "
                                         f"rollwise.train) a function; got a value of type {type(fn).__name__}, "
                                         "which is not callable")
                    item = {**item, "fn": wrap_object(fn, f"env.rewards[{i}].fn")}
                items.append(item)
            data["rewards"] = items
        kwargs = data.get("kwargs")
        if isinstance(kwargs, dict):
            out = {}
            for k, v in kwargs.items():
                if isinstance(v, os.PathLike):  # a Path from Python: the file's name, as YAML would give it
                    v = os.fspath(v)
                if data.get("name") == "dataset" and k in ("path", "test_path") and v is not None and \
                        not isinstance(v, str):
                    if plain(v) and not api:
                        raise ValueError(f"env.kwargs.{k} must be a file path, got a {type(v).__name__}: rows in memory "
                                         "are passed through the Python API, rollwise.train(train_dataset=rows)")
                    v = as_dataset(v, f"env.kwargs.{k}")
                elif not plain(v) and not isinstance(v, InMemory):
                    v = wrap_object(v, f"env.kwargs.{k}")
                out[k] = v
            data["kwargs"] = out
        return data

    @field_serializer("kwargs", "rewards", when_used="json")
    def _placeholders(self, value: Any) -> Any:
        return to_placeholders(value)

    @model_validator(mode="after")
    def _rewards(self) -> "EnvConfig":
        if self.reward is not None and self.rewards:
            raise ValueError("set env.reward or env.rewards, not both")
        for i, item in enumerate(self.rewards or []):
            if any(k in item for k in MODEL_KINDS):
                self.rewards[i] = item = check_reward_item(item, i)  # type: ignore[index]  # a judge, a reward model
            elif "fn" not in item or not isinstance(item["fn"], (str, InMemory)):
                raise ValueError(f"env.rewards[{i}] needs 'fn': \"file.py:fn\" or \"module:fn\" (or a model: judge, "
                                 "reward_model)")
            else:
                extra = set(item) - {"fn", "weight", "name"}
                if extra:
                    raise ValueError(f"env.rewards[{i}]: unknown keys {sorted(extra)} (allowed: fn, weight, name)")
            w = item.get("weight", 1.0)
            if isinstance(w, bool) or not isinstance(w, (int, float)):
                raise ValueError(f"env.rewards[{i}].weight must be a number, got {w!r}")
        if self.chat_template is False and self.system_prompt:
            raise ValueError("env.system_prompt needs the chat template, but env.chat_template is false")
        if self.chat_template_kwargs:
            check_template_kwargs(self.chat_template_kwargs)
            if self.chat_template is False:
                raise ValueError("env.chat_template_kwargs needs the chat template, but env.chat_template is false")
        return self


class SpeculativeConfig(_Section):
    """Speculative rollouts (engine/speculative.py): verify drafts in the engine's forward passes; the sampling
    distribution (and, for a given seed, the output) is unchanged. Local engine only."""

    source: Literal["off", "past", "ngram", "both"] = "off"
    """Where drafts come from: 'past' = the prompt's most recent rollouts (control/drafts.py), 'ngram' = the prompt
    and the group's other samples, 'both', or 'off'."""
    k: int = Field(8, ge=1, le=64)
    """Most draft tokens verified per sample per engine step (the engine shortens drafts when acceptance is low or
    the batch is full)."""
    per_prompt: int = Field(8, ge=1)
    """source past / both: how many of a prompt's most recent completions are kept as its drafts."""


class TreeConfig(_Section):
    """Tree rollouts (engine/tree.py, docs/tree.md): each group's samples grow as a tree that branches where the
    policy is unsure, so shared beginnings are generated (and trained on) once. Local engine only. The group size
    is still rollout.samples_per_prompt (the tree's leaves)."""

    branch: Literal["off", "entropy", "fixed"] = "off"
    """'entropy': branch at the first position of each window whose next-token entropy reaches entropy_threshold
    (else at the window's end); 'fixed': at every window's end; 'off': independent samples."""
    fanout: int = Field(2, ge=2)
    """Children per branch point, the parent's own continuation included."""
    segment_tokens: int = Field(8, ge=1)
    """Window length: a sample branches at most once per this many tokens (and at the latest at its end)."""
    entropy_threshold: float = Field(1.0, ge=0)
    """branch 'entropy': nats of next-token entropy (temperature-scaled) that make a position a branch point."""
    roots: int = Field(1, ge=1)
    """Samples that start from the prompt (the rest branch from them)."""
    first_segment_tokens: int | None = Field(None, ge=1)
    """A root's first window (default: segment_tokens). Longer: with 'fixed' the leaves branch only after their
    opening, which on a small model goes with the reward (docs/tree.md)."""

    def spec(self) -> Any:
        """The engine's `TreeSpec`, or None when off."""
        if self.branch == "off":
            return None
        from rollwise.types import TreeSpec

        return TreeSpec(self.branch, self.fanout, self.segment_tokens, self.entropy_threshold, self.roots,
                        self.first_segment_tokens)


class RolloutConfig(_Section):
    """What to sample each RL step."""

    prompts_per_step: int = Field(16, ge=1)
    """Prompts (groups) per RL step."""
    samples_per_prompt: int = Field(8, ge=1)
    """Samples per prompt (the group size for GRPO-style advantages)."""
    max_tokens: int = Field(256, ge=1)
    """Most generated tokens per sample (also Dr. GRPO's constant normaliser unless algo.max_length is set)."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature; the trainer divides its logits by the same value. 0 = greedy (not for RL)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold; 1 = off."""
    top_k: int = Field(-1, ge=-1)
    """Top-k sampling; -1 = off."""
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)
    """Speculative rollouts: drafts from past rollouts and/or n-grams, verified exactly by the local engine."""
    tree: TreeConfig = Field(default_factory=TreeConfig)
    """Tree rollouts: a group's samples share their beginnings and branch where the policy is unsure."""


AdvantageName = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "tree", "gae"]
LossName = Literal["ppo", "grpo", "dr_grpo", "dapo", "gspo"]


CorrectionMode = Literal["none", "tis", "token_mask", "icepop", "sequence_truncate", "sequence_mask"]


class CorrectionConfig(_Section):
    """The rollout-policy correction: a detached weight on each token's loss term from rho = pi_trainer / pi_engine
    (per token, or per sequence), truncated or masked outside [low, high] (rollwise.train.corrections;
    docs/corrections.md)."""

    mode: CorrectionMode = "none"
    """'none'; 'tis' (per-token rho clamped to [low, high]: truncated importance sampling, what algo.tis_cap sets);
    'token_mask' (per-token rho, tokens outside [low, high] get weight 0); 'icepop' (the token mask, always
    two-sided: one bound given, the other is its reciprocal; none given, [0.5, 5]); 'sequence_truncate' (one rho
    per sequence, clamped, on all its tokens); 'sequence_mask' (sequences whose rho leaves [low, high] train on
    nothing). TRL's vllm_importance_sampling_mode token_truncate / token_mask / sequence_truncate / sequence_mask
    are tis / token_mask / sequence_truncate / sequence_mask."""
    low: float | None = Field(None, gt=0)
    """Lower bound on rho; None = no lower bound (icepop: 1 / high)."""
    high: float | None = Field(None, gt=0)
    """Upper bound on rho (needed by tis and sequence_truncate); None = no upper bound (icepop: 1 / low)."""
    sequence_ratio: Literal["product", "geometric"] = "product"
    """The sequence modes' rho: the product of the token ratios (TRL's, verl's 'sequence') or their geometric mean
    (verl's 'geometric': independent of length, so its bounds sit much closer to 1, e.g. high 1.001)."""

    @model_validator(mode="after")
    def _bounds(self) -> CorrectionConfig:
        if self.mode == "none":
            return self
        if self.mode in ("tis", "sequence_truncate") and self.high is None:
            raise ValueError(f"algo.correction.mode {self.mode} truncates from above: set algo.correction.high "
                             f"(e.g. 2.0)")
        if self.mode in ("token_mask", "sequence_mask") and self.low is None and self.high is None:
            raise ValueError(f"algo.correction.mode {self.mode} needs a bound: set algo.correction.high and/or .low")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"algo.correction.low ({self.low}) is above algo.correction.high ({self.high})")
        one_high = self.low is None and self.high is not None and self.high < 1.0
        one_low = self.high is None and self.low is not None and self.low > 1.0
        if self.mode == "icepop" and (one_high or one_low):
            raise ValueError("algo.correction.mode icepop with one bound k masks outside [1/k, k]: give high >= 1 "
                             "or low <= 1, or both bounds")
        return self


class GaeConfig(_Section):
    """Generalized advantage estimation (Schulman et al. 2016) with `algo.advantage: gae`: per-token advantages from
    the critic's values (docs/ppo.md). verl's `algorithm.gamma` / `algorithm.lam`, OpenRLHF's `--gamma` / `--lambd`."""

    gamma: float = Field(1.0, ge=0, le=1)
    """Discount per policy token. 1 (verl's default): the episode's reward counts fully at every token."""
    lam: float = Field(1.0, ge=0, le=1)
    """GAE's lambda: 1 = Monte-Carlo advantages (return - value, unbiased, higher variance); lower values lean on
    the critic's next-token values (less variance, biased by the critic's errors). verl defaults to 1; 0.95 is
    the classic PPO choice."""
    whiten: bool = True
    """Whiten the advantages over the batch's policy tokens (subtract their mean, divide by their std), as verl and
    OpenRLHF do: the loss sees one scale whatever the rewards' scale."""


class CriticConfig(_Section):
    """The value model of `algo.advantage: gae`: a separate critic (the policy's architecture with a one-output
    value head in place of the LM head, HF `AutoModelForTokenClassification`, as verl's critic) with its own AdamW
    (docs/ppo.md). Saved with every checkpoint (`checkpoints/step-N/critic/`) and restored on resume."""

    model: str | None = None
    """The critic's starting weights: an HF checkpoint directory (a causal LM: its body, with a new value head
    starting at 0; or a saved critic, `checkpoints/step-N/critic`), a .gguf file or a known name. None = the policy's
    initial model (after warm-up or SFT), verl's default. It must share the policy's tokenizer."""
    lr: float = Field(1e-5, gt=0)
    """The critic's AdamW learning rate (constant). verl's `critic.optim.lr` default; the built-in tiny model
    learns its values at about 1e-3."""
    cliprange_value: float | None = Field(0.5, gt=0)
    """Value clipping (verl's `critic.cliprange_value`, OpenRLHF's `--value_clip`): a new value is kept within this
    distance of the value the step's advantages were computed with, and the loss takes the worse of the clipped
    and unclipped squared errors. None = plain squared error."""
    grad_clip: float | None = Field(1.0, gt=0)
    """Clip the critic's global gradient norm to this; None = no clipping."""
    updates_per_step: int = Field(1, ge=1)
    """The critic's optimiser steps per RL step (its batch split into this many shuffled mini-batches; verl's
    critic.ppo_epochs x mini-batches)."""
    warmup_steps: int = Field(0, ge=0)
    """RL steps at the start in which only the critic trains and the policy is left as it is (verl's
    `trainer.critic_warmup`, OpenRLHF's `--freezing_actor_steps`): the policy's first updates then see a critic that
    has learned something."""
class DistillConfig(_Section):
    """On-policy distillation (docs/distillation.md): a frozen teacher scores every token the policy sampled, and the
    per-token reverse KL, log pi_teacher(y_t) - log pi_policy(y_t) on the sampled token, is a dense advantage on
    each policy token (Tinker's on-policy distillation, prime-rl's teacher_tau, NeMo RL's 'opd' advantage)."""

    teacher: str | None = None
    """The teacher: an HF checkpoint directory, a .gguf file, a known name (smollm2-135m) or a hub id; None = off.
    It must share the policy's tokenizer (vocabulary, special tokens, and the prompt its chat template renders), or
    the run is refused at start. Loaded once, frozen, beside the trainer (on model.device, its forward in
    train.bf16's precision)."""
    coef: float = Field(1.0, gt=0)
    """Weight of the reverse-KL advantage (Tinker's kl_penalty_coef, prime-rl's teacher_tau)."""
    reward_weight: float = Field(0.0, ge=0)
    """Weight of the task reward's advantage (algo.advantage's) added on every token (prime-rl's adv_tau); 0 = pure
    distillation: rewards are still scored and reported, but only the teacher trains the policy."""


class AlgoConfig(_Section):
    """The RL algorithm: which advantage estimator, which loss, and their knobs."""

    advantage: AdvantageName = "grpo"
    """Advantage estimator (`rollwise.train.advantages.ADVANTAGE_NAMES`); 'tree' gives per-token credit from the
    completions' shared prefixes (TreeRL), for every loss but gspo (one advantage per sequence); 'gae' gives
    per-token advantages from a learned value model (PPO with a critic: `algo.critic`, `algo.gae`, docs/ppo.md)."""
    loss: LossName = "grpo"
    """Policy loss (`rollwise.train.losses.LOSSES`)."""
    adv_eps: float = Field(1e-6, gt=0)
    """Added to the std in GRPO / REINFORCE++ normalisation."""
    reinforce_baseline: Literal["group", "batch"] = "group"
    """REINFORCE++ baseline: subtract the group mean (REINFORCE++-baseline) or the batch mean, then divide by the
    batch std."""
    clip_eps_low: float = Field(0.2, ge=0)
    """Lower clip of the importance ratio: 1 - clip_eps_low."""
    clip_eps_high: float | None = Field(None, ge=0)
    """Upper clip: 1 + clip_eps_high. None = clip_eps_low (0.28 for the dapo loss: clip-higher)."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of the KL penalty to the initial (reference) model; 0 = off and no reference model is kept."""
    kl_estimator: Literal["k1", "k3"] = "k3"
    """KL estimator: 'k1' (log-ratio) or 'k3' (non-negative, lower variance)."""
    tis_cap: float | None = Field(None, gt=0)
    """Truncated importance sampling cap C on pi_trainer / pi_engine; None = off. Shorthand for algo.correction
    {mode: tis, high: C}; set one or the other."""
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)
    """Rollout-policy correction beyond TIS: token or sequence ratios, truncated or masked (docs/corrections.md)."""
    decoupled: bool = False
    """Decoupled PPO: clip against the trainer's proximal log-probs, weight by proximal / behaviour."""
    max_length: int | None = Field(None, ge=1)
    """Dr. GRPO's constant length normaliser; None = rollout.max_tokens."""
    skip_zero_variance: bool = True
    """Drop groups whose rewards are all equal (they carry no GRPO signal) from the train batch. Not with
    `advantage: gae`, whose baseline is the critic: there a group of equal rewards still teaches, and trains."""
    errored_reward: float | None = 0.0
    """What an errored rollout (a user's reward function raised, the sandbox could not be built; never an output
    the built-in verifiers can blame on the policy: those are wrong answers) counts as in advantages. A number: a
    wrong answer with this reward (or its group's lowest, if lower), trained on with the advantage that gives it,
    so a policy never gains by making the scorer fail. null: left out of the advantages and the loss. Default 0.0
    (the built-in verifiers' wrong-answer value): a user's reward most often raises on the odd outputs a policy
    learns to produce, and leaving those out would pay the policy for finding them; the cost, a correct answer
    penalised when infrastructure failed, is noise no policy can exploit, and errored rollouts are still counted
    (score_errors) and shown. See rollwise/filter.py and README, "Reliability"."""
    overlong_filter: bool | None = None
    """DAPO overlong filtering: truncated samples (hit rollout.max_tokens) are left out of the loss; they still
    count in their group's advantage baseline. None = on for `loss: dapo`, off otherwise."""
    overlong_penalty: bool | None = None
    """DAPO soft overlong punishment: a penalty falling linearly from 0 to -1 over the last `overlong_cache`
    tokens before rollout.max_tokens, added to the reward the advantages see (not to the stored task reward).
    None = on for `loss: dapo`, off otherwise."""
    overlong_cache: int | None = Field(None, ge=1)
    """L_cache of the soft overlong punishment, in tokens (at most rollout.max_tokens); None = rollout.max_tokens
    // 5 (the paper's 4096 of 20480)."""
    gae: GaeConfig = Field(default_factory=GaeConfig)
    """GAE's gamma, lambda and whitening (`advantage: gae`)."""
    critic: CriticConfig = Field(default_factory=CriticConfig)
    """The value model of `advantage: gae`: its starting weights, learning rate, value clipping, warm-up."""
    distill: DistillConfig = Field(default_factory=DistillConfig)
    """On-policy distillation from a frozen teacher's per-token log-probs (docs/distillation.md)."""

    @model_validator(mode="after")
    def _one_correction(self) -> AlgoConfig:
        if self.tis_cap is not None and self.correction.mode != "none":
            raise ValueError(f"algo.tis_cap is the 'tis' correction's cap and algo.correction.mode is "
                             f"{self.correction.mode!r}: set one of them")
        return self


class LoraConfig(_Section):
    """LoRA adapters through peft (optional dependency: pip install 'rollwise[lora]')."""

    enabled: bool = False
    """Train LoRA adapters instead of all weights."""
    r: int = Field(8, ge=1)
    """Adapter rank."""
    alpha: float = Field(16.0, gt=0)
    """Scaling numerator (the update is scaled by alpha / r)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter input."""
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names to adapt."""


class TrainConfig(_Section):
    """The optimiser and the training forward/backward."""

    lr: float = Field(1e-6, gt=0)
    """Peak AdamW learning rate (1e-6 as in TRL and verl for pretrained models; the built-in tiny model's recipe
    uses 3e-4, and 1e-3 wrecks a trained tiny model within one or two updates)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    adam_eps: float = Field(1e-8, gt=0)
    """AdamW epsilon."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """LR schedule after warm-up: constant, linear decay or cosine decay to min_lr_ratio * lr at `steps`."""
    warmup_steps: int = Field(0, ge=0)
    """Linear LR warm-up from 0 over this many optimiser steps."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Final LR as a fraction of lr for the linear and cosine schedules."""
    grad_clip: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this; None = no clipping (the norm is still reported)."""
    micro_batch_tokens: int = Field(4096, ge=8)
    """Token cap of one packed micro-batch (one forward/backward); gradients accumulate over micro-batches."""
    updates_per_step: int = Field(1, ge=1)
    """Optimiser steps per RL step: the batch is split into this many mini-batches (PPO-style; >1 makes the clip
    matter). Gradient accumulation over the packed micro-batches of a mini-batch is automatic."""
    steps: int = Field(30, ge=0)
    """RL steps (one batch of rollouts each)."""
    seed: int = 0
    """Seeds python, numpy and torch, the data order and the sampler."""
    lora: LoraConfig = Field(default_factory=LoraConfig)
    """LoRA options."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    bf16: bool | Literal["auto"] = "auto"
    """bf16 mixed precision for the training forward and backward (torch.autocast; parameters, gradients and AdamW
    state stay float32): true, false, or 'auto' = on for CUDA, and on CPUs with native bf16 dot products (AMX or
    AVX512-BF16, where the training step runs 2-3x faster) when model.dtype is below float32 (the loss then corrects
    the engine/trainer gap with TIS, and bf16 training learned as float32 did over 3 seeds); float32 otherwise
    (train/precision.py, docs/benchmarks.md). The post-sync probe's reference is float32 either way."""
    world_size: int = Field(1, ge=1)
    """Data-parallel trainer ranks (torch.distributed: gloo on CPU, NCCL on CUDA). 1 = the trainer runs in the
    driver process; N > 1 = N rank processes (Ray actors with engine.backend 'ray'), each training on its share of
    every mini-batch, with the same update as one rank (docs/distributed.md)."""
    parallel: Literal["auto", "ddp", "fsdp2"] = "auto"
    """How ranks share an update: 'ddp' (whole replicas, gradients summed), 'fsdp2' (parameters, gradients and
    optimiser state sharded: `fully_shard`), 'auto' (fsdp2 on CUDA, ddp on CPU). Ignored at world_size 1."""
    max_restarts: int = Field(3, ge=0)
    """Times a run restarts a trainer whose process (or a rank or Ray actor of it) died: from the last checkpoint,
    re-training the steps since from the stored rollouts. 0 = the run stops with one line (resume it later)."""

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError(f"betas must be in [0, 1), got {list(v)}")
        return v


LOGGER_PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow-skinny"),
}
"""run.loggers name -> (the module it imports, the pip package that provides it); 'jsonl' needs nothing."""


class RunOptions(_Section):
    """Where the run writes and how often it checkpoints and evaluates."""

    out_dir: str = "runs/default"
    """Run directory: config.yaml, metrics.jsonl, summary.json, rollouts/, checkpoints/, report.html."""
    checkpoint_every: int = Field(10, ge=0)
    """Save a checkpoint every N RL steps (and at the end); 0 = only at the end. Not what keeps a crash from losing
    steps (the stored rollouts are the write-ahead log: a resume re-trains the steps after the last checkpoint from
    them); it bounds how many steps a resume re-trains."""
    keep_checkpoints: int | None = Field(2, ge=1)
    """Keep only the newest N checkpoints (disk stays bounded); None = keep all."""
    eval_every: int = Field(0, ge=0)
    """Evaluate on held-out problems every N RL steps (and before and after training); 0 = before and after only."""
    eval_size: int | None = Field(None, ge=1)
    """Held-out problems per evaluation; None = env.eval_size."""
    eval_samples: int = Field(4, ge=1)
    """Samples per held-out problem for the sampled accuracy (at rollout.temperature); the greedy accuracy always
    takes one. Frequent evaluations (bench/time_to_accuracy.py) use 1: the held-out set, not the samples per
    problem, is what bounds the noise of a greedy curve."""
    loggers: list[str] = Field(default_factory=lambda: ["jsonl"])
    """Where each step's metrics go (train/loggers.py): 'jsonl' (RUN_DIR/metrics.jsonl, the run's record: always
    on, listed or not), 'tensorboard' (RUN_DIR/tensorboard), 'wandb' (W&B; files under RUN_DIR/wandb,
    WANDB_MODE=offline for no network), 'mlflow' (MLFLOW_TRACKING_URI, default sqlite RUN_DIR/mlflow.db). A
    logger whose package is not installed is refused at load."""
    tensorboard: bool | None = None
    """Deprecated alias (one line on stderr when set): true adds 'tensorboard' to run.loggers, false removes it."""
    project: str | None = None
    """The loggers' project: the W&B project, the MLflow experiment (and a TensorBoard text summary); None = the
    environment's WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME, else 'rollwise'."""
    run_name: str | None = None
    """The loggers' name for this run (W&B run name, MLflow run name, TensorBoard text summary); None = the run
    directory's name."""
    resume: bool = False
    """Continue from the latest complete checkpoint in out_dir."""
    max_all_errored_steps: int = Field(3, ge=1)
    """Stop the run (non-zero exit, one line naming the reward's error and file:line) when the reward errored on
    every sample of this many consecutive RL steps, or of the run's first step: the reward is broken, not the
    policy's output. Errors on some samples never stop a run (each is that sample's outcome, `algo.errored_reward`)."""
    log_every: int = Field(1, ge=1)
    """When stdout is not a terminal (nohup, SLURM, CI), print a plain progress line every N RL steps (and after
    the last): step, reward, accuracy, kept / filtered / errored rollouts, step time, tokens/s. A terminal gets the
    progress bar instead."""
    num_scorers: int = Field(2, ge=1)
    """Scoring actors (verifiers, sandboxes) when engine.backend is 'ray'."""
    ray_address: str | None = None
    """engine.backend 'ray': address of an existing Ray cluster ('auto' or host:port); None starts a local one."""
    ray_gpus_per_engine: float | None = Field(None, ge=0)
    """engine.backend 'ray': GPUs each engine actor asks for; None = 1 on CUDA, 0 on CPU. A fraction (0.5) lets an
    engine share a GPU with the trainer on a one-GPU machine."""
    ray_gpus_per_trainer_rank: float | None = Field(None, ge=0)
    """engine.backend 'ray': GPUs each trainer rank's actor asks for; None = 1 on CUDA, 0 on CPU."""
    ray_timeout_s: float = Field(600.0, gt=0)
    """engine.backend 'ray': longest wait on a Ray actor before the run stops with a message (no silent hangs)."""
    cpu_threads: int | None = Field(None, ge=1)
    """torch CPU threads; None = torch's default. Tiny models run faster on 1: per-op overhead dominates, and
    oversubscribed OpenMP threads on a busy machine slow everything down by an order of magnitude."""

    @model_validator(mode="before")
    @classmethod
    def _tensorboard_alias(cls, data: Any) -> Any:
        """Fold the deprecated `tensorboard: bool` into `loggers` (so config.yaml carries `loggers` only)."""
        if not isinstance(data, dict) or data.get("tensorboard") is None:
            return data
        data = dict(data)
        on = data.pop("tensorboard")
        given = data.get("loggers")
        if not isinstance(on, bool) or not isinstance(given, (list, type(None))):
            data["tensorboard"] = on  # leave the type error to the field's own validation
            return data
        loggers = list(given) if given is not None else ["jsonl"]
        if not on and "tensorboard" in loggers and given is not None:
            raise ValueError("run.tensorboard: false contradicts run.loggers, which lists 'tensorboard'; drop "
                             "run.tensorboard (deprecated)")
        loggers = [x for x in loggers if x != "tensorboard"] + (["tensorboard"] if on else [])
        data["loggers"] = loggers
        sys.stderr.write(f"rollwise: config key 'run.tensorboard' is deprecated; use run.loggers: "
                         f"[{', '.join(dict.fromkeys(['jsonl', *map(str, loggers)]))}]\n")
        return data

    @field_validator("loggers")
    @classmethod
    def _loggers(cls, v: list[str]) -> list[str]:
        """'jsonl' first and always, no repeats; a logger whose package is missing fails here, before any work."""
        import importlib.util

        known = ["jsonl", *LOGGER_PACKAGES]
        for name in v:
            if name not in known:
                near = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
                raise ValueError(f"unknown logger {name!r}; known: {', '.join(known)}"
                                 + (f" (did you mean '{near[0]}'?)" if near else ""))
        out = ["jsonl", *[x for x in dict.fromkeys(v) if x != "jsonl"]]
        for name in out:
            module, pip = LOGGER_PACKAGES.get(name, ("", ""))
            if module and importlib.util.find_spec(module) is None:
                raise ValueError(f"logger '{name}' needs the {module} package, which is not installed: "
                                 f"pip install {pip} (or drop '{name}' from run.loggers)")
        if "mlflow" in out and not os.environ.get("MLFLOW_TRACKING_URI") and importlib.util.find_spec("sqlalchemy") is None:
            raise ValueError("logger 'mlflow' has no tracking store: set MLFLOW_TRACKING_URI (an http:// server, or "
                             "file:DIR with MLFLOW_ALLOW_FILE_STORE=true), or pip install mlflow for the default "
                             "sqlite store RUN_DIR/mlflow.db")
        return out


class WarmupConfig(_Section):
    """Supervised warm-up of the built-in model before RL (a random model gets reward 0 and cannot learn)."""

    enabled: bool = True
    """Run the warm-up phase (only for model.path 'builtin:tiny')."""
    steps: int | None = Field(None, ge=1)
    """Stop after this many optimiser steps; None = stop by time only."""
    seconds: float = Field(90.0, gt=0)
    """Wall-clock budget of the warm-up phase."""
    lr: float = Field(1e-3, gt=0)
    """AdamW learning rate of the warm-up."""
    batch_size: int = Field(64, ge=1)
    """Demonstrations per step."""
    noise_fraction: float = Field(0.6, ge=0, le=1)
    """Fraction of demonstrations whose answer is corrupted, so the model imitates noisy data and RL has room."""
    cache: bool = True
    """Reuse a warmed-up model cached under cache_dir, keyed by the model and warm-up config."""
    cache_dir: str | None = None
    """Where warmed-up models are cached; None = ~/.cache/rollwise/warmup."""


class SftConfig(_Section):
    """Supervised fine-tuning on demonstrations before RL (`rollwise.run.sft`); on when `path` is set. Demonstrations
    are rendered exactly as rollouts are (`models.turns`), with the loss on assistant tokens only."""

    path: str | None = None
    """JSONL of demonstrations, one `{"messages": [...]}` per line (OpenAI / transformers chat format: assistant
    turns may carry `tool_calls`, tool results are `tool`-role turns)."""
    steps: int = Field(100, ge=1)
    """Optimiser steps."""
    lr: float = Field(1e-5, gt=0)
    """AdamW learning rate (peak, after warm-up)."""
    batch_size: int = Field(16, ge=1)
    """Demonstrations per step (drawn in a seeded shuffled order, epoch after epoch)."""
    schedule: Literal["constant", "linear", "cosine"] = "cosine"
    """LR schedule over `steps`."""
    warmup_steps: int = Field(0, ge=0)
    """Linear LR warm-up steps."""
    grad_clip: float | None = Field(1.0, gt=0)
    """Max global gradient norm; None = no clipping."""
    checkpoint_every: int = Field(25, ge=0)
    """Save a resumable SFT checkpoint every N steps (RUN_DIR/sft/checkpoints/); the last step is always saved."""
    eval_base: bool = False
    """Evaluate the model before SFT too (summary.json `eval_base`), off by default: it costs a whole evaluation;
    `eval_before` is after SFT, before RL, either way."""


PolicyName = Literal["uniform", "dynamic", "adaptive", "knapsack", "early_stop", "partial"]


class ControlConfig(_Section):
    """The rollout controller (rollwise.control): which prompts to sample, how many samples, when to stop.
    It runs every step; the default (policy 'uniform', select 'all') samples K completions for each prompt."""

    policy: PolicyName | list[PolicyName] = "uniform"
    """Generation policy (`rollwise.control.POLICIES`), or a list that composes an allocation with a stopping rule:
    'uniform' K samples per prompt; 'dynamic' DAPO over-sample and refill with informative groups; 'adaptive' pilot
    groups, full groups only for mixed pilots; 'knapsack' the step's samples split over more prompts by each one's
    chance of a mixed group under the posterior (up to `max_group` each; needs select posterior); 'partial' stop at
    the batch target and carry unfinished samples over;
    'early_stop' abort groups decided zero-variance (alone: under uniform allocation; `[dynamic, early_stop]`,
    `[adaptive, early_stop]`: under that one). Prompt selection is `select`, a separate concern."""

    @field_validator("policy")
    @classmethod
    def _one_allocation(cls, v: Any) -> Any:
        names = [v] if isinstance(v, str) else list(v)
        alloc = [n for n in names if n != "early_stop"]
        if not names or len(set(names)) != len(names) or len(alloc) > 1:
            raise ValueError(f"control.policy takes one allocation (uniform, dynamic, adaptive, knapsack or partial), optionally "
                             f"with early_stop, each once; got {names}")
        if "partial" in alloc and "early_stop" in names:
            raise ValueError("control.policy [partial, early_stop]: partial rollouts drive the engine across steps "
                             "themselves and do not take a stopping rule yet; use one of the two")
        return v

    @property
    def policies(self) -> tuple[str, ...]:
        """`policy` as a tuple of names (a single name is a tuple of one)."""
        return (self.policy,) if isinstance(self.policy, str) else tuple(self.policy)
    select: Literal["all", "posterior"] = "all"
    """Prompt selector (`rollwise.control.SELECTORS`): 'all', or 'posterior' to skip prompts whose Beta pass-rate
    posterior says the group would almost surely be all-correct or all-wrong."""
    oversample: float = Field(1.5, ge=1)
    """dynamic / adaptive: prompts per round = ceil(missing informative groups x oversample); knapsack: candidate
    prompts per step = ceil(prompts_per_step x oversample)."""
    max_rounds: int = Field(4, ge=1)
    """dynamic / adaptive: most generation rounds per step (the batch may then be short)."""
    pilot_samples: int = Field(2, ge=2)
    """adaptive: samples in each prompt's pilot group; must be < rollout.samples_per_prompt."""
    budget_factor: float = Field(1.0, gt=0)
    """adaptive, knapsack: rollouts per step = budget_factor x prompts_per_step x samples_per_prompt."""
    max_group: int = Field(0, ge=0)
    """knapsack: most samples one prompt gets in a step; 0 = twice rollout.samples_per_prompt."""
    direct_above: float = Field(0.7, gt=0, le=1)
    """adaptive: sample all K at once (no pilot) for a prompt whose pass-rate belief gives P(informative group) >= this
    (with select=posterior: a prompt seen mixed before); 1 = always pilot."""
    confidence: float = Field(0.75, gt=0, lt=1)
    """early_stop: abort the rest of a group once P(all remaining samples agree) exceeds this."""
    min_finished: int = Field(2, ge=1)
    """early_stop: never decide on fewer finished samples than this."""
    over_provision: float = Field(0.5, ge=0)
    """partial: groups kept in flight = ceil(prompts_per_step x (1 + over_provision))."""
    prior_a: float = Field(0.5, gt=0)
    """Beta prior a (pseudo-successes) of a prompt's pass rate (posterior selector, early_stop); 0.5/0.5 (Jeffreys) is
    U-shaped, as pass rates on verifiable tasks mostly are, so a few agreeing samples can decide."""
    prior_b: float = Field(0.5, gt=0)
    """Beta prior b (pseudo-failures) of a prompt's pass rate."""
    decay: float = Field(0.95, ge=0, le=1)
    """posterior: per weight version, evidence shrinks toward the prior by this factor (1 = never forget)."""
    skip_above: float = Field(0.6, gt=0, le=1)
    """posterior: skip a prompt when P(its next group is zero-variance) exceeds this."""
    explore: float = Field(0.1, ge=0, le=1)
    """posterior: probability of sampling a prompt anyway when it would be skipped."""
    refill: bool = True
    """posterior: replace each skipped prompt with the next one from the data, so a step samples
    rollout.prompts_per_step groups (true); or not (false: the step samples only the prompts it did not skip, at
    least one, and costs less: GRESO's trade, measured in docs/control.md)."""
    async_staleness: int = Field(0, ge=0)
    """K: generation runs ahead of training by at most K weight versions, in a background thread
    (rollwise.run.sources.AsyncSource); the loss corrects with algo.tis_cap / algo.decoupled. 0 = synchronous."""


class ReplaySection(_Section):
    """Reuse of past rollouts in training (off by default): see rollwise.store.replay."""

    enabled: bool = False
    """Keep a replay buffer of this run's scored rollouts and feed some back into training."""
    reuse_per_step: int = Field(32, ge=0)
    """Past rollouts (with a non-zero advantage) added to each step's training batch; the loss's clipped ratio
    against their stored behaviour log-probs is the importance correction."""
    rescue: bool = True
    """For a group whose samples all failed, add a past success of the same prompt to the group (its
    advantages are then computed with it), so the group teaches instead of being filtered."""
    rescue_k: int = Field(1, ge=1)
    """Past successes added to a rescued group."""
    max_age: int = Field(4, ge=0)
    """Oldest weight version (relative to the current one) a replayed rollout may come from."""
    max_reuse: int = Field(2, ge=1)
    """Times a rollout may be replayed before it leaves the buffer."""
    capacity: int = Field(4096, ge=1)
    """Rollouts the buffer holds (oldest evicted first)."""


class RunConfig(BaseModel):
    """The whole run config: one section per component."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True, allow_inf_nan=False)

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy model."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """The generation engine."""
    env: EnvConfig = Field(default_factory=EnvConfig)
    """The task environment."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Sampling per RL step."""
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    """Advantages and loss."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """Optimiser and training forward."""
    run: RunOptions = Field(default_factory=RunOptions)
    """Run directory, checkpoints, evaluation."""
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    """Supervised warm-up of the built-in model."""
    sft: SftConfig = Field(default_factory=SftConfig)
    """Supervised fine-tuning on demonstrations before RL."""
    control: ControlConfig = Field(default_factory=ControlConfig)
    """Rollout controller: prompt selection, group sizes, early stops, partial rollouts."""
    replay: ReplaySection = Field(default_factory=ReplaySection)
    """Reuse of past rollouts in training."""

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        if self.model.dtype != "float32" and not ({"tis_cap", "decoupled", "correction"} & self.algo.model_fields_set):
            # NOTE: the engine samples at lower precision than the float32 trainer: correct the mismatch by default.
            self.algo.tis_cap = LOW_PRECISION_TIS_CAP
        for problem in cross_section_problems(self):
            raise ValueError(problem)
        return self


# ------------------------------------------------------------------------------------------------- cross-section

LOW_PRECISION_TIS_CAP = 2.0
"""algo.tis_cap set when model.dtype is not float32 and none of algo.tis_cap, algo.correction, algo.decoupled is
given (the cap Yao et al. 2025 use for bf16/fp8 rollouts under a higher-precision trainer)."""

_STEPWISE_POLICIES = ("early_stop", "partial")
"""Policies that abort and resume samples mid-generation: they need a step-level engine (in-process, or remote
servers through streaming and abort-on-disconnect)."""

_ADAPTIVE_OR_DYNAMIC = ("dynamic", "adaptive")

# (dotted key, does the key take effect?, the condition in words). A key set to a non-default value where it has
# no effect is refused at load, so no option is silently ignored.
_APPLIES_WHEN: list[tuple[str, Any, str]] = [
    ("engine.remote_urls", lambda c: c.engine.backend == "remote", "engine.backend is 'remote'"),
    ("engine.remote_server", lambda c: c.engine.backend == "remote", "engine.backend is 'remote'"),
    ("engine.remote_api_key_env", lambda c: c.engine.backend == "remote", "engine.backend is 'remote'"),
    ("engine.remote_timeout_s", lambda c: c.engine.backend == "remote", "engine.backend is 'remote'"),
    ("engine.remote_weights_dir", lambda c: c.engine.backend == "remote" and c.engine.remote_server != "rollwise",
     "engine.backend is 'remote' and engine.remote_server is vllm or sglang"),
    ("engine.vllm", lambda c: c.engine.backend == "remote" and c.engine.remote_server == "vllm",
     "engine.backend is 'remote' and engine.remote_server is 'vllm'"),
    ("engine.num_engines", lambda c: c.engine.backend == "ray", "engine.backend is 'ray'"),
    ("run.num_scorers", lambda c: c.engine.backend == "ray", "engine.backend is 'ray'"),
    ("run.ray_address", lambda c: c.engine.backend == "ray" or c.engine.vllm.placement == "ray",
     "engine.backend is 'ray' or engine.vllm.placement is 'ray'"),
    ("run.ray_timeout_s", lambda c: c.engine.backend == "ray", "engine.backend is 'ray'"),
    ("model.builtin", lambda c: c.model.path == "builtin:tiny", "model.path is 'builtin:tiny'"),
    ("warmup", lambda c: c.model.path == "builtin:tiny", "model.path is 'builtin:tiny'"),
    ("control.oversample", lambda c: bool(set(c.control.policies) & {*_ADAPTIVE_OR_DYNAMIC, "knapsack"}),
     "control.policy is dynamic, adaptive or knapsack"),
    ("control.max_rounds", lambda c: bool(set(c.control.policies) & set(_ADAPTIVE_OR_DYNAMIC)), "control.policy is dynamic or adaptive"),
    ("control.pilot_samples", lambda c: "adaptive" in c.control.policies, "control.policy is 'adaptive'"),
    ("control.budget_factor", lambda c: bool({"adaptive", "knapsack"} & set(c.control.policies)),
     "control.policy is adaptive or knapsack"),
    ("control.max_group", lambda c: "knapsack" in c.control.policies, "control.policy is 'knapsack'"),
    ("control.direct_above", lambda c: "adaptive" in c.control.policies, "control.policy is 'adaptive'"),
    ("control.confidence", lambda c: "early_stop" in c.control.policies, "control.policy is 'early_stop'"),
    ("control.min_finished", lambda c: "early_stop" in c.control.policies, "control.policy is 'early_stop'"),
    ("control.over_provision", lambda c: "partial" in c.control.policies, "control.policy is 'partial'"),
    ("control.decay", lambda c: c.control.select == "posterior", "control.select is 'posterior'"),
    ("control.skip_above", lambda c: c.control.select == "posterior", "control.select is 'posterior'"),
    ("control.explore", lambda c: c.control.select == "posterior", "control.select is 'posterior'"),
    ("control.refill", lambda c: c.control.select == "posterior", "control.select is 'posterior'"),
    ("control.prior_a", lambda c: c.control.select == "posterior" or bool({"early_stop", "adaptive"} & set(c.control.policies)),
     "control.select is 'posterior' or control.policy is early_stop or adaptive"),
    ("control.prior_b", lambda c: c.control.select == "posterior" or bool({"early_stop", "adaptive"} & set(c.control.policies)),
     "control.select is 'posterior' or control.policy is early_stop or adaptive"),
    ("rollout.speculative.k", lambda c: c.rollout.speculative.source != "off", "rollout.speculative.source is not 'off'"),
    ("rollout.tree.fanout", lambda c: c.rollout.tree.branch != "off", "rollout.tree.branch is not 'off'"),
    ("rollout.tree.segment_tokens", lambda c: c.rollout.tree.branch != "off", "rollout.tree.branch is not 'off'"),
    ("rollout.tree.roots", lambda c: c.rollout.tree.branch != "off", "rollout.tree.branch is not 'off'"),
    ("rollout.tree.first_segment_tokens", lambda c: c.rollout.tree.branch != "off", "rollout.tree.branch is not 'off'"),
    ("rollout.tree.entropy_threshold", lambda c: c.rollout.tree.branch == "entropy", "rollout.tree.branch is 'entropy'"),
    ("rollout.speculative.per_prompt", lambda c: c.rollout.speculative.source in ("past", "both"),
     "rollout.speculative.source is 'past' or 'both'"),
    ("replay.reuse_per_step", lambda c: c.replay.enabled, "replay.enabled is true"),
    ("replay.rescue", lambda c: c.replay.enabled, "replay.enabled is true"),
    ("replay.rescue_k", lambda c: c.replay.enabled and c.replay.rescue, "replay.enabled and replay.rescue are true"),
    ("replay.max_age", lambda c: c.replay.enabled, "replay.enabled is true"),
    ("replay.max_reuse", lambda c: c.replay.enabled, "replay.enabled is true"),
    ("replay.capacity", lambda c: c.replay.enabled, "replay.enabled is true"),
    ("algo.reinforce_baseline", lambda c: c.algo.advantage == "reinforce_pp", "algo.advantage is 'reinforce_pp'"),
    ("algo.gae", lambda c: c.algo.advantage == "gae", "algo.advantage is 'gae'"),
    ("algo.critic", lambda c: c.algo.advantage == "gae", "algo.advantage is 'gae'"),
    ("algo.skip_zero_variance", lambda c: c.algo.advantage != "gae",
     "algo.advantage is not 'gae' (a critic's baseline trains on groups of equal rewards too)"),
    ("algo.kl_estimator", lambda c: c.algo.kl_coef > 0, "algo.kl_coef > 0"),
    ("algo.distill.coef", lambda c: c.algo.distill.teacher is not None, "algo.distill.teacher is set"),
    ("algo.distill.reward_weight", lambda c: c.algo.distill.teacher is not None, "algo.distill.teacher is set"),
    ("algo.correction.low", lambda c: c.algo.correction.mode != "none", "algo.correction.mode is set"),
    ("algo.correction.high", lambda c: c.algo.correction.mode != "none", "algo.correction.mode is set"),
    ("algo.correction.sequence_ratio", lambda c: c.algo.correction.mode in ("sequence_truncate", "sequence_mask"),
     "algo.correction.mode is sequence_truncate or sequence_mask"),
    ("algo.max_length", lambda c: c.algo.loss == "dr_grpo" or c.algo.advantage == "dr_grpo",
     "algo.loss or algo.advantage is 'dr_grpo'"),
    ("algo.overlong_cache", lambda c: c.algo.overlong_penalty or (c.algo.overlong_penalty is None and c.algo.loss == "dapo"),
     "the soft overlong penalty is on (algo.overlong_penalty, or algo.loss 'dapo')"),
    ("env.system_prompt", lambda c: c.env.chat_template is not False, "env.chat_template is not false"),
    ("env.environment_api", lambda c: c.env.environment is not None, "env.environment is set"),
    ("env.tool_timeout_s", lambda c: c.env.environment is not None, "env.environment is set"),
    ("env.max_tool_calls", lambda c: c.env.environment is not None, "env.environment is set"),
    ("env.tool_isolation", lambda c: c.env.environment is not None, "env.environment is set"),
    ("sft", lambda c: c.sft.path is not None, "sft.path is set"),
    ("train.lora.r", lambda c: c.train.lora.enabled, "train.lora.enabled is true"),
    ("train.lora.alpha", lambda c: c.train.lora.enabled, "train.lora.enabled is true"),
    ("train.lora.dropout", lambda c: c.train.lora.enabled, "train.lora.enabled is true"),
    ("train.lora.target_modules", lambda c: c.train.lora.enabled, "train.lora.enabled is true"),
    ("train.min_lr_ratio", lambda c: c.train.schedule != "constant", "train.schedule is linear or cosine"),
    ("train.parallel", lambda c: c.train.world_size > 1, "train.world_size > 1"),
    ("run.ray_gpus_per_engine", lambda c: c.engine.backend == "ray", "engine.backend is 'ray'"),
    ("run.ray_gpus_per_trainer_rank", lambda c: c.engine.backend == "ray", "engine.backend is 'ray'"),
]


def _value_at(cfg: BaseModel, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node.model_dump(mode="json") if isinstance(node, BaseModel) else node


_DEFAULTS: RunConfig | None = None


def _defaults() -> RunConfig:
    global _DEFAULTS
    if _DEFAULTS is None:
        _DEFAULTS = RunConfig.model_construct(**{name: f.default_factory() for name, f in RunConfig.model_fields.items()})
    return _DEFAULTS


_RECIPE: RunConfig | None = None


def _recipe() -> RunConfig:
    """The embedded default (the built-in model's recipe), as validated, for `inert_keys`."""
    global _RECIPE
    if _RECIPE is None:
        _RECIPE = RunConfig.model_validate(_read_config_file(None))
    return _RECIPE


def _differs(cfg: RunConfig, dotted: str) -> bool:
    """The value at `dotted` is neither the field default nor the embedded recipe's (a dump of either carries it)."""
    try:
        value = _value_at(cfg, dotted)
        return value != _value_at(_defaults(), dotted) and value != _value_at(_recipe(), dotted)
    except AttributeError:  # a free-form dict's key (env.kwargs.x): not a schema field
        return True


def cross_section_problems(cfg: RunConfig) -> list[str]:
    """Combinations that cannot work, and keys set where they take no effect; one line each (empty: fine)."""
    out: list[str] = []
    c = cfg
    stepwise = [p for p in c.control.policies if p in _STEPWISE_POLICIES]
    if stepwise and c.engine.backend == "ray":
        out.append(f"control.policy '{stepwise[0]}' needs engine.backend 'local' or 'remote': it aborts and "
                   "resumes samples mid-generation, which Ray engine actors do not expose")
    if "adaptive" in c.control.policies and c.control.pilot_samples >= c.rollout.samples_per_prompt:
        out.append(f"control.pilot_samples ({c.control.pilot_samples}) must be smaller than "
                   f"rollout.samples_per_prompt ({c.rollout.samples_per_prompt}) for control.policy=adaptive")
    if "knapsack" in c.control.policies and c.control.select != "posterior":
        out.append("control.policy 'knapsack' splits samples by each prompt's pass-rate belief: it needs "
                   "control.select 'posterior'")
    if "knapsack" in c.control.policies and 0 < c.control.max_group < 2:
        out.append(f"control.max_group ({c.control.max_group}) must be at least 2: a group needs two samples to show a mix")
    if c.rollout.speculative.source != "off" and c.engine.backend != "local":
        out.append(f"rollout.speculative.source '{c.rollout.speculative.source}' needs engine.backend 'local': "
                   f"{c.engine.backend} engines take whole batches and no drafts")
    launching = c.engine.backend == "remote" and c.engine.remote_server == "vllm" and c.engine.vllm.launch
    if c.engine.backend == "remote" and not c.engine.remote_urls and not launching:
        out.append("engine.backend 'remote' needs engine.remote_urls (e.g. ['http://127.0.0.1:8000']) or, for vLLM, "
                   "engine.vllm.launch: true")
    if c.train.world_size > 1 and c.train.parallel == "fsdp2" and c.train.lora.enabled:
        out.append("train.parallel 'fsdp2' does not shard LoRA adapters yet: use train.parallel 'ddp' (an adapter is "
                   "small enough to replicate)")
    if c.engine.vllm.lora_adapters and not c.train.lora.enabled:
        out.append("engine.vllm.lora_adapters sends LoRA adapters: it needs train.lora.enabled")
    if c.engine.vllm.lora_adapters and c.engine.vllm.weight_transfer == "nccl":
        out.append("engine.vllm.lora_adapters sends adapter files: it does not combine with weight_transfer 'nccl'")
    if c.engine.vllm.lora_adapters and c.train.lora.r > c.engine.vllm.max_lora_rank:
        out.append(f"train.lora.r ({c.train.lora.r}) is above engine.vllm.max_lora_rank "
                   f"({c.engine.vllm.max_lora_rank}): vLLM would refuse the adapter")
    if c.engine.vllm.weight_transfer == "nccl" and c.model.device == "cpu":
        out.append("engine.vllm.weight_transfer 'nccl' sends CUDA tensors: it needs model.device cuda (use 'disk' "
                   "on a CPU trainer)")
    if launching and c.engine.remote_urls:
        out.append("engine.vllm.launch starts the servers itself: leave engine.remote_urls empty")
    for where, judge in judges_in(c.env.reward, c.env.rewards):
        if judge.model == "builtin:tiny" and c.model.path != "builtin:tiny":
            out.append(f"{where}.model 'builtin:tiny' is the run's own built-in model: it needs model.path "
                       "builtin:tiny (name a checkpoint directory or 'smollm2-135m' otherwise)")
    if c.engine.backend == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            out.append("engine.backend 'ray' needs Ray: pip install 'rollwise[ray]'")
    ov_cache = c.algo.overlong_cache
    if ov_cache is not None and ov_cache > c.rollout.max_tokens:
        out.append(f"algo.overlong_cache ({ov_cache}) must be at most rollout.max_tokens ({c.rollout.max_tokens})")
    if c.model.dtype == "int8" and (c.engine.backend != "local" or c.model.device.startswith("cuda")):
        out.append("model.dtype 'int8' is the in-process CPU engine's weight-only mode: it needs engine.backend "
                   "'local' and model.device cpu or auto (use bfloat16 for remote servers and GPUs)")
    if c.engine.logprobs_mode != "processed":
        out.append("engine.logprobs_mode 'raw' records log-probs of another distribution than the one sampled from: "
                   "the trainer's importance ratios need 'processed'")
    if c.algo.advantage in ("tree", "gae") and c.algo.loss == "gspo":
        out.append(f"algo.advantage '{c.algo.advantage}' gives one advantage per token, and algo.loss 'gspo' takes one "
                   "per sequence: use another loss (grpo, dapo, dr_grpo, ppo) or another estimator")
    if c.algo.advantage == "gae" and c.train.world_size > 1:
        out.append("algo.advantage 'gae' trains its critic on one rank: it needs train.world_size 1 (use a "
                   "group-baseline estimator such as grpo or rloo with several ranks)")
    if c.rollout.temperature == 0:
        out.append("rollout.temperature 0 (greedy) gives every sample of a group the same completion: RL needs "
                   "temperature > 0")
    out.extend(_tree_problems(c))
    out.extend(_distill_problems(c))
    return out


_REWARD_VARIANCE_POLICIES = ("dynamic", "adaptive", "early_stop")
"""Allocations that decide by a group's reward variance (resample, size or stop groups by it)."""


def _distill_problems(c: RunConfig) -> list[str]:
    """algo.distill gives one advantage per token; with reward_weight 0 the reward does not train at all."""
    if c.algo.distill.teacher is None:
        return []
    if c.algo.loss == "gspo":
        return ["algo.distill gives one advantage per token, and algo.loss 'gspo' takes one per sequence: use another "
                "loss (grpo, dapo, dr_grpo, ppo)"]
    if c.algo.advantage == "gae":
        return ["algo.distill's advantage is the teacher's per-token reverse KL (plus the group advantage it weights); "
                "algo.advantage 'gae' computes its own from a critic: use one of them"]
    by_variance = [p for p in c.control.policies if p in _REWARD_VARIANCE_POLICIES]
    if by_variance and c.algo.distill.reward_weight == 0:
        return [f"control.policy '{by_variance[0]}' allocates samples by their rewards' variance, and with "
                "algo.distill.reward_weight 0 the reward does not train: use control.policy 'uniform' (or give the "
                "reward a weight)"]
    return []


_TREE_POLICIES = ("uniform", "dynamic", "early_stop")
"""Allocations whose requests hold a whole group (n = the group size), which a tree needs, and the stopping rule
that reads a tree's leaves as they end; posterior selection composes with them."""


def _tree_problems(c: RunConfig) -> list[str]:
    """rollout.tree needs a request per group on the in-process engine, and nothing that resumes or drafts."""
    if c.rollout.tree.branch == "off":
        return []
    t = f"rollout.tree.branch '{c.rollout.tree.branch}'"
    if c.engine.backend != "local":
        return [f"{t} needs engine.backend 'local': {c.engine.backend} engines sample independent samples only"]
    bad = [p for p in c.control.policies if p not in _TREE_POLICIES]
    if bad:
        return [f"{t} does not combine with control.policy '{bad[0]}' (it splits or resumes a group's samples); "
                f"use one of {', '.join(_TREE_POLICIES)}"]
    if c.rollout.speculative.source != "off":
        return [f"{t} does not combine with rollout.speculative (a tree's children already share their prefix)"]
    if c.env.environment is not None:
        return [f"{t} does not combine with a multi-turn env.environment (episodes are not forked mid-turn)"]
    if c.rollout.tree.roots >= c.rollout.samples_per_prompt:
        return [f"rollout.tree.roots ({c.rollout.tree.roots}) must be smaller than rollout.samples_per_prompt "
                f"({c.rollout.samples_per_prompt}), or nothing branches"]
    return []


def inert_keys(cfg: RunConfig, given: set[str] | list[str]) -> list[str]:
    """Keys the user gave (dotted, from their YAML and --set) with a non-default value where it takes no effect,
    one line each. Values a recipe or a saved run's config.yaml carries are not the user's choice and pass; so do
    the field defaults and the embedded recipe's values written out, which every dump holds (`rollwise train
    --print-config [--defaults]`): a dump of the built-in model's recipe loads with another model.path, its
    warm-up keys inert."""
    out = []
    for key, applies, when in _APPLIES_WHEN:
        touched = sorted(g for g in given if g == key or g.startswith(key + ".") or key.startswith(g + "."))
        if not touched or applies(cfg):
            continue
        # Name the most specific key the user set to a non-default value (e.g. 'warmup.steps', not 'warmup').
        changed = [g for g in touched if g.startswith(key + ".") and _differs(cfg, g)]
        if changed or _differs(cfg, key) and any(not g.startswith(key + ".") for g in touched):
            name = changed[0] if changed else key
            out.append(f"bad config: '{name}' is set but has no effect unless {when}")
    return out


# Keys that may differ between a run's saved config.yaml and the config given with --resume: they change where
# and how fast the run goes, not what it computes.
RESUME_MAY_DIFFER: tuple[str, ...] = (
    "run.out_dir", "run.resume", "run.tensorboard", "run.loggers", "run.checkpoint_every", "run.keep_checkpoints",
    "run.eval_every", "run.eval_samples", "run.cpu_threads", "run.ray_timeout_s", "run.ray_address", "run.num_scorers",
    "train.steps", "engine.max_num_seqs", "engine.max_num_batched_tokens", "engine.num_kv_blocks",
    "engine.kv_cache_gb", "engine.remote_timeout_s", "warmup.cache", "warmup.cache_dir", "model.device",
    "sft.checkpoint_every",
    "run.log_every", "run.max_all_errored_steps",  # what is printed; when a broken reward stops the run
    # the same update at any world size (to float reassociation), and a checkpoint holds full, unsharded state
    "train.world_size", "train.parallel", "train.max_restarts", "run.ray_gpus_per_engine",
    "run.ray_gpus_per_trainer_rank",
    "run.project", "run.run_name",  # where metrics are reported, not what is computed
)


def config_leaves(d: Any, prefix: str = "") -> dict[str, Any]:
    """A config dump (`model_dump(mode='json')`, nested mappings) as {dotted key: leaf value}."""
    if isinstance(d, Mapping):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(config_leaves(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def resume_conflicts(saved: RunConfig, given: RunConfig) -> list[str]:
    """Dotted keys whose values differ between a run's saved config and the one given to resume it, leaving out
    `RESUME_MAY_DIFFER`; each as "key: saved -> given"."""
    a, b = config_leaves(saved.model_dump(mode="json")), config_leaves(given.model_dump(mode="json"))
    free = RESUME_MAY_DIFFER
    diffs = []
    for k in sorted(set(a) | set(b)):
        if any(k == f or k.startswith(f + ".") for f in free):
            continue
        if a.get(k) != b.get(k):
            diffs.append(f"{k}: {json.dumps(a.get(k))} -> {json.dumps(b.get(k))}")
    return diffs


# ------------------------------------------------------------------------------------------------- loading


def default_config_path() -> Path:
    """Path of the embedded default config shipped in the package."""
    return Path(str(resources.files("rollwise") / "configs" / "default.yaml"))


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _unwrap_model(tp: Any) -> type[BaseModel] | None:
    """The BaseModel inside `tp` (or `tp | None`), else None."""
    if _is_model(tp):
        return tp
    for arg in get_args(tp):
        if _is_model(arg):
            return arg
    return None


def valid_keys(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[str]:
    """Every dotted key of the config (sections and leaves), e.g. 'train', 'train.lr', 'train.lora.r'."""
    keys: list[str] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        keys.append(key)
        sub = _unwrap_model(field.annotation)
        if sub is not None:
            keys.extend(valid_keys(sub, key + "."))
    return keys


def _trl_suggestion(parts: list[str], siblings: list[str]) -> str | None:
    """' (did you mean 'x'? TRL's name)' when the last component of `parts` is TRL's name for a rollwise key,
    written at the top level or in any section ('learning_rate', 'algo.beta', 'rollout.num_generations')."""
    name = parts[-1]
    keys = list(config_keys_for(name))
    if not keys:
        return None
    section = ".".join(parts[:-1])
    # The same knob in the section written ('warmup.learning_rate' is warmup.lr, 'sft.max_steps' is sft.steps).
    local = [f"{section}.{k.rsplit('.', 1)[-1]}" for k in keys if k.rsplit(".", 1)[-1] in siblings]
    if section and local:
        keys = local[:1]
    shown = [f"'{k}'" for k in keys]
    choice = " and ".join(shown)
    same = all(k.rsplit(".", 1)[-1] == name for k in keys)  # 'seed', 'temperature': TRL's name is rollwise's too
    return f" (did you mean {choice}?)" if same else f" (did you mean {choice}? '{name}' is TRL's name)"


def _suggest(parts: list[str], i: int, siblings: list[str], all_keys: list[str]) -> str:
    """' (did you mean 'x'?)' for `parts` whose component i is unknown among `siblings`, or ''."""
    bad = parts[i]

    def fix(name: str) -> str:
        return " (did you mean '" + ".".join(parts[:i] + [name] + parts[i + 1:]) + "'?)"

    # 0. TRL's name for a key ('learning_rate', 'algo.beta'): before the prefix rule, which would send
    # 'lr_scheduler_type' to 'lr'; a plural of a sibling ('train.beta' for Adam's 'train.betas') stays in place.
    plural = [s for s in siblings if s in (bad + "s", bad + "es") or bad in (s + "s", s + "es")]
    if plural:
        return fix(plural[0])
    if i == len(parts) - 1:
        trl = _trl_suggestion(parts, siblings)
        if trl is not None:
            return trl
    # 1. A truncated or extended name ('lr_rate' for 'lr', 'out' for 'out_dir'): difflib scores these low.
    pref = sorted((s for s in siblings if bad.startswith(s) or s.startswith(bad)), key=len, reverse=True)
    if pref:
        return fix(pref[0])
    # 2. A key that exists in another section ('rollout.lr' or top-level 'lr' for 'train.lr').
    if i == len(parts) - 1:
        # the shallowest first: 'lr' is train.lr, not the critic's algo.critic.lr
        elsewhere = sorted((k for k in all_keys if k.rsplit(".", 1)[-1] == bad), key=lambda k: k.count("."))
        if elsewhere:
            return f" (did you mean '{elsewhere[0]}'?)"
    # 3. A typo.
    near = difflib.get_close_matches(bad, siblings, n=1, cutoff=0.5)
    if near:
        return fix(near[0])
    by_leaf: dict[str, str] = {}
    for k in sorted(all_keys, key=lambda k: k.count(".")):  # the shallowest key of each leaf name
        by_leaf.setdefault(k.rsplit(".", 1)[-1], k)
    leaf_near = difflib.get_close_matches(parts[-1], list(by_leaf), n=1, cutoff=0.75)
    return f" (did you mean '{by_leaf[leaf_near[0]]}'?)" if leaf_near else ""


class _UnknownKey(ConfigError):
    """One unknown key; `entry` is "'key' (did you mean ...)", for the error that lists them all."""

    def __init__(self, entry: str) -> None:
        super().__init__(f"unknown config key {entry}")
        self.entry = entry


def _unknown_error(entries: list[str]) -> ConfigError:
    """One error for every unknown key found: one named as before, several listed on one line."""
    if len(entries) == 1:
        return _UnknownKey(entries[0])
    return ConfigError(f"{len(entries)} unknown config keys: " + "; ".join(entries))


def _unknown_keys(data: Any, model: type[BaseModel], prefix: str, all_keys: list[str]) -> list[str]:
    """Every unknown key in user data, walked against the models, each as "'key' (did you mean ...)"."""
    if not isinstance(data, dict):
        return []
    fields = model.model_fields
    out: list[str] = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if not isinstance(key, str) or key not in fields:
            parts = prefix.split(".")[:-1] + [str(key)]
            out.append(f"'{dotted}'{_suggest(parts, len(parts) - 1, list(fields), all_keys)}")
            continue
        sub = _unwrap_model(fields[key].annotation)
        if sub is not None and isinstance(value, dict):
            out.extend(_unknown_keys(value, sub, dotted + ".", all_keys))
    return out


def _check_keys(data: Any, model: type[BaseModel], prefix: str, all_keys: list[str]) -> None:
    """Walk user data against the models; fail naming every unknown key, each with a suggestion."""
    unknown = _unknown_keys(data, model, prefix, all_keys)
    if unknown:
        raise _unknown_error(unknown)


def _field_annotation(path: tuple[Any, ...]) -> Any:
    model: Any = RunConfig
    ann: Any = None
    for part in path:
        sub = _unwrap_model(model) if model is not None else None
        if sub is None or not isinstance(part, str) or part not in sub.model_fields:
            return None
        ann = sub.model_fields[part].annotation
        model = ann
    return ann


def _literal_choices(ann: Any) -> list[str]:
    if get_origin(ann) is Literal:
        return [str(a) for a in get_args(ann)]
    out: list[str] = []
    for arg in get_args(ann):
        out.extend(_literal_choices(arg))
    return out


def _validation_message(err: ValidationError) -> str:
    e = err.errors(include_url=False)[0]
    loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p in ("function-after", "function-before")))
    # Union members appear in loc as their type names ('int', 'constrained-float', ...): keep only real keys.
    real: list[Any] = []
    for p in loc:
        if _field_annotation(tuple(real) + (p,)) is not None or (isinstance(p, int) and real):
            real.append(p)
    key = ".".join(str(p) for p in real) if real else "<top>"
    msg = str(e["msg"]).rstrip(".").replace("\n", " ").removeprefix("Value error, ")
    got = e.get("input")
    if e["type"] == "missing":
        if real and isinstance(real[-1], int):  # a tuple given too few items: 'train.betas=[0.9]'
            return f"bad value for config key '{'.'.join(str(p) for p in real[:-1])}': too few items"
        return f"missing config key '{key}'"
    hint = ""
    if e["type"] == "literal_error" and isinstance(got, str):
        choices = _literal_choices(_field_annotation(tuple(real)))
        near = difflib.get_close_matches(got, choices, n=1, cutoff=0.5)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
    shown = json.dumps(got, default=str) if not isinstance(got, str) else repr(got)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    if e["type"] == "value_error":  # our own validators already quote the value
        if msg.startswith((f"{key}.", f"{key}[")):  # a section's validator naming the key itself
            return f"bad config: {msg}"
        return f"bad value for config key '{key}': {msg}" if real else f"bad config: {msg}"
    return f"bad value for config key '{key}': {msg} (got {shown}){hint}"


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"bad override {item!r}: expected KEY=VALUE, e.g. train.lr=1e-4")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"bad override {item!r}: expected KEY=VALUE with a dotted key, e.g. train.lr=1e-4")
    try:
        value = load_yaml(raw, f"override {key}") if raw.strip() else None
    except ConfigYAMLError as e:
        raise ConfigError(str(e)) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"bad override {item!r}: value is not a YAML scalar ({str(e).splitlines()[0]})") from None
    return key.split("."), value


def _apply_override(data: dict[str, Any], parts: list[str], value: Any, all_keys: list[str]) -> None:
    # Check the path before writing, so the error names the first wrong component with a suggestion.
    model: Any = RunConfig
    node = data
    for i, part in enumerate(parts):
        sub = _unwrap_model(model)
        if sub is None:
            if isinstance(node, dict) and i == len(parts) - 1:  # a free-form dict field, e.g. env.kwargs.seed
                node[part] = value
                return
            if isinstance(node, dict):
                node = node.setdefault(part, {})
                continue
            raise ConfigError(f"unknown config key '{'.'.join(parts)}' ('{'.'.join(parts[:i])}' is not a section)")
        if part not in sub.model_fields:
            raise _UnknownKey(f"'{'.'.join(parts)}'{_suggest(parts, i, list(sub.model_fields), all_keys)}")
        if i == len(parts) - 1:
            node[part] = value
            return
        model = sub.model_fields[part].annotation
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt


def field_of(dotted: str) -> tuple[type[BaseModel], str]:
    """The section model and the dotted key of the field `dotted` names ('train.lr' -> (TrainConfig, 'train.lr'));
    a key under a free-form mapping ('env.kwargs.path') gives that mapping's field ('env.kwargs'). ConfigError
    names the closest valid key."""
    parts = dotted.split(".")
    if not dotted or any(not p for p in parts):
        raise ConfigError(f"bad config key {dotted!r}: expected a dotted key, e.g. train.lr")
    model: type[BaseModel] = RunConfig
    all_keys = valid_keys()
    for i, part in enumerate(parts):
        if part not in model.model_fields:
            raise _UnknownKey(f"'{dotted}'{_suggest(parts, i, list(model.model_fields), all_keys)}")
        sub = _unwrap_model(model.model_fields[part].annotation)
        if i == len(parts) - 1 or sub is None:
            if i < len(parts) - 1 and get_origin(model.model_fields[part].annotation) is not dict:
                raise ConfigError(f"unknown config key '{dotted}' ('{'.'.join(parts[:i + 1])}' is not a section)")
            return model, ".".join(parts[:i + 1])
        model = sub
    raise AssertionError("unreachable")  # pragma: no cover


def _dotted_keys(data: Any, prefix: str = "") -> list[str]:
    if not isinstance(data, dict):
        return [prefix[:-1]] if prefix else []
    out = [prefix[:-1]] if prefix and not data else []
    for k, v in data.items():
        out.extend(_dotted_keys(v, f"{prefix}{k}."))
    return out


def _read_config_file(path: str | Path | None) -> dict[str, Any]:
    """The YAML mapping at `path` (the embedded default when None), keys not yet checked."""
    src = default_config_path() if path is None else Path(path)
    try:
        text = src.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {src}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {src}: {e.strerror or e}") from None
    try:
        data = load_yaml(text, str(src))
    except ConfigYAMLError as e:
        raise ConfigError(str(e)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{src}: invalid YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{src}: the config must be a mapping of sections (model:, train:, ...), got {type(data).__name__}")
    return copy.deepcopy(data)


def _refuse_placeholders(data: dict[str, Any], where: str) -> None:
    """A placeholder of an in-memory object (`rollwise.in_memory`) read from YAML or --set: the object is not there."""
    found = placeholders_in(data)
    if found:
        key, text = found[0]
        raise ConfigError(f"{key} in {where} is {text}, the placeholder of an object passed through the Python API "
                          "(the object is not in the file): resume or rerun such a run through the Python API, "
                          "rollwise.train(..., resume=True), passing the same objects")


def _validate(data: dict[str, Any], given: set[str], *, api: bool = False) -> RunConfig:
    try:
        cfg = RunConfig.model_validate(data, context={IN_MEMORY_CONTEXT: True} if api else None)
    except ValidationError as e:
        raise ConfigError(_validation_message(e)) from None
    inert = inert_keys(cfg, given)
    if inert:
        raise ConfigError(inert[0])
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                saved_run: bool = False, defaults: bool = False) -> RunConfig:
    """Read YAML (or the embedded default when `path` is None), apply `a.b=c` overrides, validate.

    `defaults=True` starts from the documented field defaults instead of the embedded default (no file).
    Raises ConfigError with a one-line message on a missing/unreadable file, bad YAML, unknown keys (all of them,
    each with the closest valid key), a bad value (naming the full dotted key), a combination that cannot work, a
    key the user set where it has no effect (`inert_keys`; `saved_run=True` reads a run's resolved config.yaml,
    whose keys were checked when the run started, so only the overrides are checked), or the placeholder of an
    object a run was given through the Python API (`rollwise.in_memory`).
    """
    if defaults and path is not None:
        raise ConfigError(f"the field defaults take no config file (got {path})")
    data: dict[str, Any] = {} if defaults else _read_config_file(path)
    all_keys = valid_keys()
    unknown = _unknown_keys(data, RunConfig, "", all_keys)
    if not unknown and not defaults:
        _refuse_placeholders(data, str(default_config_path() if path is None else path))
    given = set() if (path is None or saved_run) else set(_dotted_keys(data))
    for item in overrides:
        parts, value = _parse_override(item)
        _refuse_placeholders({".".join(parts): value}, "the overrides")
        try:
            _apply_override(data, parts, value, all_keys)
        except _UnknownKey as e:
            unknown.append(e.entry)
            continue
        given.add(".".join(parts))
    if unknown:
        raise _unknown_error(unknown)
    _check_keys(data, RunConfig, "", all_keys)
    return _validate(data, given)


def _flatten(value: Any, prefix: str) -> list[tuple[str, Any]]:
    """A section dict (or pydantic section) as (dotted key, leaf value) assignments, nested dicts merged."""
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_unset=True)
    if isinstance(value, dict) and value:
        out: list[tuple[str, Any]] = []
        for k, v in value.items():
            out.extend(_flatten(v, f"{prefix}.{k}"))
        return out
    return [(prefix, value)]


def build_config(config: str | Path | Mapping[str, Any] | RunConfig | None = None,
                 overrides: Mapping[str, Any] | None = None, *, saved_run: bool = False) -> RunConfig:
    """The run config the Python API (`rollwise.train`) is given: `config` is None (the embedded default), a YAML
    path, a dict of sections as the YAML has them, or a `RunConfig`; `overrides` maps a section name to a dict of
    its keys (`{"train": {"lr": 1e-5}}`, merged key by key) or a dotted key to a value (`{"train.lr": 1e-5}`).
    Values may be Python objects where the config takes code or data by a string (`rollwise.in_memory`).

    Checked exactly as YAML and --set are (unknown keys with the closest valid one, bad values, combinations,
    inert keys), with the same one-line ConfigError; a placeholder string of an in-memory object is refused.
    `saved_run=True`: `config` is a run's own config.yaml (its keys were checked when it started); the
    overrides must then give again every object its placeholders stand for."""
    all_keys = valid_keys()
    if isinstance(config, RunConfig):
        if not overrides:
            return config.model_copy(deep=True)
        data = config.model_dump()
        given: set[str] = set()
    elif isinstance(config, Mapping):
        data = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in config.items()}
        data = _copy_plain(data)
        _check_keys(data, RunConfig, "", all_keys)
        given = set(_dotted_keys(data))
        _refuse_placeholders(data, "the config dict")
    elif config is None or isinstance(config, (str, Path)):
        data = _read_config_file(config)
        _check_keys(data, RunConfig, "", all_keys)
        given = set() if (config is None or saved_run) else set(_dotted_keys(data))
        if not saved_run:
            _refuse_placeholders(data, str(config or default_config_path()))
    else:
        raise ConfigError(f"config must be None, a YAML path, a dict of sections or a RunConfig, got "
                          f"{type(config).__name__}")
    unknown: list[str] = []
    for key, value in (overrides or {}).items():
        if not isinstance(key, str) or not key or any(not p for p in key.split(".")):
            raise ConfigError(f"bad override {key!r}: expected a section name or a dotted key, e.g. train.lr")
        if "." not in key and isinstance(value, (Mapping, BaseModel)) and key in RunConfig.model_fields:
            pairs = _flatten(value, key)
        else:
            pairs = [(key, value)]
        for dotted, leaf in pairs:
            if placeholders_in(leaf):
                _refuse_placeholders({dotted: leaf}, "the overrides")
            try:
                _apply_override(data, dotted.split("."), leaf, all_keys)
            except _UnknownKey as e:
                unknown.append(e.entry)
                continue
            given.add(dotted)
    if unknown:
        raise _unknown_error(unknown)
    _check_keys(data, RunConfig, "", all_keys)
    if saved_run:
        left = placeholders_in(data)
        if left:
            key, text = left[0]
            raise ConfigError(f"{key} in {config} is {text}: pass the same object again to resume the run (e.g. "
                              "env={'reward': fn}, train_dataset=rows, eval_dataset=rows)")
    return _validate(data, given, api=True)


def _copy_plain(data: Any) -> Any:
    """A deep copy of config data that shares (does not copy) the Python objects inside it."""
    if isinstance(data, dict):
        return {k: _copy_plain(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy_plain(v) for v in data]
    return data


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as YAML (what a run directory's config.yaml holds); load_config reads it back."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, default_flow_style=None)


def config_hash(cfg: RunConfig | BaseModel, sections: list[str] | tuple[str, ...] | None = None) -> str:
    """A stable 16-hex-digit hash of the config (or of the named sections only, e.g. ('model', 'warmup') to key a
    cache of warmed-up models). Key order and YAML formatting do not matter; values do."""
    data = cfg.model_dump(mode="json")
    if sections is not None:
        missing = [s for s in sections if s not in data]
        if missing:
            raise ConfigError(f"config_hash: unknown section {missing[0]!r}; known: {', '.join(data)}")
        data = {s: data[s] for s in sections}
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
