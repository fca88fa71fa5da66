"""SIGKILL a real training run at several points, resume it, and check the store with DuckDB: every completed
step's rollouts are present exactly once and the metrics continue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

duckdb = pytest.importorskip("duckdb")

PROMPTS, SAMPLES, STEPS = 4, 4, 6


def args(out: Path, model: Path) -> list[str]:
    sets = [
        f"model.path={model}", f"rollout.prompts_per_step={PROMPTS}", f"rollout.samples_per_prompt={SAMPLES}", "rollout.max_tokens=6",
        "env.eval_size=8", f"train.steps={STEPS}", "run.loggers=[jsonl]", "run.checkpoint_every=2",
        "algo.skip_zero_variance=false",
    ]
    cmd = [sys.executable, "-m", "rollwise.cli.main", "train", "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def metric_steps(out: Path) -> list[int]:
    p = out / "metrics.jsonl"
    if not p.exists():
        return []
    steps = []
    for line in p.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError):
            pass
    return steps


def run_until(cmd: list[str], out: Path, kill_at_step: int | None, delay_s: float, timeout_s: float = 300) -> int:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    t0 = time.time()
    try:
        while proc.poll() is None:
            if kill_at_step is not None and metric_steps(out) and max(metric_steps(out)) >= kill_at_step:
                time.sleep(delay_s)  # land somewhere inside the next step
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return -9
            if time.time() - t0 > timeout_s:
                proc.kill()
                raise AssertionError(f"training did not finish in {timeout_s}s")
            time.sleep(0.02)
        err = proc.stderr.read().decode() if proc.stderr else ""
        assert proc.returncode == 0, err[-2000:]
        return 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_sigkill_at_several_points_then_resume(tmp_path, tiny_model):
    out = tmp_path / "run"
    cmd = args(out, tiny_model)
    # 1) killed inside step 2 (before the first checkpoint), 2) inside step 4 (right after checkpoint 2 or
    # during checkpoint 4's save), 3) then run to the end.
    assert run_until(cmd, out, kill_at_step=1, delay_s=0.05) == -9
    assert run_until(cmd + ["--resume"], out, kill_at_step=3, delay_s=0.1) == -9
    assert run_until(cmd + ["--resume"], out, kill_at_step=None, delay_s=0) == 0

    con = duckdb.connect()
    glob = str(out / "rollouts" / "*.parquet")
    per_step = con.execute(f"select step, count(*) from read_parquet('{glob}') group by step order by step").fetchall()
    assert per_step == [(s, PROMPTS * SAMPLES) for s in range(1, STEPS + 1)]
    dupes = con.execute(
        f"select group_id, sample_index, count(*) c from read_parquet('{glob}') group by 1, 2 having c > 1").fetchall()
    assert dupes == []
    assert metric_steps(out) == list(range(1, STEPS + 1))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollouts"]["total"] == STEPS * PROMPTS * SAMPLES
    assert not list((out / "rollouts").glob("*.tmp*"))
