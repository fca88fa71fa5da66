"""`rollwise generate` and `rollwise eval` on a tiny built-in-shaped checkpoint (random weights)."""

from __future__ import annotations

import json

import pytest

from rollwise.cli.main import main
from rollwise.envs import get_env
from rollwise.models.builtin import build_builtin_model
from rollwise.store.writer import RolloutStore


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    env = get_env("arithmetic")
    return build_builtin_model(tmp_path_factory.mktemp("m") / "ckpt", env.charset, hidden_size=32, num_layers=1,
                               num_heads=2, num_kv_heads=1, intermediate_size=64, max_position_embeddings=64)


def test_generate_writes_scored_rollouts(ckpt, tmp_path, capsys):
    rc = main(["generate", "--model", str(ckpt), "--env", "arithmetic", "--out", str(tmp_path / "g"), "--n", "10",
               "--samples", "3", "--prompts-per-step", "4", "--max-tokens", "5", "--device", "cpu"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["rollouts"]["total"] == 30
    store = RolloutStore(tmp_path / "g")
    assert store.steps() == [1, 2, 3]
    rows = store.read()
    assert len(rows) == 30 and all(r.reward is not None for r in rows)
    # A random model rarely emits EOS within 5 tokens: those samples are counted as truncated, not hidden.
    assert sum(r.status == "truncated" for r in rows) == sum(r.finish_reason == "length" for r in rows)


def test_eval_reports_accuracy(ckpt, capsys):
    assert main(["eval", "--model", str(ckpt), "--env", "arithmetic", "--n", "8", "--samples", "2",
                 "--max-tokens", "4", "--device", "cpu", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["n"] == 8 and res["errored"] == res["errored_greedy"] == 0
    # arithmetic's reward is 1 or 0: the pass rate is the mean reward, over 8 x 2 sampled and 8 greedy answers
    assert res["accuracy"] == res["reward_mean"] and (res["accuracy"] * 16).is_integer()
    assert res["accuracy_greedy"] == res["reward_mean_greedy"] and (res["accuracy_greedy"] * 8).is_integer()


def test_bad_inputs_are_one_line_errors(ckpt, tmp_path, capsys):
    assert main(["eval", "--model", str(tmp_path / "missing"), "--env", "arithmetic", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model directory not found" in err[0]
    assert main(["generate", "--model", str(ckpt), "--env", "arithmetic", "--out", str(tmp_path / "x"),
                 "--samples", "0"]) == 2
    assert "--samples must be a positive integer" in capsys.readouterr().err
