"""Synthetic rollouts for trainer tests (a helper module, not a test module: test modules never import each other)."""

from __future__ import annotations

import random

import torch

from rollwise.types import Rollout


def make_rollouts(n=6, seed=0, vocab=64, env_tokens=True):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, c = rng.randint(1, 7), rng.randint(1, 9)
        mask = [1] * c
        if env_tokens and c > 3 and i % 2:
            mask[2] = 0  # an environment token inside the completion
        out.append(Rollout(prompt_id=f"p{i // 2}", group_id=f"g{i // 2}", sample_index=i % 2,
                           prompt_token_ids=[rng.randrange(4, vocab) for _ in range(p)],
                           completion_token_ids=[rng.randrange(4, vocab) for _ in range(c)],
                           logprobs=[-rng.uniform(2.0, 6.0) for _ in range(c)], weight_versions=[0] * c,
                           loss_mask=mask, advantage=rng.uniform(-1, 1)))
    return out


def _groups(spec, vocab=64, seed=0):
    """spec: [(prompt_len, [completion lengths])] -> rollouts, samples of a group sharing the prompt ids."""
    g = torch.Generator().manual_seed(seed)
    ros = []
    for gi, (p, comps) in enumerate(spec):
        prompt = torch.randint(3, vocab, (p,), generator=g).tolist()
        for k, c in enumerate(comps):
            comp = torch.randint(3, vocab, (c,), generator=g).tolist()
            ros.append(Rollout(prompt_id=str(gi), group_id=str(gi), sample_index=k, prompt_token_ids=prompt,
                               completion_token_ids=comp, logprobs=[-1.0] * c, weight_versions=[0] * c,
                               loss_mask=[1] * c, advantage=float(k) - 1.0))
    return ros


SPEC = [(5, [3, 0, 6, 1]), (2, [4, 4]), (7, [2]), (3, [5, 1, 2])]
