"""The long-tail recipe's data (recipes/make_longtail_data.py) and config: right answers, a clean split, the prefix
property its calibration relies on, and prompts the dataset environment scores with the recipe's reward."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gen = _load("make_longtail_data", REPO / "recipes" / "make_longtail_data.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("longtail")
    subprocess.run([sys.executable, str(REPO / "recipes" / "make_longtail_data.py"), "--out", str(out)], check=True,
                   capture_output=True)
    return out


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_the_data_is_deterministic_split_and_right(data, tmp_path):
    train, test = _rows(data / "longtail-train.jsonl"), _rows(data / "longtail-test.jsonl")
    assert (len(train), len(test)) == (64, 100)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert len({r["question"] for r in train}) == 64
    assert {r["ops"] for r in test} == set(range(1, 7))
    for r in train + test:
        assert r["prompt"][-1] == {"role": "user", "content": r["question"]} and len(r["prompt"]) == 5
        lines = r["solution"].splitlines()
        assert len(lines) == r["ops"] + 1 and lines[-1] == f"The result is {r['answer']}."
        values = [int(x.split(" = ")[1].rstrip(".")) for x in lines[:-1]]
        assert all(0 <= v <= gen.MAX_VALUE for v in values) and values[-1] == r["answer"]
    subprocess.run([sys.executable, str(REPO / "recipes" / "make_longtail_data.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    assert (tmp_path / "longtail-test.jsonl").read_text() == (data / "longtail-test.jsonl").read_text()


def test_a_test_set_of_any_mix_is_a_prefix_of_each_kinds_sequence():
    """The calibration evaluates each kind's sequence once and reads any mix's accuracy off it."""
    for mix, large in (("1:3,2:3,3:2,4:1,5:1,6:1", 0.25), ("1:1,2:1,3:1,4:1,5:1,6:1", 0.5)):
        q = gen.quotas(100, gen.parse_mix(mix), large)
        assert sum(q.values()) == 100
        rows = gen.draw(100, gen.parse_mix(mix), large, True, 0, 2)
        for (k, size), n in q.items():
            seq = gen.kind_sequence(k, size, True, 0, 40, 2)
            assert {r["question"] for r in rows if r["kind"] == f"ops{k}-{size}"} == {r["question"] for r in seq[:n]}


def test_the_recipe_scores_its_own_worked_solutions_right(data):
    from rollwise.config import load_config
    from rollwise.envs.build import make_env

    cfg = load_config(REPO / "recipes" / "smollm2-longtail.yaml")
    assert cfg.rollout.max_tokens >= 256 and cfg.env.kwargs["prompt_key"] == "prompt"
    kw = {**cfg.env.kwargs, "path": str(data / "longtail-train.jsonl"), "test_path": str(data / "longtail-test.jsonl")}
    env = make_env("dataset", kw, reward=str(REPO / "recipes" / "addition_reward.py") + ":sum_correct")
    tasks = env.load("test")
    assert len(tasks) == 100 and isinstance(tasks[0].prompt, list)
    scores = env.score_batch(tasks, [t.metadata["solution"] for t in tasks])
    assert [s.value for s in scores] == [1.0] * 100
    wrong = env.score_batch(tasks[:3], [f"The result is {t.metadata['answer'] + 1}." for t in tasks[:3]])
    assert [s.value for s in wrong] == [0.0] * 3


def test_the_bench_counts_informative_groups_over_steps_only():
    """The benches' `signal` (bench/time_to_accuracy.py, used by bench/longtail.py): groups with reward variance are the ones that carry a gradient; an evaluation
    row (no step_s) adds nothing, and a run without the control keys counts zero rather than failing."""
    bench = _load("time_to_accuracy", REPO / "bench" / "time_to_accuracy.py")
    rows = [{"step": 1, "step_s": 2.0, "control_groups": 8, "control_zero_variance_groups": 6,
             "control_skipped_prompts": 1},
            {"step": 2, "step_s": 3.0, "control_groups": 7, "control_zero_variance_groups": 7},
            {"step": 2, "eval_accuracy_greedy": 0.3, "control_groups": 100}]
    assert bench.signal(rows) == {"groups": 15, "informative_groups": 2, "skipped_prompts": 1}
    assert bench.signal([{"step": 1, "step_s": 1.0}]) == {"groups": 0, "informative_groups": 0, "skipped_prompts": 0}
