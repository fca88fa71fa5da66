"""Asynchronous loop: generation at most K weight versions ahead of training, every token's age measured."""

from __future__ import annotations

import json
import time

import torch

from rollwise.run.loop import train
from rollwise.run.sources import AsyncSource, StepBatch
from rollwise.store.writer import RolloutStore


class _Maker:
    """Stands in for the controller: records which weight version the engine had when each step was made."""

    def __init__(self, engine):
        self.engine = engine
        self.made = []

    def make(self, step):
        self.made.append((step, self.engine.weight_version))
        return StepBatch(step, None, {})


class _Engine:
    def __init__(self):
        self.weight_version = 0
        self.loaded = []

    def load_weights(self, state, version):
        self.loaded.append((state["w"], version))
        self.weight_version = version


def test_async_source_stays_within_k_versions_and_loads_the_newest_weights():
    eng = _Engine()
    src = AsyncSource(_Maker(eng), 1, 1, 4, 0)
    src.maker.engine = eng
    src.engine = eng
    assert src.next_batch(1).step == 1
    time.sleep(0.1)
    assert [s for s, _ in src.maker.made] == [1, 2]  # step 2 needs version >= 0: made ahead, step 3 is not
    weights = {"w": torch.ones(2)}
    src.sync(weights, 1)
    weights["w"].add_(5)  # the trainer's next update must not reach the published copy
    assert src.next_batch(2).step == 2
    assert src.next_batch(3).step == 3
    assert [v for _, v in eng.loaded] == [1]  # loaded once, as version 1, by the producer
    assert torch.equal(eng.loaded[0][0], torch.ones(2))  # the published copy, not the trainer's live tensor
    assert dict(src.maker.made)[3] == 1  # step 3 was generated with version 1 (<= K=1 behind the trainer's 2)
    with src.exclusive() as e:  # evaluation between steps gets the engine at the newest weights
        assert e.weight_version == 1
    src.close()


def test_async_run_keeps_staleness_within_k(tmp_path_factory, run_cfg):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("async")
    cfg = run_cfg(out, "control.async_staleness=1", "algo.tis_cap=2.0", "train.steps=4")
    summary = train(cfg, log=lambda s: None)
    assert summary["async_staleness"] == 1
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4] and [m["weight_version"] for m in lines] == [1, 2, 3, 4]
    for m in lines:
        assert 0 <= m["staleness_max"] <= 1 and m["control_generated_tokens"] == m["gen_tokens"]
    rows = RolloutStore(out).read()
    c = summary["rollouts"]
    assert c["total"] == len(rows) == 4 * 4 * 4
    for r in rows:  # batch s is sampled by a version in [s-1-K, s-1]
        assert all(r.step - 2 <= v <= r.step - 1 for v in r.weight_versions)
