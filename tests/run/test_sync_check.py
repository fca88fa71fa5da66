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


def test_only_rollouts_made_at_the_trainers_version_are_held_to_its_log_probs(tiny_model):
    """An older rollout (async, replayed) may differ from the trainer by design; one made at its version may not."""
    from rollwise.train.batch import TrainBatch
    from rollwise.train.losses import LOSSES, LossConfig
    from rollwise.types import Rollout

    eng = LLM(tiny_model, block_size=4, max_model_len=64)
    tr = Trainer(tiny_model, TrainConfig(lr=1e-6), temperature=1.0)
    outs = eng.generate([PROMPTS[0]], SamplingParams(n=4, max_tokens=5, seed=3, ignore_eos=True))[0].outputs
    rs = []
    for j, o in enumerate(outs):
        old = j >= 2  # samples 2 and 3: an older version's rollouts, whose log-probs are far from today's weights
        rs.append(Rollout("p", "g", j, PROMPTS[0], o.token_ids, [-0.01] * 5 if old else o.logprobs,
                          [4 if old else 5] * 5, [1] * 5, reward=float(j % 2), advantage=1.0 - 2 * (j % 2)))
    m = tr.train_step(TrainBatch.from_rollouts(rs, 4096), LOSSES["grpo"], LossConfig(), fresh_version=5)
    assert m["logprob_diff_seqs"] == 2 and m["logprob_diff_seq_max"] < 1e-4 and m["logprob_diff_max"] > 0.5
    m = tr.train_step(TrainBatch.from_rollouts(rs, 4096), LOSSES["grpo"], LossConfig(), fresh_version=4)
    assert m["logprob_diff_seqs"] == 2 and m["logprob_diff_seq_max"] > 0.5  # now they claim today's version


def test_the_rollout_check_by_backend_and_precision():
    from rollwise.run.sync_check import RolloutMismatch, rollout_check

    assert rollout_check("auto", remote=False, engine_dtype="float32", trainer_bf16=False) is None
    assert rollout_check("off", remote=True, engine_dtype="float32", trainer_bf16=False) is None
    assert rollout_check("auto", remote=True, engine_dtype="float32", trainer_bf16=False).tol == 0.05
    assert rollout_check("auto", remote=True, engine_dtype="bfloat16", trainer_bf16=False).tol == 1.0
    assert rollout_check("auto", remote=True, engine_dtype="float32", trainer_bf16=True).tol == 1.0
    chk = rollout_check(0.2, remote=False, engine_dtype="float32", trainer_bf16=True, engine_name="http://h:1")
    chk.verify(3, {"logprob_diff_seq_max": 0.19, "logprob_diff_seqs": 8})
    chk.verify(3, {"logprob_diff_seq_max": 9.0, "logprob_diff_seqs": 0})  # nothing made at this version
    chk.verify(3, {})  # an empty step
    with pytest.raises(RolloutMismatch, match=r"^the rollouts of step 3 are not the policy's: one of the 8 checked "
                                              r"rollouts is on average 2.95 nats .*http://h:1 made them up"):
        chk.verify(3, {"logprob_diff_seq_max": 2.95, "logprob_diff_seqs": 8})
