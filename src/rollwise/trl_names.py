"""TRL's GRPOConfig field names and what each becomes in rollwise: the mapping as plain data.

`TRL_FIELDS` has every field of TRL's GRPOConfig: mapped onto rollwise config keys (`Mapped`), accepted at any
value (`Inert`), or accepted only at TRL's default (`DefaultOnly`). `rollwise.trl` translates TRL's arguments with
it; `rollwise.config` reads it to answer a TRL name written in a rollwise config (`learning_rate` -> `train.lr`).
Pure data with no imports, so both can use it: the translation itself lives in `rollwise.trl`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Mapped", "Inert", "DefaultOnly", "Entry", "TRL_FIELDS", "config_keys_for"]


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
    "chat_template_kwargs": Mapped(("env.chat_template_kwargs",), "every rendering of the template: prompts, tool "
                                                                  "turns, demonstrations, checks"),
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
    "bf16": Mapped(("train.bf16",), "bf16 autocast over float32 master weights (unset: 'auto', on CUDA, and on CPUs with AMX / AVX512-BF16 behind a bf16 engine)"),
    "gradient_checkpointing": Mapped(("train.gradient_checkpointing",), "TRL's default True is kept"),
    "use_cpu": Mapped(("model.device",), "True -> cpu"),
    # ---- logging, saving, evaluation
    "output_dir": Mapped(("run.out_dir",), "None -> trainer_output, as TRL"),
    "logging_steps": Mapped((), "GRPOTrainer.state.log_history: one entry per logging_steps optimizer steps, the "
                                "mean over them; metrics.jsonl has every RL step"),
    "report_to": Mapped(("run.loggers",), "none, tensorboard, wandb, mlflow (jsonl is always on); others refused"),
    "run_name": Mapped(("run.run_name",), "the trackers' run name (W&B, MLflow); None -> the run directory's name"),
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
    "vllm_importance_sampling_correction": Mapped(("algo.correction.mode",), "with use_vllm; False -> no correction"),
    "vllm_importance_sampling_mode": Mapped(("algo.correction.mode", "algo.correction.sequence_ratio"),
                                            "with use_vllm: token_truncate -> tis; token_mask, sequence_truncate, "
                                            "sequence_mask (the product of the token ratios, as TRL) -> the same "
                                            "algo.correction.mode (docs/corrections.md)"),
    "vllm_importance_sampling_clip_max": Mapped(("algo.correction.high",), "with use_vllm; None refused with a "
                                                                          "truncate mode"),
    "vllm_importance_sampling_clip_min": Mapped(("algo.correction.low",), "with use_vllm"),
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
                    "generation_kwargs", "cache_implementation", "num_generations_eval",
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

_CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "per_device_train_batch_size": ("rollout.prompts_per_step", "rollout.samples_per_prompt"),
    "generation_batch_size": ("rollout.prompts_per_step", "rollout.samples_per_prompt"),
    "gradient_accumulation_steps": ("train.micro_batch_tokens",),
    "steps_per_generation": ("train.updates_per_step",),
    "logging_steps": ("run.log_every",),
    "project": ("run.project",),
    "warmup_ratio": ("train.warmup_steps",),
}
"""TRL names whose rollwise key, for a user who writes them in a rollwise config, is not the first key
`TRL_FIELDS` translates them onto: the key that means the same to a user (a batch of completions is
prompts_per_step x samples_per_prompt; rollwise accumulates gradients over micro_batch_tokens; TRL's project names
the tracker's project, run.project)."""


def config_keys_for(name: str) -> tuple[str, ...]:
    """The rollwise config keys a user means by TRL's GRPOConfig field `name` (empty: none, or not TRL's name)."""
    if name in _CONFIG_KEYS:
        return _CONFIG_KEYS[name]
    entry = TRL_FIELDS.get(name)
    return entry.keys[:1] if isinstance(entry, Mapped) else ()
