"""Resume without losing a step: the rollout store is the write-ahead log.

Each step ends by writing its shard, and the shard carries, in its Parquet metadata and so in the same atomic
rename as its rows, a `StepRecord`: what the step trained on and in what order (its own rollouts by
(group_id, sample_index) and advantage; replayed copies in full), the python/numpy/torch RNG just before the
update, the loop's state after the step (data position, replay buffer, partial-rollout carry, RNG), its
metrics line and the config it ran under. The loop's order is

    generate -> train -> sync -> (eval) -> write shard with its record -> log metrics -> checkpoint when due

so a SIGKILL at any moment leaves complete shards 1..N and a complete checkpoint at some C <= N (or none: C = 0,
the initial model). A resume restores C, then `replay_stored_steps` re-trains C+1..N from their shards: the
update is a function of (weights, optimizer state, batch, RNG), all restored, so the weights after it are
those the interrupted run had after step N (bit for bit on CPU; on a GPU as far as its kernels are
deterministic: a re-trained step whose loss differs from the logged one is reported). The loop continues at N+1
from step N's state. Nothing stored is deleted: only the step in flight is lost.

What a resume refuses, with one line: a shard whose record is not its own (the seal binding the record to its
shard's step, rows and bytes does not match: a shard copied over another step's, a record or its rows edited) or
is malformed; a config that differs from the one the checkpoint or a stored step was
trained under in a key that changes results (every such key is named; `config.RESUME_MAY_DIFFER` lists the
harmless ones: where the run writes, how often it checkpoints and evaluates, train.steps, engine sizing),
also when config.yaml was edited by hand (its sha256 is kept with each checkpoint, so the edit is named as
such); a train.steps below the checkpoint's step.

What it moves aside, into RUN_DIR/quarantine/ (never deleted): shards it cannot re-train from (after a missing
step, unreadable, or without a sealed record: written by an older rollwise) and every shard after them; metrics lines
of steps it will log again (train/metrics.py `prepare_resume`).

What is regenerated, not restored: with control.async_staleness K > 0, batches the producer generated ahead
but the trainer had not trained (up to K) are generated again from the data position of the last trained step,
with the current weights (their staleness is 0 where the lost ones' was up to K). The prompt selector's beliefs
(control.selector: posterior) and the speculative draft store start empty. With the Ray trainer the update runs
in its actor, whose RNG is its own: the re-trained steps are exact only when the update draws no random numbers
(one update per step, the default).

A resume of a run that already finished (`finished_run`: its summary.json says train.steps steps and was written
after the newest checkpoint, which is at that step) does nothing: one line, no model loaded, no evaluation, no sync
check, nothing rewritten. A larger train.steps continues it.

The same machinery brings back a trainer that died mid-run (a rank process or a Ray actor: `recover_trainer`):
fresh ranks, the latest checkpoint, the stored steps since re-trained, then the step in flight again.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollwise.types import Rollout

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.cluster.trainer_handle import TrainerHandle
    from rollwise.config import RunConfig
    from rollwise.control.controller import RolloutController
    from rollwise.run.sources import DataOrder
    from rollwise.store.replay import ReplayBuffer
    from rollwise.store.writer import RolloutStore
    from rollwise.train.checkpoint import Checkpoint
    from rollwise.types import Task, Tokenizer

RECORD_VERSION = 2
"""2: sealed to its shard (`store.writer.SEAL_KEY`); records of version 1 are re-generated, not re-trained."""
Log = Callable[[str], None]


class ResumeError(ValueError):
    """A resume that cannot continue the run as it was; the message is one line."""


@dataclasses.dataclass(frozen=True)
class ResumeSpec:
    """What resuming and re-training need of the run's config, taken from it once (`ResumeSpec.of`)."""

    run_dir: Path
    config: dict[str, Any]
    """The resolved run config as JSON (`model_dump(mode="json")`): what every record and checkpoint keeps, and
    what a resume compares key by key."""
    train_steps: int
    """`train.steps`: no stored step or checkpoint may lie beyond it."""
    max_restarts: int
    """`train.max_restarts`: trainer restarts a run may use."""
    config_yaml_sha256: str = ""
    """sha256 of RUN_DIR/config.yaml as this invocation wrote it."""
    resume: bool = False
    """`run.resume`: re-train stored steps after the checkpoint."""
    checkpoint_every: int = 0
    """`run.checkpoint_every` (0: only at the end)."""
    keep_checkpoints: int | None = None
    """`run.keep_checkpoints`."""

    @classmethod
    def of(cls, cfg: RunConfig, run_dir: Path, config_yaml_sha256: str = "") -> ResumeSpec:
        return cls(Path(run_dir), cfg.model_dump(mode="json"), cfg.train.steps, cfg.train.max_restarts,
                   config_yaml_sha256, cfg.run.resume, cfg.run.checkpoint_every, cfg.run.keep_checkpoints)

    def due(self, step: int) -> bool:
        """A checkpoint is written after this step (every `checkpoint_every` steps, and after the last one)."""
        return bool(self.checkpoint_every and step % self.checkpoint_every == 0) or step == self.train_steps

    def run_info(self) -> dict[str, Any]:
        """What a checkpoint keeps of the run's config: the resolved config and the sha256 of config.yaml."""
        return {"config": self.config, "config_yaml_sha256": self.config_yaml_sha256}


@dataclasses.dataclass(frozen=True)
class FinishedRun:
    """A run directory whose run did every step and wrote its summary (`finished_run`)."""

    run_dir: Path
    step: int
    summary: dict[str, Any]
    """RUN_DIR/summary.json."""

    def line(self) -> str:
        return (f"run already finished at step {self.step}: {self.run_dir}; nothing to do (its results are in "
                "summary.json; a larger train.steps trains further)")


def finished_run(cfg: RunConfig) -> FinishedRun | None:
    """The finished run a resume of `cfg` would find, or None (not a resume, or the run has steps left).

    Finished: RUN_DIR/summary.json reads, says `steps` == train.steps, and was written no earlier than the newest
    complete checkpoint, which is at train.steps (a summary older than that checkpoint is an earlier run's: this
    one stopped between its last checkpoint and its summary, and the resume finishes it). Reads files only."""
    from rollwise.train.checkpoint import MANIFEST, find_latest_checkpoint

    if not cfg.run.resume:
        return None
    run_dir = Path(cfg.run.out_dir)
    path = run_dir / "summary.json"
    latest = find_latest_checkpoint(run_dir)
    if latest is None or not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
        ckpt_step = int(json.loads((latest / MANIFEST).read_text())["step"])
        fresh = path.stat().st_mtime >= (latest / MANIFEST).stat().st_mtime
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None  # unreadable: the resume proper says what is wrong
    if not (isinstance(summary, dict) and fresh and summary.get("steps") == cfg.train.steps == ckpt_step):
        return None
    return FinishedRun(run_dir, ckpt_step, summary)


# ------------------------------------------------------------------------------------------------- RNG as JSON


def _b64(t: Any) -> str:
    return base64.b64encode(bytes(t.numpy().tobytes())).decode()


def rng_state() -> dict[str, Any]:
    """The python, numpy, torch (and CUDA) RNG states as JSON-able data."""
    import numpy as np
    import torch

    v, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [v, list(internal), gauss],
        "numpy": [str(name), base64.b64encode(np.asarray(keys, dtype=np.uint32).tobytes()).decode(), int(pos),
                  int(has_gauss), float(cached)],
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Put back what `rng_state` returned."""
    import numpy as np
    import torch

    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.frombuffer(base64.b64decode(keys), dtype=np.uint32).copy(), pos, has_gauss, cached))

    def tensor(s: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()

    torch.set_rng_state(tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensor(s) for s in state["cuda"]])


# ------------------------------------------------------------------------------------------------- config


def config_diffs(saved: Mapping[str, Any], given: Mapping[str, Any], *, harmless: bool = False) -> list[str]:
    """"key: saved -> given" for each dotted key that differs between two config dumps (`model_dump(mode='json')`).
    harmless=False: only keys that change results; True: only those in `config.RESUME_MAY_DIFFER`."""
    from rollwise.config import RESUME_MAY_DIFFER, RunConfig, config_leaves

    a, b = config_leaves(saved), config_leaves(given)
    # NOTE: a key the saved config does not have was added to rollwise after the run was saved; at its default it
    # computes what the older version did, so an upgrade between a run and its resume is no difference.
    defaults = config_leaves(RunConfig().model_dump(mode="json"))
    out = []
    for k in sorted(set(a) | set(b)):
        free = any(k == f or k.startswith(f + ".") for f in RESUME_MAY_DIFFER)
        if k not in a and k in defaults and b.get(k) == defaults[k]:
            continue
        if free == harmless and a.get(k) != b.get(k):
            out.append(f"{k}: {json.dumps(a.get(k))} -> {json.dumps(b.get(k))}")
    return out


def check_resume_config(spec: ResumeSpec, ckpt: Checkpoint, log: Log) -> None:
    """Refuse (ResumeError, one line naming every differing key) a resume whose config changes results against
    the config checkpoint `ckpt` was trained under; say so when config.yaml was edited by hand."""
    from rollwise.train.checkpoint import file_sha256

    run_dir = spec.run_dir
    if ckpt.step > spec.train_steps:
        raise ResumeError(f"cannot resume {run_dir}: train.steps={spec.train_steps} is below the {ckpt.step} steps "
                          f"checkpoint {ckpt.path.name} has already trained")
    info = ckpt.data_position.get("run") or {}
    saved = info.get("config")
    if saved is None:  # a checkpoint from before configs were kept with it: the CLI's check against config.yaml
        log(f"resume: {ckpt.path.name} keeps no copy of its config (older rollwise); checked against config.yaml only")
        return
    yaml_path = run_dir / "config.yaml"
    edited = bool(info.get("config_yaml_sha256")) and yaml_path.is_file() and \
        file_sha256(yaml_path) != info["config_yaml_sha256"]
    now = spec.config
    diffs = config_diffs(saved, now)
    if diffs:
        how = "config.yaml was edited after it was written, and " if edited else ""
        raise ResumeError(f"cannot resume {run_dir}: {how}the config differs from the one {ckpt.path.name} was "
                          f"trained under in {len(diffs)} key(s) that change results: {'; '.join(diffs)} (saved -> "
                          "now; put them back, or start a new run directory)")
    if edited:
        free = [d for d in config_diffs(saved, now, harmless=True) if not d.startswith("run.resume:")]
        log(f"resume: config.yaml was edited since {ckpt.path.name} was saved; "
            + (f"only keys that do not change results differ: {'; '.join(free)}" if free else "no key's value differs"))


# ------------------------------------------------------------------------------------------------- records


def trained_refs(trainable: Sequence[Rollout], is_replayed: Callable[[Rollout], bool]) -> list[Any]:
    """What a step trained on, in order: [group_id, sample_index, advantage] for its own rollouts (their rows are
    in its shard), the whole rollout for a replayed copy (its source row differs from what trained)."""
    return [{"copy": dataclasses.asdict(r)} if is_replayed(r) else [r.group_id, r.sample_index, r.advantage]
            for r in trainable]


def step_record(step: int, trained: list[Any], rng_before_train: dict[str, Any], state: dict[str, Any],
                metrics: Mapping[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The write-ahead log record of one step (stored with its shard: `RolloutStore.write_step(journal=...)`)."""
    from rollwise.train.metrics import flatten_metrics

    return {"version": RECORD_VERSION, "step": int(step), "trained": trained, "rng_before_train": rng_before_train,
            "state": state, "metrics": flatten_metrics(metrics), "config": config}


def loop_state(data_position: Mapping[str, Any], policy_state: Any, replay: ReplayBuffer | None, wall_s: float) -> dict[str, Any]:
    """The loop's state after a step (what a checkpoint and a record carry besides weights)."""
    return {"data_position": {k: int(v) for k, v in data_position.items()}, "policy": policy_state,
            "replay": replay.state_dict() if replay is not None else None, "rng": rng_state(), "wall_s": float(wall_s)}


class StoredRollouts:
    """Rollouts of the store by (step, group_id, sample_index), one shard read per step."""

    def __init__(self, store: RolloutStore) -> None:
        self.store = store
        self._by_step: dict[int, dict[tuple[str, int], Rollout]] = {}

    def step(self, step: int) -> dict[tuple[str, int], Rollout]:
        if step not in self._by_step:
            self._by_step[step] = {(r.group_id, r.sample_index): r for r in self.store.read(steps=[step])}
        return self._by_step[step]

    def get(self, step: int, group_id: str, sample_index: int) -> Rollout:
        r = self.step(step).get((group_id, sample_index))
        if r is None:
            raise ResumeError(f"{self.store.shard_path(step)} has no rollout {group_id}/{sample_index}, which the "
                              "saved loop state names")
        return r


def apply_loop_state(state: Mapping[str, Any], *, order: DataOrder, replay: ReplayBuffer | None,
                     controller: RolloutController, rollouts: StoredRollouts, tasks: Mapping[str, Task]) -> float:
    """Put the loop back where `loop_state` saved it (the RNG included); returns the run's wall time so far."""
    pos = state.get("data_position") or {}
    order.epoch, order.index = int(pos.get("epoch", 0)), int(pos.get("index", 0))
    load = getattr(controller.policy, "load_state_dict", None)  # only a policy with cross-step state saved one
    if state.get("policy") is not None and callable(load):
        load(state["policy"], tasks)
    if replay is not None and state.get("replay") is not None:
        replay.load_state_dict(state["replay"], rollouts.get)
    if state.get("rng") is not None:
        set_rng_state(state["rng"])
    return float(state.get("wall_s", 0.0))


# ------------------------------------------------------------------------------------------------- re-training


@dataclasses.dataclass
class ReplayedSteps:
    """What `replay_stored_steps` did."""

    last_step: int
    """The step whose weights the trainer now holds (the checkpoint's when nothing was re-trained)."""
    steps: list[int]
    """Steps re-trained from their shards, ascending."""
    state: dict[str, Any] | None
    """The last re-trained step's loop state (None: nothing re-trained; use the checkpoint's)."""
    metrics: dict[int, dict[str, Any]]
    """Each re-trained step's metrics line (for metrics.jsonl lines a crash cut off)."""
    quarantined: list[int]


_RECORD_PARTS = {"trained": list, "rng_before_train": dict, "state": dict, "metrics": dict, "config": dict}


def _record_problem(rec: Mapping[str, Any], step: int) -> str | None:
    """Why a step's record cannot be re-trained from (a key missing or of the wrong type, another step's), or None."""
    if rec.get("step") != step:
        return f"it names step {rec.get('step')!r}, not {step}"
    for key, kind in _RECORD_PARTS.items():
        if not isinstance(rec.get(key), kind):
            return f"its {key!r} is missing or not a JSON {'array' if kind is list else 'object'}"
    return None


def _rebuild(table: Any, path: Path, trained: list[Any]) -> list[Rollout]:
    """The batch a record says its step trained on, from the shard's rows (`table`) and replayed copies."""
    import math

    from rollwise.store.schema import table_to_rollouts

    rows = {(r.group_id, r.sample_index): r for r in table_to_rollouts(table)}
    out = []
    for k, ref in enumerate(trained):
        if isinstance(ref, dict) and isinstance(ref.get("copy"), dict):
            out.append(Rollout(**ref["copy"]))
            continue
        if not (isinstance(ref, list) and len(ref) == 3 and isinstance(ref[0], str) and isinstance(ref[1], int)
                and isinstance(ref[2], (int, float)) and not isinstance(ref[2], bool) and math.isfinite(ref[2])):
            raise ValueError(f"trained entry {k} is not [group_id, sample_index, advantage] or {{\"copy\": ...}}")
        gid, idx, adv = ref
        r = rows.get((gid, idx))
        if r is None:
            raise ResumeError(f"{path}: its record trained rollout {gid}/{idx}, which the shard does not hold")
        r.advantage = float(adv)
        out.append(r)
    return out


def replay_stored_steps(store: RolloutStore, trainer: TrainerHandle, from_step: int, spec: ResumeSpec,
                        log: Log) -> ReplayedSteps:
    """Re-train the steps after `from_step` (the restored checkpoint's; 0 = the initial model) from their shards,
    in order, while each has a record; move every shard after the last usable one to RUN_DIR/quarantine/."""
    from rollwise.store.writer import JournalMismatch, ShardError

    now, run_dir = spec.config, spec.run_dir
    done: list[int] = []
    state: dict[str, Any] | None = None
    metrics: dict[int, dict[str, Any]] = {}
    why = ""
    for s in [s for s in store.steps() if s > from_step]:
        expect = from_step + len(done) + 1
        if s != expect:
            why = f"step {expect} has no shard"
            break
        if s > spec.train_steps:
            raise ResumeError(f"cannot resume {run_dir}: train.steps={spec.train_steps} is below the {s} steps its "
                              "rollout store holds")
        path = store.shard_path(s)

        def refuse(what: object, path: Path = path, s: int = s) -> ResumeError:
            return ResumeError(f"cannot resume {run_dir}: {what}; move {path.name} out of {path.parent} to run step "
                               f"{s} and the steps after it again")

        try:
            journal = store.read_step_journal(s)  # the record, checked against the seal binding it to this shard
        except JournalMismatch as e:
            raise refuse(e) from None
        except ShardError as e:
            why = str(e)
            break
        if journal is None or not journal.sealed or journal.record.get("version") != RECORD_VERSION:
            why = f"{path} has no write-ahead log record this rollwise reads (an older rollwise wrote it)"
            break
        rec = journal.record
        try:
            problem = _record_problem(rec, s)
            if problem is not None:
                raise ValueError(problem)
            batch = _rebuild(journal.table, path, rec["trained"])
            diffs = config_diffs(rec["config"], now)
            if not diffs:
                set_rng_state(rec["rng_before_train"])
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RuntimeError) as e:
            if isinstance(e, ResumeError):
                raise
            raise refuse(f"{path}: its write-ahead log record is malformed "
                         f"({' '.join(str(e).split()) or type(e).__name__})") from None
        if diffs:
            raise ResumeError(f"cannot resume {run_dir}: the config differs from the one step {s} (stored in "
                              f"{store.shard_path(s).name}) was trained under in {len(diffs)} key(s) that change "
                              f"results: {'; '.join(diffs)} (saved -> now)")
        m = trainer.train_step(batch)
        if trainer.version != s:
            raise ResumeError(f"re-training step {s} left the trainer at version {trainer.version}")
        logged = rec["metrics"].get("loss")
        if isinstance(logged, (int, float)) and m.get("loss") is not None and \
                abs(float(m["loss"]) - float(logged)) > 1e-5 * max(1.0, abs(float(logged))):
            log(f"resume: re-trained step {s} has loss {float(m['loss']):.6g}, the run logged {float(logged):.6g} "
                "(the update is not bit-deterministic on this device, or a changed train.steps re-planned the LR)")
        done.append(s)
        state, metrics[s] = rec["state"], rec["metrics"]
    last = from_step + len(done)
    moved: list[int] = []
    if why:
        dest = run_dir / "quarantine" / f"rollouts-{time.strftime('%Y%m%dT%H%M%S')}"
        moved = store.quarantine_after(last, dest)
        log(f"resume: cannot re-train from step {last + 1} on ({why}); moved the shards of steps "
            f"{moved[0]}..{moved[-1]} to {dest}; those steps run again")
    if done:
        log(f"resume: re-trained steps {done[0]}..{done[-1]} from their stored rollouts (write-ahead log), "
            f"continuing after step {last}")
    return ReplayedSteps(last, done, state, metrics, moved)


@dataclasses.dataclass
class ResumePoint:
    """Where a run continues (`restore`): the trainer, the data order, the replay buffer, the policy's carry and
    the RNG are as they were after `step`."""

    step: int
    """The last step done (0: a fresh run); the loop goes on at step + 1."""
    wall_s: float
    """The run's wall-clock seconds before this invocation."""
    checkpoint: Path | None
    """The checkpoint holding step's weights (the final model of a finished run), None when none does."""
    metrics: dict[int, dict[str, Any]] | None
    """Each re-trained step's metrics line (for metrics.jsonl lines a crash cut off); None without a resume."""


def restore(spec: ResumeSpec, trainer: TrainerHandle, store: RolloutStore, ckpt: Checkpoint | None, *,
            order: DataOrder, replay: ReplayBuffer | None, controller: RolloutController, tasks: Mapping[str, Task],
            tokenizer: Tokenizer | None, log: Log) -> ResumePoint:
    """Bring a run back to where it stopped: restore `ckpt` (None: the initial model), re-train the stored steps
    after it (`replay_stored_steps`), put the loop's state back, and write the checkpoint a crash interrupted."""
    step, wall, saved = 0, 0.0, None
    if ckpt is not None:
        pos = trainer.restore(ckpt.path)  # trainer.version = the checkpoint's step
        order.epoch, order.index = int(pos.get("epoch", 0)), int(pos.get("index", 0))
        wall = float(pos.get("wall_s", 0.0))
        step, saved = ckpt.step, pos.get("loop")
        log(f"resume: continuing after step {step} from {ckpt.path}")
    wal = replay_stored_steps(store, trainer, step, spec, log) if spec.resume else None
    if wal is not None and wal.steps:
        step, saved = wal.last_step, wal.state
    ckpt_dir = ckpt.path if ckpt is not None and ckpt.step == step else None
    if saved is not None:  # replay buffer, partial carry, data position, RNG: as they were after `step`
        wall = apply_loop_state(saved, order=order, replay=replay, controller=controller,
                                rollouts=StoredRollouts(store), tasks=tasks)
        if wal is not None and wal.steps and spec.due(step):  # the save the crash interrupted
            ckpt_dir = trainer.save(spec.run_dir, step, {**saved["data_position"], "wall_s": wall, "loop": saved,
                                    "run": spec.run_info()}, spec.keep_checkpoints, tokenizer=tokenizer)
    return ResumePoint(step, wall, ckpt_dir, wal.metrics if wal is not None else None)


def recover_trainer(trainer: TrainerHandle, store: RolloutStore, step: int, spec: ResumeSpec, log: Log,
                    cause: BaseException) -> None:
    """A trainer died (`TrainerLost`) while training `step`: restart it, restore the last checkpoint and re-train
    steps after it up to step - 1 from the stored rollouts, so the trainer is again where it was when the step
    began (version step - 1). The caller then trains `step` again. Raises ResumeError when the restarts are used
    up or the stored steps do not lead back to step - 1."""
    from rollwise.train.checkpoint import find_latest_checkpoint

    used = trainer.restarts

    def stopped() -> ResumeError:
        return ResumeError(f"{cause}; the run stopped at step {step} after {used} trainer restart(s) "
                           f"(train.max_restarts={spec.max_restarts}): run.resume: true continues it")

    if used >= spec.max_restarts:
        raise stopped() from None
    rng = rng_state()  # the recovery must not move the loop's own random streams
    t0 = time.perf_counter()
    if not trainer.restart():
        raise stopped() from None
    latest = find_latest_checkpoint(spec.run_dir)
    base = 0
    if latest is not None:
        trainer.restore(latest)
        base = trainer.version
    replayed = replay_stored_steps(store, trainer, base, spec, log) if step - 1 > base else None
    set_rng_state(rng)
    if trainer.version != step - 1:
        raise ResumeError(f"{cause}; after a restart the trainer is at step {trainer.version}, not {step - 1} (the "
                          f"stored rollouts stop there): run.resume: true continues from the store")
    redone = f"re-trained steps {base + 1}..{step - 1} from the stored rollouts" if replayed and replayed.steps else \
        "nothing to re-train"
    log(f"trainer lost at step {step} ({cause}); restart {used + 1} of {spec.max_restarts}: restored "
        f"{latest.name if latest is not None else 'the initial model'}, {redone}, in {time.perf_counter() - t0:.1f}s; "
        f"no step or rollout was lost, step {step} trains again")
