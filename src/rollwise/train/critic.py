"""The critic of PPO with GAE (`algo.advantage: gae`): a separate value model with its own AdamW, and the step that
runs it beside the policy's trainer.

The shape is verl's: the policy's architecture with a one-output value head in place of the LM head (HF
`AutoModelForTokenClassification`, num_labels 1), loaded from the policy's initial checkpoint unless
`algo.critic.model` names another, trained by its own optimiser at its own learning rate. It is a separate model,
not a head on the policy's trunk: the policy's update never feels the value loss, and the two learning rates are
set apart (a critic usually wants a larger one). It costs a second model's memory and forward/backward.

A new value head starts at 0 (V = 0 everywhere), so the first step's advantages are the (whitened) returns, and
the critic moves away from there as it learns; a saved critic keeps its head.

V(s_t), the value of the state before completion token t, is read at the row position whose logits predict token
t (the same positions the policy's log-probs are taken at), so values line up with the `[B, T]` completion layout.

One RL step with a critic (`actor_critic_step`):

    values  = critic.values(batch)                    # [B, T], before this step's critic update
    adv, R  = GAE over each episode's policy tokens    # train/gae.py; whitened over the batch (algo.gae.whiten)
    policy  = trainer.train_step(batch with adv)      # skipped during the critic's warm-up (algo.critic.warmup_steps)
    critic  = critic.train_step(batch, R, values)     # clipped value loss (train/losses.py value_loss)

The trainer stays algorithm-blind: it gets per-token advantages as it would from any estimator.

Deliberately left out: a critic across ranks (`train.world_size` 1 only), a critic LR schedule, LoRA on the critic,
and a shared-trunk value head. They are additions here when needed, not flags elsewhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rollwise.train.attention import enable_segment_attention, row_inputs
from rollwise.train.batch import PackedMicroBatch, TrainBatch
from rollwise.train.errors import TrainerError
from rollwise.train.gae import episode_gae, explained_variance, whiten
from rollwise.train.losses import LossConfig, LossFn, value_loss
from rollwise.train.optim import adamw
from rollwise.train.precision import TrainPrecision

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.config import CriticConfig, GaeConfig
    from rollwise.train.trainer import Trainer
    from rollwise.types import Rollout

CRITIC_DIR = "critic"
"""The critic's folder inside a checkpoint (`checkpoints/step-N/critic/`: config.json, model.safetensors)."""


@dataclass(frozen=True)
class CriticSpec:
    """What a critic is built from (picklable: it travels to rank processes and Ray actors in `TrainerSpec`)."""

    model_path: str
    """Its starting weights: `algo.critic.model`, or the policy's initial model."""
    critic: CriticConfig
    gae: GaeConfig


def _value_head(model: torch.nn.Module) -> torch.nn.Linear:
    head = getattr(model, "score", None)
    if not isinstance(head, torch.nn.Linear) or head.out_features != 1:
        raise TrainerError(f"{type(model).__name__} has no one-output value head ('score'): the critic needs a "
                           "decoder model transformers builds for token classification (Llama, Qwen2, Qwen3, Mistral)")
    return head


def _load_value_model(path: str | Path, device: torch.device, seed: int) -> torch.nn.Module:
    """The critic as an HF token-classification model with one label, float32, dropout off; a value head the
    checkpoint does not hold starts at 0. One-line errors for a bad path or an architecture without one."""
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    from rollwise.models.convert import ModelResolveError, resolve_model
    from rollwise.train.trainer import zero_dropout

    try:
        p = resolve_model(path)
    except ModelResolveError as e:
        raise TrainerError(f"algo.critic.model: {e}") from None
    if not (p / "config.json").is_file():
        raise TrainerError(f"algo.critic.model: not an HF checkpoint directory (no config.json): {p}")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the load report lists the new head as missing: expected, said here instead
    try:
        # NOTE: a new head's random init would draw from the global RNG and shift the run's random streams
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model, info = AutoModelForTokenClassification.from_pretrained(
                str(p), num_labels=1, dtype=torch.float32, output_loading_info=True)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainerError(f"cannot load the critic from {p}: {first}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    head = _value_head(model)
    missing = set(info.get("missing_keys") or ())
    if missing - {"score.weight", "score.bias"}:
        raise TrainerError(f"cannot load the critic from {p}: it lacks {sorted(missing)[0]!r} (not this architecture?)")
    if missing:  # a new head: V = 0 everywhere until the critic learns
        with torch.no_grad():
            head.weight.zero_()
            if head.bias is not None:
                head.bias.zero_()
    zero_dropout(model)
    return model.to(device)


class Critic:
    """The value model, its AdamW and its step counters. Built once per trainer handle (`TrainerSpec.build`)."""

    def __init__(self, spec: CriticSpec, *, device: torch.device, precision: TrainPrecision, seed: int) -> None:
        self.spec = spec
        self.cfg = spec.critic
        self.device = device
        self.precision = precision
        self.seed = int(seed)
        self.model = _load_value_model(spec.model_path, device, seed)
        self.share_prompt = enable_segment_attention(self.model)  # type: ignore[arg-type]
        self.head = _value_head(self.model)
        self.vocab_size = int(getattr(self.model.config, "vocab_size", 0) or 0)
        self.optimizer = adamw([p for p in self.model.parameters() if p.requires_grad], lr=self.cfg.lr)
        self.step = 0  # optimiser steps taken
        self.rl_step = 0  # train_step calls completed (the warm-up counts them)

    @property
    def body(self) -> torch.nn.Module:
        """The decoder stack under the value head (`LlamaModel` & co)."""
        body = self.model.base_model
        if not isinstance(body, torch.nn.Module):
            raise TrainerError(f"{type(self.model).__name__} has no decoder body (base_model)")
        return body

    def _row_values(self, mb: PackedMicroBatch) -> torch.Tensor:
        """V at the positions that predict each completion target of one packed row. -> [N] float32."""
        kw = row_inputs(self.model, mb, self.device, segments_ok=self.share_prompt)
        with self.precision.autocast():
            hidden = self.body(use_cache=False, **kw).last_hidden_state  # [1, L, H]
            v = self.head(hidden[0, mb.pred_positions.to(self.device)])  # [N, 1]
        return v[:, 0].float()

    def _check_vocab(self, batch: TrainBatch) -> None:
        top = max((max(t) for t in batch.tokens if t), default=0)
        if self.vocab_size and top >= self.vocab_size:
            raise TrainerError(f"the critic's vocabulary has {self.vocab_size} tokens and a rollout holds token id "
                               f"{top}: algo.critic.model must share the policy's tokenizer")

    @torch.no_grad()
    def values(self, batch: TrainBatch) -> torch.Tensor:
        """The critic's value of every completion position of `batch`, before any update. -> [B, T] float32, 0 on
        padding."""
        self._check_vocab(batch)
        batch = batch.with_layout(batch.share_prompt and self.share_prompt)
        b, t = batch.num_sequences, batch.max_completion_len
        out = torch.zeros(b, t, dtype=torch.float32, device=self.device)
        was = self.model.training
        self.model.eval()
        try:
            for mb in batch.micro_batches:
                sel = torch.tensor(mb.seq_ids, dtype=torch.long, device=self.device)
                out[sel] = mb.scatter(self._row_values(mb), t)
        finally:
            self.model.train(was)
        return out

    def minibatch_generator(self) -> torch.Generator:
        """The critic's mini-batch split of this RL step: a function of (seed, rl_step) only, so a run and its
        resume draw the same split (`Trainer.minibatch_generator`'s rule, with its own stream)."""
        return torch.Generator().manual_seed((self.seed * 1_000_003 + 7919 * self.rl_step + 104_729) % 2**63)

    def train_step(self, batch: TrainBatch, returns: torch.Tensor, old_values: torch.Tensor) -> dict[str, float]:
        """`updates_per_step` AdamW steps on the clipped value loss against `returns` ([B, T], the GAE lambda-returns)
        with `old_values` ([B, T], the values the returns came from) as the clip's anchor. Returns value_loss (the
        mean over the mini-batches), value_clip_frac (token-weighted), grad_norm (last update, before clipping)."""
        batch = batch.with_layout(batch.share_prompt and self.share_prompt)
        n = min(self.cfg.updates_per_step, batch.num_sequences)
        if n == 1:
            minis = [list(range(batch.num_sequences))]
        else:
            order = torch.randperm(batch.num_sequences, generator=self.minibatch_generator()).tolist()
            minis = [sorted(order[k::n]) for k in range(n)]
        self.model.train()
        loss_sum, clip_w, tokens, grad_norm = 0.0, 0.0, 0.0, float("nan")
        for idx in minis:
            mini = batch if len(idx) == batch.num_sequences else batch.subset(idx)
            sel_full = torch.tensor(idx, dtype=torch.long)
            t = mini.max_completion_len
            mask = mini.loss_mask.to(self.device)
            ret = returns[sel_full, :t].to(self.device)
            old = old_values[sel_full, :t].to(self.device)
            n_tok = int(mask.sum().item())
            self.optimizer.zero_grad(set_to_none=True)
            for mb in mini.micro_batches:
                sel = torch.tensor(mb.seq_ids, dtype=torch.long, device=self.device)
                v = mb.scatter(self._row_values(mb), t)  # [b_mb, T] with grad
                loss, met = value_loss(v, old[sel], ret[sel], mask[sel],
                                       cliprange_value=self.cfg.cliprange_value, num_tokens=n_tok)
                loss.backward()
                w = float(mask[sel].sum().item())
                loss_sum += met["value_loss"]
                clip_w += met["value_clip_frac"] * w
                tokens += w
            grad_norm = self._update()
        self.optimizer.zero_grad(set_to_none=True)
        self.rl_step += 1
        return {"value_loss": loss_sum / len(minis), "value_clip_frac": clip_w / max(tokens, 1.0),
                "grad_norm": grad_norm, "lr": float(self.optimizer.param_groups[0]["lr"])}

    def _update(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:  # a parameter no micro-batch reached: an exact zero gradient, as the full computation gives
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        clip = self.cfg.grad_clip if self.cfg.grad_clip is not None else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        if math.isfinite(norm):  # NOTE: a NaN/inf gradient would poison AdamW's moments for good: drop the update
            self.optimizer.step()
        self.step += 1
        return norm

    # ------------------------------------------------------------------------------------------- checkpoints

    def save(self, out: Path) -> dict[str, Any]:
        """Write the critic's HF directory to `out` (loads with `AutoModelForTokenClassification`, and as
        `algo.critic.model`); return what `trainer_state.pt` keeps of it (optimiser, counters)."""
        self.model.save_pretrained(str(out))  # type: ignore[operator]
        return {"optimizer": self.optimizer.state_dict(), "optimizer_steps": int(self.step),
                "rl_steps": int(self.rl_step)}

    def restore(self, folder: Path, state: dict[str, Any]) -> None:
        """Weights from a checkpoint's critic folder and the optimiser and counters `save` returned. Raises
        ValueError (the caller's one-line CheckpointError) on anything that does not fit."""
        from safetensors.torch import load_file

        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ValueError(f"no *.safetensors weights in {folder}")
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            sd.update(load_file(str(f)))
        live = self.model.state_dict()
        bad = [k for k in sd if k not in live or tuple(sd[k].shape) != tuple(live[k].shape)]
        missing = [k for k in live if k not in sd]
        if bad or missing:
            raise ValueError(f"its weights do not fit this critic ({(bad or missing)[0]!r})")
        with torch.no_grad():
            for k, v in sd.items():
                live[k].copy_(v.to(live[k].device, live[k].dtype))
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["optimizer_steps"])
        self.rl_step = int(state["rl_steps"])


def episodes_of(rollouts: Sequence[Rollout]) -> tuple[list[list[int]], list[float]]:
    """The rows of `TrainBatch.from_rollouts(rollouts)` each episode spans (a rollout is one row, an agent episode
    one per sequence: `Rollout.sequences`), and each episode's return (its scalar `advantage`, which `gae` sets)."""
    episodes: list[list[int]] = []
    outcomes: list[float] = []
    row = 0
    for r in rollouts:
        k = 1 + len(r.segments or ())
        episodes.append(list(range(row, row + k)))
        outcomes.append(float(r.advantage) if r.advantage is not None else 0.0)
        row += k
    return episodes, outcomes


def actor_critic_step(trainer: Trainer, critic: Critic, batch: TrainBatch, rollouts: Sequence[Rollout],
                      loss_fn: LossFn, loss_cfg: LossConfig, *, fresh_version: int | None = None) -> dict[str, float]:
    """One RL step of PPO with a critic (the module docstring's four lines): the policy's metrics as
    `Trainer.train_step` returns them (none during the critic's warm-up), and `critic/*`: value_loss,
    value_clip_frac, explained_var (of this step's returns by the values before the critic's update; absent when
    the returns do not vary), value_mean, return_mean, grad_norm, lr, warmup (1 while the policy waits for the
    critic), train_s."""
    t0 = time.perf_counter()
    g = critic.spec.gae
    values = critic.values(batch)  # [B, T] at the critic before this step
    mask = batch.loss_mask.to(values.device)
    episodes, outcomes = episodes_of(rollouts)
    adv, ret = episode_gae(values, mask, outcomes, episodes, batch.completion_lens.tolist(), gamma=g.gamma, lam=g.lam)
    if g.whiten:
        adv = whiten(adv, mask)
    batch.advantages = adv.detach().to(torch.float32).cpu()  # [B, T] per token: the trainer's ordinary input
    warmup = critic.rl_step < critic.cfg.warmup_steps
    out: dict[str, float] = {}
    if not warmup:
        out.update(trainer.train_step(batch, loss_fn, loss_cfg, fresh_version=fresh_version))
    t_critic = time.perf_counter()
    cm = critic.train_step(batch, ret, values)
    on = mask > 0
    n = max(int(on.sum().item()), 1)
    out.update({
        "critic/value_loss": cm["value_loss"], "critic/value_clip_frac": cm["value_clip_frac"],
        "critic/value_mean": float(values[on].sum().item() / n), "critic/return_mean": float(ret[on].sum().item() / n),
        "critic/grad_norm": cm["grad_norm"], "critic/lr": cm["lr"], "critic/warmup": float(warmup),
        "critic/train_s": time.perf_counter() - t_critic,
    })
    ev = explained_variance(values, ret, mask)
    if math.isfinite(ev):  # returns that do not vary leave nothing to explain: the key is left out, never NaN
        out["critic/explained_var"] = ev
    out["train_s"] = time.perf_counter() - t0  # the whole step: values, the policy's update and the critic's
    return out
