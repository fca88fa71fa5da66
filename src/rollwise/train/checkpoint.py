"""Checkpoints: HF-format weights plus everything a resume needs, written atomically, verified on load.

Layout of `RUN_DIR/checkpoints/step-N/`:

    config.json, model.safetensors (or shards), generation_config.json   # save_pretrained: loads anywhere
    tokenizer files                                                        # when the trainer has a tokenizer
    trainer_state.pt    # optimizer, scheduler, steps, python/numpy/torch RNG, caller's data position, LoRA adapter,
                        # and with a critic its optimizer and steps
    critic/             # with `algo.advantage: gae`: the critic, config.json + model.safetensors (loads with
                        # AutoModelForTokenClassification, and as algo.critic.model)
    checkpoint.json     # manifest: step, size and sha256 of every file (the critic's too); written last, so its
                        # presence marks a complete checkpoint

A checkpoint is written into a hidden temp directory next to the final one and renamed into place, so a crash
leaves either the previous complete checkpoint or the new complete one, never a half-written `step-N`. The temp
directory a crash leaves behind (`.tmp-step-N-PID`, or `.old-step-N-PID` of an interrupted swap) is removed by
`clean_stale_temp` at the next start.

On load, every file is checked against the manifest: its size (a truncated copy, a full disk) and its sha256 (a
weight changed in place, flipped bits), and the manifest's step must agree with its folder's name (a `step-7`
holding step 3 would resume at the wrong place). Any mismatch is a one-line `CheckpointError` naming the file.
Hashing costs about a second per GB on save and on load; a checkpoint is loaded once per resume. Manifests of
format 1 (sizes only, written before hashes existed) still load, checked by size.

With LoRA the saved weights are the MERGED full model (what `rollwise eval`/the engine load), and the adapter
tensors go into trainer_state.pt, so a resume rebuilds the same base + adapter exactly.

`trainer_state.pt` holds only tensors and plain Python containers (numpy RNG arrays are stored as tensors), so it
loads with `torch.load(weights_only=True)`: a checkpoint from elsewhere cannot run code on load.

Deliberately left out: asynchronous/background saving and sharded optimizer state (single-process trainer). With
the rollout store as the write-ahead log (run/resume.py), a checkpoint bounds how many steps a resume re-trains;
it is not what keeps a step from being lost, so a synchronous save every few steps is enough.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.train.critic import Critic
    from rollwise.train.trainer import Trainer
    from rollwise.types import Tokenizer

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.pt"
MANIFEST = "checkpoint.json"
FORMAT_VERSION = 1
"""Version of trainer_state.pt's layout."""
MANIFEST_VERSION = 2
"""Version of checkpoint.json: 2 = size and sha256 per file; 1 = sizes only (still read)."""
_STEP_RE = re.compile(r"^step-(\d+)$")
_TEMP_RE = re.compile(r"^\.(?:tmp|old)-step-\d+-(\d+)$")
_TOKENIZER_GLOBS = ("tokenizer*.json", "tokenizer.model", "vocab*", "merges.txt", "special_tokens_map.json",
                    "added_tokens.json", "chat_template*")


class CheckpointError(ValueError):
    """A missing, incomplete or corrupt checkpoint; the message is one line and names the file."""


@dataclass
class Checkpoint:
    """A verified checkpoint on disk, with its trainer state loaded (call `restore_checkpoint` to apply it)."""

    path: Path
    step: int  # RL step at which it was saved
    data_position: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step-{step}"


# ------------------------------------------------------------------------------------------------- RNG


def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state(legacy=True)
    if not isinstance(np_state, tuple):  # only a non-MT19937 global generator gives the dict form
        raise CheckpointError("numpy's global generator is not MT19937: its state cannot be checkpointed")
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np.array(np_state[1], dtype=np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------------------------------------- save


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clean_stale_temp(run_dir: str | Path) -> list[Path]:
    """Remove the temp folders crashed saves left in RUN_DIR/checkpoints (`.tmp-step-N-PID`, `.old-step-N-PID`);
    returns what was removed. A folder whose PID is a live process (a save under way) is left alone."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    gone = []
    for p in sorted(root.iterdir()):
        m = _TEMP_RE.match(p.name)
        if m and not p.is_symlink() and p.is_dir() and not _pid_alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_weights(trainer: Trainer, out: Path, full: dict[str, torch.Tensor] | None) -> None:
    from rollwise.train.weights import save_plain_hf

    if full is not None:  # gathered from the shards (FSDP2)
        save_plain_hf(trainer.model, full, out)
    else:  # the HF model itself, or with LoRA the merged weights under the plain names
        trainer.weight_mode.save_weights(trainer.model, trainer.sync, out)


def _save_tokenizer(trainer: Trainer, tokenizer: Tokenizer | None, out: Path) -> None:
    tok = tokenizer if tokenizer is not None else trainer.tokenizer
    if tok is not None and hasattr(tok, "save_pretrained"):
        tok.save_pretrained(str(out))
        return
    src = trainer.model_path  # no loadable tokenizer object: carry the files over as they are
    for pattern in _TOKENIZER_GLOBS:
        for f in src.glob(pattern):
            if f.is_file():
                shutil.copy2(f, out / f.name)


def save_checkpoint(trainer: Trainer, run_dir: str | Path, step: int, *, data_position: dict[str, Any] | None = None,
                    tokenizer: Tokenizer | None = None, keep: int | None = None, critic: Critic | None = None) -> Path:
    """Write `RUN_DIR/checkpoints/step-{step}/` atomically and return its path.

    data_position: the caller's place in its data (e.g. {"epoch": 1, "index": 96, "sampler": generator.get_state()})
    - tensors and plain containers only. keep: delete all but the newest `keep` checkpoints afterwards. critic: the
    value model trained beside the policy (`algo.advantage: gae`), saved into `critic/` with its optimiser state.
    """
    root = Path(run_dir) / CHECKPOINTS
    final = root / f"step-{step}"
    # NOTE on ranks: every rank calls this; under FSDP2 the two gathers below are collectives. Only rank 0 writes,
    # and what it writes is the full (unsharded) state, so the checkpoint loads at any world size.
    full = trainer.full_weights() if trainer.sync.lockstep else None
    optimizer_state = trainer.full_optimizer_state()
    if trainer.sync.rank != 0:
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-step-{step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        _save_weights(trainer, tmp, full)
        _save_tokenizer(trainer, tokenizer, tmp)
        state = {
            "format_version": FORMAT_VERSION,
            "step": int(step),
            "optimizer_steps": int(trainer.step),
            "rl_steps": int(trainer.rl_step),
            "optimizer": optimizer_state,
            "world_size": int(trainer.sync.world_size),
            "scheduler": trainer.scheduler.state_dict(),
            "rng": _rng_state(),
            "data_position": dict(data_position or {}),
            "trainable": trainer.trainable_state_dict(),
            "lora": bool(trainer.lora),
        }
        if critic is not None:
            from rollwise.train.critic import CRITIC_DIR

            state["critic"] = critic.save(tmp / CRITIC_DIR)
        torch.save(state, tmp / STATE_FILE)
        files = {p.relative_to(tmp).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p)}
                 for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / MANIFEST).write_text(json.dumps({"format_version": MANIFEST_VERSION, "step": int(step), "files": files},
                                               indent=1))
        _fsync_tree(tmp)
        if final.exists():  # re-saving a step (e.g. after a resume): swap, then drop the old one
            old = root / f".old-step-{step}-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep is not None:
        for _, old_path in _complete_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old_path, ignore_errors=True)
    return final


# ------------------------------------------------------------------------------------------------- load


def _complete_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of checkpoints with a manifest, oldest first. Temp dirs and dirs without manifest are skipped."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and p.is_dir() and (p / MANIFEST).is_file():
            out.append((int(m.group(1)), p))
    return sorted(out)


def find_latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Path of the newest complete checkpoint under RUN_DIR/checkpoints, or None."""
    found = _complete_checkpoints(run_dir)
    return found[-1][1] if found else None


def _manifest_entry(entry: Any, version: int, mf: Path, name: str) -> tuple[int, str | None]:
    """(size, sha256) of one manifest entry: an int size in format 1, {"size": int, "sha256": str} in format 2; any
    other shape is a one-line CheckpointError naming the manifest and the file."""
    if version == 1:
        if isinstance(entry, int) and not isinstance(entry, bool):
            return entry, None
    elif isinstance(entry, dict):
        size, digest = entry.get("size"), entry.get("sha256")
        if isinstance(size, int) and not isinstance(size, bool) and isinstance(digest, str):
            return size, digest
    want = "a size in bytes" if version == 1 else '{"size": bytes, "sha256": hex digest}'
    got = json.dumps(entry)[:60] if entry is None or isinstance(entry, (int, float, str)) else f"a JSON {type(entry).__name__}"
    raise CheckpointError(f"corrupt checkpoint manifest: {mf} gives file {name!r} as {got}, not {want}")


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check the manifest against the folder's name and the files on disk (size, then sha256); return the
    manifest. Any mismatch is a one-line CheckpointError naming the file."""
    path = Path(path)
    mf = path / MANIFEST
    if not mf.is_file():
        raise CheckpointError(f"incomplete checkpoint (no {MANIFEST}): {path}")
    try:
        manifest = json.loads(mf.read_text())
        files = manifest["files"]
        version = int(manifest.get("format_version", 1))
        step = int(manifest["step"])
        if not isinstance(files, dict):
            raise TypeError
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, UnicodeDecodeError, RecursionError):
        raise CheckpointError(f"corrupt checkpoint manifest: {mf}") from None
    m = _STEP_RE.match(path.name)
    if m and int(m.group(1)) != step:
        raise CheckpointError(f"checkpoint {path}: its manifest says step {step}, its folder says step "
                              f"{int(m.group(1))}; refusing to guess which is right")
    if version > MANIFEST_VERSION:
        raise CheckpointError(f"checkpoint manifest {mf} has format {version}, newer than this rollwise reads "
                              f"({MANIFEST_VERSION}); upgrade rollwise")
    for name, entry in files.items():
        f = path / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise CheckpointError(f"corrupt checkpoint manifest: {mf} names a file outside its folder ({name!r})")
        if not f.is_file():
            raise CheckpointError(f"corrupt checkpoint: missing file {f}")
        size, digest = _manifest_entry(entry, version, mf, name)
        actual = f.stat().st_size
        if actual != size:
            raise CheckpointError(f"corrupt checkpoint: {f} is {actual} bytes, expected {size} (truncated?)")
        if version >= 2 and file_sha256(f) != digest:
            raise CheckpointError(f"corrupt checkpoint: {f} does not match the sha256 in {MANIFEST} (changed or "
                                  "damaged after it was saved)")
    return manifest


def load_checkpoint(path: str | Path) -> Checkpoint | None:
    """Load the newest complete checkpoint of a run directory (or a `step-N` directory itself).

    Returns None when the run has no checkpoint yet. Raises CheckpointError (one line, naming the file) when the
    checkpoint is truncated or corrupt; a damaged checkpoint is never silently skipped in favour of an older one,
    because resuming from an older step without saying so would repeat data and steps.
    """
    path = Path(path)
    if _STEP_RE.match(path.name) and path.is_dir():
        ckpt = path
    else:
        if not path.is_dir():
            raise CheckpointError(f"run directory not found: {path}")
        latest = find_latest_checkpoint(path)
        if latest is None:
            return None
        ckpt = latest
    manifest = verify_checkpoint(ckpt)
    sf = ckpt / STATE_FILE
    try:
        state = torch.load(sf, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the file is damaged
        raise CheckpointError(f"corrupt checkpoint file {sf}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"corrupt checkpoint file {sf}: unknown format (expected format_version {FORMAT_VERSION})")
    if int(state.get("step", -1)) != int(manifest["step"]):
        raise CheckpointError(f"corrupt checkpoint file {sf}: holds step {state.get('step')}, its manifest says "
                              f"step {manifest['step']}")
    return Checkpoint(path=ckpt, step=int(manifest["step"]), data_position=state["data_position"], state=state)


def _load_weight_files(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"corrupt checkpoint: no *.safetensors weights in {ckpt}")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            sd.update(load_file(str(f)))
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"corrupt checkpoint file {f}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
    return sd


def restore_checkpoint(trainer: Trainer, ckpt: Checkpoint, *, restore_rng: bool = True,
                       critic: Critic | None = None) -> dict[str, Any]:
    """Apply a loaded checkpoint to a freshly built Trainer (same model architecture and options): weights (or
    the LoRA adapter), optimizer, scheduler, step counters and RNG, and the critic's weights, optimizer and counters
    when `critic` is given (a checkpoint without one is refused). Returns the caller's data position.

    NOTE: build that Trainer from the run's ORIGINAL model path, not from the checkpoint directory: the frozen
    reference model of the KL penalty is the initial policy, copied when the Trainer is built.
    """
    state = ckpt.state
    if bool(state.get("lora")) != bool(trainer.lora):
        raise CheckpointError(f"{ckpt.path / STATE_FILE}: saved with lora={state.get('lora')}, trainer has lora={trainer.lora}")
    if trainer.lora:
        trainer.load_trainable(state["trainable"], source=str(ckpt.path / STATE_FILE))
    else:
        trainer.load_full_weights(_load_weight_files(ckpt.path), source=str(ckpt.path))
    try:
        trainer.load_optimizer_state(state["optimizer"])
        trainer.scheduler.load_state_dict(state["scheduler"])
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"{ckpt.path / STATE_FILE}: optimizer state does not fit this trainer ({str(e).splitlines()[0]})") from None
    trainer.step = int(state["optimizer_steps"])
    trainer.rl_step = int(state["rl_steps"])
    if critic is not None:
        _restore_critic(critic, ckpt)
    if restore_rng:
        _set_rng_state(state["rng"])
    return dict(state["data_position"])


def _restore_critic(critic: Critic, ckpt: Checkpoint) -> None:
    """The critic's weights (`critic/`), optimizer and counters; one-line CheckpointError when the checkpoint has no
    critic (saved by a run without `algo.advantage: gae`) or one that does not fit."""
    from rollwise.train.critic import CRITIC_DIR

    folder = ckpt.path / CRITIC_DIR
    saved = ckpt.state.get("critic")
    if not isinstance(saved, dict) or not folder.is_dir():
        raise CheckpointError(f"checkpoint {ckpt.path} holds no critic (saved without algo.advantage: gae), and this "
                              "run trains one")
    try:
        critic.restore(folder, saved)
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"{folder}: the critic does not fit this run ({str(e).splitlines()[0]})") from None
