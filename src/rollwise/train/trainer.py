"""`Trainer`: an HF causal LM, AdamW, an LR schedule, and one `train_step` over a packed `TrainBatch`.

The trainer is algorithm-blind: advantages arrive inside the batch and the loss function is handed in
(`rollwise.train.losses.LOSSES[name]`). One `train_step` is one RL step: the batch is split into
`cfg.updates_per_step` mini-batches (one optimiser step each); each mini-batch runs as packed micro-batches whose
gradients accumulate, with the losses normalised by whole-mini-batch counts, so the update does not depend on how
the sequences were packed.

Log-probs are float32 log-probs of the rollouts' sampling distribution (`train/logprobs.py`: temperature and the
engine's top-k / top-p truncation, which the trainer must match or every ratio is off). Each step reports the gap between the trainer's and the engine's log-probs on the same tokens
(`logprob_diff_mean` / `logprob_diff_max`): a broken weight sync or position bug shows there at once.

NOTE on dropout: RL compares the trainer's forward with the engine's, so every dropout is set to 0 at load.
NOTE on attention: with 'sdpa' and 'eager' models the trainer switches to the segment-aware implementation
(`train.attention`) and runs shared-prompt rows (`TrainBatch(share_prompt=True)`, the default): each group's prompt
and its completions' common prefixes once, per-segment attention with compact masks. Unshared rows use an explicit
block-diagonal causal mask there; other implementations (flash-attention) get the unshared rows with `attention_mask=None` plus restarting
`position_ids`, from which transformers detects the packed sequences itself.
NOTE on the vocabulary: for plain decoder LMs (Llama, Qwen2/3, Mistral: logits = lm_head(final hidden)) the trainer
runs the decoder body, gathers the hidden states that predict targets, and applies the LM head a chunk of rows at a
time (`head_logprobs`), with each chunk recomputed in backward: float32 [tokens, vocab] logits never exist for the
whole row, only [chunk, vocab]. Other models get their logits from the model's own forward (`logits_to_keep`).

NOTE on ranks (`train.world_size` > 1, `train/parallel.py`): every rank gets the same rollouts and computes the
same mini-batch split and the same zero-advantage filtering, then trains on its own share of each mini-batch
(`train/rank_split.py`), with the losses normalised by the whole mini-batch's counts and the gradients summed over
the ranks: the update equals the one-rank update up to float reassociation. The metrics are merged over ranks
(`train/step_stats.py`).
NOTE on LoRA: full-weight vs adapter training is a `train/weights.py` mode chosen once at build time.
NOTE on precision: float32 or bf16 autocast over float32 master weights is a `train/precision.py` object chosen once
at build time (`train.bf16`, 'auto' by device and CPU); every training, reference and teacher forward runs in it, the
sync probe (`probe_logprobs`) always in float32.
NOTE on distillation (`distill`, `train/distill.py`): a frozen teacher, loaded as the policy is, scores the batch's
sampled tokens at the start of each step (one forward, every rank the whole batch: the teacher is not sharded), and
the batch's advantages become the per-token distillation advantages before anything is planned, so a sequence
whose task advantage is 0 still trains. The trainer only applies `distill_advantages`; what it means is there.

Deliberately left out: tensor/pipeline parallelism, optimizer offload, a fused CUDA linear + cross-entropy kernel.
They are new modules when needed, not flags here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import torch

from rollwise.config import TrainConfig
from rollwise.train.attention import enable_segment_attention, row_inputs
from rollwise.train.batch import PackedMicroBatch, TrainBatch
from rollwise.train.errors import TrainerError
from rollwise.train.logprobs import PLAIN_HEAD_MODEL_TYPES, head_logprobs, sampling_logprobs, token_logprobs
from rollwise.train.losses import LossConfig, LossFn, normalizers
from rollwise.train.optim import adamw
from rollwise.train.parallel import Single
from rollwise.train.precision import TrainPrecision, train_precision
from rollwise.train.rank_split import split_for_ranks
from rollwise.train.step_plan import MiniBatchPlan, MiniBatchTensors, StepInputs, fresh_tokens, with_gradient
from rollwise.train.step_stats import StepStats
from rollwise.train.causal_lm import as_causal_lm
from rollwise.train.distill import DistillOptions, distill_advantages, distill_metrics
from rollwise.train.weights import freeze, weight_mode

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel

    from rollwise.types import Tokenizer

__all__ = ["Trainer", "TrainerError", "load_causal_lm", "lr_lambda", "resolve_device", "seed_all"]


def lr_lambda(step: int, *, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier after `step` optimiser steps: linear warm-up, then constant / linear / cosine decay."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(total_steps - warmup_steps, 1)
    progress = min(max((step - warmup_steps) / span, 0.0), 1.0)
    if schedule == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * progress
    if schedule == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise TrainerError(f"unknown LR schedule {schedule!r}; known: constant, linear, cosine")


def zero_dropout(model: torch.nn.Module) -> None:
    """Every dropout to 0 (modules and config): RL compares the trainer's forward with the engine's."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    cfg = getattr(model, "config", None)
    for attr in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop"):
        if cfg is not None and isinstance(getattr(cfg, attr, None), float):
            setattr(cfg, attr, 0.0)


def load_causal_lm(path: str | Path, device: torch.device | str, attn_implementation: str | None = None) -> PreTrainedModel:
    """Load an HF causal-LM checkpoint in float32 (master weights), dropout off. One-line error on a bad path."""
    from transformers import AutoModelForCausalLM

    from rollwise.models.convert import ModelResolveError, resolve_model

    try:
        p = resolve_model(path)  # a checkpoint dir, a .gguf file, a known name or a hub id
    except ModelResolveError as e:
        raise TrainerError(str(e)) from None
    if not (p / "config.json").is_file():
        raise TrainerError(f"not an HF checkpoint directory (no config.json): {p}")
    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(str(p), **kwargs)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainerError(f"cannot load model from {p}: {first}") from None
    zero_dropout(model)
    # transformers wraps PreTrainedModel.to with functools.wraps(Module.to), which types `self` as the first argument
    return model.to(device)  # type: ignore[arg-type]


def resolve_device(device: str | torch.device) -> torch.device:
    """'auto' -> CUDA when available, else CPU; anything else as torch.device."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def seed_all(seed: int) -> None:
    """Seed python, numpy and torch (all devices): call once at the start of a run, before building anything."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _sampling_options(temperature: float, top_p: float, top_k: int) -> tuple[float, float, int]:
    """The rollouts' sampling options, checked: the trainer's log-probs must be of the distribution they came from."""
    if temperature <= 0:
        raise TrainerError(f"trainer temperature must be > 0 (the rollouts' sampling temperature), got {temperature}")
    if not 0 < top_p <= 1:
        raise TrainerError(f"trainer top_p must be in (0, 1] (the rollouts' top_p), got {top_p}")
    if top_k < -1:
        raise TrainerError(f"trainer top_k must be -1 or 0 (off) or a positive count, got {top_k}")
    return float(temperature), float(top_p), int(top_k)


class Trainer:
    """Holds the policy (and optionally a frozen reference), the optimiser and the LR schedule.

    >>> tr = Trainer("ckpt_dir", TrainConfig(lr=1e-4), device="cpu", temperature=1.0)
    >>> metrics = tr.train_step(TrainBatch.from_rollouts(rollouts, 4096), LOSSES["grpo"], LossConfig())
    >>> engine.load_weights(tr.state_dict_for_sync())
    """

    def __init__(
        self,
        model_path: str | Path,
        cfg: TrainConfig | None = None,
        *,
        device: str | torch.device = "cpu",
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        reference: bool = False,
        total_steps: int | None = None,
        attn_implementation: str | None = None,
        tokenizer_path: str | Path | None = None,
        sync: Single | None = None,
        distill: DistillOptions | None = None,
        low_precision_rollouts: bool = False,
    ) -> None:
        """model_path: an HF checkpoint dir, a .gguf file, a known name ('smollm2-135m') or a hub id (`models.convert.resolve_model`). device: 'cpu', 'cuda', 'cuda:N' or 'auto'. temperature: the sampling temperature of the rollouts (> 0).
        top_p, top_k: the rollouts' sampling truncation (rollout.top_p / rollout.top_k; 1.0 and -1 = off); pass them
        whenever the rollouts were sampled with them (not for greedy rollouts, whose log-probs are untruncated).
        reference: keep a frozen copy of the initial policy for the KL penalty (with LoRA: the adapter-free base).
        total_steps: RL steps the LR schedule spans (default cfg.steps).
        sync: how this rank shares updates with the others (`train.parallel`); None = one process.
        distill: on-policy distillation from a frozen teacher (`train/distill.py`); None = off.
        low_precision_rollouts: the engine samples below float32 (model.dtype bfloat16 / int8): `train.bf16: auto`
        then trains in bf16 on CPUs with native bf16 too (`train.precision`)."""
        self.cfg = cfg if cfg is not None else TrainConfig.model_validate({})
        self.sync = sync if sync is not None else Single()
        self.temperature, self.top_p, self.top_k = _sampling_options(temperature, top_p, top_k)
        self.device = resolve_device(device)
        from rollwise.models.convert import ModelResolveError, resolve_model

        try:
            self.model_path = resolve_model(model_path)
        except ModelResolveError as e:
            raise TrainerError(str(e)) from None
        self.logprob_chunk = 1024  # rows of [N, V] logits turned into float32 log-probs at a time (model-logits path)
        self.head_chunk_elems = 1 << 24  # [rows, V] float32 logits elements per LM-head chunk (64 MB)
        self.skip_zero_advantage = True  # exact: such sequences add 0 to loss and gradient without a KL term
        self.step = 0  # optimiser steps taken
        self.rl_step = 0  # train_step calls completed
        self.weight_mode = weight_mode(self.cfg.lora)
        self.precision: TrainPrecision = train_precision(self.cfg.bf16, self.device, low_precision_rollouts=low_precision_rollouts)
        self.lora = self.weight_mode.lora
        self.has_reference = reference
        self.model, self.ref_model = self._build_model(attn_implementation, reference)
        self.distill = distill
        self.teacher: torch.nn.Module | None = None
        self.teacher_plain_head = self.teacher_share_prompt = False
        if distill is not None:
            self.teacher, self.teacher_plain_head, self.teacher_share_prompt = self._build_teacher(
                distill.teacher, attn_implementation)
        self.tokenizer = self._load_tokenizer(tokenizer_path or self.model_path)
        self.optimizer, self.scheduler = self._build_optimizer(total_steps)

    # ------------------------------------------------------------------------------------------- set-up

    def _build_model(self, attn_implementation: str | None, reference: bool
                     ) -> tuple[torch.nn.Module, torch.nn.Module | None]:
        """The policy as this rank trains it (LoRA-wrapped, checkpointed, sharded / replicated) and, for full
        weights with `reference`, the frozen copy of the initial policy."""
        hf = load_causal_lm(self.model_path, self.device, attn_implementation)
        # shared-prompt rows need the segment-aware attention (sdpa/eager models); others get unshared rows
        self.share_prompt = enable_segment_attention(hf)
        self.plain_head = (getattr(hf.config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES
                           and hf.get_output_embeddings() is not None)
        if self.sync.lockstep:
            # NOTE: under FSDP2 the root module's hooks gather the embedding / LM head; calling the decoder body
            # and the head separately would bypass them, so the model's own forward computes the logits
            self.plain_head = False
        model = self.weight_mode.prepare(hf, self.sync, self.cfg.seed)
        if self.cfg.gradient_checkpointing:
            self.weight_mode.gradient_checkpointing(model)
        ref_model = self.weight_mode.frozen_reference(model, self.sync) if reference else None
        return self.sync.wrap(model), ref_model  # FSDP2 shards here; DDP makes the replicas equal

    def _build_teacher(self, path: str, attn_implementation: str | None) -> tuple[torch.nn.Module, bool, bool]:
        """The distillation teacher, loaded as the policy is (dropout off), frozen and never sharded or wrapped; with
        whether its logits are a plain LM head and whether it runs shared-prompt rows. Its weights stay float32 under
        a float32 trainer and become bfloat16 under bf16 autocast (whose matmuls round them to bf16 anyway): a
        teacher larger than the policy then holds half the memory."""
        try:
            hf = load_causal_lm(path, self.device, attn_implementation)
        except TrainerError as e:
            raise TrainerError(f"algo.distill.teacher: {e}") from None
        if self.precision.autocast_dtype is not None:
            hf = hf.to(self.precision.autocast_dtype)  # type: ignore[arg-type]
        share = enable_segment_attention(hf)
        plain = getattr(hf.config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES and hf.get_output_embeddings() is not None
        return freeze(hf), plain, share

    def _build_optimizer(self, total_steps: int | None
                         ) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
        """AdamW over the trainable parameters and the LR schedule spanning `total_steps` RL steps' updates."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        beta1, beta2 = self.cfg.betas
        optimizer = adamw(
            params, lr=self.cfg.lr, betas=(beta1, beta2), eps=self.cfg.adam_eps, weight_decay=self.cfg.weight_decay,
        )
        total_opt_steps = (total_steps if total_steps is not None else self.cfg.steps) * self.cfg.updates_per_step
        schedule, warmup, min_ratio = self.cfg.schedule, self.cfg.warmup_steps, self.cfg.min_lr_ratio

        def factor(s: int) -> float:
            return lr_lambda(s, schedule=schedule, warmup_steps=warmup, total_steps=total_opt_steps,
                             min_lr_ratio=min_ratio)

        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    @staticmethod
    def _load_tokenizer(path: str | Path) -> Tokenizer | None:
        """The tokenizer next to the weights, or None (token-in/token-out training does not need one)."""
        p = Path(path)
        if not any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")):
            return None
        try:
            from transformers import AutoTokenizer

            tok: Tokenizer = AutoTokenizer.from_pretrained(str(p))
            return tok
        except Exception:  # noqa: BLE001 - a tokenizer is optional here; checkpoints then copy its files instead
            return None

    @contextlib.contextmanager
    def _reference(self) -> Iterator[torch.nn.Module]:
        if not self.has_reference:
            raise TrainerError("the KL penalty needs a reference model: build the Trainer with reference=True")
        with self.weight_mode.reference(self.model, self.ref_model) as model:
            yield model

    # ------------------------------------------------------------------------------------------- forward

    def _row_logprobs(self, model: torch.nn.Module, mb: PackedMicroBatch, need_entropy: bool, *,
                      plain_head: bool | None = None, share_prompt: bool | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of the completion targets of one packed row. -> ([N], [N] | None)
        plain_head, share_prompt: the model's own flags where it is not the policy (the teacher); None = the policy's."""
        plain_head = self.plain_head if plain_head is None else plain_head
        share_prompt = self.share_prompt if share_prompt is None else share_prompt
        pred = mb.pred_positions.to(self.device)  # [N]
        targets = mb.target_ids.to(self.device)  # [N]
        kw = row_inputs(model, mb, self.device, segments_ok=share_prompt)  # ids, positions [1, L], attention
        with self.precision.autocast():
            head = as_causal_lm(model).get_output_embeddings() if plain_head else None
            if head is not None:
                body = as_causal_lm(model).get_decoder()
                hidden = body(use_cache=False, **kw).last_hidden_state
                return head_logprobs(hidden[0, pred], head, targets, self.temperature,
                                     need_entropy, self.head_chunk_elems, self.top_p, self.top_k)
            out = model(use_cache=False, logits_to_keep=pred, **kw)
        logits = out.logits[0]  # [N, V] in the forward's dtype: only the positions that predict targets
        return token_logprobs(logits, targets, self.temperature, need_entropy, self.logprob_chunk, self.top_p, self.top_k)

    @staticmethod
    def _scatter(values: torch.Tensor, mb: PackedMicroBatch, width: int) -> torch.Tensor:
        """[N] target values -> [len(mb.seq_ids), width] in the row's sequence order (0 elsewhere); differentiable."""
        return mb.scatter(values, width)

    @overload
    def compute_logprobs(self, batch: TrainBatch, *, reference: bool = ..., with_entropy: Literal[False] = ...
                         ) -> torch.Tensor: ...

    @overload
    def compute_logprobs(self, batch: TrainBatch, *, reference: bool = ..., with_entropy: Literal[True]
                         ) -> tuple[torch.Tensor, torch.Tensor]: ...

    @torch.no_grad()
    def compute_logprobs(self, batch: TrainBatch, *, reference: bool = False, with_entropy: bool = False
                         ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs of every completion token under the current policy (or the reference).

        -> [B, T] float32 on the trainer's device, 0 on padding (and `[B, T]` entropies when `with_entropy`).
        Same temperature and top-p/top-k truncation as the engine; runs on the packed micro-batches of `batch`.
        """
        lp, ent = self._batch_logprobs(batch, reference=reference, with_entropy=with_entropy)
        return (lp, ent) if with_entropy else lp

    @torch.no_grad()
    def _batch_logprobs(self, batch: TrainBatch, *, reference: bool, with_entropy: bool
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """`compute_logprobs`: ([B, T] log-probs, [B, T] entropies, zeros unless `with_entropy`)."""
        ctx = self._reference() if reference else contextlib.nullcontext(self.model)
        batch = batch.with_layout(batch.share_prompt and self.share_prompt)
        b, t = batch.num_sequences, batch.max_completion_len
        lp_out = torch.zeros(b, t, dtype=torch.float32, device=self.device)
        ent_out = torch.zeros(b, t, dtype=torch.float32, device=self.device)
        with ctx as model:
            was_training = model.training
            model.eval()
            try:
                extra = self._lockstep_extra(len(batch.micro_batches))
                for mb in batch.micro_batches:
                    lp, ent = self._row_logprobs(model, mb, with_entropy)
                    sel = torch.tensor(mb.seq_ids, dtype=torch.long, device=self.device)
                    lp_out[sel] = self._scatter(lp, mb, t)
                    if ent is not None:
                        ent_out[sel] = self._scatter(ent, mb, t)
                self._run_dummies(model, extra, backward=False)
            finally:
                model.train(was_training)
        return lp_out, ent_out

    @torch.no_grad()
    def teacher_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """The distillation teacher's log-prob of every completion token, under the policy's sampling transform
        (temperature, top-k / top-p). -> [B, T] float32 on the trainer's device, 0 on padding.
        NOTE: no lockstep dummies: the teacher is never sharded, so its forwards join no collective."""
        if self.teacher is None:
            raise TrainerError("teacher_logprobs needs a distillation teacher: build the Trainer with distill=...")
        batch = batch.with_layout(batch.share_prompt and self.teacher_share_prompt)
        t = batch.max_completion_len
        out = torch.zeros(batch.num_sequences, t, dtype=torch.float32, device=self.device)
        for mb in batch.micro_batches:
            lp, _ = self._row_logprobs(self.teacher, mb, False, plain_head=self.teacher_plain_head,
                                       share_prompt=self.teacher_share_prompt)
            out[torch.tensor(mb.seq_ids, dtype=torch.long, device=self.device)] = self._scatter(lp, mb, t)
        return out

    def _distilled(self, batch: TrainBatch) -> tuple[TrainBatch, dict[str, float]]:
        """`batch` with the distillation advantages (`train/distill.py`) in place of its own, and their metrics."""
        assert self.distill is not None
        teacher = self.teacher_logprobs(batch).cpu()  # [B, T]
        adv = distill_advantages(batch.old_logprobs, teacher, batch.loss_mask, batch.advantages,
                                 coef=self.distill.coef, reward_weight=self.distill.reward_weight)
        return dataclasses.replace(batch, advantages=adv), distill_metrics(batch.old_logprobs, teacher, batch.loss_mask)

    def _lockstep_extra(self, n_local: int) -> int:
        """Under FSDP2 every rank runs as many forwards (and backwards) as the busiest one: how many dummy ones
        this rank owes. A collective: call it BEFORE the real forwards (their gathers are collectives too)."""
        return self.sync.max_count(n_local) - n_local if self.sync.lockstep else 0

    def _run_dummies(self, model: torch.nn.Module, extra: int, *, backward: bool) -> None:
        """`extra` zero-weighted forwards (and backwards): their gradient is exactly 0."""
        ids = torch.zeros(1, 2, dtype=torch.long, device=self.device)
        for _ in range(extra):
            with self.precision.autocast():
                out = model(input_ids=ids, use_cache=False, logits_to_keep=1)
            if backward:
                (out.logits.float().sum() * 0.0).backward()

    @torch.no_grad()
    def probe_logprobs(self, prompts: list[list[int]]) -> torch.Tensor:
        """The policy's next-token distribution after each prompt, as the engine samples it: float32 log-probs
        of logits / T truncated to top-k / top-p and renormalised (-inf outside the kept set). [P, V] on the CPU.

        The weight-sync check (`run.sync_check`) compares an engine's reported log-probs with these: a sync that
        did not land, or a server reporting another log-prob mode, shows as a gap far above float noise.
        NOTE: always float32, whatever `self.precision` the training forward runs in: the reference is the weights'
        own distribution, so a float32 engine matches it to float noise, and bf16 training (whose rounding is
        ~1e-2 in log-prob) cannot make a landed sync look like a failed one."""
        if not prompts or any(not p for p in prompts):
            raise TrainerError("probe_logprobs needs non-empty prompts")
        was_training = self.model.training
        self.model.eval()
        rows = []
        try:
            for p in prompts:
                ids = torch.tensor([p], dtype=torch.long, device=self.device)
                logits = self.model(input_ids=ids).logits[0, -1:].float()
                rows.append(sampling_logprobs(logits, self.temperature, self.top_p, self.top_k)[0].cpu())
        finally:
            self.model.train(was_training)
        return torch.stack(rows)

    # ------------------------------------------------------------------------------------------- update

    def minibatch_generator(self) -> torch.Generator:
        """The generator this RL step's mini-batch split is drawn from: a function of (`cfg.seed`, `rl_step`) only,
        so the split differs from step to step, repeats across identical runs, and survives a resume (rl_step is
        checkpointed) without carrying any RNG state. NOTE: a fixed split (every updates_per_step-th sequence, each
        step) would put the same sequences together in every step's mini-batches; PPO-style epochs shuffle."""
        return torch.Generator().manual_seed((int(self.cfg.seed) * 1_000_003 + 7919 * int(self.rl_step)) % 2**63)

    def _plan(self, batch: TrainBatch, minis: list[tuple[list[int], TrainBatch | None]], loss_cfg: LossConfig
              ) -> tuple[list[MiniBatchPlan], int]:
        """Per mini-batch: the batch indices this rank trains on, their sub-batch, the whole mini-batch's counts;
        and how many sequences were skipped for carrying no gradient. The same on every rank up to the last step,
        which takes this rank's share (`train/rank_split.py`)."""
        plans = []
        dropped = 0
        for idx, given in minis:
            mini = given if given is not None else batch.subset(idx)
            # the losses divide by whole-mini-batch counts, taken before any sequence is dropped or split off
            n_seq, n_tok = normalizers(mini.loss_mask)
            keep = list(range(mini.num_sequences))
            if loss_cfg.kl_coef == 0 and self.skip_zero_advantage:
                keep = with_gradient(mini)
                dropped += mini.num_sequences - len(keep)
            if self.sync.world_size > 1 and keep:
                shares = split_for_ranks([mini.tokens[j] for j in keep], [mini.prompt_lens[j] for j in keep],
                                         self.sync.world_size)
                keep = [keep[j] for j in shares[self.sync.rank]]
            trained: TrainBatch | None = mini
            if len(keep) < mini.num_sequences:
                idx = [idx[j] for j in keep]
                trained = mini.subset(keep) if keep else None
            plans.append(MiniBatchPlan(idx, trained, n_seq, n_tok))
        return plans, dropped

    def _logprobs_of(self, batch: TrainBatch, rows: list[int], *, reference: bool = False) -> torch.Tensor:
        """`compute_logprobs` of `rows` only, laid out as [B, T] for the whole batch (0 elsewhere)."""
        out = torch.zeros(batch.num_sequences, batch.max_completion_len, dtype=torch.float32, device=self.device)
        if len(rows) == batch.num_sequences:
            return self.compute_logprobs(batch, reference=reference)
        if rows:
            lp = self.compute_logprobs(batch.subset(rows), reference=reference)
            out[torch.tensor(rows, dtype=torch.long, device=self.device), :lp.shape[1]] = lp
        elif self.sync.lockstep:  # nothing of ours: still run the other ranks' number of forwards
            ctx = self._reference() if reference else contextlib.nullcontext(self.model)
            with ctx as model, torch.no_grad():
                self._run_dummies(model, self._lockstep_extra(0), backward=False)
        return out

    def _step_inputs(self, batch: TrainBatch, loss_cfg: LossConfig, generator: torch.Generator | None) -> StepInputs:
        """The step's mini-batch plans and the fixed log-probs its losses compare against (reference, proximal)."""
        n_updates = min(self.cfg.updates_per_step, batch.num_sequences)
        minis: list[tuple[list[int], TrainBatch | None]]
        if n_updates == 1:
            minis = [(list(range(batch.num_sequences)), batch)]
        else:
            gen = generator if generator is not None else self.minibatch_generator()
            order = torch.randperm(batch.num_sequences, generator=gen).tolist()
            minis = [(sorted(order[k::n_updates]), None) for k in range(n_updates)]
        plans, dropped = self._plan(batch, minis, loss_cfg)
        # reference / proximal log-probs of the sequences this rank trains on, nothing else
        need = sorted({i for p in plans for i in p.idx})
        ref = self._logprobs_of(batch, need, reference=True) if self.has_reference else None  # [B, T]
        prox = None
        if loss_cfg.uses_proximal and n_updates > 1:
            # The proximal policy is the one before this step's first update; with a single update the loss
            # takes logprobs.detach(), which is the same thing without a second forward.
            prox = self._logprobs_of(batch, need)  # [B, T]
        return StepInputs(plans, dropped, len(minis), ref, prox)

    def train_step(self, batch: TrainBatch, loss_fn: LossFn, loss_cfg: LossConfig, *,
                   generator: torch.Generator | None = None, fresh_version: int | None = None) -> dict[str, float]:
        """One RL step on `batch`: `cfg.updates_per_step` optimiser steps (shuffled mini-batches when > 1, drawn
        from `generator`, else from `minibatch_generator`: seeded by `cfg.seed` and this step's number, so a run
        and its resume shuffle alike), gradient accumulation over packed micro-batches. Returns float metrics:

        loss, pg_loss, kl, entropy, clip_frac, ratio_mean (token-weighted over micro-batches), ratio_max, grad_norm
        (before clipping, last update), lr (used by the last update), logprob_diff_mean / logprob_diff_max (|trainer - engine| log-prob on
        the same policy tokens, before any update of this step), train_tokens (prompt + completion of every
        sequence), forward_tokens (tokens the training forwards ran: fewer with shared prompts and skipped sequences), zero_adv_sequences
        (sequences not run because they carry no gradient: all-zero advantage or no loss token, without a KL term;
        the per-token metrics are then over the sequences that ran), micro_batches, skipped_steps, and
        wall times: train_s (all), ref_s (reference / proximal forward passes), optim_s (clip + AdamW).
        With a distillation teacher also distill_reverse_kl, distill_teacher_logprob (`train.distill.distill_metrics`)
        and teacher_s (its forward).

        fresh_version: the weight version these weights were published as. Then also logprob_diff_seq_max (the
        largest per-sequence mean |trainer - engine| log-prob over the loss tokens generated at that version: a
        made-up rollout shows here, however few) and logprob_diff_seqs (the sequences it was taken over). Like the
        gap metrics it is taken before any update of the step: over every sequence that runs when the loss has a
        proximal policy or there is one update, else over the first mini-batch's.
        """
        t0 = time.perf_counter()
        batch = batch.with_layout(batch.share_prompt and self.share_prompt)
        distill_m: dict[str, float] = {}
        if self.distill is not None:  # per-token advantages from the teacher, before any sequence is planned or skipped
            batch, distill_m = self._distilled(batch)
            distill_m["teacher_s"] = time.perf_counter() - t0
        if loss_cfg.kl_coef > 0 and not self.has_reference:
            raise TrainerError("algo.kl_coef > 0 needs a reference model: build the Trainer with reference=True")
        collective_s0 = self.sync.clock.seconds
        t_ref = time.perf_counter()
        inputs = self._step_inputs(batch, loss_cfg, generator)
        ref_s = time.perf_counter() - t_ref
        optim_s = 0.0
        stats = StepStats(lr=float(self.optimizer.param_groups[0]["lr"]), train_tokens=float(batch.num_tokens),
                          zero_adv_sequences=float(inputs.dropped), mini_batches=float(inputs.mini_batches))
        self.model.train()
        for k, plan in enumerate(inputs.plans):
            self.optimizer.zero_grad(set_to_none=True)
            # the trainer-vs-engine gap is measured at the pre-update parameters
            self._accumulate(plan, inputs, loss_fn, loss_cfg, stats, gap=k == 0 or inputs.prox is not None,
                             fresh_version=fresh_version)
            optim_s += self._update(stats)
        self.optimizer.zero_grad(set_to_none=True)
        self.rl_step += 1
        if self.sync.world_size > 1:  # every rank reports the whole step
            stats = stats.merge(self.sync.gather(stats))
        timings = {"ref_s": ref_s, "optim_s": optim_s}
        if self.sync.world_size > 1:
            timings["collective_s"] = self.sync.clock.seconds - collective_s0
        timings["train_s"] = time.perf_counter() - t0
        return {**stats.metrics(**timings), **distill_m}

    def _accumulate(self, plan: MiniBatchPlan, inputs: StepInputs, loss_fn: LossFn, loss_cfg: LossConfig,
                    stats: StepStats, *, gap: bool, fresh_version: int | None = None) -> None:
        """Forward and backward over one mini-batch's packed micro-batches (gradients accumulate); under FSDP2
        also the dummy ones that keep this rank in lockstep."""
        mini = plan.batch
        if mini is None:  # nothing of this mini-batch on this rank
            self._run_dummies(self.model, self._lockstep_extra(0), backward=True)
            return
        sel_full = torch.tensor(plan.idx, dtype=torch.long, device=self.device)
        t = mini.max_completion_len
        fixed = MiniBatchTensors(
            width=t,
            old=mini.old_logprobs.to(self.device),  # [b, T]
            mask=mini.loss_mask.to(self.device),  # [b, T]
            adv=mini.advantages.to(self.device),  # [b], or [b, T] per token
            ref=inputs.ref[sel_full, :t] if inputs.ref is not None else None,
            prox=inputs.prox[sel_full, :t] if inputs.prox is not None else None,
            fresh=fresh_tokens(mini, fresh_version).to(self.device) if gap and fresh_version is not None else None,
        )
        extra = self._lockstep_extra(len(mini.micro_batches))
        for mb in mini.micro_batches:
            self._micro_step(mb, fixed, plan, loss_fn, loss_cfg, stats, gap=gap)
        self._run_dummies(self.model, extra, backward=True)

    def _micro_step(self, mb: PackedMicroBatch, fixed: MiniBatchTensors, plan: MiniBatchPlan, loss_fn: LossFn,
                    loss_cfg: LossConfig, stats: StepStats, *, gap: bool) -> None:
        """One packed micro-batch: forward, the loss over its sequences, backward, and its totals."""
        t = fixed.width
        lp_tok, ent_tok = self._row_logprobs(self.model, mb, need_entropy=True)  # [N]
        lp = self._scatter(lp_tok, mb, t)  # [b_mb, T]
        ent = self._scatter(ent_tok, mb, t) if ent_tok is not None else None
        sel = torch.tensor(mb.seq_ids, dtype=torch.long, device=self.device)
        m = fixed.mask[sel]
        old = fixed.old[sel]
        prox = fixed.prox[sel] if fixed.prox is not None else None
        loss, met = loss_fn(lp, old, fixed.adv[sel], m, cfg=loss_cfg,
                            ref_logprobs=fixed.ref[sel] if fixed.ref is not None else None,
                            prox_logprobs=prox, entropy=ent, num_sequences=plan.num_sequences,
                            num_tokens=plan.num_tokens)
        (loss * self.sync.loss_scale if self.sync.loss_scale != 1.0 else loss).backward()
        w = float(m.sum().item())
        stats.add_micro(met, w, forward_tokens=mb.num_tokens)
        if gap:  # trainer-vs-engine gap on the same tokens
            d = ((prox if prox is not None else lp.detach()) - old).abs() * m
            stats.add_gap(float(d.sum().item()), w, float(d.max().item()) if d.numel() else 0.0)
            if fixed.fresh is not None:  # per sequence, over its tokens made at the trainer's version
                f = fixed.fresh[sel] * m
                n = f.sum(dim=1)
                seq_gap = (d * f).sum(dim=1)[n > 0] / n[n > 0]
                if seq_gap.numel():
                    stats.add_seq_gap(float(seq_gap.max().item()), float(seq_gap.numel()))

    def _update(self, stats: StepStats) -> float:
        """Reduce, clip and apply the accumulated gradient (one optimiser step); -> its wall seconds."""
        t_opt = time.perf_counter()
        stats.lr = float(self.optimizer.param_groups[0]["lr"])
        params = [p for p in self.model.parameters() if p.requires_grad]
        # NOTE: nothing ran here -> exact zero gradients, as the full computation would give (AdamW's moments
        # and step count still advance); with ranks, the sum over them
        self.sync.reduce_grads(params)
        clip = self.cfg.grad_clip if self.cfg.grad_clip is not None else float("inf")
        stats.grad_norm = self.sync.clip_grad_norm(params, clip)
        if math.isfinite(stats.grad_norm):
            self.optimizer.step()
        else:  # NOTE: a NaN/inf gradient would poison AdamW's moments for good; drop this update instead
            stats.skipped_steps += 1
        self.scheduler.step()
        self.step += 1
        return time.perf_counter() - t_opt

    # ------------------------------------------------------------------------------------------- weights

    def full_weights(self) -> dict[str, torch.Tensor]:
        """The unsharded HF-named weights (every rank must call it under FSDP2; rank 0 gets them, others {})."""
        return self.sync.full_model_state(self.model)

    def full_optimizer_state(self) -> dict[str, Any]:
        """AdamW's state in `optimizer.state_dict()` layout, whatever the world size (a gather under FSDP2)."""
        return self.sync.full_optimizer_state(self.model, self.optimizer)

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.sync.load_optimizer_state(self.model, self.optimizer, state)

    @torch.no_grad()
    def state_dict_for_sync(self) -> dict[str, torch.Tensor]:
        """Full HF-named weights for `engine.load_weights` (LoRA merged in, without touching the live weights).

        NOTE: without LoRA the tensors alias the live parameters (no copy); clone them if you keep them across an
        optimiser step or send them to another process. Under FSDP2 a gather every rank joins; rank 0 gets them.
        """
        return self.weight_mode.weights_for_sync(self.model, self.sync)

    def save_adapter(self, path: str | Path) -> None:
        """The LoRA adapter in PEFT format (adapter_model.safetensors + adapter_config.json) at `path`: what a vLLM
        with LoRA on loads (`engine.vllm.lora_adapters`), a few MB instead of the merged model."""
        self.weight_mode.save_adapter(self.model, Path(path))

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """What a resume must restore besides the HF weights: the LoRA adapter tensors (empty without LoRA)."""
        return self.weight_mode.trainable_state(self.model)

    def load_full_weights(self, state_dict: dict[str, torch.Tensor], source: str = "") -> None:
        """Load HF-named full weights into the policy (not for LoRA). Tied weights may be absent; anything else
        missing or unexpected is an error naming the key."""
        self.weight_mode.check_full_load()
        live = self.model.state_dict()
        unexpected = [k for k in state_dict if k not in live]
        if unexpected:
            raise TrainerError(f"{source or 'weights'}: unexpected parameter {unexpected[0]!r} for this model")
        for k, v in state_dict.items():
            if tuple(v.shape) != tuple(live[k].shape):
                raise TrainerError(f"{source or 'weights'}: parameter {k!r} has shape {tuple(v.shape)}, model expects {tuple(live[k].shape)}")
        if self.sync.lockstep:  # sharded: each rank keeps its slice of the full tensors
            tied = {"lm_head.weight"} if getattr(as_causal_lm(self.model).config, "tie_word_embeddings", False) else set()
            missing = [k for k in live if k not in state_dict and k not in tied]
            if missing:
                raise TrainerError(f"{source or 'weights'}: missing parameter {missing[0]!r}")
            self.sync.load_model_state(self.model, state_dict)
            return
        loaded_ptrs = {live[k].data_ptr() for k in state_dict}
        missing = [k for k in live if k not in state_dict and live[k].data_ptr() not in loaded_ptrs]
        if missing:
            raise TrainerError(f"{source or 'weights'}: missing parameter {missing[0]!r}")
        self.sync.load_model_state(self.model, state_dict)

    def load_trainable(self, state_dict: dict[str, torch.Tensor], source: str = "") -> None:
        """Restore LoRA adapter tensors saved by `trainable_state_dict`."""
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for k, v in state_dict.items():
                if k not in params:
                    raise TrainerError(f"{source or 'adapter'}: unexpected adapter parameter {k!r} (different LoRA options?)")
                params[k].copy_(v.to(params[k].device, params[k].dtype))
