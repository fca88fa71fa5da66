"""Hand-made rollouts for the store tests."""

from __future__ import annotations

import pytest

from rollwise.types import Rollout


def make_rollout(step: int = 0, group: int = 0, sample: int = 0, n_tokens: int = 5, **kw) -> Rollout:
    base = dict(
        prompt_id=f"p{group}",
        group_id=f"s{step}-g{group}",
        sample_index=sample,
        prompt_token_ids=[1, 2, 3 + group],
        completion_token_ids=[10 + i for i in range(n_tokens)],
        logprobs=[-0.1 * (i + 1) for i in range(n_tokens)],
        weight_versions=[step] * n_tokens,
        loss_mask=[1] * n_tokens,
        text="abc",
        finish_reason="stop",
        reward=float(sample % 2),
        reward_parts={"correct": float(sample % 2)},
        advantage=0.5 - (sample % 2),
        status="kept",
        timings={"generate_s": 0.01},
        env_info={"turns": 1},
        seed=1234 + sample,
        step=step,
    )
    base.update(kw)
    return Rollout(**base)


@pytest.fixture
def rollouts_for():
    def make(step: int, groups: int = 2, samples: int = 3) -> list[Rollout]:
        return [make_rollout(step, g, s) for g in range(groups) for s in range(samples)]

    return make


@pytest.fixture
def rollout_factory():
    return make_rollout
