from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from rollwise.store.card import (
    ACCURACY_METHOD_DEFAULT,
    build_rollout_card,
    checkpoint_hashes,
    normalise_counts,
    package_versions,
)
from rollwise.store.writer import RolloutStore


@pytest.fixture
def checkpoint(tmp_path):
    d = tmp_path / "checkpoints" / "step-2"
    d.mkdir(parents=True)
    save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(d / "model.safetensors"))
    (d / "config.json").write_text("{}")
    return d


def test_card_from_store(tmp_path, checkpoint, rollout_factory):
    store = RolloutStore(tmp_path)
    store.write_step(0, [rollout_factory(sample=0), rollout_factory(sample=1, status="errored")])
    store.write_step(1, [rollout_factory(step=1, status="truncated"), rollout_factory(step=1, sample=1, status="aborted")])
    card = build_rollout_card(
        store.counts_by_status(),
        config_hash="3f9a0c1d2e4b5a69",
        seeds={"run": 0, "sampling": 1},
        accuracy_method=ACCURACY_METHOD_DEFAULT,
        checkpoints=[checkpoint],
    )
    assert card["rollouts"] == {"total": 4, "kept": 1, "filtered": 0, "errored": 1, "truncated": 1, "aborted": 1}
    assert card["seeds"] == {"run": 0, "sampling": 1} and card["config_hash"] == "3f9a0c1d2e4b5a69"
    assert "errored" in card["accuracy_method"]
    expected = hashlib.sha256((checkpoint / "model.safetensors").read_bytes()).hexdigest()
    assert card["checkpoints"] == {"step-2": {"model.safetensors": expected}}
    assert card["versions"]["rollwise"] == "0.1.0" and card["versions"]["torch"] and card["versions"]["python"]
    assert card["rollout_schema_version"] == 1
    assert json.loads(json.dumps(card)) == card  # JSON-ready as it is
    # Its keys do not clash with the rest of summary.json.
    assert not set(card) & {"eval_before", "eval_after", "steps", "wall_s"}


def test_counts_are_checked():
    assert normalise_counts({"kept": 3}) == {"total": 3, "kept": 3, "filtered": 0, "errored": 0, "truncated": 0, "aborted": 0}
    with pytest.raises(ValueError, match="total=5 but the statuses add up to 3"):
        normalise_counts({"total": 5, "kept": 3})
    with pytest.raises(ValueError, match="unknown status"):
        normalise_counts({"ok": 1})


def test_checkpoint_hash_errors(tmp_path, checkpoint):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        checkpoint_hashes(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        checkpoint_hashes(empty)
    assert list(checkpoint_hashes(checkpoint / "model.safetensors")) == ["model.safetensors"]


def test_labelled_checkpoints_and_seed_list(checkpoint):
    card = build_rollout_card({"kept": 1}, config_hash="abc", seeds=[3, 4], accuracy_method="x", checkpoints={"final": checkpoint})
    assert list(card["checkpoints"]) == ["final"] and card["seeds"] == [3, 4]
    with pytest.raises(ValueError, match="accuracy_method"):
        build_rollout_card({"kept": 1}, config_hash="abc", seeds=[], accuracy_method=" ")


def test_package_versions_do_not_need_the_package():
    v = package_versions(["definitely-not-installed-pkg"])
    assert v["definitely-not-installed-pkg"] is None and "python" in v
