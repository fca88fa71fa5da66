"""The loop with an engine whose behaviour log-probs are deliberately wrong (Gaussian noise on every recorded
log-prob, the gap a broken kernel or sync would leave, made large): a masking correction logs the share it masks
every step, and the run still learns."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

import rollwise.run.setup as setup_mod

RL_IMPROVES = Path(__file__).with_name("test_rl_improves.py")


class NoisyLogprobs:
    """An engine that hands back its samples with N(0, sigma) added to each token's behaviour log-prob. Only the
    batch `generate` is offered (no step-level core), so every rollout goes through the noise."""

    _HIDDEN = frozenset({"engine", "add_request", "step", "has_unfinished", "stepwise"})

    def __init__(self, inner: Any, sigma: float, seed: int = 0) -> None:
        self.inner = inner
        self.sigma = sigma
        self.rng = random.Random(seed)

    def __getattr__(self, name: str) -> Any:
        if name in NoisyLogprobs._HIDDEN or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def generate(self, prompts: Any, sampling_params: Any = None, **kw: Any) -> Any:
        outs = self.inner.generate(prompts, sampling_params, **kw)
        for o in outs:
            for c in o.outputs:
                c.logprobs = [lp + self.rng.gauss(0.0, self.sigma) for lp in c.logprobs]
        return outs


@pytest.fixture
def noisy_engine(monkeypatch):
    made: list[NoisyLogprobs] = []
    real = setup_mod.make_engine

    def make(*args: Any, **kw: Any) -> NoisyLogprobs:
        made.append(NoisyLogprobs(real(*args, **kw), sigma=0.4))
        return made[-1]

    monkeypatch.setattr(setup_mod, "make_engine", make)
    return made


def _lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def echo_cfg(tmp_path_factory):
    """`echo_cfg(out, *overrides)`: test_rl_improves' echo task and settings (the warm-up shared by this module)."""
    from rollwise.config import load_config

    cache = tmp_path_factory.mktemp("echo-warmup")

    def make(out: Path, *extra: str):
        return load_config(None, [
            f"run.out_dir={out}", f"env.name={RL_IMPROVES}:EchoEnv", "env.eval_size=100",
            "model.builtin.hidden_size=64", "model.builtin.num_layers=2", "model.builtin.intermediate_size=128",
            "warmup.steps=150", "warmup.seconds=300", f"warmup.cache_dir={cache}",
            "rollout.prompts_per_step=8", "rollout.samples_per_prompt=8", "rollout.max_tokens=5",
            "train.steps=30", "train.lr=3e-4", "train.micro_batch_tokens=512", "train.seed=0",
            "model.device=cpu", "run.cpu_threads=1", "run.loggers=[jsonl]", *extra,
        ])

    return make


def test_sequence_mask_logs_masked_sequences(tmp_path, echo_cfg, noisy_engine):
    from rollwise.run.loop import train

    out = tmp_path / "run"
    # about 4 tokens of N(0, 0.4) noise: the product ratio's log is N(0, ~0.8), so [1/2, 2] masks about a third
    train(echo_cfg(out, "train.steps=3", "env.eval_size=8", "algo.correction.mode=sequence_mask",
                   "algo.correction.low=0.5", "algo.correction.high=2"), log=lambda s: None)
    assert noisy_engine, "the loop did not build its engine through setup.make_engine"
    trained = [m for m in _lines(out) if "logprob_mismatch_mean" in m]
    assert trained
    for m in trained:
        assert m["logprob_mismatch_mean"] > 0.1  # the noise is what the trainer sees
        assert 0 < m["masked_seq_frac"] < 1 and 0 < m["masked_token_frac"] < 1, m
        assert "tis_clip_frac" not in m


def test_perturbed_engine_with_icepop_still_learns(tmp_path, echo_cfg, noisy_engine):
    """The echo task of test_rl_improves behind an engine with noisy log-probs: IcePop masks the tokens whose ratio
    leaves [0.5, 2] and the held-out accuracy still rises."""
    from rollwise.run.loop import train

    out = tmp_path / "run"
    summary = train(echo_cfg(out, "algo.correction.mode=icepop", "algo.correction.high=2"), log=lambda s: None)
    before, after = summary["eval_before"], summary["eval_after"]
    trained = [m for m in _lines(out) if "masked_token_frac" in m]
    assert len(trained) >= 20
    shares = [m["masked_token_frac"] for m in trained]
    # P(|N(0, 0.4)| > ln 2) is 8%: every step masks some tokens, never most
    assert all(0 < s < 0.3 for s in shares), shares
    assert after["accuracy"] >= before["accuracy"] + 0.2, (before, after)
