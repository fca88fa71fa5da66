"""The SFT stage: supervised fine-tuning on demonstrations, before RL in `rollwise train`, or alone (`rollwise sft`).

    demos    = train.sft.load_demos(sft.path)                      # {"messages": [...]} per line
    rendered = render_demos(demos, ChatTurns(tokenizer, prompt))   # exactly as rollouts are laid out
    for step in 1..sft.steps:                                      # a seeded order, epoch after epoch
        trainer.train_step(batch of sft.batch_size, sft_loss)      # loss on assistant tokens only
        checkpoint every sft.checkpoint_every (RUN_DIR/sft/checkpoints/step-N, resumable)
    -> RUN_DIR/sft/checkpoints/step-{sft.steps}: the model RL starts from

Resume: the newest complete SFT checkpoint is restored (weights, optimiser, LR schedule, RNG) and the stage goes on
from its step; a batch depends only on (seed, step), so a resumed stage trains on exactly the batches the
uninterrupted one would. A finished stage (`RUN_DIR/sft/done.json`) is not run again: `rollwise train --resume`
after SFT goes straight to RL. A fresh run in a used RUN_DIR moves an earlier `sft/` aside into `quarantine/`.

Deliberately left out: evaluation inside the stage (the loop evaluates the base model and the SFT model on the
held-out set, as `eval_base` and `eval_before`), and SFT on a Ray trainer (it runs in-process).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.config import RunConfig, SftConfig, TrainConfig
    from rollwise.models.prompting import PromptFormat
    from rollwise.train.sft import DemoFile, RenderedDemo
    from rollwise.types import Tokenizer

Log = Callable[[str], None]
SFT_DIR = "sft"
DONE = "done.json"
_STEP_NAME = re.compile(r"step-\d+")


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> list[int]:
    """The demonstrations of 1-based `step`: positions [(step-1)*B, step*B) of the stream made of one seeded
    permutation of range(n) per epoch. A function of its arguments only (so a resume needs just the step)."""
    out = []
    for pos in range((step - 1) * batch_size, step * batch_size):
        epoch, k = divmod(pos, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()
        out.append(perm[k])
    return out


def sft_train_config(sft: SftConfig, train: TrainConfig) -> TrainConfig:
    """The trainer config of the SFT stage: the `train` section with `sft`'s optimiser settings."""
    return train.model_copy(update={"lr": sft.lr, "steps": sft.steps, "schedule": sft.schedule,
                                    "warmup_steps": sft.warmup_steps, "grad_clip": sft.grad_clip,
                                    "updates_per_step": 1})


@dataclass(frozen=True)
class SftStage:
    """What the SFT stage needs of the run config, taken from it once (`SftStage.of`)."""

    sft: SftConfig
    train: TrainConfig
    """The trainer config of the stage (`sft_train_config`): `train` with `sft`'s optimiser settings."""
    seed: int
    """`train.seed`: the order of the demonstrations."""
    micro_batch_tokens: int
    max_model_len: int | None
    """`engine.max_model_len`: a longer demonstration is refused before any training."""
    tokenizer_path: str | None
    """`model.tokenizer`."""

    @classmethod
    def of(cls, cfg: RunConfig) -> SftStage:
        return cls(cfg.sft, sft_train_config(cfg.sft, cfg.train), cfg.train.seed, cfg.train.micro_batch_tokens,
                   cfg.engine.max_model_len, cfg.model.tokenizer)


class SftStageError(ValueError):
    """A finished SFT stage whose record or model cannot be trusted; one line naming the file."""


def finished_sft(run_dir: Path) -> Path | None:
    """The final SFT model of a run whose stage finished, verified, else None (the stage has not finished).

    The model is verified by hash before a resume uses it: every file against its checkpoint manifest, and the
    manifest against the sha256 `done.json` recorded when the stage finished, so a model changed in place (or a
    manifest rewritten to match it) is refused with one line instead of silently becoming the start of RL."""
    from rollwise.train.checkpoint import MANIFEST, CheckpointError, file_sha256, verify_checkpoint

    root = run_dir / SFT_DIR
    done = root / DONE
    if not done.is_file():
        return None
    fix = f"move {root} aside to run the SFT stage again"
    try:
        info = json.loads(done.read_text())
    except (ValueError, RecursionError):
        raise SftStageError(f"{done} is not valid JSON ({fix})") from None
    name = info.get("checkpoint") if isinstance(info, dict) else None
    if not isinstance(name, str) or _STEP_NAME.fullmatch(name) is None:
        if isinstance(info, dict) and isinstance(info.get("model"), str) and "checkpoint" not in info:
            name = Path(info["model"]).name  # written before done.json named its checkpoint: the folder's name
        if not isinstance(name, str) or _STEP_NAME.fullmatch(name) is None:
            raise SftStageError(f"{done} names no SFT checkpoint (checkpoint: step-N) ({fix})")
    path = root / "checkpoints" / name
    if not (path / "config.json").is_file():
        return None
    try:
        verify_checkpoint(path)
    except CheckpointError as e:
        raise SftStageError(f"the finished SFT model was changed after the stage ended: {e} ({fix})") from None
    want = info.get("manifest_sha256")
    if want is not None and file_sha256(path / MANIFEST) != want:
        raise SftStageError(f"the finished SFT model was changed after the stage ended: {path / MANIFEST} does not "
                            f"match the sha256 {done} recorded ({fix})")
    return path


def model_context(model_dir: Path) -> int | None:
    """The longest sequence the model's config says it takes (`max_position_embeddings` or its equivalents, also
    under `text_config`), or None when its config.json does not say."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    for section in (cfg, cfg.get("text_config") if isinstance(cfg, dict) else None):
        if not isinstance(section, dict):
            continue
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            n = section.get(key)
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                return n
    return None


def _check_context(demos: DemoFile, rendered: list[RenderedDemo], max_model_len: int | None, base_dir: Path) -> None:
    """Refuse, naming its file and line, a demonstration longer than the model's context: `engine.max_model_len`
    when set, else what the model's config.json says (a longer one would train on positions the model has no
    place for, silently)."""
    from rollwise.train.sft import DemoError

    limit = max_model_len or model_context(base_dir)
    if not limit:
        return
    tokens = [len(d.prompt_ids) + len(d.completion_ids) for d in rendered]
    over = [i for i, n in enumerate(tokens) if n > limit]
    if over:
        what = "engine.max_model_len" if max_model_len else f"the model's context ({base_dir / 'config.json'})"
        more = f"; {len(over) - 1} more demonstration(s) are over it too" if len(over) > 1 else ""
        raise DemoError(f"{demos.where(over[0])}: the demonstration is {tokens[over[0]]} tokens as rendered for "
                        f"the model, over {what} of {limit} tokens: shorten it or drop the line{more}")


def set_aside(run_dir: Path) -> Path | None:
    """A fresh run: move an earlier run's `sft/` into `quarantine/` (nothing is deleted)."""
    old = run_dir / SFT_DIR
    if not old.exists():
        return None
    dest = run_dir / "quarantine" / f"previous-sft-{time.strftime('%Y%m%d-%H%M%S')}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    old.rename(dest)
    return dest


def _keep_metrics_through(path: Path, step: int) -> None:
    """Drop metrics lines after `step` (and a torn last line): a resumed stage logs those steps again. The file is
    replaced, not rewritten in place, so the stage appends to a file of its own (never through a hard link)."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line)["step"]) <= step:
                keep.append(line)
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    os.replace(tmp, path)


def run_sft(stage: SftStage, base_dir: Path, tokenizer: Tokenizer | None, prompt_format: PromptFormat, run_dir: Path,
            device: str, log: Log, *, stop_after: int | None = None) -> tuple[Path | None, dict[str, Any]]:
    """Run (or resume, or skip when finished) the SFT stage; (final model dir, info). With `stop_after`, stop after
    that many steps of this invocation as if interrupted (returns (None, info))."""
    from rollwise.models.turns import ChatTurns
    from rollwise.train.checkpoint import (
        MANIFEST,
        clean_stale_temp,
        file_sha256,
        find_latest_checkpoint,
        load_checkpoint,
        restore_checkpoint,
        save_checkpoint,
    )
    from rollwise.train.sft import demo_rollouts, read_demos, render_demos, sft_loss
    from rollwise.train.batch import TrainBatch
    from rollwise.train.losses import LossConfig
    from rollwise.train.trainer import Trainer

    S = stage.sft
    root = run_dir / SFT_DIR
    done = finished_sft(run_dir)
    if done is not None:
        info = json.loads((root / DONE).read_text())
        log(f"sft: finished earlier ({info.get('steps')} steps); RL starts from {done}")
        return done, info
    if not S.path:
        raise ValueError("sft.path is not set: the SFT stage needs a demonstrations file")
    raw = read_demos(S.path)
    from rollwise.models.template_check import ensure_prefix_preserving

    # the demonstrations' shape: a template that re-renders earlier turns is refused (or swapped for a known fix)
    ensure_prefix_preserving(tokenizer, prompt_format, what="SFT demonstrations", log=log,
                             tool_turns=bool(prompt_format.tools) or any(m.get("role") == "tool" for d in raw.messages for m in d))
    demos = render_demos(raw, ChatTurns(tokenizer, prompt_format))
    _check_context(raw, demos, stage.max_model_len, base_dir)
    rollouts = demo_rollouts(demos)
    t0 = time.perf_counter()
    trainer = Trainer(base_dir, stage.train, device=device, temperature=1.0, total_steps=S.steps,
                      tokenizer_path=stage.tokenizer_path)
    start = 0
    clean_stale_temp(root)  # temp folders of a save a crash cut short
    latest = find_latest_checkpoint(root)
    if latest is not None:
        ckpt = load_checkpoint(latest)
        if ckpt is None:  # found complete a moment ago: it went away since
            raise ValueError(f"{latest} is no longer a complete checkpoint")
        restore_checkpoint(trainer, ckpt)
        start = ckpt.step
        log(f"sft: resuming after step {start} from {latest}")
    log(f"sft: {len(demos)} demonstrations ({sum(sum(d.loss_mask) for d in demos)} assistant tokens), "
        f"{S.steps} steps of {S.batch_size}, lr {S.lr:g}")
    metrics_path = root / "metrics.jsonl"
    root.mkdir(parents=True, exist_ok=True)
    _keep_metrics_through(metrics_path, start)  # lines of steps the crash lost are logged again
    last = S.steps if stop_after is None else min(S.steps, start + stop_after)
    loss_cfg = LossConfig()
    m: dict[str, float] = {}
    path = latest
    for step in range(start + 1, last + 1):
        batch = [rollouts[i] for i in batch_indices(len(rollouts), S.batch_size, step, stage.seed)]
        m = trainer.train_step(TrainBatch.from_rollouts(batch, stage.micro_batch_tokens), sft_loss, loss_cfg)
        rec = {"step": step, "loss": m.get("loss"), "nll": m.get("nll"), "lr": m.get("lr"),
               "grad_norm": m.get("grad_norm"), "train_s": m.get("train_s")}
        with open(metrics_path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        if step % 10 == 0 or step == S.steps:
            log(f"sft step {step}/{S.steps}: loss {m.get('loss', float('nan')):.4f} ({m.get('train_s', 0):.1f}s)")
        if step == S.steps or (S.checkpoint_every and step % S.checkpoint_every == 0) or step == last:
            path = save_checkpoint(trainer, root, step, data_position={"sft_step": step}, keep=1)
    info = {"steps": S.steps, "demos": len(demos), "final_loss": m.get("loss"), "sft_s": time.perf_counter() - t0,
            "model": str(path) if path is not None else None}
    del trainer
    if last < S.steps or path is None:
        return None, info
    # what a resume checks the final model against (`finished_sft`)
    info.update(checkpoint=path.name, manifest_sha256=file_sha256(path / MANIFEST))
    tmp = root / f".{DONE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, root / DONE)  # a crash leaves the stage unfinished (resumable), never a torn done.json
    log(f"sft: done in {info['sft_s']:.0f}s; RL starts from {path}")
    return path, info


__all__ = ["SftStage", "SftStageError", "batch_indices", "finished_sft", "model_context", "run_sft", "set_aside",
           "sft_train_config"]
