"""SIGKILL a process while it writes shards: every shard left on disk is whole, temp files are ignored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rollwise.store.writer import RolloutStore

pytestmark = pytest.mark.slow  # three writer processes (a few seconds); still runs in CI

WRITER = textwrap.dedent(
    """
    import sys
    from rollwise.store.writer import RolloutStore
    from rollwise.types import Rollout

    store = RolloutStore(sys.argv[1])
    start = int(sys.argv[2])
    n = 128
    for step in range(start, start + 10_000):
        rs = [Rollout(prompt_id=f"p{g}", group_id=f"s{step}-g{g}", sample_index=i, prompt_token_ids=[1, 2, 3],
                      completion_token_ids=list(range(n)), logprobs=[-0.5] * n, weight_versions=[step] * n,
                      loss_mask=[1] * n, text="t" * n, reward=1.0, step=step)
              for g in range(8) for i in range(8)]
        store.write_step(step, rs)
        print(step, flush=True)
    """
)


def _run_and_kill(run_dir, start: int, after_lines: int, extra_delay: float) -> int:
    """Start a writer, wait for `after_lines` completed steps plus a delay, SIGKILL it; last step it reported."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir), str(start)], stdout=subprocess.PIPE, text=True)
    last = start - 1
    try:
        for _ in range(after_lines):
            line = proc.stdout.readline()
            assert line, "writer died before it was killed"
            last = int(line)
        time.sleep(extra_delay)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    return last


def test_sigkill_mid_write_leaves_only_whole_shards(tmp_path):
    run = tmp_path / "run"
    store = RolloutStore(run)
    resume_from = 0
    for attempt, (lines, delay) in enumerate([(2, 0.013), (3, 0.029), (1, 0.047)]):
        acked = _run_and_kill(run, resume_from, lines, delay)
        steps = store.steps()
        # Every step the writer reported is on disk, and whatever is on disk reads strictly.
        assert set(range(acked + 1)) <= set(steps), (attempt, acked, steps)
        table = store.read_table(columns=["step", "group_id"])
        per_step = {}
        for s in table.column("step").to_pylist():
            per_step[s] = per_step.get(s, 0) + 1
        assert set(per_step.values()) == {64}, per_step  # no partial shard, no duplicated rows
        # Resume as a training loop does: drop steps after the last checkpoint, rewrite from there.
        resume_from = max(0, acked - 1)
        store.truncate_after(resume_from - 1)
    # A later writer cleans up whatever temp files the kills left behind.
    RolloutStore(run).write_step(resume_from, [])
    assert not [p for p in store.dir.iterdir() if p.name.endswith(".tmp")]
