"""The RL loop end to end on the built-in tiny model (short warm-up), resume, and replay."""

from __future__ import annotations

import json
import subprocess
import sys

from safetensors.torch import load_file

from rollwise.envs import register_env
from rollwise.envs.arithmetic import ArithmeticEnv
from rollwise.types import Score
from rollwise.run.loop import train
from rollwise.store.writer import RolloutStore


def test_run_writes_everything_and_accounts_for_every_rollout(tmp_path, run_cfg):
    out = tmp_path / "run"
    summary = train(run_cfg(out, "run.checkpoint_every=2", "train.steps=4", "run.eval_every=2", "run.eval_samples=1",
                            builtin=True), log=lambda s: None)
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "report.html", "eval_before.json"):
        assert (out / name).is_file(), name
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if not p.name.startswith(".")) == ["step-2", "step-4"]
    ck = out / "checkpoints" / "step-4"
    assert (ck / "config.json").is_file() and (ck / "model.safetensors").is_file() and (ck / "tokenizer.json").is_file()
    s = json.loads((out / "summary.json").read_text())
    assert s == json.loads(json.dumps(summary, default=str))
    for k in ("eval_before", "eval_after", "steps", "wall_s", "rollouts"):
        assert k in s
    for ev in (s["eval_before"], s["eval_after"]):  # arithmetic's 0/1 reward: the pass rate is the mean reward
        assert ev["n"] == 8 and ev["errored"] == 0 and ev["accuracy"] == ev["reward_mean"]
        assert ev["accuracy_greedy"] == ev["reward_mean_greedy"] and (ev["accuracy_greedy"] * 8).is_integer()
    c = s["rollouts"]
    assert c["total"] == 4 * 4 * 4
    assert c["kept"] + c["filtered"] + c["errored"] + c["truncated"] + c["aborted"] == c["total"]
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    for m in lines:
        for key in ("reward_mean", "accuracy", "zero_var_frac", "resp_len_mean", "resp_len_max", "truncation_rate",
                    "gen_tokens_per_s", "time_generate_s", "time_score_s", "time_train_s", "time_sync_s",
                    "logprob_mismatch_mean", "entropy", "grad_norm"):
            assert key in m, key
        # The engine and the trainer see the same weights: their log-probs agree on the same tokens.
        assert m["logprob_mismatch_mean"] < 1e-4
        assert m["weight_version"] == m["step"]
        assert m["cpu_s"] > 0 and m["step_s"] > 0
    # The mid-run evaluation (step 2; step 4's is the final one) is timed on its own and left out of step_s, so the
    # sum of step_s is training time: the wall clock moved by at least both.
    assert [("time_eval_s" in m, "eval_accuracy_greedy" in m) for m in lines] == [(False, False), (True, True),
                                                                                   (False, False), (False, False)]
    assert lines[1]["wall_s"] - lines[0]["wall_s"] >= lines[1]["step_s"] + lines[1]["time_eval_s"] - 1e-3
    rows = RolloutStore(out).read()
    assert len(rows) == 64 and {r.step for r in rows} == {1, 2, 3, 4}
    assert all(len(r.logprobs) == len(r.completion_token_ids) for r in rows)
    # Every stored rollout says how long its generation and its scoring took (the store's `timings` column).
    assert all({"generate_s", "score_s"} <= set(r.timings) and r.timings["generate_s"] > 0 for r in rows)


def test_resume_continues_as_if_never_stopped(tmp_path, run_cfg):
    full = tmp_path / "full"
    train(run_cfg(full, "run.checkpoint_every=2", "train.steps=4", "train.lr=1e-3"), log=lambda s: None)
    part = tmp_path / "part"
    assert train(run_cfg(part, "run.checkpoint_every=2", "train.steps=4", "train.lr=1e-3"), log=lambda s: None,
                 stop_after=3) is None
    # Step 3 ran after the last checkpoint (step 2): it is redone on resume, and stored once.
    assert (part / "rollouts" / "step-000003.parquet").is_file()
    train(run_cfg(part, "run.checkpoint_every=2", "train.steps=4", "train.lr=1e-3", "run.resume=true"),
          log=lambda s: None)
    a = load_file(full / "checkpoints" / "step-4" / "model.safetensors")
    b = load_file(part / "checkpoints" / "step-4" / "model.safetensors")
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
    ma = [json.loads(l) for l in (full / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(l) for l in (part / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in mb] == [1, 2, 3, 4]
    for x, y in zip(ma, mb):
        assert x["reward_mean"] == y["reward_mean"] and x["resp_len_mean"] == y["resp_len_mean"]
        assert abs(x["loss"] - y["loss"]) < 1e-5
    ra, rb = RolloutStore(full).read(), RolloutStore(part).read()
    assert [(r.step, r.completion_token_ids) for r in ra] == [(r.step, r.completion_token_ids) for r in rb]


def test_resume_with_a_critic_continues_as_if_never_stopped(tmp_path, run_cfg):
    """PPO with GAE: the checkpoint carries the critic (weights, AdamW, its warm-up count) and the write-ahead log the
    returns, so a resumed run re-trains step 3 and ends with the same policy and the same critic."""
    # TINY_RUN keeps zero-variance groups (false); with a critic that key has no effect, so it is set back
    extra = ("algo.advantage=gae", "algo.loss=ppo", "algo.skip_zero_variance=true", "algo.critic.lr=1e-3",
             "algo.critic.warmup_steps=1", "algo.critic.updates_per_step=2", "run.checkpoint_every=2",
             "train.steps=4", "train.lr=1e-3")
    full, part = tmp_path / "full", tmp_path / "part"
    train(run_cfg(full, *extra), log=lambda s: None)
    assert train(run_cfg(part, *extra), log=lambda s: None, stop_after=3) is None
    train(run_cfg(part, *extra, "run.resume=true"), log=lambda s: None)
    for name in ("model.safetensors", "critic/model.safetensors"):
        a = load_file(full / "checkpoints" / "step-4" / name)
        b = load_file(part / "checkpoints" / "step-4" / name)
        assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6, name
    ma = [json.loads(l) for l in (full / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(l) for l in (part / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in mb] == [1, 2, 3, 4] and "loss" not in ma[0] and "loss" in ma[1]  # the warm-up step
    for x, y in zip(ma, mb):
        assert x["reward_mean"] == y["reward_mean"]
        assert abs(x["critic/value_loss"] - y["critic/value_loss"]) < 1e-6
    rows = RolloutStore(full).read()
    assert all(r.token_advantages is None and r.advantage in (r.reward, 0.0) for r in rows if r.status == "kept")


def test_cli_bad_config_fails_before_work(tmp_path):
    r = subprocess.run([sys.executable, "-m", "rollwise.cli.main", "train", "--set", "train.lr_rate=1",
                        "--out", str(tmp_path / "x")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "train.lr_rate" in r.stderr and "train.lr" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


class _ParityArithmetic(ArithmeticEnv):
    """Arithmetic prompts, but reward 1 for an even-length completion: a random model gets mixed groups."""

    def score(self, task, completion):
        ok = float(len(completion) % 2 == 0)
        return Score(ok, parts={"correct": ok})


def test_replay_reuses_past_rollouts_without_storing_them_twice(tmp_path, run_cfg):
    register_env("parity_arith_test", _ParityArithmetic, overwrite=True)
    out = tmp_path / "replay"
    train(run_cfg(out, "replay.enabled=true", "replay.reuse_per_step=8", "train.steps=5", "train.lr=1e-3",
                  "env.name=parity_arith_test"), log=lambda s: None)
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(m["replay_used"] for m in lines) > 0 and lines[0]["replay_used"] == 0
    assert all(m["replay_age_max"] <= 4 for m in lines)
    rows = RolloutStore(out).read()
    assert len(rows) == 5 * 4 * 4  # replayed copies are not stored again
    assert not any("replay_from_step" in r.env_info for r in rows)
    s = json.loads((out / "summary.json").read_text())
    assert s["rollouts"]["total"] == 80
