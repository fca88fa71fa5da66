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

Nothing is silently ignored: an argument rollwise cannot honour with TRL's meaning (a reward model, vLLM colocate
mode, `num_iterations` > 1, callbacks, a rollout function, a field without a mapping set to a value other than
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

__all__ = [
    "GRPOConfig", "GRPOTrainer", "TRLArgumentError", "TRLState", "TrainOutput", "TRL_FIELDS", "Mapped", "Inert",
    "DefaultOnly", "FIXED_SETTINGS", "SAME_NAME_OTHER_MEANING", "check_args", "translate_args", "to_rollwise",
    "mapping_table", "nested",
]


class TRLArgumentError(ValueError):
    """A TRL argument rollwise cannot honour with TRL's meaning; the message is one line and names it."""


# ------------------------------------------------------------------------------------------------ the mapping


@dataclass(frozen=True)
class Mapped:
    """A TRL field translated onto rollwise keys (`keys`; empty when it shapes the trainer object itself)."""

    keys: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class Inert:
    """A TRL field accepted at any value: it changes nothing rollwise computes (printing, data loading, ...)."""

    reason: str


@dataclass(frozen=True)
class DefaultOnly:
    """A TRL field with no rollwise counterpart: accepted at TRL's default (which rollwise matches), refused
    otherwise, naming `reason`."""

    reason: str


Entry = Mapped | Inert | DefaultOnly

_BATCH = ("rollout.prompts_per_step", "rollout.samples_per_prompt", "train.updates_per_step")
_STEPS = ("train.steps",)


def _default_only(reason: str, *names: str) -> dict[str, Entry]:
    return {n: DefaultOnly(reason) for n in names}


def _inert(reason: str, *names: str) -> dict[str, Entry]:
    return {n: Inert(reason) for n in names}


TRL_FIELDS: dict[str, Entry] = {
    # ---- generation and batch
    "num_generations": Mapped(("rollout.samples_per_prompt",), "the group size"),
    "per_device_train_batch_size": Mapped(_BATCH, "completions per optimizer step = per_device_train_batch_size x "
                                                  "gradient_accumulation_steps (one process); prompts per RL step = "
                                                  "generation batch / num_generations"),
    "gradient_accumulation_steps": Mapped(_BATCH, "rollwise accumulates over packed micro-batches itself "
                                                  "(train.micro_batch_tokens): only the batch size it implies counts"),
    "generation_batch_size": Mapped(_BATCH, "completions per generation = rollout.prompts_per_step x "
                                            "rollout.samples_per_prompt"),
    "steps_per_generation": Mapped(_BATCH + _STEPS, "steps_per_generation / gradient_accumulation_steps optimizer "
                                                    "steps per generation = train.updates_per_step (shuffled "
                                                    "mini-batches); must be a whole multiple"),
    "max_completion_length": Mapped(("rollout.max_tokens",), "also Dr. GRPO's constant normaliser, as in TRL"),
    "temperature": Mapped(("rollout.temperature",)),
    "top_p": Mapped(("rollout.top_p",)),
    "top_k": Mapped(("rollout.top_k",), "0 (off) -> -1 (off)"),
    # ---- loss
    "loss_type": Mapped(("algo.loss", "algo.overlong_filter", "algo.overlong_penalty"),
                        "grpo, dr_grpo, dapo; dapo -> algo.loss dapo with algo.overlong_filter = "
                        "mask_truncated_completions and algo.overlong_penalty false (TRL's dapo is the token-level "
                        "normaliser only); bnpo, cispo, sapo, luspo, vespo refused"),
    "beta": Mapped(("algo.kl_coef", "algo.kl_estimator"), "k3 estimator, as TRL; beta > 0 needs "
                                                          "use_bias_correction_kl=False"),
    "use_bias_correction_kl": Mapped((), "rollwise's KL term is not weighted by the importance ratio: with beta > 0 "
                                         "set it False (at beta 0 it changes nothing)"),
    "epsilon": Mapped(("algo.clip_eps_low",)),
    "epsilon_high": Mapped(("algo.clip_eps_high",), "None -> epsilon, as TRL (set explicitly: rollwise's dapo "
                                                    "would take 0.28)"),
    "scale_rewards": Mapped(("algo.advantage", "algo.adv_eps"), "group -> grpo (std + 1e-4, as TRL); none -> "
                                                                "dr_grpo; batch refused"),
    "importance_sampling_level": Mapped(("algo.loss",), "token; sequence with loss_type grpo -> algo.loss gspo"),
    "mask_truncated_completions": Mapped(("algo.overlong_filter",)),
    "num_iterations": Mapped((), "1 only: rollwise trains each mini-batch once (train.updates_per_step splits the "
                                 "batch, it does not repeat it)"),
    "reward_weights": Mapped(("env.rewards",), "weight of each reward function"),
    # ---- optimiser and schedule
    "learning_rate": Mapped(("train.lr",)),
    "lr_scheduler_type": Mapped(("train.schedule", "train.min_lr_ratio", "train.warmup_steps"),
                                "linear, cosine (to 0), constant (no warm-up, as TRL), constant_with_warmup"),
    "warmup_steps": Mapped(("train.warmup_steps",), "optimizer steps; a value below 1 is a fraction of them"),
    "weight_decay": Mapped(("train.weight_decay",)),
    "adam_beta1": Mapped(("train.betas",)),
    "adam_beta2": Mapped(("train.betas",)),
    "adam_epsilon": Mapped(("train.adam_eps",)),
    "optim": Mapped((), "adamw_torch and adamw_torch_fused (rollwise's optimiser is torch's AdamW); others refused"),
    "max_grad_norm": Mapped(("train.grad_clip",), "0 or None -> no clipping"),
    "max_steps": Mapped(_STEPS, "optimizer steps / train.updates_per_step"),
    "num_train_epochs": Mapped(_STEPS, "when max_steps <= 0: ceil(epochs x (prompts // prompts per RL step))"),
    "seed": Mapped(("train.seed",)),
    "bf16": Mapped(("train.bf16",), "bf16 autocast on CUDA (rollwise trains in float32 on the CPU)"),
    "gradient_checkpointing": Mapped(("train.gradient_checkpointing",), "TRL's default True is kept"),
    "use_cpu": Mapped(("model.device",), "True -> cpu"),
    # ---- logging, saving, evaluation
    "output_dir": Mapped(("run.out_dir",), "None -> trainer_output, as TRL"),
    "logging_steps": Mapped((), "GRPOTrainer.state.log_history: one entry per logging_steps optimizer steps, the "
                                "mean over them; metrics.jsonl has every RL step"),
    "report_to": Mapped(("run.loggers",), "none, tensorboard, wandb, mlflow (jsonl is always on); others refused"),
    "run_name": Mapped(("run.out_dir",), "rollwise names a run after its directory: None or output_dir's name only"),
    "save_strategy": Mapped(("run.checkpoint_every",), "steps; no -> only the final checkpoint; epoch/best refused"),
    "save_steps": Mapped(("run.checkpoint_every",), "optimizer steps / train.updates_per_step"),
    "save_total_limit": Mapped(("run.keep_checkpoints",)),
    "eval_strategy": Mapped(("run.eval_every",), "no / steps; rollwise also evaluates before and after training "
                                                 "(held-out accuracy, not TRL's eval loss)"),
    "eval_steps": Mapped(("run.eval_every",), "optimizer steps / train.updates_per_step; None -> logging_steps"),
    # ---- vLLM
    "use_vllm": Mapped(("engine.backend", "engine.remote_server"), "True -> remote vLLM servers"),
    "vllm_mode": Mapped(("engine.backend",), "server only (colocate refused): a vLLM OpenAI server rollwise can "
                                             "reload (docs/serve.md, Remote engines), not `trl vllm-serve`"),
    "vllm_server_base_url": Mapped(("engine.remote_urls",)),
    "vllm_server_host": Mapped(("engine.remote_urls",), "with vllm_server_port when vllm_server_base_url is None"),
    "vllm_server_port": Mapped(("engine.remote_urls",)),
    "vllm_importance_sampling_correction": Mapped(("algo.tis_cap",), "with use_vllm; False -> no correction"),
    "vllm_importance_sampling_mode": Mapped(("algo.tis_cap",), "token_truncate only (truncated IS against the "
                                                               "trainer's own log-probs: algo.tis_cap); the mask "
                                                               "and sequence modes are refused with use_vllm"),
    "vllm_importance_sampling_clip_max": Mapped(("algo.tis_cap",)),
    "vllm_importance_sampling_clip_min": Mapped(("algo.tis_cap",), "None only (rollwise truncates from above)"),
    # ---- accepted at any value
    **_inert("changes what is printed or kept, not what is trained: rollwise keeps every completion in "
             "RUN_DIR/rollouts/*.parquet", "log_completions"),
    **_inert("always the case in rollwise (it evaluates before training)", "eval_on_start"),
    **_inert("batching of evaluation only", "per_device_eval_batch_size"),
    **_inert("terminal output, data loading, process plumbing: nothing rollwise computes",
             "disable_tqdm", "log_level", "log_level_replica", "log_on_each_node", "dataloader_num_workers",
             "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
             "ddp_timeout", "skip_memory_metrics", "do_train", "do_eval", "do_predict", "local_rank",
             "dataloader_multiprocessing_context"),
    # ---- TRL's default only
    **_default_only("TRL's generation knobs rollwise's samplers do not have", "min_p", "repetition_penalty",
                    "generation_kwargs", "cache_implementation", "num_generations_eval", "chat_template_kwargs",
                    "vllm_structured_outputs_regex"),
    **_default_only("losses and regularisers rollwise does not have", "delta", "sapo_temperature_neg",
                    "sapo_temperature_pos", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg",
                    "multi_objective_aggregation", "sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps",
                    "top_entropy_quantile", "entropy_coef", "use_adaptive_entropy", "entropy_coef_min",
                    "entropy_coef_max", "entropy_coef_delta", "entropy_target", "off_policy_mask_threshold",
                    "router_aux_loss_coef", "label_smoothing_factor", "neftune_noise_alpha",
                    "average_tokens_across_devices", "cast_lm_head_to_fp32", "disable_dropout"),
    **_default_only("vLLM settings of TRL's colocate mode or of the server's own command line",
                    "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_gpu_memory_utilization",
                    "vllm_max_model_length", "vllm_tensor_parallel_size", "vllm_group_port",
                    "vllm_server_timeout", "vllm_importance_sampling_cap", "ds3_gather_for_generation"),
    **_default_only("model loading rollwise does itself (model.dtype, model.tokenizer)", "model_init_kwargs",
                    "trust_remote_code"),
    **_default_only("rollwise's data order is a seeded shuffle of every column (all reach the reward functions)",
                    "remove_unused_columns", "shuffle_dataset", "data_seed", "train_sampling_strategy",
                    "length_column_name", "label_names", "pad_to_multiple_of", "dataloader_drop_last",
                    "dataloader_in_order", "ignore_data_skip"),
    **_default_only("multi-turn tool episodes are shaped by env.max_turns / env.max_tool_calls",
                    "max_tool_calling_iterations"),
    **_default_only("TRL's logging channels rollwise does not have (metrics.jsonl holds every step)",
                    "log_multimodal", "num_completions_to_print", "log_unique_prompts", "log_completions_hub_repo",
                    "logging_strategy", "logging_first_step", "logging_nan_inf_filter", "include_num_input_tokens_seen",
                    "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id"),
    **_default_only("other generation back ends", "use_transformers_continuous_batching",
                    "transformers_continuous_batching_config", "use_transformers_paged"),
    **_default_only("precision, compilation and kernels are rollwise's own (model.dtype, train.bf16)", "fp16",
                    "bf16_full_eval", "fp16_full_eval", "tf32", "torch_compile", "torch_compile_backend",
                    "torch_compile_mode", "use_liger_kernel", "liger_kernel_config", "use_cache",
                    "torch_empty_cache_steps", "activation_checkpointing", "activation_checkpointing_kwargs",
                    "gradient_checkpointing_kwargs", "optim_args", "optim_target_modules", "lr_scheduler_kwargs",
                    "auto_find_batch_size", "full_determinism"),
    **_default_only("distributed training is train.world_size / train.parallel, not accelerate's", "accelerator_config",
                    "parallelism_config", "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers",
                    "ddp_static_graph", "ddp_backend", "fsdp", "fsdp_config", "deepspeed", "debug"),
    **_default_only("TRL's evaluation loop (rollwise reports held-out accuracy instead)", "eval_delay",
                    "prediction_loss_only", "eval_do_concat_batches", "eval_use_gather_object",
                    "eval_accumulation_steps", "include_for_metrics", "batch_eval_metrics", "load_best_model_at_end",
                    "metric_for_best_model", "greater_is_better"),
    **_default_only("rollwise checkpoints are always resumable and local (push to a hub yourself)", "save_only_model",
                    "save_on_each_node", "enable_jit_checkpoint", "push_to_hub", "hub_token", "hub_private_repo",
                    "hub_model_id", "hub_strategy", "hub_always_push", "hub_revision",
                    "restore_callback_states_from_checkpoint"),
    **_default_only("pass it to GRPOTrainer.train(resume_from_checkpoint=...)", "resume_from_checkpoint"),
}
"""Every field of TRL's GRPOConfig (TRL 1.16.0, with transformers' TrainingArguments): how rollwise takes it."""

FIXED_SETTINGS: dict[str, tuple[Any, str]] = {
    "env.name": ("dataset", "train_dataset / eval_dataset rows, the `prompt` column, every other column a reward "
                            "keyword, as TRL"),
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
    "num_generations_eval": None, "chat_template_kwargs": None, "vllm_structured_outputs_regex": None,
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
    run_name = a.run_name
    if run_name is not None and run_name != Path(_output_dir(a)).name and run_name != _output_dir(a):
        raise _refuse("run_name", run_name, "rollwise names a run after its directory: set output_dir instead")
    if a.use_vllm:
        if _s(a.vllm_mode) != "server":
            raise _refuse("vllm_mode", a.vllm_mode, "rollwise drives vLLM as separate servers (vllm_mode='server'); "
                                                    "colocated vLLM is not supported")
        if a.vllm_importance_sampling_correction:
            mode = _s(a.vllm_importance_sampling_mode)
            if mode != "token_truncate":
                raise _refuse("vllm_importance_sampling_mode", mode,
                              "rollwise corrects the engine/trainer gap with token-level truncated importance "
                              "sampling only: set vllm_importance_sampling_mode='token_truncate' (algo.tis_cap) or "
                              "vllm_importance_sampling_correction=False")
            if a.vllm_importance_sampling_clip_min is not None:
                raise _refuse("vllm_importance_sampling_clip_min", a.vllm_importance_sampling_clip_min,
                              "rollwise truncates importance weights from above only")
            if a.vllm_importance_sampling_clip_max is None:
                raise _refuse("vllm_importance_sampling_clip_max", None, "token_truncate needs an upper bound")


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
    out["train.bf16"] = bool(a.bf16) if a.bf16 is not None else not bool(getattr(a, "fp16", False))
    out["train.gradient_checkpointing"] = bool(a.gradient_checkpointing)
    if a.use_cpu:
        out["model.device"] = "cpu"
    # logging, saving, evaluation
    out["run.out_dir"] = _output_dir(a)
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
            out["algo.tis_cap"] = float(a.vllm_importance_sampling_clip_max)
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


def _rewards(reward_funcs: Any, weights: Sequence[float] | None) -> list[dict[str, Any]]:
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        raise TRLArgumentError("GRPOTrainer: reward_funcs is empty; give one or several reward functions")
    for i, fn in enumerate(funcs):
        where = "reward_funcs" if len(funcs) == 1 else f"reward_funcs[{i}]"
        if isinstance(fn, str):
            raise TRLArgumentError(f"GRPOTrainer: {where}={fn!r} names a reward model, which rollwise does not run; "
                                   "give a reward function (wrap your reward model in one)")
        if not callable(fn) or _is_module(fn):
            raise TRLArgumentError(f"GRPOTrainer: {where} is a {type(fn).__name__}, not a reward function "
                                   "(reward models are not supported)")
    if weights is not None and len(weights) != len(funcs):
        raise _refuse("reward_weights", list(weights), f"{len(weights)} weights for {len(funcs)} reward functions")
    out: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, fn in enumerate(funcs):
        name = _reward_name(fn)
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name}_{seen[name]}"
        out.append({"fn": _sync_reward(fn), "weight": float(weights[i]) if weights is not None else 1.0,
                    "name": name})
    return out


def _is_module(obj: Any) -> bool:
    return any(c.__name__ in ("Module", "PreTrainedModel") for c in type(obj).__mro__)


def _rows(dataset: Any, name: str) -> Any:
    """A TRL dataset (datasets.Dataset or a list of dicts) as rollwise takes it; refused otherwise."""
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
                peft_config: Any = None, environment_factory: Any = None) -> dict[str, Any]:
    """The whole rollwise run config (dotted keys) a GRPOTrainer's arguments mean; values may be in-memory objects
    (reward callables, datasets, an environment class) where `rollwise.train` takes them."""
    if not isinstance(model, (str, Path)):
        raise TRLArgumentError(f"GRPOTrainer: model is a {type(model).__name__}; rollwise loads the model itself: "
                               "pass its path or name (e.g. 'smollm2-135m' or an HF checkpoint directory)")
    if train_dataset is None:
        raise TRLArgumentError("GRPOTrainer: train_dataset is required")
    train = _rows(train_dataset, "train_dataset")
    test = _rows(eval_dataset, "eval_dataset") if eval_dataset is not None else train
    out = translate_args(args, num_train_prompts=len(train))
    out["model.path"] = str(model)
    out["env.name"] = "dataset"
    out["env.kwargs"] = {"path": train, "test_path": test, "prompt_key": "prompt", "answer_key": None}
    # an eval_dataset is evaluated whole (as TRL); without one, up to rollwise's default 200 training prompts
    out["env.eval_size"] = len(test) if eval_dataset is not None else min(len(train), EVAL_ON_TRAIN_PROMPTS)
    conv = _conversational(train)
    if eval_dataset is not None and _conversational(test) != conv:
        raise TRLArgumentError("GRPOTrainer: train_dataset and eval_dataset mix standard (text) and conversational "
                               "(message list) prompts")
    out["env.chat_template"] = conv
    out["env.rewards"] = _rewards(reward_funcs, args.reward_weights)
    if peft_config is not None:
        out.update(_lora(peft_config))
    if environment_factory is not None:
        if not isinstance(environment_factory, type):
            raise TRLArgumentError("GRPOTrainer: environment_factory must be a class (rollwise builds one per "
                                   f"episode and calls reset(**row)); got a {type(environment_factory).__name__}")
        out["env.environment"] = environment_factory
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

    def __init__(self, model: Any, reward_funcs: Any, args: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, reward_processing_classes: Any = None,
                 callbacks: Any = None, optimizers: tuple[Any, Any] = (None, None), peft_config: Any = None,
                 environment_factory: Any = None, tools: Any = None, rollout_func: Any = None) -> None:
        if args is None:
            name = str(model).rstrip("/").rsplit("/", 1)[-1]
            args = GRPOConfig(output_dir=f"{name}-GRPO")
        if processing_class is not None and str(getattr(processing_class, "name_or_path", "")) != str(model):
            raise TRLArgumentError("GRPOTrainer: processing_class is not the model's own tokenizer; rollwise uses "
                                   "the tokenizer saved with the model (model.tokenizer in a rollwise config)")
        refused = {"reward_processing_classes": (reward_processing_classes, "they tokenize for reward models, "
                                                 "which rollwise does not run"),
                   "callbacks": (callbacks, "rollwise runs no transformers TrainerCallback; read "
                                 "RUN_DIR/metrics.jsonl or trainer.state.log_history"),
                   "tools": (tools, "rollwise's tools are the public methods of an environment class "
                             "(environment_factory)"),
                   "rollout_func": (rollout_func, "rollwise generates with its own engines (a multi-turn "
                                    "environment class covers custom rollouts)")}
        for name, (value, why) in refused.items():
            if value not in (None, [], ()):
                raise TRLArgumentError(f"GRPOTrainer: {name} is not supported by rollwise: {why}")
        if tuple(optimizers) != (None, None):
            raise TRLArgumentError("GRPOTrainer: optimizers is not supported by rollwise: its optimiser is AdamW "
                                   "built from learning_rate, adam_beta1/2, adam_epsilon and weight_decay")
        self.args = args
        self.model = model
        self.overrides = to_rollwise(model, reward_funcs, args, train_dataset, eval_dataset, peft_config=peft_config,
                                     environment_factory=environment_factory)
        self._window = logging_window(args, int(self.overrides["train.steps"]))
        self._updates = batch_shape(args).updates_per_step
        self._num_prompts = len(train_dataset)
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
        rows, test_rows = kwargs.pop("path"), kwargs.pop("test_path")  # dataset rows go through the API's keywords
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
    "env.eval_size": ("eval_dataset",), "env.rewards": ("reward_funcs",), "env.chat_template": ("train_dataset",),
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
                    "async functions; a reward model (a hub id or a model object) is refused",
    "train_dataset": "`env.kwargs.path` (a datasets.Dataset or a list of dicts with a `prompt` column, standard or "
                     "conversational); an IterableDataset or DatasetDict is refused",
    "eval_dataset": "`env.kwargs.test_path`, `env.eval_size` (all of it); without it rollwise evaluates on up to "
                    "200 of train_dataset's prompts (it always evaluates before and after training)",
    "GRPOConfig(warmup_ratio=...)": "older transformers' fractional warm-up, taken as warmup_steps below 1",
    "processing_class": "None, or the model's own tokenizer; any other is refused",
    "reward_processing_classes": "refused (reward models)",
    "callbacks": "refused (read metrics.jsonl or trainer.state.log_history)",
    "optimizers": "refused unless (None, None)",
    "peft_config": "`train.lora` (r, lora_alpha, lora_dropout, target_modules as a list); other LoRA options refused",
    "environment_factory": "`env.environment` (a class; public methods are tools, `reset(**row)`)",
    "tools": "refused (tools are an environment class's methods)",
    "rollout_func": "refused (rollwise generates with its own engines)",
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
