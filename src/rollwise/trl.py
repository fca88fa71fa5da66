"""TRL's `GRPOConfig` / `GRPOTrainer`, run by rollwise: a TRL script keeps working with one import changed.

    from rollwise.trl import GRPOConfig, GRPOTrainer     # was: from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir="runs/addition", num_generations=8, per_device_train_batch_size=64,
                      max_completion_length=32, learning_rate=1e-5, max_steps=20)
    trainer = GRPOTrainer(model="smollm2-135m", reward_funcs=sum_correct, args=args, train_dataset=data)
    trainer.train()
    trainer.state.log_history[-1]

This is a translation layer. `GRPOConfig` has TRL's argument names and, for every argument rollwise can
honour, TRL's default. `GRPOTrainer` turns its arguments into a rollwise run config (`to_rollwise`) and calls
`rollwise.train`. The mapping is data (`TRL_FIELDS`: every field of TRL's GRPOConfig, mapped to rollwise keys,
accepted at any value because it changes nothing rollwise computes, or accepted only at TRL's default), and
`mapping_table()` renders it as the table in docs/trl.md.

Nothing is silently ignored: an argument rollwise cannot honour with TRL's meaning (a reward model object, vLLM
colocate mode, `num_iterations` > 1, callbacks, a rollout function, a field without a mapping set to a value other than
TRL's default, ...) fails when the config or the trainer is built, with one line naming it
(`TRLArgumentError`). `args` may also be TRL's own `trl.GRPOConfig`; it is checked the same way.

Units differ, and the translation converts them: TRL's `max_steps`, `warmup_steps`, `save_steps`, `eval_steps`
and `logging_steps` count optimizer steps, rollwise's `train.steps`, `run.checkpoint_every` and
`run.eval_every` count RL steps (one generation batch each, `steps_per_generation /
gradient_accumulation_steps` optimizer steps). A TRL step count that does not fall on an RL step is refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import functools
import inspect
import math
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rollwise.trl_names import TRL_FIELDS, DefaultOnly, Inert, Mapped

__all__ = [
    "GRPOConfig", "GRPOTrainer", "TRLArgumentError", "TRLState", "TrainOutput", "TRL_FIELDS", "Mapped", "Inert",
    "DefaultOnly", "FIXED_SETTINGS", "SAME_NAME_OTHER_MEANING", "check_args", "translate_args", "to_rollwise",
    "mapping_table", "nested",
]


class TRLArgumentError(ValueError):
    """A TRL argument rollwise cannot honour with TRL's meaning; the message is one line and names it."""


# ------------------------------------------------------------------------------------------------ the mapping
# The mapping itself is data in rollwise.trl_names (TRL_FIELDS, Mapped, Inert, DefaultOnly), re-exported here.


FIXED_SETTINGS: dict[str, tuple[Any, str]] = {
    "env.name": ("dataset", "train_dataset / eval_dataset rows, the `prompt` column, every other column a reward "
                            "keyword, as TRL; `env_owned` without a train_dataset (an environment_factory's reset() "
                            "makes each prompt, env.kwargs.rows = generation_batch_size // num_generations)"),
    "env.chat_template": ("true / false", "true for conversational prompts (message lists), false for standard "
                                          "(text) prompts: TRL applies the chat template to conversational data only"),
    "env.kwargs.answer_key": (None, "no column is special: an `answer` column reaches the rewards as `answer=`"),
    "algo.skip_zero_variance": (False, "TRL keeps zero-variance groups in the batch (advantage 0, counted in the "
                                       "dapo normaliser)"),
    "algo.errored_reward": (None, "TRL leaves a completion every reward function returned None for out of the "
                                  "group baseline, with advantage 0; rollwise's closest rule also leaves it out of "
                                  "the loss (so, unlike TRL's, out of the dapo token count), and a None from one of "
                                  "several functions errors the sum (TRL counts it as 0)"),
}
"""Rollwise keys the translation always sets, with no TRL field: (value, why TRL means it)."""

SAME_NAME_OTHER_MEANING: dict[str, str] = {
    "algo.loss: dapo": "rollwise's dapo also turns on overlong filtering, the soft overlong penalty and clip-higher "
                       "(0.28) unless set; TRL's loss_type 'dapo' is only the token-level normaliser (its default "
                       "since TRL 0.2x): the translation sets algo.overlong_filter, algo.overlong_penalty and "
                       "algo.clip_eps_high explicitly",
    "train.steps": "RL steps (one generation batch each); TRL's max_steps counts optimizer steps",
    "train.lr": "the same peak learning rate, but TRL's default schedule is linear decay (rollwise's is constant): "
                "the translation sets train.schedule",
    "run.eval_every": "held-out accuracy (sampled and greedy) every N RL steps, and always before and after; TRL's "
                      "eval_steps computes the loss and rewards on eval_dataset",
    "train.gradient_checkpointing": "the same; TRL's default is True (rollwise's False): the translation keeps True",
    "train.warmup_steps": "the same count of optimizer steps, one step earlier: rollwise's LR at warm-up step t "
                          "(from 0) is (t + 1) / W of the peak, transformers' is t / W (its first step has LR 0)",
    "algo.advantage: dr_grpo": "TRL's scale_rewards 'none' (no std scaling); TRL's loss_type 'dr_grpo' is the loss "
                               "normaliser, algo.loss dr_grpo",
    "rollout.top_p / rollout.top_k": "the same sampling; rollwise's trainer also applies the truncation to its "
                                     "log-probs (the distribution sampled from), TRL's computes them over the whole "
                                     "vocabulary, so with top_p < 1 or top_k > 0 the importance ratios differ",
    "engine.remote_timeout_s": "the longest one request may take; TRL's vllm_server_timeout is how long to wait "
                               "for the server to come up (not mapped)",
}
"""rollwise keys whose name matches a TRL argument but whose meaning differs."""


# ---------------------------------------------------------------------------------------------- the config


_TRL_FIELD_NAMES = frozenset(TRL_FIELDS)


@dataclass
class GRPOConfig:
    """TRL's GRPOConfig arguments rollwise honours, with TRL's defaults. Any other field of TRL's GRPOConfig may
    be given by name: accepted at TRL's default (or at any value where it changes nothing), else refused here
    (`TRLArgumentError`). An unknown name is refused with the closest valid one."""

    output_dir: str | None = None
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    num_generations: int = 8
    generation_batch_size: int | None = None
    steps_per_generation: int | None = None
    max_completion_length: int | None = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    loss_type: str = "dapo"
    beta: float = 0.0
    use_bias_correction_kl: bool = True
    epsilon: float = 0.2
    epsilon_high: float | None = None
    scale_rewards: str | bool = "group"
    importance_sampling_level: str = "token"
    mask_truncated_completions: bool = False
    num_iterations: int = 1
    reward_weights: list[float] | None = None
    learning_rate: float = 1e-6
    lr_scheduler_type: str = "linear"
    warmup_steps: float = 0
    warmup_ratio: float = 0.0
    """Older transformers' name for a fractional warm-up (warmup_steps below 1 in current TRL)."""
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    optim: str = "adamw_torch_fused"
    max_grad_norm: float | None = 1.0
    max_steps: int = -1
    num_train_epochs: float = 3.0
    seed: int = 42
    bf16: bool | None = None
    gradient_checkpointing: bool = True
    use_cpu: bool = False
    logging_steps: float = 10
    report_to: str | list[str] | None = "none"
    run_name: str | None = None
    save_strategy: str = "steps"
    save_steps: float = 500
    save_total_limit: int | None = None
    eval_strategy: str = "no"
    eval_steps: float | None = None
    log_completions: bool = False
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_server_base_url: str | None = None
    vllm_server_host: str = "0.0.0.0"
    vllm_server_port: int = 8000
    vllm_importance_sampling_correction: bool = True
    vllm_importance_sampling_mode: str = "sequence_mask"
    vllm_importance_sampling_clip_max: float | None = 3.0
    vllm_importance_sampling_clip_min: float | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    other: dict[str, Any] = field(default_factory=dict)
    """The other TRL fields given (each at a value `check_args` accepts)."""

    def __post_init__(self) -> None:
        check_args(self)
        batch_shape(self)
        if self.max_steps is not None and self.max_steps > 0:
            translate_args(self)  # the step counts (with num_train_epochs they need the dataset: GRPOTrainer)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not dataclass fields: the other TRL fields, at their TRL default.
        if name in _TRL_FIELD_NAMES and name != "other":
            other = self.__dict__.get("other", {})
            return other.get(name, _trl_default(name))
        raise AttributeError(f"GRPOConfig has no attribute {name!r}")


_DATACLASS_INIT = GRPOConfig.__init__
_OWN_FIELDS = frozenset(f.name for f in dataclasses.fields(GRPOConfig)) - {"other"}


def _config_init(self: GRPOConfig, *args: Any, **kwargs: Any) -> None:
    """The dataclass __init__, plus any other TRL field by name (kept in `other`); an unknown name is refused.
    Only output_dir may be positional (as TRL's first argument)."""
    if len(args) > 1:
        raise TRLArgumentError("GRPOConfig: pass the arguments by name (only output_dir may be positional)")
    if args:
        kwargs["output_dir"] = args[0]
    other: dict[str, Any] = dict(kwargs.pop("other", None) or {})
    for name in list(kwargs):
        if name in _OWN_FIELDS:
            continue
        if name not in _TRL_FIELD_NAMES:
            near = difflib.get_close_matches(name, sorted(_OWN_FIELDS | _TRL_FIELD_NAMES), n=1, cutoff=0.6)
            raise TRLArgumentError(f"GRPOConfig: unknown argument {name!r}"
                                   + (f" (did you mean {near[0]!r}?)" if near else ""))
        other[name] = kwargs.pop(name)
    _DATACLASS_INIT(self, **kwargs, other=other)


setattr(GRPOConfig, "__init__", functools.wraps(_DATACLASS_INIT)(_config_init))  # noqa: B010 - mypy refuses a method assignment


_TRL_DEFAULTS: dict[str, Any] = {
    # TRL 1.16.0's defaults of the fields without a rollwise mapping (checked against the installed TRL by
    # tests/test_trl.py): the value a field must keep to be accepted.
    "min_p": None, "repetition_penalty": 1.0, "generation_kwargs": None, "cache_implementation": None,
    "num_generations_eval": None, "vllm_structured_outputs_regex": None,
    "delta": None, "sapo_temperature_neg": 1.05, "sapo_temperature_pos": 1.0, "vespo_k_pos": 2.0,
    "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0,
    "multi_objective_aggregation": "sum_then_normalize", "sync_ref_model": False, "ref_model_mixup_alpha": 0.6,
    "ref_model_sync_steps": 512, "top_entropy_quantile": 1.0, "entropy_coef": 0.0, "use_adaptive_entropy": False,
    "entropy_coef_min": 0.0, "entropy_coef_max": 1.0, "entropy_coef_delta": 0.005, "entropy_target": 0.2,
    "off_policy_mask_threshold": None, "router_aux_loss_coef": None, "label_smoothing_factor": 0.0,
    "neftune_noise_alpha": None, "average_tokens_across_devices": True, "cast_lm_head_to_fp32": False,
    "disable_dropout": False, "vllm_model_impl": "vllm", "vllm_enable_sleep_mode": False,
    "vllm_gpu_memory_utilization": 0.3, "vllm_max_model_length": None, "vllm_tensor_parallel_size": 1,
    "vllm_group_port": 51216, "vllm_server_timeout": 240.0, "vllm_importance_sampling_cap": None,
    "ds3_gather_for_generation": True, "model_init_kwargs": None, "trust_remote_code": False,
    "remove_unused_columns": False, "shuffle_dataset": True, "data_seed": None, "train_sampling_strategy": "random",
    "length_column_name": "length", "label_names": None, "pad_to_multiple_of": "auto", "dataloader_drop_last": False,
    "dataloader_in_order": True, "ignore_data_skip": False, "max_tool_calling_iterations": None,
    "log_multimodal": True, "num_completions_to_print": None, "log_unique_prompts": False,
    "log_completions_hub_repo": None, "logging_strategy": "steps", "logging_first_step": False,
    "logging_nan_inf_filter": True, "include_num_input_tokens_seen": "no", "project": "huggingface",
    "trackio_space_id": None, "trackio_bucket_id": None, "trackio_static_space_id": None,
    "use_transformers_continuous_batching": False, "transformers_continuous_batching_config": None,
    "use_transformers_paged": False, "fp16": False, "bf16_full_eval": False, "fp16_full_eval": False, "tf32": None,
    "torch_compile": False, "torch_compile_backend": None, "torch_compile_mode": None, "use_liger_kernel": False,
    "liger_kernel_config": None, "use_cache": False, "torch_empty_cache_steps": None,
    "activation_checkpointing": None, "activation_checkpointing_kwargs": None, "gradient_checkpointing_kwargs": None,
    "optim_args": None, "optim_target_modules": None, "lr_scheduler_kwargs": None, "auto_find_batch_size": False,
    "full_determinism": False, "accelerator_config": None, "parallelism_config": None,
    "ddp_find_unused_parameters": None, "ddp_bucket_cap_mb": None, "ddp_broadcast_buffers": None,
    "ddp_static_graph": None, "ddp_backend": None, "fsdp": None, "fsdp_config": None, "deepspeed": None, "debug": "",
    "eval_delay": 0, "prediction_loss_only": False, "eval_do_concat_batches": True, "eval_use_gather_object": False,
    "eval_accumulation_steps": None, "include_for_metrics": [], "batch_eval_metrics": False,
    "load_best_model_at_end": False, "metric_for_best_model": None, "greater_is_better": None,
    "save_only_model": False, "save_on_each_node": False, "enable_jit_checkpoint": False, "push_to_hub": False,
    "hub_token": None, "hub_private_repo": None, "hub_model_id": None, "hub_strategy": "every_save",
    "hub_always_push": False, "hub_revision": None, "restore_callback_states_from_checkpoint": False,
    "resume_from_checkpoint": None,
    # inert fields (any value is accepted; these are TRL's defaults)
    "eval_on_start": False, "per_device_eval_batch_size": 8, "disable_tqdm": None, "log_level": "passive",
    "log_level_replica": "warning", "log_on_each_node": True, "dataloader_num_workers": 0,
    "dataloader_pin_memory": True, "dataloader_persistent_workers": False, "dataloader_prefetch_factor": None,
    "ddp_timeout": 1800, "skip_memory_metrics": True, "do_train": False, "do_eval": False, "do_predict": False,
    "local_rank": -1, "dataloader_multiprocessing_context": None,
}


def _trl_default(name: str) -> Any:
    if name in _TRL_DEFAULTS:
        return _TRL_DEFAULTS[name]
    for f in dataclasses.fields(GRPOConfig):
        if f.name == name and f.default is not dataclasses.MISSING:
            return f.default
    raise KeyError(name)


# ---------------------------------------------------------------------------------------------- checking


def _s(v: Any) -> Any:
    """A value as plain data: transformers' str enums (SchedulerType, IntervalStrategy, ...) as their strings."""
    value = getattr(v, "value", None)
    return value if isinstance(value, str) else v


def _refuse(name: str, value: Any, why: str) -> TRLArgumentError:
    shown = repr(_s(value))
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return TRLArgumentError(f"GRPOConfig.{name}={shown} is not supported by rollwise: {why}")


_REAL_TRL_REFERENCE: dict[tuple[type, Any, Any], Any] = {}


def _reference(args: Any) -> Callable[[str], Any]:
    """What counts as a field's default for `args`: TRL's default for rollwise's GRPOConfig, and for TRL's own
    GRPOConfig the value a freshly built one holds (its __post_init__ resolves some defaults: 'auto', enums)."""
    if isinstance(args, GRPOConfig):
        return _trl_default
    cls = type(args)
    # the mapped fields transformers validates against the machine (bf16 on a CPU) are taken from `args`
    key = (cls, getattr(args, "bf16", None), getattr(args, "use_cpu", False))
    if key not in _REAL_TRL_REFERENCE:
        _REAL_TRL_REFERENCE[key] = cls(output_dir=getattr(args, "output_dir", None) or "trainer_output",
                                       bf16=key[1], use_cpu=key[2])
    ref = _REAL_TRL_REFERENCE[key]
    return lambda name: getattr(ref, name, None)


def _same(a: Any, b: Any) -> bool:
    a, b = _s(a), _s(b)
    if a == b:
        return True
    empty: tuple[Any, ...] = (None, "", [], {}, (), "none")
    return a in empty and b in empty or repr(a) == repr(b)


def check_args(args: Any) -> None:
    """Raise `TRLArgumentError` (one line, naming the argument) for the first field of `args` (rollwise's or
    TRL's GRPOConfig) rollwise cannot honour with TRL's meaning. The batch, step and schedule arithmetic is
    checked by `translate_args`."""
    default = _reference(args)
    for name, entry in TRL_FIELDS.items():
        if isinstance(entry, DefaultOnly):
            if not hasattr(args, name):
                continue
            value = getattr(args, name)
            if not _same(value, default(name)):
                raise _refuse(name, value, f"{entry.reason} (only TRL's default {_s(default(name))!r} is accepted)")
    _check_mapped_values(args)


_LOSSES = {"grpo": "grpo", "dr_grpo": "dr_grpo", "dapo": "dapo"}
_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
_LOGGERS = ("tensorboard", "wandb", "mlflow")


def _check_mapped_values(a: Any) -> None:
    loss = _s(a.loss_type)
    if loss not in _LOSSES:
        raise _refuse("loss_type", loss, "rollwise has grpo, dr_grpo and dapo with TRL's meaning (bnpo normalises "
                                          "per micro-batch; cispo, sapo, luspo and vespo are not implemented)")
    level = _s(a.importance_sampling_level)
    if level not in ("token", "sequence"):
        raise _refuse("importance_sampling_level", level, "expected 'token' or 'sequence'")
    if level == "sequence" and loss != "grpo":
        raise _refuse("importance_sampling_level", level, f"sequence-level ratios are rollwise's gspo loss, which "
                                                          f"aggregates as TRL's loss_type 'grpo', not {loss!r}")
    scale = _scale(a)
    if scale not in ("group", "none"):
        raise _refuse("scale_rewards", scale, "TRL's batch scaling divides by the std of the raw rewards, which no "
                                              "rollwise estimator does (reinforce_pp whitens the centred ones)")
    if a.num_iterations != 1:
        raise _refuse("num_iterations", a.num_iterations, "rollwise trains each mini-batch once per generation "
                                                          "(use steps_per_generation for several optimizer steps)")
    if a.beta and a.use_bias_correction_kl:
        raise _refuse("use_bias_correction_kl", True, "with beta > 0 TRL weights the KL term by the importance "
                                                      "ratio, rollwise does not: set use_bias_correction_kl=False")
    if a.num_generations < 2:
        raise _refuse("num_generations", a.num_generations, "GRPO needs at least 2 completions per prompt")
    if a.max_completion_length is None:
        raise _refuse("max_completion_length", None, "rollwise needs a completion length limit")
    if _s(a.optim) not in ("adamw_torch", "adamw_torch_fused"):
        raise _refuse("optim", a.optim, "rollwise's optimiser is torch's AdamW (adamw_torch, adamw_torch_fused)")
    sched = _s(a.lr_scheduler_type)
    if sched not in _SCHEDULES:
        raise _refuse("lr_scheduler_type", sched, f"rollwise has {', '.join(_SCHEDULES)}")
    if sched == "constant" and (_warmup_fraction(a) or _warmup_count(a)):
        raise _refuse("lr_scheduler_type", sched, "TRL's 'constant' schedule has no warm-up, and a warm-up is set: "
                                                  "use 'constant_with_warmup'")
    if _warmup_fraction(a) and _warmup_count(a):
        raise _refuse("warmup_ratio", getattr(a, "warmup_ratio", 0.0), "set warmup_steps or warmup_ratio, not both")
    if _s(a.save_strategy) not in ("steps", "no"):
        raise _refuse("save_strategy", a.save_strategy, "rollwise saves every N RL steps ('steps') or at the end "
                                                        "('no')")
    if a.save_total_limit is not None and a.save_total_limit < 1:
        raise _refuse("save_total_limit", a.save_total_limit, "rollwise keeps at least the newest checkpoint")
    if _s(a.eval_strategy) not in ("no", "steps"):
        raise _refuse("eval_strategy", a.eval_strategy, "rollwise evaluates every N RL steps ('steps') or before "
                                                        "and after only ('no')")
    for name in _report_to(a):
        if name not in _LOGGERS:
            raise _refuse("report_to", a.report_to, f"rollwise logs to {', '.join(_LOGGERS)} (and metrics.jsonl)")
    if a.use_vllm:
        if _s(a.vllm_mode) != "server":
            raise _refuse("vllm_mode", a.vllm_mode, "rollwise drives vLLM as separate servers (vllm_mode='server'); "
                                                    "colocated vLLM is not supported")
        if a.vllm_importance_sampling_correction:
            mode = _s(a.vllm_importance_sampling_mode)
            if mode not in _TRL_CORRECTION_MODES:
                raise _refuse("vllm_importance_sampling_mode", mode,
                              f"expected one of {', '.join(_TRL_CORRECTION_MODES)}")
            lo, hi = a.vllm_importance_sampling_clip_min, a.vllm_importance_sampling_clip_max
            if mode.endswith("_truncate") and hi is None:
                raise _refuse("vllm_importance_sampling_clip_max", None,
                              f"{mode} needs an upper bound (a truncated weight is never left unbounded)")
            if lo is None and hi is None:
                raise _refuse("vllm_importance_sampling_clip_max", None, f"{mode} with neither bound masks nothing: "
                                                                         "set a bound or "
                                                                         "vllm_importance_sampling_correction=False")
            for name, v in (("vllm_importance_sampling_clip_min", lo), ("vllm_importance_sampling_clip_max", hi)):
                if v is not None and not v > 0:
                    raise _refuse(name, v, "importance-ratio bounds are positive")
            if lo is not None and hi is not None and lo > hi:
                raise _refuse("vllm_importance_sampling_clip_min", lo, "above vllm_importance_sampling_clip_max")


_TRL_CORRECTION_MODES = {"token_truncate": "tis", "token_mask": "token_mask", "sequence_truncate": "sequence_truncate",
                         "sequence_mask": "sequence_mask"}
"""TRL's vllm_importance_sampling_mode -> algo.correction.mode (TRL's sequence ratio is the product of the token
ratios: algo.correction.sequence_ratio 'product')."""


def _scale(a: Any) -> Any:
    """scale_rewards with TRL's booleans read as their names (True: 'group', False: 'none')."""
    v = a.scale_rewards
    return ("group" if v else "none") if isinstance(v, bool) else _s(v)


def _report_to(a: Any) -> list[str]:
    r = a.report_to
    names = [r] if isinstance(r, str) else list(r or [])
    return [n for n in names if n != "none"]


def _output_dir(a: Any) -> str:
    return str(a.output_dir) if a.output_dir is not None else "trainer_output"


def _warmup_fraction(a: Any) -> float:
    ratio = float(getattr(a, "warmup_ratio", 0.0) or 0.0)
    ws = float(a.warmup_steps or 0)
    return ws if 0 < ws < 1 else ratio


def _warmup_count(a: Any) -> int:
    ws = float(a.warmup_steps or 0)
    return int(ws) if ws >= 1 else 0


# ---------------------------------------------------------------------------------------------- translating


@dataclass(frozen=True)
class Batch:
    """TRL's batch arithmetic in rollwise's terms."""

    prompts_per_step: int
    samples_per_prompt: int
    updates_per_step: int
    """Optimizer steps per generation (TRL's steps_per_generation / gradient_accumulation_steps)."""


def batch_shape(a: Any) -> Batch:
    """Prompts and completions per generation, optimizer steps per generation, from TRL's batch arguments (one
    process: the per-device batch is the global one)."""
    per, accum, g = int(a.per_device_train_batch_size), int(a.gradient_accumulation_steps), int(a.num_generations)
    gbs, spg = a.generation_batch_size, a.steps_per_generation
    if gbs is not None and spg is not None and gbs != per * spg:
        raise _refuse("generation_batch_size", gbs, "set generation_batch_size or steps_per_generation, not both")
    if gbs is None:
        spg = accum if spg is None else int(spg)
        gbs = per * spg
    elif spg is None:
        if gbs % per:
            raise _refuse("generation_batch_size", gbs, f"must be a multiple of per_device_train_batch_size ({per})")
        spg = gbs // per
    if gbs % g:
        raise _refuse("num_generations", g, f"the generation batch ({gbs} completions) must be a whole number of "
                                            f"groups of num_generations")
    if spg % accum:
        raise _refuse("steps_per_generation", spg, f"must be a multiple of gradient_accumulation_steps ({accum}): "
                                                   "rollwise takes whole optimizer steps from one generation")
    return Batch(prompts_per_step=gbs // g, samples_per_prompt=g, updates_per_step=spg // accum)


def _rl_steps(name: str, value: float, b: Batch, total_opt: int | None) -> int:
    """A TRL count of optimizer steps (or a fraction of them, below 1) as a whole number of RL steps; a period
    (total_opt given) at or past the run's end is 0 (nothing falls due before the end)."""
    opt = math.ceil(value * total_opt) if 0 < value < 1 and total_opt is not None else int(value)
    if total_opt is not None and opt >= total_opt:
        return 0
    if value <= 0 or opt % b.updates_per_step:
        raise _refuse(name, value, f"{opt} optimizer steps is not a whole number of RL steps "
                                   f"({b.updates_per_step} optimizer steps each)")
    return opt // b.updates_per_step


def translate_args(a: Any, *, num_train_prompts: int | None = None) -> dict[str, Any]:
    """The rollwise config keys (dotted) that `a` (rollwise's or TRL's GRPOConfig) means. `num_train_prompts` (the
    training set's length) is needed when max_steps <= 0 (the length comes from num_train_epochs). Raises
    `TRLArgumentError` for what cannot be honoured."""
    check_args(a)
    b = batch_shape(a)
    out: dict[str, Any] = {
        "rollout.prompts_per_step": b.prompts_per_step, "rollout.samples_per_prompt": b.samples_per_prompt,
        "rollout.max_tokens": int(a.max_completion_length), "rollout.temperature": float(a.temperature),
        "rollout.top_p": float(a.top_p), "rollout.top_k": int(a.top_k) if a.top_k and a.top_k > 0 else -1,
    }
    if b.updates_per_step != 1:
        out["train.updates_per_step"] = b.updates_per_step
    # steps
    if a.max_steps is not None and a.max_steps > 0:
        steps = _rl_steps("max_steps", a.max_steps, b, None)
    else:
        if num_train_prompts is None:
            raise _refuse("max_steps", a.max_steps, "set max_steps: the training set's length is unknown, so "
                                                    "num_train_epochs gives no step count")
        per_epoch = num_train_prompts // b.prompts_per_step
        if per_epoch < 1:
            raise _refuse("per_device_train_batch_size", a.per_device_train_batch_size,
                          f"one generation takes {b.prompts_per_step} prompts and train_dataset has "
                          f"{num_train_prompts}")
        steps = math.ceil(float(a.num_train_epochs) * per_epoch)
    total_opt = steps * b.updates_per_step
    out["train.steps"] = steps
    # loss
    loss = _s(a.loss_type)
    level = _s(a.importance_sampling_level)
    out["algo.loss"] = "gspo" if level == "sequence" else _LOSSES[loss]
    out["algo.overlong_filter"] = bool(a.mask_truncated_completions)
    out["algo.overlong_penalty"] = False
    out["algo.clip_eps_low"] = float(a.epsilon)
    out["algo.clip_eps_high"] = float(a.epsilon_high if a.epsilon_high is not None else a.epsilon)
    scale = _scale(a)
    out["algo.advantage"] = "grpo" if scale == "group" else "dr_grpo"
    if scale == "group":
        out["algo.adv_eps"] = 1e-4
    out["algo.kl_coef"] = float(a.beta)
    if a.beta:
        out["algo.kl_estimator"] = "k3"
    out["algo.skip_zero_variance"] = False
    out["algo.errored_reward"] = None
    # optimiser and schedule
    out["train.lr"] = float(a.learning_rate)
    out["train.weight_decay"] = float(a.weight_decay)
    out["train.betas"] = [float(a.adam_beta1), float(a.adam_beta2)]
    out["train.adam_eps"] = float(a.adam_epsilon)
    out["train.grad_clip"] = float(a.max_grad_norm) if a.max_grad_norm else None
    sched = _SCHEDULES[_s(a.lr_scheduler_type)]
    out["train.schedule"] = sched
    if sched != "constant":
        out["train.min_lr_ratio"] = 0.0
    frac, count = _warmup_fraction(a), _warmup_count(a)
    warm = math.ceil(frac * total_opt) if frac else count
    if _s(a.lr_scheduler_type) != "constant":
        out["train.warmup_steps"] = warm
    out["train.seed"] = int(a.seed)
    # TRL's None means "bf16 unless fp16": rollwise's 'auto' (bf16 where the device runs it natively)
    out["train.bf16"] = bool(a.bf16) if a.bf16 is not None else (False if getattr(a, "fp16", False) else "auto")
    out["train.gradient_checkpointing"] = bool(a.gradient_checkpointing)
    if a.chat_template_kwargs:
        out["env.chat_template_kwargs"] = dict(a.chat_template_kwargs)
    if a.use_cpu:
        out["model.device"] = "cpu"
    # logging, saving, evaluation
    out["run.out_dir"] = _output_dir(a)
    if a.run_name is not None:
        out["run.run_name"] = str(a.run_name)
    out["run.loggers"] = ["jsonl", *_report_to(a)]
    if _s(a.save_strategy) == "no":
        out["run.checkpoint_every"] = 0
    else:
        out["run.checkpoint_every"] = _rl_steps("save_steps", a.save_steps, b, total_opt)
    out["run.keep_checkpoints"] = a.save_total_limit
    if _s(a.eval_strategy) == "steps":
        every = a.eval_steps if a.eval_steps is not None else a.logging_steps
        out["run.eval_every"] = _rl_steps("eval_steps", every, b, total_opt)
    else:
        out["run.eval_every"] = 0
    # vLLM
    if a.use_vllm:
        url = a.vllm_server_base_url or f"http://{a.vllm_server_host}:{a.vllm_server_port}"
        out["engine.backend"] = "remote"
        out["engine.remote_server"] = "vllm"
        out["engine.remote_urls"] = [str(url).rstrip("/")]
        if a.vllm_importance_sampling_correction:
            mode = _TRL_CORRECTION_MODES[_s(a.vllm_importance_sampling_mode)]
            out["algo.correction.mode"] = mode
            lo, hi = a.vllm_importance_sampling_clip_min, a.vllm_importance_sampling_clip_max
            out["algo.correction.low"] = float(lo) if lo is not None else None
            out["algo.correction.high"] = float(hi) if hi is not None else None
            if mode.startswith("sequence_"):
                out["algo.correction.sequence_ratio"] = "product"
    return out


def logging_window(a: Any, rl_steps: int) -> int:
    """TRL's logging_steps (optimizer steps; below 1: a fraction of the run's) as RL steps per log_history entry,
    rounded up to whole RL steps (it shapes only `GRPOTrainer.state.log_history`)."""
    b = batch_shape(a)
    value = float(a.logging_steps)
    if 0 < value < 1:
        value = math.ceil(value * rl_steps * b.updates_per_step)
    return max(1, math.ceil(value / b.updates_per_step))


# ---------------------------------------------------------------------------------------------- the trainer


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def _run_coroutine(coro: Any) -> Any:
    """Run `coro` to completion from synchronous code (in a new thread when this one already runs a loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _sync_reward(fn: Callable[..., Any]) -> Callable[..., Any]:
    """An async reward function as a synchronous one with the same signature and name (TRL takes both)."""
    if not _is_async(fn):
        return fn

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return _run_coroutine(fn(*args, **kwargs))

    return call


def _reward_name(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def _reward_model_name(path: str) -> str:
    """TRL's name for a reward model: the last part of the path or hub id it was loaded from."""
    return path.rstrip("/").rsplit("/", 1)[-1] or "reward_model"


def _reward_tokenizers(classes: Any, funcs: list[Any]) -> list[str | None]:
    """reward_processing_classes as each reward model's `tokenizer` directory (None: the model's own). As TRL, one
    class stands for a single reward, entries for reward functions are ignored; a tokenizer rollwise cannot load
    from a directory is refused."""
    if classes is None:
        return [None] * len(funcs)
    items = list(classes) if isinstance(classes, (list, tuple)) else [classes]
    if len(items) != len(funcs):
        raise TRLArgumentError(f"GRPOTrainer: reward_processing_classes has {len(items)} entries for {len(funcs)} "
                               "reward functions (one per reward, as TRL)")
    out: list[str | None] = []
    for i, (tok, fn) in enumerate(zip(items, funcs)):
        if tok is None or not isinstance(fn, (str, Path)):
            out.append(None)
            continue
        where = str(getattr(tok, "name_or_path", "") or "")
        if not where or not Path(where).is_dir():
            raise TRLArgumentError(f"GRPOTrainer: reward_processing_classes[{i}] was not loaded from a directory; "
                                   "rollwise loads the reward model's tokenizer itself: save it "
                                   "(tokenizer.save_pretrained(dir)) and pass AutoTokenizer.from_pretrained(dir)")
        out.append(where)
    return out


def _rewards(reward_funcs: Any, weights: Sequence[float] | None, *, env_scores: bool = False,
             processing_classes: Any = None) -> list[dict[str, Any]]:
    """env.rewards from reward_funcs (a string is a reward model's path, as TRL loads it: `reward_model` items); none
    at all only when an environment class has get_reward (`env_scores`: as TRL, the episodes of a class without one
    then have no reward: errored, left out as TRL leaves a None reward)."""
    if reward_funcs is None:
        reward_funcs = []
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        if env_scores:
            if weights:
                raise _refuse("reward_weights", list(weights), "there are no reward_funcs to weight (get_reward "
                                                               "has weight 1, as TRL)")
            return []
        raise TRLArgumentError("GRPOTrainer: no reward source: pass reward_funcs, or an environment_factory whose "
                               "environment defines a get_reward() method")
    for i, fn in enumerate(funcs):
        where = "reward_funcs" if len(funcs) == 1 else f"reward_funcs[{i}]"
        if isinstance(fn, (str, Path)):
            if not str(fn).strip():
                raise TRLArgumentError(f"GRPOTrainer: {where} is an empty string (a reward model's path)")
            continue
        if _is_module(fn):
            raise TRLArgumentError(f"GRPOTrainer: {where} is a {type(fn).__name__} object; rollwise loads reward "
                                   "models itself: pass the model's directory as a string, as TRL takes it")
        if not callable(fn):
            raise TRLArgumentError(f"GRPOTrainer: {where} is a {type(fn).__name__}, not a reward function or a "
                                   "reward model's path")
    if weights is not None and len(weights) != len(funcs):
        raise _refuse("reward_weights", list(weights), f"{len(weights)} weights for {len(funcs)} reward functions")
    tokenizers = _reward_tokenizers(processing_classes, funcs)
    out: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, fn in enumerate(funcs):
        is_model = isinstance(fn, (str, Path))
        name = _reward_model_name(str(fn)) if is_model else _reward_name(fn)
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name}_{seen[name]}"
        weight = float(weights[i]) if weights is not None else 1.0
        if is_model:
            rm: dict[str, Any] = {"path": str(fn)}
            if tokenizers[i] is not None:
                rm["tokenizer"] = tokenizers[i]
            out.append({"reward_model": rm, "weight": weight, "name": name})
        else:
            out.append({"fn": _sync_reward(fn), "weight": weight, "name": name})
    return out


def _is_module(obj: Any) -> bool:
    return any(c.__name__ in ("Module", "PreTrainedModel") for c in type(obj).__mro__)


def _rows(dataset: Any, name: str, *, prompt_optional: bool = False) -> Any:
    """A TRL dataset (datasets.Dataset or a list of dicts) as rollwise takes it; refused otherwise. With an
    environment (`prompt_optional`), rows without a prompt get an empty user message, which `reset` fills (TRL's)."""
    cls = type(dataset).__name__
    if cls in ("IterableDataset", "IterableDatasetDict"):
        raise TRLArgumentError(f"GRPOTrainer: {name} is an {cls}: rollwise reads the rows into memory; pass a "
                               "datasets.Dataset or a list of dicts")
    if cls == "DatasetDict" or isinstance(dataset, Mapping):
        raise TRLArgumentError(f"GRPOTrainer: {name} is a {cls}: pass one split, e.g. dataset['train']")
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise TRLArgumentError(f"GRPOTrainer: {name} is a {cls}: pass a datasets.Dataset or a list of dicts")
    if len(dataset) == 0:
        raise TRLArgumentError(f"GRPOTrainer: {name} is empty")
    first = dataset[0]
    if prompt_optional and isinstance(first, Mapping) and "prompt" not in first:
        return [{"prompt": [{"role": "user", "content": ""}], **dict(row)} for row in dataset]
    if not isinstance(first, Mapping) or "prompt" not in first:
        cols = ", ".join(map(str, first)) if isinstance(first, Mapping) else type(first).__name__
        raise TRLArgumentError(f"GRPOTrainer: {name} rows need a 'prompt' column, as TRL's (got: {cols})")
    return dataset


def _conversational(dataset: Any) -> bool:
    return isinstance(dataset[0]["prompt"], list)


def _lora(peft_config: Any) -> dict[str, Any]:
    """peft's LoraConfig as train.lora; anything rollwise's LoRA does not have is refused."""
    if type(peft_config).__name__ != "LoraConfig":
        raise TRLArgumentError(f"GRPOTrainer: peft_config is a {type(peft_config).__name__}; rollwise trains LoRA "
                               "adapters only (peft.LoraConfig)")
    for attr, ok in (("use_dora", False), ("use_rslora", False), ("bias", "none"), ("modules_to_save", None),
                     ("init_lora_weights", True), ("layers_to_transform", None), ("rank_pattern", {}),
                     ("alpha_pattern", {})):
        value = getattr(peft_config, attr, ok)
        if not _same(value, ok):
            raise TRLArgumentError(f"GRPOTrainer: peft_config.{attr}={value!r} is not supported by rollwise "
                                   f"(train.lora has r, alpha, dropout and target_modules)")
    targets = peft_config.target_modules
    if targets is None or isinstance(targets, str):
        raise TRLArgumentError(f"GRPOTrainer: peft_config.target_modules={targets!r}: name the modules as a list "
                               "(e.g. ['q_proj', 'k_proj', 'v_proj', 'o_proj'])")
    return {"train.lora.enabled": True, "train.lora.r": int(peft_config.r),
            "train.lora.alpha": float(peft_config.lora_alpha), "train.lora.dropout": float(peft_config.lora_dropout),
            "train.lora.target_modules": sorted(map(str, targets))}


def to_rollwise(model: Any, reward_funcs: Any, args: Any, train_dataset: Any, eval_dataset: Any = None, *,
                peft_config: Any = None, environment_factory: Any = None,
                reward_processing_classes: Any = None) -> dict[str, Any]:
    """The whole rollwise run config (dotted keys) a GRPOTrainer's arguments mean; values may be in-memory objects
    (reward callables, datasets, environment classes) where `rollwise.train` takes them."""
    if not isinstance(model, (str, Path)):
        raise TRLArgumentError(f"GRPOTrainer: model is a {type(model).__name__}; rollwise loads the model itself: "
                               "pass its path or name (e.g. 'smollm2-135m' or an HF checkpoint directory)")
    envs = _environments(environment_factory)
    if train_dataset is None:
        out = _env_owned(args, envs)
    else:
        train = _rows(train_dataset, "train_dataset", prompt_optional=envs is not None)
        test = _rows(eval_dataset, "eval_dataset", prompt_optional=envs is not None) if eval_dataset is not None \
            else train
        if isinstance(environment_factory, Mapping):
            _check_routing(train, "train_dataset", environment_factory)
            _check_routing(test, "eval_dataset", environment_factory)
        out = translate_args(args, num_train_prompts=len(train))
        out["env.name"] = "dataset"
        out["env.kwargs"] = {"path": train, "test_path": test, "prompt_key": "prompt", "answer_key": None}
        # an eval_dataset is evaluated whole (as TRL); without one, up to rollwise's default 200 training prompts
        out["env.eval_size"] = len(test) if eval_dataset is not None else min(len(train), EVAL_ON_TRAIN_PROMPTS)
        conv = _conversational(train)
        if eval_dataset is not None and _conversational(test) != conv:
            raise TRLArgumentError("GRPOTrainer: train_dataset and eval_dataset mix standard (text) and "
                                   "conversational (message list) prompts")
        out["env.chat_template"] = conv
    out["model.path"] = str(model)
    env_scores = envs is not None and any(_owns_reward(cls) for cls in envs.values())
    out["env.rewards"] = _rewards(reward_funcs, args.reward_weights, env_scores=env_scores,
                                  processing_classes=reward_processing_classes) or None
    if peft_config is not None:
        out.update(_lora(peft_config))
    if envs is not None:
        out["env.environment"] = dict(environment_factory) if isinstance(environment_factory, Mapping) else \
            environment_factory
    return out


def with_tools(factory: Any, tools: Any) -> Any:
    """`environment_factory` with TRL's standalone `tools=` functions added to every environment's tools (TRL offers
    `tools + methods`); without a factory, a class whose only tools are the functions. Each environment class gets a
    subclass holding the functions as static methods (rollwise's tools are the public functions of the class), and
    its instances are the factory's own, re-typed to it."""
    if tools in (None, [], ()):
        return factory
    if not isinstance(tools, (list, tuple)) or not all(inspect.isfunction(t) or inspect.isbuiltin(t) for t in tools):
        raise TRLArgumentError("GRPOTrainer: tools must be a list of functions (each tool is a function with type "
                               "hints and a docstring, as TRL's)")
    names = [t.__name__ for t in tools]
    bad = sorted({n for n in names if not n.isidentifier() or n.startswith("_") or n in ("reset", "get_reward") or names.count(n) > 1})
    if bad:
        raise TRLArgumentError(f"GRPOTrainer: tools {bad} cannot be tools (private, reserved or given twice)")
    from transformers.utils import get_json_schema

    for t in tools:
        try:
            get_json_schema(t)
        except Exception as e:  # noqa: BLE001 - transformers' DocstringParsingException / TypeHintParsingException
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise TRLArgumentError(f"GRPOTrainer: tools: {t.__name__!r} cannot be described ({first}); give it type "
                                   "hints and a docstring with an Args: section") from None
    members = {t.__name__: staticmethod(t) for t in tools}
    if factory is None:
        return _registered(type("Tools", (), {"__doc__": "The standalone tools.", "reset": _no_reset, **members}))
    if isinstance(factory, Mapping):
        return {name: with_tools(f, tools) for name, f in factory.items()}
    if inspect.isclass(factory):
        return _registered(type(factory.__name__, (factory,), members))

    def build() -> Any:  # a factory function: its instances, re-typed to a subclass that has the tools too
        obj = factory()
        sub = _TOOL_SUBCLASSES.get(type(obj))
        if sub is None:
            sub = _TOOL_SUBCLASSES[type(obj)] = _registered(type(type(obj).__name__, (type(obj),), members))
        obj.__class__ = sub
        return obj

    _TOOL_SUBCLASSES: dict[type, type] = {}
    return build


def _no_reset(self: Any, **row: Any) -> None:
    """Start an episode: standalone tools keep no state."""


def _registered(cls: type) -> type:
    """`cls` findable by pickle (in this process and its forks): a module attribute of its own unique name."""
    qual = f"_tools_{cls.__name__}_{id(cls):x}"
    cls.__module__, cls.__qualname__ = __name__, qual
    globals()[qual] = cls
    return cls


def _owns_reward(probe_type: type) -> bool:
    return inspect.isfunction(getattr(probe_type, "get_reward", None))


def _environments(factory: Any) -> dict[str, type] | None:
    """{name: the class each factory builds} (one probe instance each, as TRL builds one at start); None without one.
    A factory that is not callable, fails, or builds an object without reset() is refused here."""
    if factory is None:
        return None
    items = list(factory.items()) if isinstance(factory, Mapping) else [("", factory)]
    if not items:
        raise TRLArgumentError("GRPOTrainer: environment_factory is an empty dict")
    out: dict[str, type] = {}
    for name, f in items:
        where = f"environment_factory[{name!r}]" if isinstance(factory, Mapping) else "environment_factory"
        if not callable(f):
            raise TRLArgumentError(f"GRPOTrainer: {where} is a {type(f).__name__}: pass a class or a zero-argument "
                                   "factory (rollwise builds instances and calls reset(**row))")
        try:
            probe = f()
        except Exception as e:  # noqa: BLE001 - the user's constructor: one line naming it
            raise TRLArgumentError(f"GRPOTrainer: {where}() failed: {type(e).__name__}: {e}") from None
        if not callable(getattr(probe, "reset", None)):
            raise TRLArgumentError(f"GRPOTrainer: {where} built a {type(probe).__name__} without a reset method "
                                   "(each environment must define reset(**row))")
        out[str(name)] = type(probe)
    return out


def _check_routing(rows: Any, name: str, factories: Mapping[str, Any]) -> None:
    """Every row of a dict environment_factory's dataset names one of its environments (TRL's `environment`)."""
    for i in range(len(rows)):
        v = rows[i].get("environment") if isinstance(rows[i], Mapping) else None
        if v not in factories:
            raise TRLArgumentError(f"GRPOTrainer: {name}[{i}] has environment={v!r}, which is not among the "
                                   f"environments passed to environment_factory: {sorted(map(str, factories))}")


def _env_owned(args: Any, envs: dict[str, type] | None) -> dict[str, Any]:
    """No train_dataset: the environment owns the data (`env.name: env_owned`): one generation's worth of empty
    prompts, which each episode's reset() fills; max_steps sets the length (TRL's rules)."""
    if envs is None:
        raise TRLArgumentError("GRPOTrainer: train_dataset is required unless an environment_factory is provided")
    if len(envs) > 1 or "" not in envs:
        raise TRLArgumentError("GRPOTrainer: a dict environment_factory needs a train_dataset with an 'environment' "
                               "column to route each example; provide one, or pass a single environment factory")
    if not (args.max_steps is not None and args.max_steps > 0):
        raise _refuse("max_steps", args.max_steps, "without a train_dataset (the environment's reset() makes each "
                                                   "prompt) set max_steps > 0 to define the training length")
    rows = batch_shape(args).prompts_per_step
    out = translate_args(args, num_train_prompts=rows)
    out["env.name"] = "env_owned"
    out["env.kwargs"] = {"rows": rows}
    out["env.eval_size"] = rows
    out["env.chat_template"] = True  # the placeholder prompts are conversational, as TRL's
    return out


EVAL_ON_TRAIN_PROMPTS = 200
"""Without an eval_dataset, rollwise's before/after evaluation takes at most this many training prompts."""


def nested(dotted: Mapping[str, Any]) -> dict[str, Any]:
    """{'train.lr': 1e-5} -> {'train': {'lr': 1e-5}} (values kept as they are, in-memory objects included)."""
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            node[leaf].update(value)
        else:
            node[leaf] = value
    return out


@dataclass
class TRLState:
    """TRL's `trainer.state`, as far as a finished rollwise run gives it."""

    log_history: list[dict[str, Any]] = field(default_factory=list)
    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0


class TrainOutput(NamedTuple):
    """What TRL's `trainer.train()` returns."""

    global_step: int
    training_loss: float
    metrics: dict[str, Any]


class GRPOTrainer:
    """TRL's GRPOTrainer, run by rollwise. Every argument is checked here: one rollwise cannot honour with TRL's
    meaning raises `TRLArgumentError` naming it, before any work."""

    def __init__(self, model: Any, reward_funcs: Any = None, args: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, reward_processing_classes: Any = None,
                 callbacks: Any = None, optimizers: tuple[Any, Any] = (None, None), quantization_config: Any = None,
                 peft_config: Any = None, tools: Any = None, rollout_func: Any = None,
                 environment_factory: Any = None) -> None:
        if args is None:
            name = str(model).rstrip("/").rsplit("/", 1)[-1]
            args = GRPOConfig(output_dir=f"{name}-GRPO")
        if processing_class is not None and str(getattr(processing_class, "name_or_path", "")) != str(model):
            raise TRLArgumentError("GRPOTrainer: processing_class is not the model's own tokenizer; rollwise uses "
                                   "the tokenizer saved with the model (model.tokenizer in a rollwise config)")
        refused = {"callbacks": (callbacks, "rollwise runs no transformers TrainerCallback; read "
                                 "RUN_DIR/metrics.jsonl or trainer.state.log_history"),
                   "rollout_func": (rollout_func, "rollwise generates with its own engines; an agent loop "
                                    "of your own runs as env.agent: fn(client, row) with an openai.OpenAI client "
                                    "on the policy (docs/agents.md)"),
                   "quantization_config": (quantization_config, "rollwise loads the model itself "
                                           "(model.dtype); quantized training is not supported")}
        for name, (value, why) in refused.items():
            if value not in (None, [], ()):
                raise TRLArgumentError(f"GRPOTrainer: {name} is not supported by rollwise: {why}")
        if tuple(optimizers) != (None, None):
            raise TRLArgumentError("GRPOTrainer: optimizers is not supported by rollwise: its optimiser is AdamW "
                                   "built from learning_rate, adam_beta1/2, adam_epsilon and weight_decay")
        self.args = args
        self.model = model
        self.overrides = to_rollwise(model, reward_funcs, args, train_dataset, eval_dataset, peft_config=peft_config,
                                     environment_factory=with_tools(environment_factory, tools),
                                     reward_processing_classes=reward_processing_classes)
        self._window = logging_window(args, int(self.overrides["train.steps"]))
        self._updates = batch_shape(args).updates_per_step
        self._num_prompts = len(train_dataset) if train_dataset is not None else int(
            self.overrides["rollout.prompts_per_step"])
        self.state = TRLState(max_steps=int(self.overrides["train.steps"]) * self._updates)
        self.result: Any = None

    def config(self) -> dict[str, Any]:
        """The run config `train()` hands to rollwise.train (nested sections)."""
        return nested(self.overrides)

    def train(self, resume_from_checkpoint: str | bool | None = None) -> TrainOutput:
        """Run the whole training with rollwise (`rollwise.train`); fills `state.log_history` with TRL's names."""
        from rollwise.train.metrics import read_metrics

        cfg = self.config()
        if resume_from_checkpoint:
            if isinstance(resume_from_checkpoint, str):
                p = Path(resume_from_checkpoint).resolve()
                out = Path(self.overrides["run.out_dir"]).resolve()
                if p != out and out not in p.parents:
                    raise TRLArgumentError(f"GRPOTrainer.train: resume_from_checkpoint={resume_from_checkpoint!r} is "
                                           f"not in output_dir ({out}): rollwise resumes a run from its own "
                                           "directory's latest checkpoint")
            cfg["run"]["resume"] = True
        from rollwise.api import train as rollwise_train

        kwargs = cfg["env"]["kwargs"] = dict(cfg["env"]["kwargs"])  # a copy: the trainer's own overrides stay whole
        rows, test_rows = kwargs.pop("path", None), kwargs.pop("test_path", None)  # rows go through the API's keywords
        self.result = rollwise_train(cfg, train_dataset=rows, eval_dataset=test_rows)
        self.state.log_history = log_history(read_metrics(self.result.run_dir), window=self._window,
                                             updates_per_step=self._updates,
                                             prompts_per_step=self.overrides["rollout.prompts_per_step"],
                                             num_prompts=self._num_prompts)
        last = self.state.log_history[-1] if self.state.log_history else {}
        self.state.global_step = int(last.get("step", 0))
        self.state.epoch = float(last.get("epoch", 0.0))
        return TrainOutput(self.state.global_step, float(last.get("train_loss", float("nan"))), dict(last))

    def save_model(self, output_dir: str | None = None) -> None:
        """Copy the final checkpoint (HF format: loads with transformers) to `output_dir` (default args.output_dir)."""
        if self.result is None:
            raise RuntimeError("GRPOTrainer.save_model: train() has not run (rollwise saves the model it trained)")
        src = getattr(self.result, "final_checkpoint", None) or getattr(self.result, "checkpoint", None)
        if src is None:
            raise RuntimeError("GRPOTrainer.save_model: the run left no final checkpoint")
        dst = Path(output_dir if output_dir is not None else self.overrides["run.out_dir"])
        src = Path(src)
        if src.resolve() == dst.resolve():
            return
        dst.mkdir(parents=True, exist_ok=True)
        for item in src.iterdir():
            if item.is_file():
                shutil.copy2(item, dst / item.name)
            elif item.is_dir():
                shutil.copytree(item, dst / item.name, dirs_exist_ok=True)


def log_history(records: Sequence[Mapping[str, Any]], *, window: int, updates_per_step: int, prompts_per_step: int,
                num_prompts: int) -> list[dict[str, Any]]:
    """metrics.jsonl records (one per RL step) as TRL's log_history: an entry per `window` RL steps holding the
    mean of each TRL-named metric over them, `step` (optimizer steps) and `epoch`; then TRL's closing entry
    (train_runtime, train_loss, ...)."""
    from rollwise.train.metrics import TRL_METRIC_ALIASES

    names = set(TRL_METRIC_ALIASES) | {"kl", "entropy", "grad_norm", "loss", "reward_std", "completions/min_length"}
    steps = [r for r in records if isinstance(r.get("step"), int)]
    out: list[dict[str, Any]] = []
    chunk: list[Mapping[str, Any]] = []
    for i, r in enumerate(steps):
        chunk.append(r)
        if len(chunk) < window and i != len(steps) - 1:
            continue
        entry: dict[str, Any] = {}
        keys = sorted({k for c in chunk for k in c if k in names or k.startswith("rewards/")})
        for k in keys:
            vals = [float(c[k]) for c in chunk if isinstance(c.get(k), (int, float)) and not isinstance(c.get(k), bool)]
            if vals:
                entry[k] = sum(vals) / len(vals)
        rl_step = int(chunk[-1]["step"])
        entry["step"] = rl_step * updates_per_step
        entry["epoch"] = rl_step * prompts_per_step / num_prompts if num_prompts else 0.0
        out.append(entry)
        chunk = []
    if steps:
        losses = [float(r["loss"]) for r in steps if isinstance(r.get("loss"), (int, float))]
        runtime = sum(float(r.get("step_s", 0.0) or 0.0) for r in steps)
        last = int(steps[-1]["step"])
        out.append({"train_runtime": runtime, "train_steps_per_second": len(steps) / runtime if runtime else 0.0,
                    "train_loss": sum(losses) / len(losses) if losses else float("nan"),
                    "step": last * updates_per_step,
                    "epoch": last * prompts_per_step / num_prompts if num_prompts else 0.0})
    return out


# ---------------------------------------------------------------------------------------------- the table


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def mapping_table() -> str:
    """The mapping as markdown (docs/trl.md between its GENERATED markers): TRL -> rollwise, rollwise -> TRL,
    the keys set with no TRL field, the same names with another meaning, and the fields accepted only at TRL's
    default."""
    lines = ["### TRL argument -> rollwise", "", "| TRL `GRPOConfig` | rollwise | notes |", "|---|---|---|"]
    for name, e in TRL_FIELDS.items():
        if isinstance(e, Mapped):
            keys = ", ".join(f"`{k}`" for k in e.keys) or "(the trainer)"
            lines.append(f"| `{name}` | {keys} | {_cell(e.note)} |")
    lines += ["", "Accepted at any value (nothing rollwise computes depends on them):", ""]
    lines.append("| TRL `GRPOConfig` | why |")
    lines.append("|---|---|")
    for name, e in TRL_FIELDS.items():
        if isinstance(e, Inert):
            lines.append(f"| `{name}` | {_cell(e.reason)} |")
    lines += ["", "### rollwise key -> TRL", "", "| rollwise | TRL `GRPOConfig` |", "|---|---|"]
    reverse: dict[str, list[str]] = {}
    for name, e in TRL_FIELDS.items():
        if isinstance(e, Mapped):
            for k in e.keys:
                reverse.setdefault(k, []).append(name)
    for key, args in TRAINER_KEYS.items():
        reverse.setdefault(key, []).extend(f"GRPOTrainer {n}" for n in args)
    for key in sorted(reverse):
        lines.append(f"| `{key}` | {', '.join(f'`{n}`' for n in reverse[key])} |")
    lines += ["", f"rollwise's own, with no TRL counterpart (left at rollwise's defaults): {ROLLWISE_ONLY}."]
    lines += ["", "Set by the translation with no TRL field:", "", "| rollwise | value | why |", "|---|---|---|"]
    for key, (value, why) in FIXED_SETTINGS.items():
        lines.append(f"| `{key}` | `{value}` | {_cell(why)} |")
    lines += ["", "Same name, other meaning:", "", "| rollwise | how it differs from TRL |", "|---|---|"]
    for key, why in SAME_NAME_OTHER_MEANING.items():
        lines.append(f"| `{key}` | {_cell(why)} |")
    lines += ["", "### Accepted only at TRL's default", "",
              "Refused with one line naming the field when set to anything else.", "",
              "| TRL `GRPOConfig` fields | why |", "|---|---|"]
    by_reason: dict[str, list[str]] = {}
    for name, e in TRL_FIELDS.items():
        if isinstance(e, DefaultOnly):
            by_reason.setdefault(e.reason, []).append(name)
    for reason, names in by_reason.items():
        lines.append(f"| {', '.join(f'`{n}`' for n in names)} | {_cell(reason)} |")
    lines += ["", "### GRPOTrainer arguments", "", "| TRL `GRPOTrainer` | rollwise |", "|---|---|"]
    for name, what in TRAINER_ARGUMENTS.items():
        lines.append(f"| `{name}` | {_cell(what)} |")
    return "\n".join(lines) + "\n"


TRAINER_KEYS: dict[str, tuple[str, ...]] = {
    "model.path": ("model",), "env.kwargs.path": ("train_dataset",), "env.kwargs.test_path": ("eval_dataset",),
    "env.eval_size": ("eval_dataset",), "env.rewards": ("reward_funcs", "reward_processing_classes"),
    "env.chat_template": ("train_dataset",),
    "train.lora": ("peft_config",), "env.environment": ("environment_factory",),
    "run.resume": ("train(resume_from_checkpoint)",),
}
"""rollwise keys set from GRPOTrainer's own arguments (the reverse table lists them with the config's)."""

ROLLWISE_ONLY = ("the rollout controller (`control.*`: prompt selection, dynamic sampling, early stops, partial "
                 "and asynchronous rollouts), `replay.*`, `rollout.speculative` and `rollout.tree`, `algo.decoupled`, "
                 "`engine.*` sizing and `engine.sync_check`, `sft.*`, `train.world_size` / `train.parallel`")

TRAINER_ARGUMENTS: dict[str, str] = {
    "model": "`model.path`: a path or name rollwise loads (an HF directory, `smollm2-135m`, a .gguf); a model "
             "object is refused",
    "reward_funcs": "`env.rewards` (`fn`, `weight` from reward_weights, `name` = the function's `__name__`); sync or "
                    "async functions; a string is a sequence-classification reward model's directory (or hub id), "
                    "loaded as TRL loads it (one label, its logit is the reward): `{reward_model: {path}, weight, "
                    "name}` with `name` the path's last part, and it may stand in a list beside functions; a reward "
                    "model object is refused (pass its directory); optional when an environment class has "
                    "get_reward() (the episodes of a class without one are then errored: no reward, as TRL)",
    "train_dataset": "`env.kwargs.path` (a datasets.Dataset or a list of dicts with a `prompt` column, standard or "
                     "conversational; with an environment_factory the prompt may be left out: reset() fills it); None "
                     "with a single environment_factory and max_steps > 0: `env.name: env_owned`; an IterableDataset "
                     "or DatasetDict is refused",
    "eval_dataset": "`env.kwargs.test_path`, `env.eval_size` (all of it); without it rollwise evaluates on up to "
                    "200 of train_dataset's prompts (it always evaluates before and after training)",
    "GRPOConfig(warmup_ratio=...)": "older transformers' fractional warm-up, taken as warmup_steps below 1",
    "processing_class": "None, or the model's own tokenizer; any other is refused",
    "reward_processing_classes": "each reward model's `reward_model.tokenizer`: the directory a tokenizer was loaded "
                                 "from (`name_or_path`; one loaded otherwise is refused); None or an entry for a "
                                 "reward function is ignored, as TRL",
    "callbacks": "refused (read metrics.jsonl or trainer.state.log_history)",
    "optimizers": "refused unless (None, None)",
    "peft_config": "`train.lora` (r, lora_alpha, lora_dropout, target_modules as a list); other LoRA options refused",
    "environment_factory": "`env.environment`: a class or zero-argument factory, or a dict of them by name (each row's "
                           "`environment` column picks one; only its tools are offered, the column is not passed to "
                           "reset). Instances are pooled and reset per episode; tools are the public functions of the "
                           "class (sync or async) but `reset` and `get_reward`; `get_reward()` (sync or async) is a "
                           "reward of weight 1 named after the class; what `reset(**row)` returns is appended to the "
                           "last user message",
    "tools": "functions (sync or async, type hints and a docstring) offered as tools beside each environment's "
             "methods, as TRL's `tools + methods`; without environment_factory, they are the only tools",
    "quantization_config": "refused (rollwise loads the model itself)",
    "rollout_func": "refused (rollwise generates with its own engines); your own agent loop: env.agent",
    "train(resume_from_checkpoint)": "`run.resume` (True, or output_dir / a checkpoint inside it)",
    "save_model(output_dir)": "copies the final checkpoint (HF format)",
    "state.log_history": "TRL's metric names (`reward`, `reward_std`, `rewards/<name>/mean`, `completions/*`, `kl`, "
                         "`entropy`, `clip_ratio/region_mean`, `learning_rate`, `grad_norm`, `loss`), also in "
                         "metrics.jsonl and the loggers",
}
"""GRPOTrainer's own arguments and methods: what each becomes."""

GENERATED_BEGIN = "<!-- BEGIN GENERATED: python -m rollwise.trl docs/trl.md -->"
GENERATED_END = "<!-- END GENERATED -->"


def render_docs(text: str) -> str:
    """`text` (docs/trl.md) with the block between the GENERATED markers replaced by `mapping_table()`."""
    head, sep, rest = text.partition(GENERATED_BEGIN)
    if not sep:
        raise ValueError(f"no {GENERATED_BEGIN!r} marker")
    _, sep2, tail = rest.partition(GENERATED_END)
    if not sep2:
        raise ValueError(f"no {GENERATED_END!r} marker")
    return f"{head}{GENERATED_BEGIN}\n\n{mapping_table()}\n{GENERATED_END}{tail}"


if __name__ == "__main__":  # pragma: no cover - python -m rollwise.trl docs/trl.md
    import sys

    for path in sys.argv[1:] or ["docs/trl.md"]:
        p = Path(path)
        p.write_text(render_docs(p.read_text(encoding="utf-8")), encoding="utf-8")
