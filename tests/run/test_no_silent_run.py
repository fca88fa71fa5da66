"""No silent run: a broken reward stops the run with one line, a policy's errors never do; every step line says
what it kept, filtered and errored and why it trained nothing; plain lines off a terminal; a finished run resumed
does nothing. Tiny runs on the warmed-up built-in model (a few seconds each)."""

from __future__ import annotations

import io
import json
import sys

import pytest

from rollwise.cli.main import main
from rollwise.config import load_config
from rollwise.run.loop import train

ROWS = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(16)]
REWARDS = {
    "raises.py": "def reward(task, completion):\n    raise RuntimeError('reward exploded')\n",
    # Raises on the odd-length completions only: which ones is up to the policy.
    "some.py": ("def reward(task, completion):\n    if len(completion) % 2:\n        raise ValueError('odd')\n"
                "    return float(completion.strip() == task.answer)\n"),
    "constant.py": "def reward(task, completion):\n    return 0.5\n",
    # Raises once the flag file beside it exists (a reward that breaks mid-run).
    "breaks.py": ("import pathlib\n\ndef reward(task, completion):\n"
                  "    if (pathlib.Path(__file__).parent / 'BROKEN').exists():\n        raise KeyError('answer')\n"
                  "    return float(len(completion) % 2)\n"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("rewards")
    (d / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    for name, text in REWARDS.items():
        (d / name).write_text(text)
    return d


def _args(files, tiny_model, reward: str, *extra: str) -> list[str]:
    """--set overrides of a tiny dataset run (4 prompts x 4 samples, 4 held-out problems) scored by `reward`."""
    return [f"model.path={tiny_model}", "model.device=cpu", "env.name=dataset", f"env.kwargs.path={files}/d.jsonl",
            "env.kwargs.test_size=4", f"env.reward={files}/{reward}:reward", "rollout.prompts_per_step=4",
            "rollout.samples_per_prompt=4", "rollout.max_tokens=4", "run.eval_samples=1", "run.loggers=[jsonl]",
            "run.cpu_threads=1", "algo.skip_zero_variance=false", *extra]


def _cfg(files, tiny_model, out, reward: str, *extra: str):
    return load_config(None, [f"run.out_dir={out}", *_args(files, tiny_model, reward, *extra)])


def _plain_stdout(monkeypatch) -> None:
    """stdout that is not a terminal, whatever runs the tests (pytest -s in a terminal too)."""
    monkeypatch.setattr(sys, "stdout", io.StringIO())


def test_a_reward_that_errors_on_every_sample_stops_the_first_step_with_one_line(files, tiny_model, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--set", "train.steps=3"]
    for kv in _args(files, tiny_model, "raises.py"):
        argv += ["--set", kv]
    code = main(argv)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2
    assert len(err) == 1, err
    line = err[0]
    assert line.startswith("rollwise train: error: the reward errored on every sample of step 1"), line
    assert "RuntimeError: reward exploded" in line and f"{files}/raises.py:2" in line and str(out) in line
    # Nothing of step 1 was trained or stored; what the run wrote before it stays.
    assert (out / "config.yaml").is_file() and (out / "eval_before.json").is_file()
    assert not list(out.glob("rollouts/step-*.parquet")) and not (out / "summary.json").exists()


def test_a_reward_that_errors_on_some_samples_is_their_outcome_and_the_run_goes_on(files, tiny_model, tmp_path,
                                                                                   monkeypatch):
    _plain_stdout(monkeypatch)
    lines: list[str] = []
    summary = train(_cfg(files, tiny_model, tmp_path / "run", "some.py", "train.steps=3"), log=lines.append)
    c = summary["rollouts"]
    assert 0 < c["errored"] < c["total"] == 3 * 16
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert len(steps) == 3
    metrics = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for ln, m in zip(steps, metrics):  # each line carries the ledger's counts of its step
        assert (f"{m['rollouts/kept']} kept, {m['rollouts/filtered']} filtered, {m['rollouts/errored']} errored"
                in ln), ln


def test_a_step_without_signal_says_why_in_a_line_every_log_every_steps(files, tiny_model, tmp_path, monkeypatch):
    _plain_stdout(monkeypatch)
    lines: list[str] = []
    train(_cfg(files, tiny_model, tmp_path / "run", "constant.py", "train.steps=4", "run.log_every=2"),
          log=lines.append)
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split(":")[0] for ln in steps] == ["step 2/4", "step 4/4"], lines
    metrics = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for ln, m in zip(steps, metrics[1::2]):
        assert ln.startswith(f"step {m['step']}/4: reward 0.500, acc 0.000; {m['rollouts/kept']} kept, 0 filtered, "
                             "0 errored") and "tok/s" in ln, ln
        assert ln.endswith("no signal: 4/4 groups had equal rewards"), ln
    assert [m["no_signal"] for m in metrics] == ["4/4 groups had equal rewards"] * 4
    assert any(ln.startswith("evaluating before RL on 4 held-out problems") for ln in lines)


def test_a_reward_that_breaks_mid_run_stops_after_n_steps_in_a_row_and_keeps_what_was_done(files, tiny_model,
                                                                                           tmp_path):
    out = tmp_path / "run"
    extra = ("train.steps=6", "run.checkpoint_every=1", "run.max_all_errored_steps=2")
    quiet = lambda s: None  # noqa: E731
    assert train(_cfg(files, tiny_model, out, "breaks.py", *extra), log=quiet, stop_after=1) is None
    (files / "BROKEN").write_text("")
    try:
        with pytest.raises(ValueError, match=r"every sample of 2 steps in a row \(2-3\): reward: KeyError: 'answer' "
                                             rf"\(at {files}/breaks.py:5\) on 16 of 16 samples of step 3"):
            train(_cfg(files, tiny_model, out, "breaks.py", *extra, "run.resume=true"), log=quiet)
    finally:
        (files / "BROKEN").unlink()
    # Step 2 (the first all-errored one) trained as wrong answers and was stored; step 3 stopped before either.
    assert sorted(p.name for p in out.glob("rollouts/step-*.parquet")) == ["step-000001.parquet", "step-000002.parquet"]
    assert [json.loads(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    summary = train(_cfg(files, tiny_model, out, "breaks.py", *extra, "run.resume=true"), log=quiet)
    assert summary["steps"] == 6 and summary["rollouts"]["total"] == 6 * 16


def test_resuming_a_finished_run_says_so_and_does_nothing(files, tiny_model, tmp_path, monkeypatch, capsys):
    import rollwise
    import rollwise.run.setup

    out = tmp_path / "run"
    summary = train(_cfg(files, tiny_model, out, "constant.py", "train.steps=2"), log=lambda s: None)
    written = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()}

    def no_work(*a, **k):
        raise AssertionError("a finished run was loaded again")

    monkeypatch.setattr(rollwise.run.setup, "build_run", no_work)
    capsys.readouterr()
    assert main(["train", "--resume", str(out)]) == 0
    said = capsys.readouterr()
    assert said.out == f"run already finished at step 2: {out}; nothing to do (its results are in summary.json; " \
                       "a larger train.steps trains further)\n" and not said.err
    lines: list[str] = []
    result = rollwise.train(resume=out, log=lines.append)
    assert lines == [said.out.strip()]
    assert result.steps == 2 and result.summary == json.loads((out / "summary.json").read_text())
    assert result.accuracy_after == summary["eval_after"]["accuracy"]
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()} == written
    # More steps asked for: not finished, the resume proper continues it.
    from rollwise.run.resume import finished_run

    assert finished_run(_cfg(files, tiny_model, out, "constant.py", "train.steps=3", "run.resume=true")) is None
    assert finished_run(_cfg(files, tiny_model, out, "constant.py", "train.steps=2")) is None  # not a resume


def _rollouts(statuses: str) -> list:
    """One Rollout per letter: e errored, k kept, a aborted."""
    from rollwise.types import Rollout

    names = {"e": "errored", "k": "kept", "a": "aborted"}
    return [Rollout(prompt_id="p", group_id="g", sample_index=i, prompt_token_ids=[1], completion_token_ids=[2],
                    logprobs=[0.0], weight_versions=[0], loss_mask=[1], status=names[c],  # type: ignore[arg-type]
                    status_reason={"e": "reward: KeyError: 'x' (at r.py:3)", "k": "", "a": "aborted"}[c])
            for i, c in enumerate(statuses)]


def test_the_guard_stops_on_the_first_step_or_n_steps_in_a_row_and_never_on_some_errors(tmp_path):
    from rollwise.run.guard import ErroredSteps, RewardBroken

    with pytest.raises(RewardBroken, match=r"of step 1, the run's first: reward: KeyError: 'x' \(at r.py:3\) on 3 of 3"):
        ErroredSteps(3, tmp_path).observe(1, _rollouts("eeea"))  # aborted samples were never scored
    guard = ErroredSteps(3, tmp_path)
    guard.observe(1, _rollouts("eeek"))  # some errors: the samples' outcome
    for step, batch in ((2, "eeee"), (3, "eeee"), (4, "keee"), (5, "eeee"), (6, "eaee")):
        guard.observe(step, _rollouts(batch))
    assert guard.streak == 2
    with pytest.raises(RewardBroken, match=r"3 steps in a row \(5-7\).*resume: rollwise train --resume"):
        guard.observe(7, _rollouts("eeee"))
    ErroredSteps(1, tmp_path).observe(2, _rollouts("aaaa"))  # nothing scored: nothing to judge
