"""Policies run inside the loop on the tiny model: statuses, books and staleness reach the metrics."""

from __future__ import annotations

import json

import pytest
import torch

from rollwise.run.loop import train
from rollwise.store.writer import RolloutStore


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("policy", ["partial", "adaptive", "dynamic", "early_stop", "knapsack"])
def test_policy_runs_inside_the_loop(tmp_path_factory, run_cfg, policy):
    out = tmp_path_factory.mktemp(policy)
    extra = {"partial": ["control.over_provision=1.0", "algo.tis_cap=2.0"], "adaptive": ["control.select=posterior"],
             "dynamic": ["control.max_rounds=2"], "early_stop": ["control.confidence=0.6"],
             "knapsack": ["control.select=posterior", "control.oversample=2.0"]}[policy]
    summary = train(run_cfg(out, f"control.policy={policy}", *extra), log=lambda s: None)
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    for m in lines:
        for key in ("control_generated_tokens", "control_zero_var_frac", "control_tokens_per_useful_group",
                    "control_idle_s", "staleness_mean", "staleness_max"):
            assert key in m, key
        assert m["control_generated_tokens"] == m["gen_tokens"]
        # the in-process engine reports when each sample ends: the generate phase's tail and its split (control/tail.py)
        assert 0.0 <= m["time_tail_s"] <= m["time_generate_s"] and 0.0 <= m["tail_frac"] <= 1.0
        assert m["time_gen_useful_s"] + m["time_gen_filtered_s"] + m["time_tail_s"] == pytest.approx(m["time_generate_s"])
    assert 'data-plot="time_tail"' in (out / "report.html").read_text()  # the report stacks it per step
    rows = RolloutStore(out).read()
    c = summary["rollouts"]
    assert c["total"] == len(rows) == sum(c[s] for s in ("kept", "filtered", "errored", "truncated", "aborted"))
    assert all(len(r.weight_versions) == len(r.completion_token_ids) for r in rows)
    if policy == "partial":
        # Stopping at the target leaves samples in flight; those finished later carry older weight versions.
        assert sum(m["control_carried_out_tokens"] for m in lines) > 0
        assert [m["weight_version"] for m in lines] == [1, 2, 3]
        assert max(m["staleness_max"] for m in lines) >= 1  # resumed under newer weights than started them
        assert len({r.group_id for r in rows}) == len(rows) // 4
    elif policy == "adaptive":
        assert {len(r) for r in _groups(rows).values()} <= {2, 4}
    elif policy == "knapsack":  # groups of any even size up to 2K, trained and stored as they are
        sizes = {len(r) for r in _groups(rows).values()}
        assert sizes <= set(range(2, 9, 2)) and sum(m["control_groups"] for m in lines) == len(_groups(rows))
    elif policy == "early_stop":  # aborted samples are stored with their status, never trained
        assert sum(r.status == "aborted" for r in rows) > 0 and all(r.reward is None for r in rows if r.status == "aborted")
        assert sum(m["control_aborted_tokens"] for m in lines) == sum(
            len(r.completion_token_ids) for r in rows if r.status == "aborted")


def _groups(rows):
    out: dict[str, list] = {}
    for r in rows:
        out.setdefault(r.group_id, []).append(r)
    return out
