"""GAE, whitening, explained variance and the clipped value loss against naive references written from their
formulas (plain Python loops over tokens), including multi-turn masks, agent episodes over several sequences and
ragged lengths."""

from __future__ import annotations

import random

import pytest
import torch

from rollwise.train.gae import episode_gae, explained_variance, gae, outcome_rewards, whiten
from rollwise.train.losses import value_loss


def naive_gae(rewards, values, mask, gamma, lam):
    """Schulman et al. 2016, eq. 16, over each row's policy tokens: delta_k = r_k + gamma V_{k+1} - V_k (V after the
    last policy token = 0), A_k = sum_l (gamma lam)^l delta_{k+l}; returns A_k + V_k. Lists of lists in and out."""
    adv_out, ret_out = [], []
    for r, v, m in zip(rewards, values, mask):
        steps = [t for t in range(len(m)) if m[t]]  # the policy's tokens: the time axis
        deltas = []
        for k, t in enumerate(steps):
            v_next = values_at(v, steps, k + 1)
            deltas.append(r[t] + gamma * v_next - v[t])
        adv = [0.0] * len(m)
        ret = [0.0] * len(m)
        for k, t in enumerate(steps):
            a = sum((gamma * lam) ** l * deltas[k + l] for l in range(len(steps) - k))
            adv[t] = a
            ret[t] = a + v[t]
        adv_out.append(adv)
        ret_out.append(ret)
    return adv_out, ret_out


def values_at(v, steps, k):
    return v[steps[k]] if k < len(steps) else 0.0


def _multi_turn_batch(seed, b=7, t=23):
    """Rows of varied lengths whose masks alternate policy turns (1) with environment turns (0), then padding."""
    rng = random.Random(seed)
    rewards, values, mask = [], [], []
    for _ in range(b):
        n = rng.randint(1, t)
        m = []
        while len(m) < n:
            turn = rng.randint(1, 5)
            m += [1 if rng.random() < 0.6 else 0] * turn
        m = m[:n] + [0] * (t - n)
        if not any(m):
            m[0] = 1
        last = max(i for i in range(t) if m[i])
        r = [0.0] * t
        r[last] = rng.choice([0.0, 1.0, 0.37, -0.5])
        if rng.random() < 0.3:  # a reward on an earlier policy token too (per-token rewards are allowed)
            r[min(i for i in range(t) if m[i])] += 0.25
        rewards.append(r)
        values.append([rng.uniform(-1, 1) if m[i] else rng.uniform(-9, 9) for i in range(t)])  # garbage off-mask
        mask.append(m)
    return rewards, values, mask


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (1.0, 0.95), (0.9, 0.8), (0.99, 0.0), (0.0, 0.5)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_the_paper_formula_over_policy_tokens(gamma, lam, seed):
    rewards, values, mask = _multi_turn_batch(seed)
    adv, ret = gae(torch.tensor(rewards), torch.tensor(values), torch.tensor(mask, dtype=torch.float32),
                   gamma=gamma, lam=lam)
    want_a, want_r = naive_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, torch.tensor(want_a), atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, torch.tensor(want_r), atol=1e-6, rtol=0)
    # environment tokens and padding get nothing, whatever values they held
    off = torch.tensor(mask) == 0
    assert (adv[off] == 0).all() and (ret[off] == 0).all()


def test_environment_tokens_do_not_break_the_recursion():
    """A policy turn, a tool result, a policy turn: with gamma = lam = 1 every policy token's return is the outcome,
    and the first turn's advantages see the second turn's values as if the tool tokens were not there."""
    mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1]], dtype=torch.float32)
    values = torch.tensor([[0.1, 0.2, 5.0, 5.0, 5.0, 0.3, 0.4]])
    rewards = outcome_rewards(mask, torch.tensor([1.0])).float()
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0, 0, 0, 1.0, 1.0]]))
    adv0, _ = gae(rewards, values, mask, gamma=1.0, lam=0.0)  # one-step TD: A_t = V_next - V_t (+ r at the end)
    torch.testing.assert_close(adv0, torch.tensor([[0.1, 0.1, 0, 0, 0, 0.1, 0.6]]))


def test_a_reward_on_an_environment_token_is_refused():
    mask = torch.tensor([[1.0, 0.0]])
    with pytest.raises(ValueError, match="outside the loss mask"):
        gae(torch.tensor([[0.0, 1.0]]), torch.zeros(1, 2), mask, gamma=1.0, lam=1.0)


def test_outcome_rewards_sit_on_the_last_policy_token():
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.float32)
    r = outcome_rewards(mask, torch.tensor([2.0, 3.0, 4.0]))
    assert r.tolist() == [[0, 2.0, 0, 0], [0, 0, 3.0, 0], [0, 0, 0, 0]]


def test_an_episode_over_several_sequences_is_one_time_axis():
    """An agent episode laid out as two rows (segments): GAE over row 0's policy tokens then row 1's, as if they
    were one row; the outcome on the last policy token of the last row."""
    rng = random.Random(7)
    lengths = [5, 3, 4, 6]
    t = 6
    mask = torch.zeros(4, t)
    values = torch.zeros(4, t)
    for i, n in enumerate(lengths):
        mask[i, :n] = torch.tensor([1.0 if rng.random() < 0.7 else 0.0 for _ in range(n)])
        mask[i, 0] = 1.0
        values[i, :n] = torch.tensor([rng.uniform(-1, 1) for _ in range(n)])
    episodes = [[0, 1], [2], [3]]
    outcomes = [1.0, 0.0, 0.5]
    adv, ret = episode_gae(values, mask, outcomes, episodes, lengths, gamma=0.97, lam=0.9)
    for e, out in zip(episodes, outcomes):
        flat_m = [float(mask[i, k]) for i in e for k in range(lengths[i])]
        flat_v = [float(values[i, k]) for i in e for k in range(lengths[i])]
        flat_r = [0.0] * len(flat_m)
        flat_r[max(k for k, m in enumerate(flat_m) if m)] = out
        want_a, want_r = naive_gae([flat_r], [flat_v], [flat_m], 0.97, 0.9)
        got_a = [float(adv[i, k]) for i in e for k in range(lengths[i])]
        got_r = [float(ret[i, k]) for i in e for k in range(lengths[i])]
        assert got_a == pytest.approx(want_a[0], abs=1e-6) and got_r == pytest.approx(want_r[0], abs=1e-6)
    with pytest.raises(ValueError, match="every row"):
        episode_gae(values, mask, [1.0], [[0, 1]], lengths, gamma=1.0, lam=1.0)


def test_whiten_and_explained_variance_match_their_formulas():
    rng = random.Random(3)
    x = torch.tensor([[rng.gauss(0, 2) for _ in range(9)] for _ in range(4)])
    m = torch.tensor([[1.0 if rng.random() < 0.6 else 0.0 for _ in range(9)] for _ in range(4)])
    vals = [float(x[i, j]) for i in range(4) for j in range(9) if m[i, j]]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    w = whiten(x, m)
    for i in range(4):
        for j in range(9):
            want = (float(x[i, j]) - mean) / (var + 1e-8) ** 0.5 if m[i, j] else 0.0
            assert float(w[i, j]) == pytest.approx(want, abs=1e-5)
    ret = torch.tensor([[rng.gauss(0, 1) for _ in range(9)] for _ in range(4)])
    rs = [float(ret[i, j]) for i in range(4) for j in range(9) if m[i, j]]
    ds = [float(ret[i, j]) - float(x[i, j]) for i in range(4) for j in range(9) if m[i, j]]

    def pvar(a):
        mu = sum(a) / len(a)
        return sum((v - mu) ** 2 for v in a) / len(a)

    assert explained_variance(x, ret, m) == pytest.approx(1 - pvar(ds) / pvar(rs), abs=1e-9)
    assert explained_variance(ret, ret, m) == pytest.approx(1.0)
    assert explained_variance(x, torch.ones_like(ret), m) != explained_variance(x, torch.ones_like(ret), m)  # NaN


def naive_value_loss(v, old, ret, mask, c):
    """0.5 * mean over loss tokens of max((v - R)^2, (old + clip(v - old, -c, c) - R)^2), token by token."""
    total, n, clipped = 0.0, 0, 0
    for i in range(len(v)):
        for t in range(len(v[i])):
            if not mask[i][t]:
                continue
            e1 = (v[i][t] - ret[i][t]) ** 2
            if c is None:
                e = e1
            else:
                vc = old[i][t] + min(max(v[i][t] - old[i][t], -c), c)
                e2 = (vc - ret[i][t]) ** 2
                e = max(e1, e2)
                clipped += e2 > e1
            total += e
            n += 1
    return 0.5 * total / n, clipped / n


@pytest.mark.parametrize("clip", [None, 0.2, 0.5])
def test_value_loss_matches_the_naive_reference_with_its_gradient(clip):
    rng = random.Random(11)
    b, t = 5, 8
    mask = [[1 if rng.random() < 0.7 else 0 for _ in range(t)] for _ in range(b)]
    old = [[rng.uniform(-1, 1) for _ in range(t)] for _ in range(b)]
    ret = [[rng.uniform(-1, 2) for _ in range(t)] for _ in range(b)]
    v0 = [[old[i][j] + rng.uniform(-0.8, 0.8) for j in range(t)] for i in range(b)]
    for i in range(b):  # padding garbage off-mask must change nothing
        for j in range(t):
            if not mask[i][j]:
                v0[i][j] = 1e4
    v = torch.tensor(v0, dtype=torch.float64, requires_grad=True)
    loss, met = value_loss(v, torch.tensor(old, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64),
                           torch.tensor(mask, dtype=torch.float64), cliprange_value=clip)
    want, frac = naive_value_loss(v0, old, ret, mask, clip)
    assert float(loss.detach()) == pytest.approx(want, abs=1e-9) and met["value_loss"] == pytest.approx(want, abs=1e-9)
    assert met["value_clip_frac"] == pytest.approx(frac)
    if clip is not None:
        assert 0 < frac < 1  # both branches are exercised
    loss.backward()
    # the gradient of the naive loss by central differences, one token at a time
    h = 1e-6
    for i in range(b):
        for j in range(t):
            up = [row[:] for row in v0]
            dn = [row[:] for row in v0]
            up[i][j] += h
            dn[i][j] -= h
            g = (naive_value_loss(up, old, ret, mask, clip)[0] - naive_value_loss(dn, old, ret, mask, clip)[0]) / (2 * h)
            assert float(v.grad[i, j]) == pytest.approx(g, abs=1e-5)


def test_value_loss_normalises_by_the_whole_mini_batch():
    """Micro-batches with the whole mini-batch's token count sum to the whole mini-batch's loss."""
    g = torch.Generator().manual_seed(0)
    v, old, ret = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    m = (torch.rand(6, 5, generator=g) < 0.7).float()
    whole, _ = value_loss(v, old, ret, m, cliprange_value=0.3)
    n = int(m.sum())
    parts = sum(value_loss(v[s], old[s], ret[s], m[s], cliprange_value=0.3, num_tokens=n)[0]
                for s in (slice(0, 2), slice(2, 6)))
    torch.testing.assert_close(parts, whole)
