"""The Python API: `rollwise.train(config, **overrides) -> TrainResult`, with objects where the config takes a string."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import yaml

import rollwise
from rollwise.api import TrainResult, check_picklable
from rollwise.config import ConfigError, build_config, dump_config, load_config, resume_conflicts
from rollwise.in_memory import InMemory, InMemoryDataset


def correct(completions, answer, **kwargs):
    """TRL's convention: 1.0 for the exact answer."""
    return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]


def _rows(n: int, start: int = 0) -> list[dict]:
    return [{"prompt": f"{a}+{a % 7}=", "answer": a + a % 7} for a in range(start + 10, start + 10 + n)]


def _tiny(model_dir, **extra) -> dict:
    """A tiny run as a dict of sections (4 prompts x 4 samples, 3 steps) on the warmed-up tiny model."""
    cfg = {"model": {"path": str(model_dir), "device": "cpu"},
           "rollout": {"prompts_per_step": 4, "samples_per_prompt": 4, "max_tokens": 6},
           "train": {"steps": 3, "lr": 3e-4, "micro_batch_tokens": 512},
           "run": {"loggers": ["jsonl"], "cpu_threads": 1, "eval_samples": 1},
           "algo": {"skip_zero_variance": False}, "env": {"eval_size": 8}}
    for k, v in extra.items():
        cfg.setdefault(k, {}).update(v)
    return cfg


# ------------------------------------------------------------------------------------------------ no run needed


def test_the_facade_is_lazy_and_train_stays_the_trainer_package():
    code = ("import sys, rollwise; assert 'torch' not in sys.modules and 'rollwise.api' not in sys.modules; "
            "import rollwise.train.losses; assert callable(rollwise.train); "
            "assert rollwise.train.losses.__name__ == 'rollwise.train.losses'; "
            "from rollwise import train, TrainResult; assert train is rollwise.train; print(TrainResult.__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "TrainResult"


@pytest.mark.parametrize("overrides, key, near", [
    ({"train": {"lr_rate": 1e-5}}, "train.lr_rate", "train.lr"),
    ({"train.lr_rate": 1e-5}, "train.lr_rate", "train.lr"),
    ({"lr": 1e-5}, "lr", "train.lr"),
    ({"trian": {"lr": 1e-5}}, "trian", "train"),
    ({"rollout": {"temperature": -1}}, "rollout.temperature", None),
    ({"env": {"reward": 3}}, "env.reward", None),
])
def test_overrides_are_checked_like_set_with_one_line(tmp_path, overrides, key, near):
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        rollwise.train(None, out_dir=out, log=lambda s: None, **overrides)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and f"'{key}'" in msg, msg
    if near:
        assert f"did you mean '{near}'" in msg
    assert not out.exists()  # refused before any work


def test_section_dicts_and_dotted_keys_merge_into_the_config():
    cfg = build_config({"train": {"lr": 1e-4, "steps": 5}}, {"train": {"lr": 2e-5}, "rollout.max_tokens": 9})
    assert (cfg.train.lr, cfg.train.steps, cfg.rollout.max_tokens) == (2e-5, 5, 9)
    again = build_config(cfg, {"train.steps": 7})  # a RunConfig, overridden
    assert (again.train.lr, again.train.steps) == (2e-5, 7)
    from rollwise.api import _overrides

    as_file = _overrides({}, "data/train.jsonl", None, "runs/x", None)  # a path stays a path
    assert as_file == {"env.name": "dataset", "env.kwargs.path": "data/train.jsonl", "run.out_dir": "runs/x"}
    for kw in ({"out_dir": "x", "run.out_dir": "y"}, {"out_dir": "x", "run": {"out_dir": "y"}},
               {"train_dataset": _rows(2), "env": {"kwargs": {"path": "a.jsonl"}}}):
        with pytest.raises(ConfigError, match="given twice"):
            rollwise.train(None, **kw)


def test_objects_are_placeholders_in_config_yaml_and_refused_from_yaml(tmp_path):
    rows = _rows(6)
    cfg = build_config({"env": {"name": "dataset", "kwargs": {"path": rows, "test_size": 2}}},
                       {"env": {"reward": correct}})
    assert isinstance(cfg.env.reward, InMemory) and cfg.env.reward.obj is correct
    assert isinstance(cfg.env.kwargs["path"], InMemoryDataset) and cfg.env.kwargs["path"].rows == rows
    text = dump_config(cfg)
    saved = yaml.safe_load(text)  # valid YAML, objects as readable placeholders
    assert saved["env"]["reward"] == f"<in-memory: {__name__}.correct>"
    assert saved["env"]["kwargs"]["path"].startswith("<in-memory dataset: 6 rows, sha256 ")
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "config.yaml", saved_run=True)
    assert len(str(e.value).splitlines()) == 1 and "rollwise.train(" in str(e.value) and "env." in str(e.value)
    with pytest.raises(ConfigError, match="in-memory"):
        load_config(None, [f"env.reward='{saved['env']['reward']}'"])
    # Rows inline in YAML where the dataset env takes a path: only the Python API passes rows.
    (tmp_path / "inline.yaml").write_text(yaml.safe_dump({"env": {"name": "dataset", "kwargs": {"path": rows}}}))
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "inline.yaml")
    assert len(str(e.value).splitlines()) == 1 and "env.kwargs.path must be a file path" in str(e.value)


def test_cli_resume_of_a_run_with_objects_refuses_with_one_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = build_config(None, {"env": {"name": "dataset", "kwargs": {"path": _rows(6), "test_size": 2},
                                      "reward": correct}, "run.out_dir": str(run_dir)})
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    r = subprocess.run([sys.executable, "-m", "rollwise.cli.main", "train", "--resume", str(run_dir)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "env.kwargs.path" in r.stderr and "rollwise.train(" in r.stderr and "resume=True" in r.stderr


def test_api_resume_with_no_config_reads_config_yaml_and_needs_the_objects_again(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = build_config(None, {"env": {"name": "dataset", "kwargs": {"path": _rows(6), "test_size": 2},
                                      "reward": correct}, "run.out_dir": str(run_dir), "train.steps": 7})
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    with pytest.raises(ConfigError) as e:
        rollwise.train(resume=run_dir, env={"reward": correct})  # the rows are missing
    assert len(str(e.value).splitlines()) == 1 and "env.kwargs.path" in str(e.value) and "train_dataset" in str(e.value)
    from rollwise.api import _overrides, _saved_config

    given = _overrides({"env": {"reward": correct}}, _rows(6), None, None, run_dir)
    again = build_config(_saved_config(given), given, saved_run=True)
    assert again.train.steps == 7 and again.run.resume and resume_conflicts(cfg, again) == []


def test_resume_check_compares_placeholders():
    def make():
        def correct(completions, answer, **kwargs):  # another function object, the same name
            return [0.0] * len(completions)
        return correct

    a = build_config(None, {"env": {"name": "dataset", "kwargs": {"path": _rows(6)}, "reward": make()}})
    same = build_config(None, {"env": {"name": "dataset", "kwargs": {"path": _rows(6)}, "reward": make()}})
    other = build_config(None, {"env": {"name": "dataset", "kwargs": {"path": _rows(6, 1)}, "reward": make()}})
    assert resume_conflicts(a, same) == []
    diffs = resume_conflicts(a, other)
    assert len(diffs) == 1 and diffs[0].startswith("env.kwargs.path:") and "sha256" in diffs[0]


def test_bad_objects_fail_with_one_line():
    for overrides, where in [({"env": {"reward": 42}}, "env.reward"),
                             ({"env": {"rewards": [{"fn": "not a spec", "weight": 1.0}, {"fn": 3}]}}, "env.rewards[1]"),
                             ({"env": {"environment": object()}}, "env.environment")]:
        with pytest.raises(ConfigError) as e:
            build_config(None, overrides)
        assert len(str(e.value).splitlines()) == 1 and where in str(e.value), str(e.value)
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(_rows(2))})
    for data, what in [(dd, "ds['train']"), ({"prompt": "1+1="}, "dict"), ([], "no rows"), (42, "int")]:
        with pytest.raises(ValueError) as e:
            rollwise.train(None, train_dataset=data)
        assert len(str(e.value).splitlines()) == 1 and what in str(e.value) and "train_dataset" in str(e.value)


def test_dataset_rows_get_the_file_checks(tmp_path):
    from rollwise.run.setup import make_env

    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(_rows(4))
    as_list = build_config(None, {"env": {"name": "dataset", "kwargs": {"path": _rows(4)}}})
    as_ds = build_config(None, {"env": {"name": "dataset", "kwargs": {"path": ds}}})
    assert as_ds.env.kwargs["path"].rows == _rows(4) and resume_conflicts(as_list, as_ds) == []

    cfg = build_config(None, {"env": {"name": "dataset", "kwargs": {"path": [{"question": "1+1="}]}, "reward": correct}})
    env = make_env(cfg.env)
    with pytest.raises(ValueError) as e:
        env.load("train")
    assert str(e.value).startswith("env.kwargs.path: row 1: no 'prompt' column") and len(str(e.value).splitlines()) == 1
    def conv_correct(completions, answer, **kwargs):  # TRL's conversational form: completions are messages
        return [float(c[-1]["content"].strip() == str(a)) for c, a in zip(completions, answer)]

    conv = [{"prompt": [{"role": "user", "content": "2+2?"}], "answer": 4}]
    env = make_env(build_config(None, {"env": {"name": "dataset", "kwargs": {"path": conv, "test_path": conv},
                                               "reward": conv_correct}}).env)
    t = env.load("train")[0]
    assert t.id == "dataset/train/in-memory:1" and t.prompt == conv[0]["prompt"] and t.answer == 4
    assert env.score_batch([t], ["4"])[0].value == 1.0
    # A reward that raises on a sample: an errored score (algo.errored_reward decides what it trains as), never raised.
    bad = make_env(build_config(None, {"env": {"name": "dataset", "kwargs": {"path": conv}, "reward": correct}}).env)
    s = bad.score_batch([t], ["4"])[0]
    assert s.error is not None and "AttributeError" in s.error


def test_async_and_per_sample_rewards_are_detected():
    from rollwise.run.setup import make_env

    async def async_correct(completions, answer, **kwargs):
        return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]

    def per_sample(task, completion):
        return float(completion.strip() == str(task.answer))

    for fn in (async_correct, per_sample):
        env = make_env(build_config(None, {"env": {"name": "dataset", "kwargs": {"path": _rows(3)}, "reward": fn}}).env)
        tasks = env.load("train")
        scores = env.score_batch(tasks, [str(t.answer) for t in tasks[:2]] + ["0"])
        assert [s.value for s in scores] == [1.0, 1.0, 0.0] and all(s.error is None for s in scores)


class Counter:
    """A tool class passed as an object (env.environment)."""

    def reset(self, **row):
        self.n = 0
        return "count"

    def add(self, k: int) -> str:
        """Add k.

        Args:
            k: How much.
        """
        self.n += k
        return str(self.n)


def test_an_environment_class_object_runs_as_a_tool_environment():
    from rollwise.envs.agent import ToolEnv
    from rollwise.run.setup import make_env

    def by_count(completions, environments, **kwargs):
        return [float(e.n) for e in environments]

    cfg = build_config(None, {"env": {"name": "dataset", "kwargs": {"path": _rows(3)}, "environment": Counter,
                                      "reward": by_count}})
    assert cfg.model_dump(mode="json")["env"]["environment"] == f"<in-memory: {__name__}.Counter>"
    env = make_env(cfg.env)
    assert isinstance(env, ToolEnv) and env.factory is Counter and [t["function"]["name"] for t in env.tools] == ["add"]
    assert env.spec == f"{__name__}.Counter"


def test_a_weighted_sum_of_function_objects():
    from rollwise.run.setup import make_env

    async def length(completions, **kwargs):
        return [float(len(c)) for c in completions]

    cfg = build_config(None, {"env": {"name": "dataset", "kwargs": {"path": _rows(2)},
                                      "rewards": [{"fn": correct, "weight": 0.5}, {"fn": length, "weight": 2.0}]}})
    assert [r["fn"] for r in cfg.model_dump(mode="json")["env"]["rewards"]] == [
        f"<in-memory: {__name__}.correct>", f"<in-memory: {__name__}.test_a_weighted_sum_of_function_objects.<locals>.length>"]
    env = make_env(cfg.env)
    t = env.load("train")[0]
    s = env.score_batch([t], [str(t.answer)])[0]
    assert s.parts == {"correct": 1.0, "length": float(len(str(t.answer)))} and s.value == 0.5 + 2.0 * len(str(t.answer))


def test_ray_refuses_an_object_that_cannot_be_pickled():
    lock = threading.Lock()

    def locked(completions, **kwargs):
        with lock:
            return [0.0] * len(completions)

    cfg = build_config(None, {"engine": {"backend": "ray"}, "env": {"reward": locked}})
    with pytest.raises(ConfigError) as e:
        check_picklable(cfg)
    assert len(str(e.value).splitlines()) == 1 and "env.reward" in str(e.value) and "pickle" in str(e.value)
    check_picklable(build_config(None, {"engine": {"backend": "ray"}, "env": {"reward": correct}}))  # pickles: fine
    check_picklable(build_config(None, {"env": {"reward": locked}}))  # not Ray: never pickled


# ------------------------------------------------------------------------------------------------ tiny runs


@pytest.mark.slow
def test_a_dict_config_with_a_reward_function_and_rows_trains(tmp_path, tiny_model):
    out = tmp_path / "run"
    lines: list[str] = []
    res = rollwise.train(_tiny(tiny_model), train_dataset=_rows(12), eval_dataset=_rows(6, 40), env={"reward": correct},
                         out_dir=out, log=lines.append)
    assert isinstance(res, TrainResult) and res.run_dir == out and res.steps == 3
    assert json.loads(json.dumps(res.summary, default=str)) == json.loads((out / "summary.json").read_text())
    for v in (res.accuracy_before, res.accuracy_after, res.accuracy_before_greedy, res.accuracy_after_greedy):
        assert v is not None and 0.0 <= v <= 1.0
    assert res.checkpoint == out / "checkpoints" / "step-3" and (res.checkpoint / "model.safetensors").is_file()
    assert [m["step"] for m in res.metrics()] == [1, 2, 3]
    assert res.summary["rollouts"]["total"] == 3 * 4 * 4 and res.summary["eval_before"]["n"] == 6
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["env"]["reward"] == f"<in-memory: {__name__}.correct>"
    assert saved["env"]["kwargs"]["path"].startswith("<in-memory dataset: 12 rows")
    assert saved["env"]["kwargs"]["test_path"].startswith("<in-memory dataset: 6 rows")
    assert any("held-out accuracy before RL" in s for s in lines)
    # The CLI cannot resume it: the objects are not in config.yaml.
    r = subprocess.run([sys.executable, "-m", "rollwise.cli.main", "train", "--resume", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "rollwise.train(" in r.stderr and "resume=True" in r.stderr


@pytest.mark.slow
def test_resume_through_the_api_needs_the_same_objects(tmp_path, tiny_model):
    from rollwise.run.resume import ResumeError

    out = tmp_path / "run"
    cfg = _tiny(tiny_model, run={"checkpoint_every": 1})
    first = rollwise.train(cfg, train_dataset=_rows(12), eval_dataset=_rows(6, 40), env={"reward": correct},
                           out_dir=out, log=lambda s: None, stop_after=2)
    assert first.summary is None and first.accuracy_after is None and first.steps == 2
    assert first.accuracy_before is not None and first.checkpoint == out / "checkpoints" / "step-2"
    with pytest.raises(ResumeError) as e:  # other rows: another hash, refused
        rollwise.train(cfg, train_dataset=_rows(12, 1), eval_dataset=_rows(6, 40), env={"reward": correct},
                       out_dir=out, log=lambda s: None, resume=True)
    assert "env.kwargs.path" in str(e.value) and len(str(e.value).splitlines()) == 1

    # The same rows and a function of the same name (another object: e.g. a restarted notebook): it continues.
    res = rollwise.train(_tiny(tiny_model, run={"checkpoint_every": 1}), train_dataset=_rows(12),
                         eval_dataset=_rows(6, 40), env={"reward": _named_correct()}, resume=out, log=lambda s: None)
    assert res.summary is not None and res.steps == 3 and [m["step"] for m in res.metrics()] == [1, 2, 3]
    assert res.checkpoint == out / "checkpoints" / "step-3"


def _named_correct():
    def correct(completions, answer, **kwargs):
        return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]
    correct.__qualname__ = "correct"  # as a module-level `correct` would be named
    return correct


@pytest.mark.slow
def test_a_reward_that_raises_on_a_sample_scores_it_errored(tmp_path, tiny_model):
    from rollwise.store.writer import RolloutStore

    def picky(task, completion):  # per-sample: raises on some samples of each group (not on all of a step's:
        if (task.answer + len(completion)) % 2:  # that is a broken reward, and stops the run, run/guard.py)
            raise RuntimeError("odd answer")
        return float(completion.strip() == str(task.answer))

    out = tmp_path / "run"
    res = rollwise.train(_tiny(tiny_model, train={"steps": 1}), train_dataset=_rows(12), eval_dataset=_rows(6, 40),
                         env={"reward": picky}, out_dir=out, log=lambda s: None)
    rows = RolloutStore(out).read()
    errored = [r for r in rows if r.status == "errored"]
    assert errored and all("odd answer" in r.status_reason for r in errored)
    assert res.summary["rollouts"]["errored"] == len(errored)


@pytest.mark.slow
def test_spawned_trainer_ranks_never_receive_the_objects(tmp_path, tiny_model):
    """train.world_size=2: the ranks are spawned with the TrainerSpec only; a lambda as the reward (which pickle
    refuses) and rows in memory do not need to reach them."""
    res = rollwise.train(_tiny(tiny_model, train={"steps": 2, "world_size": 2}), train_dataset=_rows(12),
                         eval_dataset=_rows(6, 40),
                         env={"reward": lambda completions, answer, **kw: [float(c.strip() == str(a))
                                                                           for c, a in zip(completions, answer)]},
                         out_dir=tmp_path / "run", log=lambda s: None)
    assert res.steps == 2 and [m["step"] for m in res.metrics()] == [1, 2]
    assert yaml.safe_load((res.run_dir / "config.yaml").read_text())["env"]["reward"] == \
        f"<in-memory: {__name__}.test_spawned_trainer_ranks_never_receive_the_objects.<locals>.<lambda>>"
