"""A run saved by an older rollwise resumes under a newer one: keys added since are at defaults that compute what the
older version did, so they are no difference; a key the user set away from its default still is."""

from __future__ import annotations

from rollwise.config import RunConfig
from rollwise.run.resume import config_diffs


def _older(dump: dict) -> dict:
    """The dump as a version without the algo.correction section (and without env.chat_template_kwargs) wrote it."""
    old = {k: dict(v) if isinstance(v, dict) else v for k, v in dump.items()}
    old["algo"].pop("correction")
    old["env"].pop("chat_template_kwargs")
    return old


def test_keys_added_since_the_run_was_saved_are_no_difference_at_their_defaults():
    now = RunConfig().model_dump(mode="json")
    assert config_diffs(_older(now), now) == []


def test_a_key_added_since_the_run_was_saved_is_a_difference_when_set():
    now = RunConfig.model_validate({"algo": {"correction": {"mode": "token_mask", "high": 2.0}}}).model_dump(mode="json")
    diffs = config_diffs(_older(RunConfig().model_dump(mode="json")), now)
    assert diffs and all(d.startswith("algo.correction.") for d in diffs)
    assert any(d.startswith("algo.correction.mode: null -> \"token_mask\"") for d in diffs)


def test_a_key_the_saved_run_had_is_still_compared():
    saved = RunConfig().model_dump(mode="json")
    now = RunConfig.model_validate({"train": {"lr": 3e-4}}).model_dump(mode="json")
    assert [d.split(":")[0] for d in config_diffs(saved, now)] == ["train.lr"]
