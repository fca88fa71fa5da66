"""train.updates_per_step > 1: each RL step splits its batch into freshly shuffled mini-batches, seeded.

The attack it stops: with no generator passed (as the run's trainer handle calls it) the split was always
every n-th sequence in batch order, so a batch laid out group by group put the same pairs of samples into
the same mini-batch at every step, and the PPO-style epochs never mixed them."""

from __future__ import annotations

import torch

from rollwise.config import TrainConfig
from rollwise.train.batch import TrainBatch
from rollwise.train.losses import LOSSES, LossConfig
from rollwise.train.trainer import Trainer

from .synthetic import make_rollouts


def _splits(tiny_llama, monkeypatch, seed, steps):
    seen: list[list[tuple[int, ...]]] = []
    orig = TrainBatch.subset

    def spy(self, indices):
        seen[-1].append(tuple(indices))
        return orig(self, indices)

    monkeypatch.setattr(TrainBatch, "subset", spy)
    tr = Trainer(tiny_llama, TrainConfig(lr=1e-4, updates_per_step=2, seed=seed))
    ros = make_rollouts(12, seed=3)
    for _ in range(steps):
        seen.append([])
        tr.train_step(TrainBatch.from_rollouts(ros, 256), LOSSES["grpo"], LossConfig())
    monkeypatch.setattr(TrainBatch, "subset", orig)
    return [s[:2] for s in seen], tr


def test_minibatches_are_reshuffled_every_step_and_seeded(tiny_llama, monkeypatch):
    a, tr = _splits(tiny_llama, monkeypatch, seed=0, steps=3)
    for split in a:
        assert sorted(i for mb in split for i in mb) == list(range(12))  # a partition of the batch
    fixed = [tuple(range(0, 12, 2)), tuple(range(1, 12, 2))]
    assert any(list(s) != fixed for s in a), "every step used the unshuffled every-n-th split"
    assert len({tuple(s) for s in a}) == 3, "the split did not change from step to step"
    b, _ = _splits(tiny_llama, monkeypatch, seed=0, steps=3)
    assert a == b  # same seed, same splits (and after a resume: they depend on (seed, rl_step) only)
    c, _ = _splits(tiny_llama, monkeypatch, seed=1, steps=3)
    assert a != c
    tr.rl_step = 1
    g1 = torch.randperm(12, generator=tr.minibatch_generator()).tolist()
    assert g1 == torch.randperm(12, generator=tr.minibatch_generator()).tolist()


def test_an_explicit_generator_still_wins(tiny_llama, monkeypatch):
    seen = []
    orig = TrainBatch.subset
    monkeypatch.setattr(TrainBatch, "subset", lambda self, idx: seen.append(tuple(idx)) or orig(self, idx))
    tr = Trainer(tiny_llama, TrainConfig(lr=1e-4, updates_per_step=2))
    batch = TrainBatch.from_rollouts(make_rollouts(12, seed=3), 256)
    tr.train_step(batch, LOSSES["grpo"], LossConfig(), generator=torch.Generator().manual_seed(5))
    order = torch.randperm(12, generator=torch.Generator().manual_seed(5)).tolist()
    assert seen[:2] == [tuple(sorted(order[0::2])), tuple(sorted(order[1::2]))]
