"""DAPO overlong filtering and soft overlong punishment, against a naive reference written from Eq. 13."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollwise.config import AlgoConfig
from rollwise.filter import FilterRules
from rollwise.train.advantages import assign_advantages, grpo
from rollwise.train.overlong import (overlong_options, shape_overlong, soft_overlong_penalty, trainable_rollouts)
from rollwise.types import Rollout, RolloutGroup


def naive_penalty(y: int, l_max: int, l_cache: int) -> float:
    """DAPO (Yu et al. 2025) Eq. 13, case by case."""
    if y <= l_max - l_cache:
        return 0.0
    if l_max - l_cache < y <= l_max:
        return ((l_max - l_cache) - y) / l_cache
    return -1.0


@pytest.mark.parametrize("l_max,l_cache", [(20480, 4096), (32, 8), (10, 10), (7, 1)])
def test_soft_penalty_matches_the_paper(l_max, l_cache):
    ys = list(range(0, l_max + 5)) + [l_max - l_cache, l_max - l_cache + 1, l_max, l_max + 1, 10 * l_max]
    got = soft_overlong_penalty(np.array(ys), l_max, l_cache)
    assert got.dtype == np.float32 or got.dtype == np.float64
    assert got.tolist() == pytest.approx([naive_penalty(y, l_max, l_cache) for y in ys], abs=1e-12)
    t = soft_overlong_penalty(torch.tensor(ys), l_max, l_cache)
    assert isinstance(t, torch.Tensor) and t.tolist() == pytest.approx(got.tolist(), abs=1e-6)


def test_soft_penalty_rejects_bad_cache():
    with pytest.raises(ValueError, match="overlong_cache"):
        soft_overlong_penalty(np.array([1]), 16, 17)
    with pytest.raises(ValueError, match="overlong_cache"):
        soft_overlong_penalty(np.array([1]), 16, 0)


def _ro(i, n_tokens, reward, status="kept", finish="stop"):
    return Rollout("p", "g", i, [1, 2], [5] * n_tokens, [0.0] * n_tokens, [0] * n_tokens, [1] * n_tokens,
                   finish_reason=finish, reward=reward, status=status)


def _group():
    return [RolloutGroup("p", "g", [
        _ro(0, 4, 1.0),  # short, right
        _ro(1, 14, 1.0),  # in the cache zone (16 - 4 = 12 < 14 <= 16): penalty -0.5
        _ro(2, 16, 0.0, "truncated", "length"),  # truncated: penalty -1, filtered out of the loss
        _ro(3, 9, 0.0),
        _ro(4, 15, None, "errored"),  # no reward: no penalty; in advantages only as a wrong answer (errored_reward)
    ])]


def test_penalty_shapes_advantages_but_not_the_task_reward():
    groups = _group()
    assert shape_overlong(groups, max_length=16, cache_len=4) == 2
    ros = groups[0].rollouts
    assert [r.reward_parts.get("overlong_penalty") for r in ros] == [0.0, -0.5, -1.0, 0.0, None]
    assert [r.reward for r in ros] == [1.0, 1.0, 0.0, 0.0, None]  # the stored task reward is untouched
    adv = assign_advantages(groups, "grpo", rules=FilterRules(errored_reward=None))  # errored left out
    shaped = np.array([[1.0, 0.5, -1.0, 0.0, 0.0]])
    ref = grpo(shaped, np.array([[True, True, True, True, False]]))
    assert np.allclose(adv, ref)
    assert adv[0, 1] < adv[0, 0]  # the long right answer is worth less than the short one
    # By default the errored rollout counts as a wrong answer: min(0.0, the lowest shaped reward) = -1.0
    adv = assign_advantages(groups, "grpo")
    shaped[0, 4] = -1.0
    assert np.allclose(adv, grpo(shaped, np.ones((1, 5), dtype=bool)))


def test_overlong_filter_drops_truncated_from_the_loss_only():
    groups = _group()
    assign_advantages(groups, "grpo")
    skip = FilterRules(errored_reward=None)
    kept = trainable_rollouts(groups, drop_truncated=True, rules=skip)
    assert [r.sample_index for r in kept] == [0, 1, 3]
    assert groups[0].rollouts[2].advantage != 0.0  # it still counted in the group's baseline
    assert [r.sample_index for r in trainable_rollouts(groups, drop_truncated=False, rules=skip)] == [0, 1, 2, 3]
    # by default the errored rollout trains too, as the wrong answer it is scored as
    assert [r.sample_index for r in trainable_rollouts(groups, drop_truncated=True)] == [0, 1, 3, 4]


def test_dapo_defaults_on_and_explicit_settings_win():
    on = overlong_options(AlgoConfig(loss="dapo"))
    assert on.filter and on.punish and on.cache_for(20480) == 4096
    off = overlong_options(AlgoConfig(loss="grpo"))
    assert not off.filter and not off.punish
    mixed = overlong_options(AlgoConfig(loss="dapo", overlong_filter=False, overlong_cache=64))
    assert not mixed.filter and mixed.punish and mixed.cache_for(512) == 64
    assert overlong_options(AlgoConfig(loss="grpo", overlong_penalty=True)).punish
