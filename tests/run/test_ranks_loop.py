"""The RL loop with train.world_size=2: the same run as one rank; a rank SIGKILLed mid-run is restarted from the
last checkpoint plus the stored rollouts and the run ends where an uninterrupted one does; with restarts off the
run stops with one line and `run.resume` finishes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from rollwise.run.loop import train
from rollwise.run.resume import ResumeError


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def final_weights(out):
    from safetensors.torch import load_file

    return load_file(str(sorted((out / "checkpoints").glob("step-*"))[-1] / "model.safetensors"))


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def rank_pids() -> list[int]:
    """This test process's spawned rank processes (torch.multiprocessing 'spawn' children)."""
    ps = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(os.getpid())], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in ps.splitlines() if "spawn_main" in line]


def kill_a_rank_at(monkeypatch, step: int, fired: list[int]) -> None:
    """SIGKILL rank 1 as the train step of `step` starts (the first time only), and wait for it to be dead: a timer
    a few ms in would race the step itself, which a tiny model finishes in less."""
    from rollwise.cluster.ranks import LocalRanks

    original = LocalRanks.train_step

    def train_step(self, rollouts):
        if self.version == step - 1 and not fired:
            proc = self.procs[1]
            fired.append(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(30)
        return original(self, rollouts)

    monkeypatch.setattr(LocalRanks, "train_step", train_step)


STEPS = ["train.steps=5", "run.checkpoint_every=2", "train.lr=1e-3"]


@pytest.mark.slow
def test_two_rank_run_matches_one_rank_and_survives_a_killed_rank(tmp_path, run_cfg, monkeypatch):
    one = tmp_path / "one"
    train(run_cfg(one, *STEPS), log=lambda s: None)
    two = tmp_path / "two"
    train(run_cfg(two, *STEPS, "train.world_size=2"), log=lambda s: None)
    for a, b in zip(metrics(one), metrics(two)):  # same samples, same losses: the update does not see the ranks
        assert a["reward_mean"] == b["reward_mean"] and a["resp_len_mean"] == b["resp_len_mean"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
    d = max_diff(final_weights(one), final_weights(two))
    print(f"builtin tiny model, 5 RL steps: max |w(1 rank) - w(2 ranks)| = {d:.2e}")
    assert d < 1e-4

    # SIGKILL a rank inside step 4: the run restarts the ranks, restores step-2, re-trains step 3 from
    # the store, trains on, and ends with the uninterrupted run's weights.
    killed = tmp_path / "killed"
    fired: list[int] = []
    kill_a_rank_at(monkeypatch, 4, fired)
    lines: list[str] = []
    train(run_cfg(killed, *STEPS, "train.world_size=2"), log=lines.append)
    assert fired, "the test never found a rank to kill"
    lost = [line for line in lines if line.startswith("trainer lost at step")]
    assert len(lost) == 1 and "exit code -9" in lost[0] and "no step or rollout was lost" in lost[0], lines
    assert [m["step"] for m in metrics(killed)] == [1, 2, 3, 4, 5]
    assert max_diff(final_weights(two), final_weights(killed)) < 1e-6
    assert not rank_pids()


@pytest.mark.slow
def test_killed_rank_without_restarts_stops_then_resumes(tmp_path, run_cfg, monkeypatch):
    out = tmp_path / "r"
    fired: list[int] = []
    kill_a_rank_at(monkeypatch, 3, fired)
    with pytest.raises(ResumeError, match=r"died while it was to .*train.max_restarts=0\): run.resume: true"):
        train(run_cfg(out, *STEPS, "train.world_size=2", "train.max_restarts=0"), log=lambda s: None)
    assert fired and not rank_pids()
    assert max(m["step"] for m in metrics(out)) == 2
    monkeypatch.undo()
    # resume at ONE rank: the checkpoint (step-2) and the stored steps load at any world size
    summary = train(run_cfg(out, *STEPS, "train.max_restarts=0", "run.resume=true"), log=lambda s: None)
    assert summary is not None and [m["step"] for m in metrics(out)] == [1, 2, 3, 4, 5]
