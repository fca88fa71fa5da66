"""MetricsLogger: metrics.jsonl lines, JSON-safe values, resume truncation, TensorBoard hook, TTY-only display.
(The loggers of run.loggers, a missing package, and the progress bar's fields: tests/train/test_loggers.py.)"""

from __future__ import annotations

import io
import json
import sys
import types

import numpy as np
import pytest
import torch
from rich.console import Console

from rollwise.train.metrics import MetricsLogger, read_metrics


def _quiet():
    return Console(file=io.StringIO(), force_terminal=False)


def test_lines_are_written_at_once_and_json_safe(tmp_path):
    log = MetricsLogger(tmp_path / "run", console=_quiet())
    log.log(1, {"loss": torch.tensor(0.5), "reward": np.float32(0.25), "n": np.int64(3), "kl": float("nan"),
                "time": {"train": 1.5, "generate": 2}, "note": "ok", "flag": True})
    # visible on disk before close (flushed + fsynced per line)
    rec = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert rec["step"] == 1 and rec["loss"] == 0.5 and rec["reward"] == 0.25 and rec["n"] == 3
    assert rec["kl"] is None and rec["time/train"] == 1.5 and rec["time/generate"] == 2
    assert rec["note"] == "ok" and rec["flag"] is True and "wall_s" in rec
    log.log(2, {"loss": 0.25})
    assert [lg.name for lg in log.loggers] == ["jsonl"]  # the default: no tracker, nothing written elsewhere
    log.close()
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["metrics.jsonl"]
    pd = pytest.importorskip("pandas")
    df = pd.read_json(tmp_path / "run" / "metrics.jsonl", lines=True)
    assert list(df["step"]) == [1, 2]


def test_resume_drops_steps_after_checkpoint_and_torn_line(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False, console=_quiet()) as log:
        for s in range(1, 6):
            log.log(s, {"loss": float(s)})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "lo')  # killed mid-write
    with MetricsLogger(tmp_path, tensorboard=False, console=_quiet(), resume_from_step=3) as log:
        log.log(4, {"loss": 40.0})
    recs = read_metrics(tmp_path)
    assert [r["step"] for r in recs] == [1, 2, 3, 4] and recs[-1]["loss"] == 40.0


def test_tensorboard_receives_numeric_scalars(tmp_path, monkeypatch):
    calls = []

    class FakeWriter:
        def __init__(self, log_dir):
            calls.append(("init", log_dir))

        def add_scalar(self, tag, value, global_step):
            calls.append((tag, value, global_step))

        def add_text(self, tag, text, global_step):
            calls.append(("text", tag, text))

        def flush(self):
            pass

        def close(self):
            calls.append(("close",))

    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    with MetricsLogger(tmp_path, loggers=["jsonl", "tensorboard"], console=_quiet()) as log:
        log.log(7, {"loss": 1.0, "note": "x", "flag": True, "kl": float("inf")})
    assert ("loss", 1.0, 7) in calls and calls[0] == ("init", str(tmp_path / "tensorboard"))
    assert not any(c[0] in ("note", "flag", "kl", "step") for c in calls)
    assert calls[-1] == ("close",)


def test_terminal_display_only_on_a_tty(tmp_path):
    quiet = _quiet()
    with MetricsLogger(tmp_path / "a", tensorboard=False, console=quiet) as log:
        log.log(1, {"reward": 0.5})
        log.print_table("eval", {"accuracy": 0.9})
    assert quiet.file.getvalue() == ""

    tty = Console(file=io.StringIO(), force_terminal=True, width=120)
    with MetricsLogger(tmp_path / "b", total_steps=4, tensorboard=False, console=tty) as log:
        log.log(1, {"reward_mean": 0.5, "loss": 0.125})
        log.print_table("eval", {"accuracy": 0.9})
    out = tty.file.getvalue()
    assert "reward=0.5" in out and "accuracy" in out


def test_the_bar_is_labelled_while_the_run_evaluates_and_shows_counts_and_why(tmp_path):
    tty = Console(file=io.StringIO(), force_terminal=True, width=200)
    printed: list[str] = []
    with MetricsLogger(tmp_path / "t", total_steps=4, console=tty, line_every=1, line=printed.append) as log:
        log.phase("evaluating before RL on 8 held-out problems", echo=True)
        log._progress.refresh()
        assert "evaluating before RL on 8 held-out problems" in tty.file.getvalue()
        log.log(1, {"reward_mean": 0.5, "rollouts": {"kept": 12, "filtered": 4, "errored": 0},
                    "no_signal": "4/4 groups had equal rewards"})
        log.phase("evaluating after RL on 8 held-out problems")
        log.phase_done()  # the bar ends on the last step's figures, not on a finished evaluation
        assert log._progress.tasks[0].description.startswith("reward=0.5  12 kept, 4 filtered, 0 errored")
    out = tty.file.getvalue()
    assert "12 kept, 4 filtered, 0 errored" in out and "no signal: 4/4 groups had equal rewards" in out
    assert printed == []  # a terminal gets the bar, not plain lines


def test_plain_lines_off_a_terminal_every_n_steps_and_after_the_last(tmp_path):
    printed: list[str] = []
    with MetricsLogger(tmp_path / "p", total_steps=5, console=_quiet(), line_every=2, line=printed.append) as log:
        log.phase("evaluating before RL on 8 held-out problems", echo=True)
        log.phase("step 1: generating rollouts")  # a label only: no line of its own
        for step in range(1, 6):
            log.log(step, {"reward_mean": 0.25, "accuracy": 0.125, "step_s": 1.25, "tokens_per_s": 212.4,
                           "rollouts": {"kept": 12, "filtered": 2, "errored": 2, "truncated": 0, "aborted": 1}})
    assert printed[0] == "evaluating before RL on 8 held-out problems"
    assert printed[1:] == [f"step {s}/5: reward 0.250, acc 0.125; 12 kept, 2 filtered, 2 errored, 1 aborted; 1.2s, "
                           "212 tok/s" for s in (2, 4, 5)]
