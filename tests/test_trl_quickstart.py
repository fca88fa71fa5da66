"""The TRL quick-start recipe (recipes/trl_quickstart.py), short: a TRL-shaped script runs on rollwise with only its
import changed, on the real model, and reports TRL's metric names. (The full recipe's learning is in docs/trl.md.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "trl_quickstart.py"


def _recipe():
    spec = importlib.util.spec_from_file_location("trl_quickstart", RECIPE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_recipe_is_a_trl_script_but_for_its_import():
    text = RECIPE.read_text()
    assert "from rollwise.trl import GRPOConfig, GRPOTrainer" in text
    rollwise_lines = [line for line in text.splitlines() if "rollwise" in line and line.startswith(("from ", "import "))]
    assert rollwise_lines == ["from rollwise.trl import GRPOConfig, GRPOTrainer  # with TRL: from trl import GRPOConfig, "
                              "GRPOTrainer"]


@pytest.mark.slow
def test_the_quick_start_runs_two_steps_on_smollm2(tmp_path, smollm2_dir):
    trainer = _recipe().main(max_steps=2, output_dir=str(tmp_path / "run"), eval_size=4, batch_size=16)
    r = trainer.result
    assert r.steps == 2 and r.accuracy_after_greedy is not None
    hist = trainer.state.log_history
    assert [h["step"] for h in hist[:2]] == [1, 2]
    assert {"reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "loss"} <= set(hist[0])
    assert (tmp_path / "run" / "config.json").is_file()  # save_model: the trained model in HF format
