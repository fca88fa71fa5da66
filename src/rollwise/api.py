"""The Python API of an RL run: `rollwise.train(config, **overrides) -> TrainResult`.

    import rollwise

    def correct(completions, answer, **kwargs):              # TRL's reward convention (sync or async)
        return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]

    result = rollwise.train("my.yaml", train_dataset=[{"prompt": "2+3=", "answer": 5}, ...],
                            eval_dataset=[...], env={"reward": correct}, train={"lr": 1e-5}, out_dir="runs/x")
    result.accuracy_before, result.accuracy_after, result.checkpoint, result.metrics()[-1]["reward_mean"]

`config` is None (the embedded default `rollwise train` runs), a YAML path, a dict of sections (as the YAML has
them) or a `rollwise.config.RunConfig`. Each override is a section with a dict of its keys (`train={"lr": 1e-5}`,
merged key by key) or a dotted key (`**{"train.lr": 1e-5}`); both are checked exactly as `--set` is
(`config.build_config`: one-line `ConfigError` naming the key and the closest valid one).

Where the config takes code or data by a string, the object itself may be passed (`rollwise.in_memory`):
`env.reward` and `env.rewards[i].fn` (a function: TRL's batch convention or rollwise's `fn(task, completion)`),
`env.environment` (a class), `env.kwargs.path` / `env.kwargs.test_path` of the `dataset` environment (rows: a list
of dicts or a `datasets.Dataset`; `train_dataset=` / `eval_dataset=` set them and `env.name: dataset`). Such a run's
config.yaml shows each as a placeholder (`<in-memory: module.qualname>`, `<in-memory dataset: N rows, sha256 ...>`);
`rollwise train --resume` refuses it (the objects are not in the file), `rollwise.train(..., resume=True)` with the
same objects continues it (the resume check compares placeholders: other rows are refused, a function of the same
name is taken). Trainer ranks (`train.world_size > 1`) never see the objects (they get the `TrainerSpec` only);
Ray scoring actors (`engine.backend: ray`) get the environment pickled, so an object that cannot be pickled is
refused before any work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from rollwise.config import ConfigError, RunConfig, build_config
from rollwise.in_memory import InMemory, as_dataset

__all__ = ["TrainResult", "train"]

Log = Callable[[str], None]


@dataclass(frozen=True)
class TrainResult:
    """What one `rollwise.train()` call leaves: the run directory and its figures."""

    run_dir: Path
    """RUN_DIR: config.yaml, metrics.jsonl, summary.json, rollouts/, checkpoints/, report.html."""
    summary: dict[str, Any] | None
    """RUN_DIR/summary.json as a dict; None when the call stopped before the last step (`stop_after`): no final
    evaluation ran and no summary was written (resume the run to finish it)."""
    accuracy_before: float | None
    """Held-out accuracy before RL, sampled at rollout.temperature (None if no evaluation ran yet)."""
    accuracy_after: float | None
    """Held-out accuracy after RL, sampled (None when stopped early)."""
    accuracy_before_greedy: float | None
    """Held-out greedy accuracy before RL."""
    accuracy_after_greedy: float | None
    """Held-out greedy accuracy after RL (None when stopped early)."""
    steps: int
    """RL steps the run has done so far (train.steps when it finished)."""
    checkpoint: Path | None
    """The newest complete checkpoint (HF format; the final one when the run finished), or None."""

    def metrics(self) -> list[dict[str, Any]]:
        """RUN_DIR/metrics.jsonl: one dict per step, in order (empty before the first step)."""
        path = self.run_dir / "metrics.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _overrides(overrides: dict[str, Any], train_dataset: Any, eval_dataset: Any, out_dir: str | Path | None,
               resume: bool | str | Path | None) -> dict[str, Any]:
    """The keyword conveniences (datasets, out_dir, resume) as overrides of config keys."""
    out: dict[str, Any] = {}
    def data(value: Any, label: str) -> Any:  # a file (any format the dataset env reads) stays a path
        return str(value) if isinstance(value, (str, Path)) else as_dataset(value, label)

    if train_dataset is not None:
        out["env.name"] = "dataset"
        out["env.kwargs.path"] = data(train_dataset, "train_dataset")
    if eval_dataset is not None:
        out["env.kwargs.test_path"] = data(eval_dataset, "eval_dataset")
    if isinstance(resume, (str, Path)):
        if out_dir is not None and Path(out_dir).resolve() != Path(resume).resolve():
            raise ConfigError(f"resume={str(resume)!r} and out_dir={str(out_dir)!r} name different run directories")
        out_dir, resume = resume, True
    if out_dir is not None:
        out["run.out_dir"] = str(out_dir)
    if resume is not None:
        out["run.resume"] = bool(resume)
    named = set(overrides)  # dotted keys, and the keys inside sections (env.kwargs.* too)
    for section, value in overrides.items():
        if isinstance(value, Mapping):
            named.update(f"{section}.{k}" for k in value)
            if isinstance(value.get("kwargs"), Mapping):
                named.update(f"{section}.kwargs.{k}" for k in value["kwargs"])
    for key in out:
        if key in named:
            raise ConfigError(f"{key} is given twice: as a config key and through a keyword of rollwise.train "
                              "(train_dataset, eval_dataset, out_dir, resume)")
    return {**overrides, **out}


def _saved_config(overrides: Mapping[str, Any]) -> Path | None:
    """A resume with no config given continues under the run's own config.yaml (as `rollwise train --resume`
    does), when it has one."""
    section = overrides.get("run")
    run = section if isinstance(section, Mapping) else {}
    if not (overrides.get("run.resume") or run.get("resume")):
        return None
    out = overrides.get("run.out_dir") or run.get("out_dir") or build_config(None).run.out_dir
    path = Path(out) / "config.yaml"
    return path if path.is_file() else None


def _in_memory(cfg: RunConfig) -> list[tuple[str, InMemory]]:
    """(dotted key, object) for every in-memory object of the config."""
    E = cfg.env
    found: list[tuple[str, InMemory]] = []
    for key, v in (("env.reward", E.reward), ("env.environment", E.environment), ("env.agent", E.agent)):
        if isinstance(v, InMemory):
            found.append((key, v))
    for i, item in enumerate(E.rewards or []):
        if isinstance(item.get("fn"), InMemory):
            found.append((f"env.rewards[{i}].fn", item["fn"]))
    found.extend((f"env.kwargs.{k}", v) for k, v in E.kwargs.items() if isinstance(v, InMemory))
    return found


def check_picklable(cfg: RunConfig) -> None:
    """engine.backend 'ray': the scoring actors get the environment pickled (Ray's cloudpickle), in-memory objects
    included; one that cannot be pickled is refused here, with one line, before any work."""
    if cfg.engine.backend != "ray":
        return
    objects = _in_memory(cfg)
    if not objects:
        return
    import importlib

    try:
        pickler: Any = importlib.import_module("ray.cloudpickle")
    except ImportError:  # the config already refuses the ray backend without Ray
        import pickle as pickler
    for key, obj in objects:
        try:
            pickler.dumps(obj.obj)
        except Exception as e:  # noqa: BLE001 - any pickling failure: one line naming the key
            reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ConfigError(f"{key} ({obj.placeholder}) cannot be pickled for Ray's scoring actors (engine.backend "
                              f"'ray'): {type(e).__name__}: {reason}; pass an object that pickles (a module-level "
                              "function or class) or name it as \"file.py:attr\"") from None


def train(config: str | Path | Mapping[str, Any] | RunConfig | None = None, /, *, log: Log = print,
          train_dataset: Any = None, eval_dataset: Any = None, out_dir: str | Path | None = None,
          resume: bool | str | Path | None = None, stop_after: int | None = None, **overrides: Any) -> TrainResult:
    """Run (or resume) RL training; see the module docstring.

    config: None (the embedded default), a YAML path, a dict of sections, or a `RunConfig`.
    log: where progress lines go (`print`; `lambda s: None` for silence).
    train_dataset / eval_dataset: rows (a list of dicts or a `datasets.Dataset`, standard `{"prompt": text, ...}`
        or conversational `{"prompt": [messages], ...}`, plus the columns the reward reads, e.g. `answer`), or a
        file path; they set env.name 'dataset' and env.kwargs.path / test_path.
    out_dir: run.out_dir. resume: run.resume (True), or the run directory to resume (also its out_dir). With no
        `config`, a resume continues under RUN_DIR/config.yaml (as `rollwise train --resume` does), and the
        objects its placeholders stand for must be passed again.
    stop_after: end this call after that many steps as if interrupted (no final evaluation or summary:
        `TrainResult.summary` is None); a later call with resume=True continues.
    overrides: `section={...}` dicts or dotted keys (`**{"train.lr": 1e-5}`), values may be Python objects where
        the config takes code or data by a string.

    Raises `rollwise.config.ConfigError` (one line) for a bad config, key, value or object, before any work; the
    errors of a run (a bad dataset row, a checkpoint that does not match, `run.guard.RewardBroken` for a reward
    that errors on every sample) are one line too. A resume of a run that already finished logs one line and
    returns its result without loading anything.
    """
    from rollwise.envs.build import check_env_section

    given = _overrides(dict(overrides), train_dataset, eval_dataset, out_dir, resume)
    saved = _saved_config(given) if config is None else None
    cfg = build_config(saved, given, saved_run=True) if saved is not None else build_config(config, given)
    check_env_section(cfg.env.name, cfg.env.kwargs, cfg.env.module)  # env.kwargs typos fail here, before any work
    check_picklable(cfg)
    from rollwise.run.loop import train as run_loop

    summary = run_loop(cfg, log, stop_after=stop_after)
    return result_of(Path(cfg.run.out_dir), summary)


def result_of(run_dir: Path, summary: dict[str, Any] | None) -> TrainResult:
    """The `TrainResult` of RUN_DIR after a call that returned `summary` (None: stopped early)."""
    from rollwise.train.checkpoint import find_latest_checkpoint

    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    if summary is not None:
        before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    elif (run_dir / "eval_before.json").is_file():
        before = json.loads((run_dir / "eval_before.json").read_text())
    result = TrainResult(run_dir=run_dir, summary=summary, accuracy_before=before.get("accuracy"),
                         accuracy_after=after.get("accuracy"), accuracy_before_greedy=before.get("accuracy_greedy"),
                         accuracy_after_greedy=after.get("accuracy_greedy"), steps=0,
                         checkpoint=find_latest_checkpoint(run_dir))
    steps = int(summary["steps"]) if summary is not None else max((int(m.get("step", 0)) for m in result.metrics()),
                                                                    default=0)
    return replace(result, steps=steps)
