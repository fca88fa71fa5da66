"""`train.world_size` data-parallel ranks as local processes, behind the `TrainerHandle` calls.

Each rank is a spawned process running a `TrainerWorker` (its own `Trainer`, joined to a gloo or NCCL process
group) and answering the driver's calls over a pipe. A call goes to every rank, because the collectives inside it
need them all; the driver keeps rank 0's answer. Weights come back as CPU tensors in shared memory (torch's
multiprocessing pickler), not as copies through the pipe.

Failure: a rank that dies (killed, out of memory) ends its peers' collectives with an error, and the driver,
which polls every rank's process while it waits, raises `TrainerLost` naming the dead rank and its exit code.
`restart()` kills the survivors and starts fresh ranks; the loop restores the last checkpoint into them and
re-trains the steps since from the stored rollouts (`run/resume.py` `recover_trainer`). Ranks get PDEATHSIG, so a
SIGKILLed driver does not leave them behind.

Deliberately left out: ranks on several nodes (that is the Ray launcher's job: `RayTrainer`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from rollwise.cluster.trainer_handle import TrainerLost, TrainerSpec, TrainerWorker, free_tcp_port
from rollwise.types import Rollout, Tokenizer

POLL_S = 0.2


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG(SIGKILL): this process dies when the driver does (Linux; elsewhere a no-op)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _rank_main(spec: TrainerSpec, rank: int, init_method: str, device: str, conn: Any) -> None:
    """A rank process: build, then answer (method, args) messages until 'shutdown' or the driver goes away."""
    _die_with_parent()
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <rank pid>` prints where a hung rank is waiting
    worker = TrainerWorker(spec, rank, device)
    try:
        conn.send(("ok", worker.setup(init_method)))
    except BaseException as e:  # noqa: BLE001 - reported to the driver as one line
        conn.send(("error", _one_line(e)))
        return
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            out = getattr(worker, method)(*args)
            conn.send(("ok", out))
        except BaseException as e:  # noqa: BLE001
            conn.send(("error", _one_line(e)))
        if method == "shutdown":
            return


def rank_devices(device: str, world_size: int) -> list[str]:
    """One device per rank: CPU ranks share the CPU; CUDA ranks take cuda:0..N-1 (refused when fewer exist)."""
    if not device.startswith("cuda"):
        return [device] * world_size
    import torch

    have = torch.cuda.device_count()
    if have < world_size:
        raise ValueError(f"train.world_size={world_size} on CUDA needs {world_size} GPUs; this machine has {have}")
    return [f"cuda:{r}" for r in range(world_size)]


class LocalRanks:
    """`spec.world_size` rank processes on this machine; the `TrainerHandle` calls of `LocalTrainer`."""

    def __init__(self, spec: TrainerSpec, *, timeout_s: float = 600.0) -> None:
        self.spec = spec
        self.timeout_s = timeout_s
        self.version = 0
        self.restarts = 0
        self.devices = rank_devices(spec.device, spec.world_size)
        self._start()

    def _start(self) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        init = f"tcp://127.0.0.1:{free_tcp_port()}"
        self.procs, self.conns = [], []
        for r in range(self.spec.world_size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_rank_main, args=(self.spec, r, init, self.devices[r], child), daemon=True,
                            name=f"rollwise-rank-{r}")
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        try:
            self.pids = self._gather("start")
        except BaseException:
            self._kill()
            raise

    def _dead(self) -> list[int]:
        return [r for r, p in enumerate(self.procs) if not p.is_alive()]

    def _lost(self, what: str) -> TrainerLost:
        gone = ", ".join(f"rank {r} (pid {self.procs[r].pid}, exit code {self.procs[r].exitcode})" for r in self._dead())
        return TrainerLost(f"trainer {gone} died while it was to {what}")

    def _recv(self, r: int, what: str, deadline: float) -> Any:
        conn = self.conns[r]
        while not conn.poll(POLL_S):
            if self._dead():
                raise self._lost(what)
            if time.monotonic() > deadline:
                raise RuntimeError(f"trainer rank {r} did not {what} within {self.timeout_s:.0f}s")
        try:
            status, out = conn.recv()
        except (EOFError, OSError):
            time.sleep(POLL_S)  # let the exit code land
            raise self._lost(what) from None
        if status != "ok":
            time.sleep(POLL_S)
            if self._dead():  # a peer's death surfaces in the survivors as a collective error
                raise self._lost(what)
            raise RuntimeError(f"trainer rank {r}: {out}")
        return out

    def _gather(self, what: str) -> list[Any]:
        deadline = time.monotonic() + self.timeout_s
        return [self._recv(r, what, deadline) for r in range(len(self.conns))]

    def _all(self, method: str, *args: Any, what: str) -> Any:
        for r, c in enumerate(self.conns):
            try:
                c.send((method, args))
            except (BrokenPipeError, OSError):
                raise self._lost(what) from None
        return self._gather(what)[0]

    def train_step(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        m = self._all("train_step", list(rollouts), what="finish a train step")
        self.version += 1
        return m

    def weights(self) -> Any:
        return self._all("weights", what="hand over its weights")

    def probe_logprobs(self, prompts: list[list[int]]) -> Any:
        return self._all("probe_logprobs", prompts, what="compute the sync probe")

    def save_adapter(self, path: str) -> None:
        self._all("save_adapter", path, what="save its LoRA adapter")

    def save(self, run_dir: str | Path, step: int, data_position: dict[str, Any], keep: int | None,
             tokenizer: Tokenizer | None = None) -> Path:
        return Path(self._all("save", str(run_dir), step, data_position, keep, what="save a checkpoint"))

    def restore(self, ckpt_path: str | Path) -> dict[str, Any]:
        pos, self.version = self._all("restore", str(ckpt_path), what="restore a checkpoint")
        return pos

    def restart(self) -> bool:
        """Kill every rank and start fresh ones from the initial model (the caller restores a checkpoint next)."""
        self._kill()
        self.restarts += 1
        self.version = 0
        self._start()
        return True

    def _kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=10)
        for c in self.conns:
            c.close()

    def shutdown(self) -> None:
        try:
            if not self._dead():
                self._all("shutdown", what="shut down")
        except (RuntimeError, TrainerLost):
            pass
        finally:
            self._kill()
