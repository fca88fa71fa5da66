"""In a real (tiny) run: an environment whose scorer raises on some outputs gets no free pass. Errored rollouts
are counted, stored as errored, and (algo.errored_reward default 0.0) enter their group's advantages as wrong
answers; and env.pass_threshold reaches replay's rescue, so a graded reward's successes can rescue a group."""

from __future__ import annotations

import json

from rollwise.envs import register_env
from rollwise.envs.arithmetic import ArithmeticEnv
from rollwise.run.loop import train
from rollwise.store import replay as replay_mod
from rollwise.store.writer import RolloutStore
from rollwise.types import Score


class _FragileGraded(ArithmeticEnv):
    """Reward 0.6 for an even-length completion, 0 for odd; the scorer raises on a length divisible by 3."""

    def score(self, task, completion):
        if len(completion) % 3 == 0:
            raise ValueError("cannot parse this output")
        ok = 0.6 if len(completion) % 2 == 0 else 0.0
        return Score(ok, parts={"correct": ok})


def test_errored_rollouts_count_as_wrong_and_pass_threshold_reaches_rescue(tmp_path, run_cfg, monkeypatch):
    seen = []

    class Recording(replay_mod.ReplayBuffer):
        def __init__(self, config=None):
            seen.append(config)
            super().__init__(config)

    monkeypatch.setattr(replay_mod, "ReplayBuffer", Recording)
    register_env("fragile_graded_test", _FragileGraded, overwrite=True)
    out = tmp_path / "run"
    train(run_cfg(out, "env.name=fragile_graded_test", "env.pass_threshold=0.5", "replay.enabled=true",
                  "train.steps=2", "train.lr=1e-3"), log=lambda s: None)
    assert seen and seen[0].success_threshold == 0.5  # was 1.0 whatever env.pass_threshold said
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(m["score_errors"] for m in lines) > 0
    rows = RolloutStore(out).read()
    errored = [r for r in rows if r.status == "errored"]
    assert errored and all(r.reward is None and "cannot parse" in r.status_reason for r in errored)
    # In a group that also has a success, the errored sample's advantage is a wrong answer's: negative.
    by_group = {}
    for r in rows:
        by_group.setdefault((r.step, r.group_id), []).append(r)
    mixed = [r for g in by_group.values() if any((x.reward or 0) > 0 for x in g) for r in g if r.status == "errored"]
    assert mixed and all(r.advantage is not None and r.advantage < 0 for r in mixed)
