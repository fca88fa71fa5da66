"""Advantage estimators against naive per-group loops written from each paper's formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollwise.train.advantages import ADVANTAGES, assign_advantages, group_table
from rollwise.types import Rollout, RolloutGroup


def _valid(rewards, mask, g):
    return [(k, rewards[g][k]) for k in range(len(rewards[g])) if mask[g][k]]


def naive_grpo(rewards, mask, eps=1e-6):
    out = [[0.0] * len(row) for row in rewards]
    for g in range(len(rewards)):
        vals = _valid(rewards, mask, g)
        n = len(vals)
        mean = sum(v for _, v in vals) / n if n else 0.0
        std = (sum((v - mean) ** 2 for _, v in vals) / (n - 1)) ** 0.5 if n > 1 else 0.0
        for k, v in vals:
            out[g][k] = (v - mean) / (std + eps)
    return out


def naive_dr_grpo(rewards, mask):
    out = [[0.0] * len(row) for row in rewards]
    for g in range(len(rewards)):
        vals = _valid(rewards, mask, g)
        mean = sum(v for _, v in vals) / len(vals) if vals else 0.0
        for k, v in vals:
            out[g][k] = v - mean
    return out


def naive_rloo(rewards, mask):
    out = [[0.0] * len(row) for row in rewards]
    for g in range(len(rewards)):
        vals = _valid(rewards, mask, g)
        for k, v in vals:
            others = [w for j, w in vals if j != k]
            out[g][k] = v - sum(others) / len(others) if others else 0.0
    return out


def naive_reinforce_pp(rewards, mask, baseline="group", eps=1e-6):
    centred = {}
    for g in range(len(rewards)):
        vals = _valid(rewards, mask, g)
        gmean = sum(v for _, v in vals) / len(vals) if vals else 0.0
        for k, v in vals:
            centred[(g, k)] = v - gmean if baseline == "group" else v
    xs = list(centred.values())
    mean = sum(xs) / len(xs)
    std = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    out = [[0.0] * len(row) for row in rewards]
    for (g, k), c in centred.items():
        out[g][k] = (c - mean) / (std + eps)
    return out


NAIVE = {
    "grpo": naive_grpo,
    "dr_grpo": naive_dr_grpo,
    "rloo": naive_rloo,
    "reinforce_pp": naive_reinforce_pp,
}


def _random_table(seed, g=5, k=6):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(g, k))
    rewards[1] = rng.integers(0, 2, size=k)  # binary rewards, the common RLVR case
    mask = rng.random((g, k)) > 0.2
    mask[0] = True
    mask[2, 1:] = False  # a group with one valid sample
    rewards[~mask] = np.nan  # errored entries must not leak
    return rewards, mask


def test_registry_matches_naive_set():
    assert set(ADVANTAGES) == set(NAIVE)


@pytest.mark.parametrize("name", sorted(NAIVE))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_numpy_matches_naive(name, seed):
    rewards, mask = _random_table(seed)
    got = ADVANTAGES[name](rewards, mask)
    want = np.array(NAIVE[name](np.nan_to_num(rewards).tolist(), mask.tolist()))
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    assert np.all(got[~mask] == 0)


@pytest.mark.parametrize("name", sorted(NAIVE))
def test_torch_values_and_gradients_match_naive(name):
    rewards_np, mask_np = _random_table(7)
    rewards_np = np.nan_to_num(rewards_np)
    r = torch.tensor(rewards_np, dtype=torch.float64, requires_grad=True)
    got = ADVANTAGES[name](r, torch.tensor(mask_np))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64

    # naive, on torch scalars so autograd gives the reference gradient
    r2 = torch.tensor(rewards_np, dtype=torch.float64, requires_grad=True)
    rows = [[r2[g, k] for k in range(r2.shape[1])] for g in range(r2.shape[0])]
    want = NAIVE[name](rows, mask_np.tolist())
    want_t = torch.stack([torch.stack([w if isinstance(w, torch.Tensor) else torch.tensor(w, dtype=torch.float64) for w in row]) for row in want])
    torch.testing.assert_close(got, want_t, rtol=1e-9, atol=1e-9)

    weights = torch.randn(got.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (got * weights).sum().backward()
    (want_t * weights).sum().backward()
    torch.testing.assert_close(r.grad, r2.grad, rtol=1e-8, atol=1e-8)


def test_float32_in_float32_out():
    r = np.array([[1.0, 0.0, 1.0, 0.0]], dtype=np.float32)
    assert ADVANTAGES["grpo"](r).dtype == np.float32
    assert ADVANTAGES["grpo"](torch.from_numpy(r)).dtype == torch.float32


def test_hand_numbers():
    r = np.array([[1.0, 0.0, 0.0, 0.0]])
    # mean 0.25, unbiased std 0.5
    np.testing.assert_allclose(ADVANTAGES["grpo"](r, eps=0.0), [[1.5, -0.5, -0.5, -0.5]])
    np.testing.assert_allclose(ADVANTAGES["dr_grpo"](r), [[0.75, -0.25, -0.25, -0.25]])
    np.testing.assert_allclose(ADVANTAGES["rloo"](r), [[1.0, -1 / 3, -1 / 3, -1 / 3]])
    # zero-variance group: no signal
    assert np.all(ADVANTAGES["grpo"](np.ones((1, 4))) == 0)


def test_bad_shapes_fail_with_one_line():
    with pytest.raises(ValueError, match=r"\[num_groups, group_size\]"):
        ADVANTAGES["grpo"](np.zeros(4))
    with pytest.raises(ValueError, match="mask shape"):
        ADVANTAGES["grpo"](np.zeros((2, 3)), np.ones((3, 2), dtype=bool))
    with pytest.raises(ValueError, match="baseline"):
        ADVANTAGES["reinforce_pp"](np.zeros((2, 3)), baseline="nope")


def _ro(gid, k, reward, status="kept"):
    return Rollout(prompt_id=gid, group_id=gid, sample_index=k, prompt_token_ids=[1], completion_token_ids=[2],
                   logprobs=[-0.1], weight_versions=[0], loss_mask=[1], reward=reward, status=status)


def test_assign_advantages_ragged_groups():
    groups = [
        RolloutGroup("a", "a", [_ro("a", 0, 1.0), _ro("a", 1, 0.0), _ro("a", 2, None, "errored")]),
        RolloutGroup("b", "b", [_ro("b", 0, 1.0), _ro("b", 1, 0.0), _ro("b", 2, 0.0), _ro("b", 3, 1.0)]),
    ]
    rewards, mask = group_table(groups)
    assert rewards.shape == (2, 4) and mask.sum() == 6
    assign_advantages(groups, "dr_grpo")
    assert [r.advantage for r in groups[0].rollouts] == [0.5, -0.5, 0.0]
    assert [r.advantage for r in groups[1].rollouts] == [0.5, -0.5, -0.5, 0.5]
    for name in ADVANTAGES:  # one calling convention for all
        assign_advantages(groups, name, eps=1e-4, baseline="batch")
    with pytest.raises(ValueError, match="has no option 'epsilon'"):
        assign_advantages(groups, "grpo", epsilon=1e-4)
    assign_advantages(groups, "grpo", eps=0.0)
    assert [r.advantage for r in groups[1].rollouts] == pytest.approx([0.8660254, -0.8660254, -0.8660254, 0.8660254])
    with pytest.raises(ValueError, match="unknown advantage estimator 'grpoo'"):
        assign_advantages(groups, "grpoo")
