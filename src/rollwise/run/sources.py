"""Rollout sources: where a step's scored groups come from, and where the trainer's weights go.

    SyncSource    generate step s now, with the weights of version s-1; `sync` loads the new weights at once.
    AsyncSource   a producer thread generates step s as soon as the trained version is >= s-1-K, so it runs at
                  most K versions ahead of training (K = control.async_staleness); `sync` publishes the weights
                  and the producer loads them before its next step.

Both run the same rollout controller on the same engine (any `engine.protocol` engine), so every policy and
every backend combine with either source; the config refuses only combinations that cannot work.

NOTE on threads (async): only the producer touches the engine while it generates; the main thread touches it
only inside `exclusive()` (held-out evaluation), which waits for the producer's current step to end and first
brings the engine to the newest published weights. Weights cross as a copied state dict (or a Ray ObjectRef,
which is immutable), so the trainer's next update never tears the weights the producer is loading.

Each batch carries the state a resume needs as it stood right after that batch was generated (the data position
and the policy's carry), taken in the thread that generated it: the async producer may be K steps further on by
the time the loop trains and records the batch.

Deliberately left out: carrying generated-but-untrained batches across a resume (a resumed run regenerates
from the recorded data position of the last trained batch; run/resume.py).
"""

from __future__ import annotations

import contextlib
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from rollwise.types import SamplingParams, Task

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.cluster.trainer_handle import TrainerHandle
    from rollwise.control.controller import ControlStep, RolloutController
    from rollwise.engine.protocol import Engine
    from rollwise.run.sync_check import ProbeReference, SyncCheck


@dataclass
class DataOrder:
    """A seeded permutation of the training tasks, reshuffled every epoch; its position is checkpointed."""

    n: int
    seed: int
    epoch: int = 0
    index: int = 0

    def _perm(self) -> list[int]:
        order = list(range(self.n))
        random.Random(f"{self.seed}/{self.epoch}").shuffle(order)
        return order

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        perm = self._perm()
        while len(out) < k:
            if self.index >= self.n:
                self.epoch, self.index = self.epoch + 1, 0
                perm = self._perm()
            out.append(perm[self.index])
            self.index += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}


@dataclass
class StepBatch:
    """One step's generated and scored groups, and where the data order stood after them."""

    step: int
    result: ControlStep
    """The groups (every rollout with a status) and the controller's books."""
    data_position: dict[str, int]
    """The data order's state after this step's prompts (what a checkpoint of this step resumes from)."""
    wait_s: float = 0.0
    """async: how long the producer waited for the trainer before it could generate this step."""
    policy_state: Any = None
    """The rollout policy's cross-step state after this step (partial rollouts' carry; None for the others)."""


class _StepMaker:
    """Runs the controller for one step: the part both sources share."""

    def __init__(self, controller: RolloutController, engine: Engine, tasks: list[Task], order: DataOrder,
                 params: Callable[[int], SamplingParams], batch_groups: int) -> None:
        self.controller, self.engine, self.tasks, self.order = controller, engine, tasks, order
        self.params, self.batch_groups = params, batch_groups

    def make(self, step: int) -> StepBatch:
        res = self.controller.run_step(self.engine, lambda k: [self.tasks[i] for i in self.order.take(k)],
                                       self.params(step), step=step, batch_groups=self.batch_groups)
        return StepBatch(step, res, self.order.state(), policy_state=policy_state(self.controller))


def policy_state(controller: RolloutController) -> Any:
    """The rollout policy's cross-step state (partial rollouts' carry), or None for a policy that keeps none: what
    a checkpoint and a step's record keep of it (`run.resume.loop_state`)."""
    fn = getattr(controller.policy, "state_dict", None)
    return fn() if callable(fn) else None


class _Checked:
    """The weight-sync check (`run.sync_check`) bound to the trainer that makes its references; none = no check."""

    def __init__(self, check: SyncCheck | None = None, trainer: TrainerHandle | None = None,
                 params: Callable[[int], SamplingParams] | None = None) -> None:
        self.check, self.trainer, self.params = check, trainer, params

    def reference(self) -> ProbeReference | None:
        """The probe for the trainer's current version, sent as the step these weights generate next is."""
        if self.check is None or self.trainer is None or self.params is None:
            return None
        return self.check.reference(self.trainer, self.params(self.trainer.version + 1))

    def verify(self, engine: Engine, ref: ProbeReference | None) -> None:
        if self.check is not None and ref is not None:
            self.check.verify(engine, ref)


class RolloutSource(Protocol):
    """Where the loop's batches come from and where its weights go (`SyncSource`, or `AsyncSource` K ahead)."""

    staleness_bound: int
    """K: how many weight versions generation may run ahead of training (0: synchronous)."""

    def next_batch(self, step: int) -> StepBatch: ...

    def sync(self, weights: Any, version: int) -> float:
        """Hand the trainer's new weights to the engine(s); the seconds it took the loop."""
        ...

    def exclusive(self) -> contextlib.AbstractContextManager[Engine]:
        """The engine, with generation paused around it (held-out evaluation)."""
        ...

    def close(self) -> None: ...


class SyncSource:
    """Generate each step when the loop asks for it."""

    staleness_bound = 0

    def __init__(self, maker: _StepMaker, checked: _Checked | None = None) -> None:
        self.maker = maker
        self.engine = maker.engine
        self.checked = checked or _Checked()

    def next_batch(self, step: int) -> StepBatch:
        return self.maker.make(step)

    def sync(self, weights: Any, version: int) -> float:
        """Load the trainer's new weights now (then prove they landed, when checked); returns the seconds."""
        t0 = time.perf_counter()
        ref = self.checked.reference()
        self.engine.load_weights(weights, version)
        self.checked.verify(self.engine, ref)
        return time.perf_counter() - t0

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[Engine]:
        yield self.engine

    def close(self) -> None:
        """Nothing runs in the background."""


def _snapshot(weights: Any) -> Any:
    """A copy the trainer's next update cannot change (torch tensors are cloned; a Ray ObjectRef is immutable)."""
    if isinstance(weights, dict):
        return {k: (v.detach().clone() if hasattr(v, "detach") else v) for k, v in weights.items()}
    return weights


class AsyncSource:
    """Generate in a background thread, at most `staleness_bound` (K >= 1) weight versions ahead of training."""

    def __init__(self, maker: _StepMaker, k: int, first_step: int, last_step: int, trained_version: int,
                 checked: _Checked | None = None) -> None:
        if k < 1:
            raise ValueError(f"AsyncSource needs K >= 1 (K = 0 is SyncSource), got {k}")
        self.checked = checked or _Checked()
        self._ref: ProbeReference | None = None
        self.maker = maker
        self.engine = maker.engine
        self.staleness_bound = k
        self.first_step, self.last_step = first_step, last_step
        self._cond = threading.Condition()
        self._version = trained_version
        self._weights: Any = None
        self._stop = False
        self._engine_lock = threading.Lock()
        self._queue: queue.Queue[StepBatch | BaseException] = queue.Queue()
        self._thread: threading.Thread | None = None

    # ---- producer side
    def _wait_for(self, version: int) -> tuple[int, Any] | None:
        with self._cond:
            self._cond.wait_for(lambda: self._stop or self._version >= version)
            return None if self._stop else (self._version, self._weights)

    def _load_newest(self) -> None:
        """Bring the engine to the newest published weights (caller holds the engine lock)."""
        with self._cond:
            version, weights, ref = self._version, self._weights, self._ref
        if weights is not None and version > self.engine.weight_version:
            self.engine.load_weights(weights, version)
            self.checked.verify(self.engine, ref)  # the reference was made when these weights were published

    def _produce(self) -> None:
        try:
            for step in range(self.first_step, self.last_step + 1):
                t0 = time.perf_counter()
                if self._wait_for(step - 1 - self.staleness_bound) is None:
                    return
                wait_s = time.perf_counter() - t0
                with self._engine_lock:
                    self._load_newest()
                    batch = self.maker.make(step)
                batch.wait_s = wait_s
                self._queue.put(batch)
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread, where the run is reported
            self._queue.put(e)

    # ---- loop side
    def next_batch(self, step: int) -> StepBatch:
        if self._thread is None:
            self._thread = threading.Thread(target=self._produce, name="rollwise-generate", daemon=True)
            self._thread.start()
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        if item.step != step:
            raise RuntimeError(f"async source: batch for step {item.step} arrived at step {step}")
        return item

    def sync(self, weights: Any, version: int) -> float:
        """Publish the trainer's weights (a copy); the producer loads them before its next step. Returns the
        seconds spent copying."""
        t0 = time.perf_counter()
        snap = _snapshot(weights)
        ref = self.checked.reference()  # the trainer is at `version` now: later it is not
        with self._cond:
            self._version, self._weights, self._ref = version, snap, ref
            self._cond.notify_all()
        return time.perf_counter() - t0

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[Engine]:
        """The engine with the newest published weights, while the producer is paused between steps."""
        with self._engine_lock:
            self._load_newest()
            yield self.engine

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()


def make_source(controller: RolloutController, engine: Engine, tasks: list[Task], order: DataOrder,
                params: Callable[[int], SamplingParams], batch_groups: int, *, staleness: int, first_step: int,
                last_step: int, trained_version: int, sync_check: SyncCheck | None = None,
                trainer: TrainerHandle | None = None) -> SyncSource | AsyncSource:
    """SyncSource for K = 0, else AsyncSource(K); `sync_check` (with the `trainer` that makes its references)
    proves every weight sync."""
    maker = _StepMaker(controller, engine, tasks, order, params, batch_groups)
    checked = _Checked(sync_check, trainer, params)
    if staleness == 0:
        return SyncSource(maker, checked)
    return AsyncSource(maker, staleness, first_step, last_step, trained_version, checked)
