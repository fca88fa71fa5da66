"""`rollwise train --resume RUN_DIR` without the YAML: continues under the run's own config.yaml, and refuses a
given key that would change results."""

from __future__ import annotations

import json

from rollwise.cli.main import main
from rollwise.config import load_config
from rollwise.run.loop import train


def test_resume_run_dir_uses_its_own_config(tmp_path, run_cfg, capsys):
    out = tmp_path / "run"
    # The built-in model at hidden size 64: resuming under the embedded default (128) would not even load.
    cfg = run_cfg(out, "train.steps=3", "run.checkpoint_every=1", "rollout.samples_per_prompt=2", builtin=True)
    assert train(cfg, log=lambda s: None, stop_after=2) is None
    saved = (out / "config.yaml").read_text()
    capsys.readouterr()  # the first run's progress bars
    # A key that changes results, given with --resume: one line naming it, nothing run.
    assert main(["train", "--resume", str(out), "--set", "train.lr=0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.lr: 0.0003 -> 0.5" in err
    # No YAML: the run's own config (samples_per_prompt=2, its model), not the built-in default's, to its own steps.
    assert main(["train", "--resume", str(out), "--set", "run.loggers=[jsonl]"]) == 0
    assert (out / "config.yaml").read_text() == saved
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert all(m["rollouts/kept"] + m["rollouts/filtered"] + m["rollouts/errored"] + m["rollouts/truncated"]
               + m["rollouts/aborted"] == 4 * 2 for m in lines)
    summary = json.loads((out / "summary.json").read_text())
    again = load_config(out / "config.yaml", saved_run=True)
    assert summary["steps"] == 3 and again.rollout.samples_per_prompt == 2 and again.model.builtin.hidden_size == 64
    # A directory that is not a run: one line.
    assert main(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert "no config.yaml there" in capsys.readouterr().err
