"""AdamW is fused where torch can run it, and takes the same steps as torch's default implementation."""

from __future__ import annotations

import torch

from rollwise.train.optim import adamw, fused_ok


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n, generator=g)) for n in (7, 300, 4096)]


def test_fused_where_it_can_run() -> None:
    assert fused_ok(_params(0))
    assert adamw(_params(0), lr=1e-3).defaults["fused"] is True
    assert not fused_ok([])
    assert not fused_ok([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))])
    assert not fused_ok([torch.nn.Parameter(torch.zeros(3, device="meta"))])
    assert adamw([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))], lr=1e-3).defaults["fused"] is None


def test_fused_steps_equal_the_default_implementation() -> None:
    a, b = _params(1), _params(1)
    opt_a = adamw(a, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99))
    opt_b = torch.optim.AdamW(b, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99), foreach=False)
    g = torch.Generator().manual_seed(2)
    for _ in range(5):
        for pa, pb in zip(a, b):
            grad = torch.randn(pa.shape, generator=g)
            pa.grad, pb.grad = grad.clone(), grad.clone()
        opt_a.step()
        opt_b.step()
    for pa, pb, p0 in zip(a, b, _params(1)):
        assert (pa.detach() - p0.detach()).abs().max() > 1e-3  # the steps moved the weights
        torch.testing.assert_close(pa.detach(), pb.detach(), rtol=1e-5, atol=1e-6)
    assert opt_a.state_dict()["state"].keys() == opt_b.state_dict()["state"].keys()
