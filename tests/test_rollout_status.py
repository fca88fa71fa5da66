"""The one place a rollout's status is decided (`types.rollout_status` / `make_rollout`)."""

from __future__ import annotations

import pytest

from rollwise.types import Score, Task, make_rollout, rollout_status

OK, BAD = Score(1.0, parts={"correct": 1.0}), Score(0.0, error="verifier crashed")


@pytest.mark.parametrize("finish, score, status", [
    ("stop", OK, "kept"), ("length", OK, "truncated"), ("max_turns", OK, "truncated"),
    ("stop", BAD, "errored"), ("length", BAD, "errored"), ("abort", BAD, "errored"),  # an env failure ended it
    ("abort", None, "aborted"),
])
def test_status_rules(finish, score, status):
    assert rollout_status(finish, score, 16)[0] == status


def test_a_finished_unscored_sample_is_a_bug_not_a_zero():
    with pytest.raises(RuntimeError, match="never scored"):
        rollout_status("stop", None)


def test_make_rollout_never_invents_a_reward():
    t = Task("t", "1+1=", 2)
    common = dict(token_ids=[5, 6], logprobs=[-0.1, -0.2], weight_versions=[3, 3], text="2", step=4, seed=9)
    r = make_rollout(t, "g", 0, [1, 2], finish_reason="stop", score=BAD, **common)
    assert r.status == "errored" and r.reward is None and r.status_reason == "verifier crashed"
    r = make_rollout(t, "g", 1, [1, 2], finish_reason="abort", score=None, **common)
    assert r.status == "aborted" and r.reward is None and r.reward_parts == {}
    r = make_rollout(t, "g", 2, [1, 2], finish_reason="length", score=OK, max_tokens=2, timings={"generate_s": 0.5},
                     **common)
    assert (r.status, r.reward, r.status_reason, r.loss_mask, r.timings) == (
        "truncated", 1.0, "hit max_tokens=2", [1, 1], {"generate_s": 0.5})
