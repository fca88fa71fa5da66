"""Chunked LM head + log-softmax (`head_logprobs`): equal to the unchunked computation in values, entropies and
gradients, and the trainer's hidden-state path equal to its full-logits path."""

from __future__ import annotations

import pytest
import torch

from rollwise.config import TrainConfig
from rollwise.train.batch import TrainBatch
from rollwise.train.logprobs import head_logprobs, token_logprobs
from rollwise.train.trainer import Trainer

from .conftest import build_tiny_llama
from .synthetic import SPEC, _groups


@pytest.mark.parametrize("top_p,top_k", [(1.0, -1), (0.7, 5)])
def test_head_logprobs_equal_unchunked_with_grads(top_p, top_k):
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(50, 16, generator=g))
    h = torch.randn(37, 16, generator=g, requires_grad=True)
    tg = torch.randint(0, 50, (37,), generator=g)
    w = torch.randn(37, generator=g)
    # the reference: full [N, V] logits, one log-softmax
    lp_ref, ent_ref = token_logprobs(head(h), tg, 0.7, True, chunk=10_000, top_p=top_p, top_k=top_k)
    (lp_ref * w).sum().backward()
    gh_ref, gw_ref = h.grad.clone(), head.weight.grad.clone()
    h.grad = None
    head.weight.grad = None
    lp, ent = head_logprobs(h, head, tg, 0.7, True, chunk_elems=50 * 4, top_p=top_p, top_k=top_k)  # 4 rows a chunk
    (lp * w).sum().backward()
    assert torch.allclose(lp, lp_ref, atol=1e-6) and torch.allclose(ent, ent_ref, atol=1e-5)
    assert torch.allclose(h.grad, gh_ref, atol=1e-5) and torch.allclose(head.weight.grad, gw_ref, atol=1e-5)


def test_head_logprobs_empty_keeps_graph():
    head = torch.nn.Linear(4, 9)
    h = torch.randn(0, 4, requires_grad=True)
    lp, ent = head_logprobs(h, head, torch.zeros(0, dtype=torch.long), 1.0, True)
    assert lp.shape == (0,) and ent.shape == (0,)
    lp.sum().backward()


def test_chunk_holds_a_bounded_number_of_logit_rows(monkeypatch):
    seen = []
    head = torch.nn.Linear(8, 100, bias=False)
    real = head.forward

    def spy(x):
        seen.append(x.shape[0])
        return real(x)

    monkeypatch.setattr(head, "forward", spy)
    h = torch.randn(25, 8, requires_grad=True)
    lp, _ = head_logprobs(h, head, torch.zeros(25, dtype=torch.long), 1.0, chunk_elems=700)
    lp.sum().backward()
    assert max(seen) == 7 and sum(seen[:4]) == 25  # 7 rows x 100 vocab per chunk; recomputed once in backward
    assert len(seen) == 8


def test_trainer_hidden_path_equals_logits_path(tmp_path):
    path = build_tiny_llama(tmp_path / "m", seed=8, tie=True)
    tr = Trainer(path, TrainConfig(lr=1e-3), device="cpu")
    assert tr.plain_head
    tr.head_chunk_elems = 64 * 3  # 3 rows a chunk
    batch = TrainBatch.from_rollouts(_groups(SPEC, seed=9), 24)
    a, ea = tr.compute_logprobs(batch, with_entropy=True)
    tr.plain_head = False
    b, eb = tr.compute_logprobs(batch, with_entropy=True)
    assert torch.allclose(a, b, atol=1e-5, rtol=0) and torch.allclose(ea, eb, atol=1e-5, rtol=0)
