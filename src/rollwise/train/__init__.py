"""rollwise.train: turn scored rollouts into a weight update.

Modules, in the order a step uses them (nothing is imported here, so `import rollwise.train` stays cheap):

- `advantages`: `ADVANTAGES[name](rewards [G, K], mask [G, K]) -> [G, K]`; per-token `TOKEN_ADVANTAGES['tree']`;
  `assign_advantages(groups, name)`.
- `batch`: `TrainBatch.from_rollouts(rollouts, micro_batch_tokens)`, sequences packed into padding-free rows, each
  group's prompt and common completion prefixes once (`share_prompt=True`, the default).
- `attention`: per-segment attention for shared-prompt rows, registered in transformers' attention interface.
- `losses`: `LOSSES[name](logprobs, old_logprobs, advantages, mask, *, cfg=LossConfig) -> (loss, metrics)`.
- `corrections`: the rollout-policy correction rules the losses weight tokens by (`build_correction(mode, low,
  high)`: tis, token_mask, icepop, sequence_truncate, sequence_mask).
- `trainer`: `Trainer(model_dir, TrainConfig, device=, temperature=, reference=)`, `.train_step(batch, loss_fn,
  loss_cfg)`, `.compute_logprobs(batch)`, `.state_dict_for_sync()` for `engine.load_weights`.
- `gae`: GAE over the policy's tokens (`gae`, `episode_gae`), `whiten`, `explained_variance`; pure functions.
- `critic`: with `algo.advantage: gae`, the value model (`Critic`), and `actor_critic_step` (values, GAE, the
  trainer's update, the critic's `losses.value_loss` update).
- `checkpoint`: `save_checkpoint(trainer, run_dir, step, data_position=, critic=)`, `load_checkpoint(run_dir)`,
  `restore_checkpoint(trainer, ckpt, critic=)`.
- `metrics`: `MetricsLogger(run_dir, loggers=)` -> metrics.jsonl, the other `run.loggers`, terminal progress.
- `loggers`: one class per `run.loggers` name (jsonl, tensorboard, wandb, mlflow) behind the `MetricLogger` Protocol.

The RL loop that wires them with the engine and environments is `train.loop` (and the recipes).
"""
