"""Asynchronous loop: generation at most K weight versions ahead of training, every token's age measured."""

from __future__ import annotations

import json
import threading
import time

import torch

from rollwise.run.async_loop import _Weights
from rollwise.run.sync import run_sync
from rollwise.store.writer import RolloutStore
from tests.control.test_in_sync_loop import tiny_cfg


def test_weights_gate_blocks_the_producer_until_training_catches_up():
    w = _Weights(0)
    assert w.wait_for(0) == (0, None)
    got = []
    t = threading.Thread(target=lambda: got.append(w.wait_for(2)))
    t.start()
    time.sleep(0.05)
    w.publish(1, {"a": 1})
    time.sleep(0.05)
    assert got == []  # version 1 < 2: still blocked
    w.publish(2, {"a": 2})
    t.join(1)
    assert got == [(2, {"a": 2})]
    t = threading.Thread(target=lambda: got.append(w.wait_for(9)))
    t.start()
    w.close()
    t.join(1)
    assert got[-1] is None and not t.is_alive()


def test_async_run_keeps_staleness_within_k(tmp_path_factory):
    torch.set_num_threads(1)
    cache = tmp_path_factory.getbasetemp() / "control-warmup-cache"
    out = tmp_path_factory.mktemp("async")
    cfg = tiny_cfg(out, cache, "control.async_staleness=1", "algo.tis_cap=2.0", "train.steps=4")
    summary = run_sync(cfg, log=lambda s: None)  # dispatches to run_async
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
