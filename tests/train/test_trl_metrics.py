"""Each step's record carries TRL GRPOTrainer's metric names beside rollwise's (`train.metrics.trl_metrics`)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from rollwise.train.metrics import TRL_METRIC_ALIASES, trl_metrics


def _ro(i, reward, parts, n_tokens=3, status="kept"):
    from rollwise.types import Rollout

    return Rollout(prompt_id="p", group_id="g", sample_index=i, prompt_token_ids=[1, 2],
                   completion_token_ids=list(range(n_tokens)), logprobs=[-0.5] * n_tokens,
                   weight_versions=[0] * n_tokens, loss_mask=[1] * n_tokens, reward=reward, reward_parts=parts,
                   status=status)


def _record(rollouts, zero_var=0, groups=1):
    from rollwise.run.loop import step_metrics

    books = SimpleNamespace(generated_tokens=12, gen_s=2.0, score_s=0.5, metrics=lambda: {})
    train_m = {"loss": 0.75, "kl": 0.01, "entropy": 1.5, "grad_norm": 0.3, "clip_frac": 0.05, "lr": 1e-6,
               "train_s": 1.0}
    return step_metrics(rollouts, groups, zero_var, books, train_m, gen_wait_s=0.1, producer_wait_s=0.0,
                        sync_s=0.1, step_s=4.0, weight_version=1, staleness_bound=0, engine_counters={}, useful=12)


def test_step_metrics_keeps_rollwise_keys_and_adds_trl_names():
    rollouts = [_ro(0, 1.5, {"acc": 1.0, "fmt": 0.5}, 4), _ro(1, 0.0, {"acc": 0.0, "fmt": 0.0}, 2),
                _ro(2, 1.0, {"acc": 1.0, "fmt": 0.0, "overlong_penalty": -0.25}, 6, status="truncated")]
    rec = _record(rollouts, zero_var=1, groups=2)
    # rollwise's own keys are all still there
    for k in ("reward_mean", "accuracy", "zero_var_frac", "resp_len_mean", "resp_len_max", "truncation_rate",
              "kl", "entropy", "grad_norm", "loss", "clip_frac", "lr"):
        assert k in rec, k
    # TRL's names, same values
    for trl, ours in TRL_METRIC_ALIASES.items():
        assert rec[trl] == rec[ours], trl
    assert rec["reward"] == pytest.approx(2.5 / 3)
    assert rec["frac_reward_zero_std"] == 0.5
    assert rec["completions/mean_length"] == 4 and rec["completions/max_length"] == 6
    assert rec["completions/min_length"] == 2
    assert rec["completions/clipped_ratio"] == pytest.approx(1 / 3)
    assert rec["clip_ratio/region_mean"] == 0.05 and rec["learning_rate"] == 1e-6
    assert rec["reward_std"] == pytest.approx(math.sqrt(((1.5 - 2.5 / 3) ** 2 + (2.5 / 3) ** 2 + (1 - 2.5 / 3) ** 2) / 2))
    # per reward function; rollwise's shaping term (the soft overlong penalty) is not a reward function
    assert rec["rewards/acc/mean"] == pytest.approx(2 / 3) and rec["rewards/fmt/mean"] == pytest.approx(0.5 / 3)
    assert "rewards/acc/std" in rec
    assert not any(k.startswith("rewards/overlong_penalty") for k in rec)
    assert all(v is not None for v in rec.values())


def test_missing_values_are_left_out():
    out = trl_metrics({"reward_mean": None, "lr": 1e-5}, [])
    assert out == {"learning_rate": 1e-5}
    one = trl_metrics({}, [_ro(0, None, {}, status="errored")])
    assert "reward_std" not in one and "reward" not in one and one["completions/min_length"] == 3


def test_reward_names_are_safe_metric_names():
    out = trl_metrics({}, [_ro(0, 1.0, {"<lambda>": 1.0, "a:b/c": 0.5})])
    assert out["rewards/_lambda_/mean"] == 1.0 and out["rewards/a_b_c/mean"] == 0.5
