"""A weight sync must be proven by log-probs: the check passes when the engine has the trainer's weights, and
stops the run with one line when a sync silently did nothing or the engine samples another distribution."""

from __future__ import annotations

import json

import pytest
import torch

from rollwise import LLM
from rollwise.config import TrainConfig
from rollwise.run.loop import train
from rollwise.run.sync_check import SyncCheck, WeightSyncError, probe_pool
from rollwise.train.trainer import Trainer
from rollwise.types import SamplingParams


class _Handle:
    """The trainer as the loop's handle sees it (version + probe)."""

    def __init__(self, tr: Trainer) -> None:
        self.tr, self.version = tr, 0

    def probe_logprobs(self, prompts):
        return self.tr.probe_logprobs(prompts).numpy()


PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]


def _params(temperature: float) -> SamplingParams:
    return SamplingParams(n=4, temperature=temperature, max_tokens=3, seed=11)


def test_check_passes_on_equal_weights_and_catches_a_sync_that_did_nothing(tiny_model):
    tr = Trainer(tiny_model, TrainConfig(), temperature=0.8)
    h = _Handle(tr)
    eng = LLM(tiny_model, block_size=4, max_model_len=64)
    chk = SyncCheck(PROMPTS, tol=1e-3)
    assert chk.verify(eng, chk.reference(h, _params(0.8)), first=True) < 1e-4
    with torch.no_grad():  # an update the size of a few RL steps
        for p in tr.model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    h.version = 1
    ref = chk.reference(h, _params(0.8))
    with pytest.raises(WeightSyncError, match=r"weight sync to version 1 did not land on the engine: its log-probs "
                                              r"are .* from the trainer's \(tolerance 0.001"):
        chk.verify(eng, ref)  # the engine was never sent the new weights
    eng.load_weights(tr.state_dict_for_sync(), 1)
    assert chk.verify(eng, ref) < 1e-4 and chk.last_diff < 1e-4


def test_engine_reporting_raw_logprobs_is_refused_at_start(tiny_model):
    # vLLM's default logprobs mode reports log_softmax(logits), not the T=0.7 distribution actually sampled.
    tr = Trainer(tiny_model, TrainConfig(), temperature=0.7)
    eng = LLM(tiny_model, block_size=4, max_model_len=64, logprobs_mode="raw")
    chk = SyncCheck(PROMPTS, engine_name="http://gpu-node:8000")
    with pytest.raises(WeightSyncError, match="http://gpu-node:8000 does not sample from the trainer's distribution "
                                              "at the start .* --logprobs-mode processed_logprobs"):
        chk.verify(eng, chk.reference(_Handle(tr), _params(0.7)), first=True)


def test_probe_pool_is_distinct_whole_real_prompts():
    assert probe_pool([[1, 2], [1, 2], [3], [], [4, 5, 6]], size=2) == [[1, 2], [3]]
    assert probe_pool([list(range(400))]) == [list(range(400))]  # whole: a cut prompt would give the probe away


def test_run_with_the_check_on_logs_the_gap_and_stops_on_a_silent_sync(run_cfg, tmp_path, monkeypatch):
    out = tmp_path / "ok"
    train(run_cfg(out, "train.steps=2", "engine.sync_check=true"), log=lambda s: None)
    gaps = [json.loads(l)["sync_logprob_gap"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(gaps) == 2 and max(gaps) < 1e-3

    def silent(self, state, version=None):  # answers like a load, changes nothing: the field's worst sync bug
        self.engine.weight_version = version
        return version

    step = Trainer.train_step

    def moving(self, *a, **k):  # every update moves the weights (the tiny task may give zero advantages)
        m = step(self, *a, **k)
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        return m

    monkeypatch.setattr(Trainer, "train_step", moving)
    monkeypatch.setattr(LLM, "load_weights", silent)
    bad = tmp_path / "silent"
    with pytest.raises(WeightSyncError, match="weight sync to version 1 did not land"):
        train(run_cfg(bad, "train.steps=2", "engine.sync_check=true"), log=lambda s: None)
