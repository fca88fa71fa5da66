"""The loop with a low-precision engine (model.dtype bfloat16 / int8) and the float32 trainer: it runs, TIS is on by
default, the behaviour log-probs are the engine's, and the engine-vs-trainer gap is logged per step."""

from __future__ import annotations

import json

import pytest

from rollwise.config import LOW_PRECISION_TIS_CAP
from rollwise.run.loop import train


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_low_precision_engine_trains_with_tis_and_logs_the_gap(dtype, tmp_path, run_cfg):
    out = tmp_path / "run"
    cfg = run_cfg(out, "train.steps=2", f"model.dtype={dtype}")
    assert cfg.algo.tis_cap == LOW_PRECISION_TIS_CAP
    train(cfg, log=lambda s: None)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    trained = [m for m in lines if "logprob_mismatch_max" in m]
    assert trained, "no step trained"
    for m in trained:
        # a low-precision sampler: a gap above float32 noise, and well below a broken sync's
        assert 1e-5 < m["logprob_mismatch_max"] < 2.0
        assert "tis_clip_frac" in m
