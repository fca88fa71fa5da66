"""Rewards a model computes, built from config: an LLM judge (`env.reward.judge`) or a sequence-classification reward
model (`env.reward.reward_model`), also as parts of `env.rewards` (`rollwise.config_rewards`).

`make_model_reward(kind, section, ...)` checks what the config names (the model and tokenizer paths, the template
file and its fields) when it is called, so a missing model is one line before the run starts; the model itself loads
on the first score (a judge on 'builtin:tiny' is the run's built-in model, which exists only once warm-up wrote it).
The `ModelReward` it returns has the shape of a user reward (`score_batch`, per-sample call, `name`), so it can stand
wherever `env.reward` or a part of `env.rewards` does.

Every input is scored once per run (`rewards.cached.ScoreCache`: same task fields and completion, one model call),
and each Score says whether its sample was computed or a cache hit (the `judge_calls` / `judge_cache_hits` metrics).

Failures keep the two kinds apart (`rewards.base`): a judge reply without a readable score is a wrong answer; an
engine or server that fails (it cannot load, it dies, a request times out) errors the samples of that call, with the
reason, so a judge that fails on every sample stops the run with one line (`run.guard`).

Objects pickle without their model, cache or engine (they are rebuilt where they land: Ray scoring actors).

Deliberately left out: sharing one judge engine between several parts that name the same model (each part loads its
own), and putting a judge on the GPU the policy trains on without a say in its memory (set `device` yourself).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from rollwise.config_rewards import JudgeConfig, RewardModelConfig, check_score_pattern, template_fields
from rollwise.rewards.base import describe
from rollwise.rewards.cached import ScoreCache, input_key
from rollwise.rewards.judge import DEFAULT_TEMPLATE, as_text
from rollwise.types import Score, Task


class ModelRewardError(ValueError):
    """What the config names for a judge or reward model cannot be used; one line naming the key."""


@dataclass(frozen=True)
class ModelPlaces:
    """Where names in the config lead that the config alone cannot say."""

    builtin_dir: Path | None = None
    """The run's built-in model (RUN_DIR/init_model) when model.path is 'builtin:tiny': what a judge's
    'builtin:tiny' loads."""
    remote_engine: Callable[..., Any] | None = None
    """Opens a remote judge's engine: `(url, model=, tokenizer=, timeout_s=) -> Engine` (`clients.remote.RemoteEngine`,
    handed down by `envs.build`: the clients sit beside the rewards, not below them)."""


def _model_dir(spec: str, where: str) -> Path:
    """An HF checkpoint directory for `spec` (a directory, a .gguf file, a known name, a hub id where reachable)."""
    from rollwise.models.convert import ModelResolveError, resolve_model

    try:
        d = Path(resolve_model(spec))
    except ModelResolveError as e:
        raise ModelRewardError(f"{where}: {e}") from None
    if not (d / "config.json").is_file():
        what = "does not exist" if not d.exists() else "is not an HF checkpoint directory (no config.json)"
        raise ModelRewardError(f"{where}: {spec!r} {what}; name an HF checkpoint directory, a .gguf file or "
                               "'smollm2-135m'")
    return d


def _tokenizer_dir(spec: str, where: str) -> Path:
    from rollwise.models.convert import ModelResolveError, resolve_model

    try:
        d = Path(resolve_model(spec))
    except ModelResolveError as e:
        raise ModelRewardError(f"{where}: {e}") from None
    if not d.is_dir():
        raise ModelRewardError(f"{where}: {spec!r} is not a directory (the tokenizer files' directory, or a model "
                               "name that resolves to one)")
    return d


def read_template(cfg: JudgeConfig, where: str) -> str:
    """The judge's template: inline, from its file, or the default; its fields checked."""
    if cfg.template_file is not None:
        p = Path(cfg.template_file)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise ModelRewardError(f"{where}.template_file: cannot read {p}: {e.strerror or e}") from None
        try:
            template_fields(text, f"{where}.template_file {p}")
        except ValueError as e:
            raise ModelRewardError(str(e)) from None
        return text
    return cfg.template if cfg.template is not None else DEFAULT_TEMPLATE


# --------------------------------------------------------------------------------------------- the judge


@dataclass
class JudgeBuilder:
    """Everything a judge needs, checked; `build()` loads its engine (where the judge runs)."""

    what: ClassVar[str] = "judge"
    cfg: JudgeConfig
    template: str
    name: str
    where: str
    model_dir: Path | None
    """local: the checkpoint directory (None for 'builtin:tiny' until the run's built-in model exists)."""
    builtin_dir: Path | None
    tokenizer_dir: Path | None
    remote_engine: Callable[..., Any] | None = None
    """engine 'remote': what opens the server's engine (`ModelPlaces.remote_engine`)."""

    def inputs(self, task: Task, completion: Any) -> dict[str, Any]:
        """What the judge reads of one sample (the cache key's fields)."""
        return {"kind": "judge", "prompt": as_text(task.prompt), "answer": task.answer, "completion": as_text(completion),
                "metadata": {str(k): v for k, v in (task.metadata or {}).items()}}

    def build(self) -> Callable[[Sequence[Task], Sequence[Any]], list[Score]]:
        from rollwise.engine.core import load_tokenizer
        from rollwise.models.prompting import stop_token_ids
        from rollwise.rewards.judge import LLMJudge
        from rollwise.types import SamplingParams

        c = self.cfg
        engine: Any
        max_len: int | None = None
        if c.engine == "local":
            model_dir = self.model_dir
            if model_dir is None:  # 'builtin:tiny': the run's built-in model, written by its warm-up
                assert self.builtin_dir is not None
                if not (self.builtin_dir / "config.json").is_file():
                    raise ModelRewardError(f"{self.where}.model 'builtin:tiny': the run's built-in model is not at "
                                           f"{self.builtin_dir} yet")
                model_dir = self.builtin_dir
            from rollwise.engine.llm import LLM

            tok = load_tokenizer(self.tokenizer_dir) if self.tokenizer_dir is not None else None
            engine = LLM(model_dir, device=c.device, dtype="float32", tokenizer=tok)
            tok = engine.tokenizer
            max_len = int(engine.engine.max_model_len)
            stops = stop_token_ids(tok, model_dir)
        else:
            assert self.tokenizer_dir is not None and c.url is not None and self.remote_engine is not None
            tok = load_tokenizer(self.tokenizer_dir)
            if tok is None:
                raise ModelRewardError(f"{self.where}.tokenizer: no tokenizer files in {self.tokenizer_dir}")
            engine = self.remote_engine(c.url, model=c.model, tokenizer=tok, timeout_s=c.timeout_s)
            stops = stop_token_ids(tok, self.tokenizer_dir)
        if tok is None:
            raise ModelRewardError(f"{self.where}: the judge model has no tokenizer files: set {self.where}.tokenizer")
        sampling = SamplingParams(temperature=c.temperature, max_tokens=c.max_tokens, stop_token_ids=stops or None,
                                  seed=0)
        judge = LLMJudge(engine, tok, template=self.template, max_score=c.max_score, score_pattern=c.score_pattern,
                         score_match=c.score_match, sampling=sampling, name=self.name, chat_template=c.chat_template, max_len=max_len)
        return judge.score_batch


def judge_builder(cfg: JudgeConfig, *, name: str, where: str, places: ModelPlaces) -> JudgeBuilder:
    """A judge's config checked against the filesystem (model, tokenizer, template file)."""
    template = read_template(cfg, where)
    check_score_pattern(cfg.score_pattern)
    model_dir = builtin = None
    if cfg.engine == "local":
        assert cfg.model is not None
        if cfg.model == "builtin:tiny":
            if places.builtin_dir is None:
                raise ModelRewardError(f"{where}.model 'builtin:tiny' is a training run's own built-in model (model.path "
                                       "builtin:tiny): here name a checkpoint directory instead")
            builtin = places.builtin_dir
        else:
            model_dir = _model_dir(cfg.model, f"{where}.model")
    tok_dir = _tokenizer_dir(cfg.tokenizer, f"{where}.tokenizer") if cfg.tokenizer is not None else None
    if cfg.engine == "remote" and places.remote_engine is None:
        raise ModelRewardError(f"{where}.engine 'remote': no client for remote engines was given (build the reward "
                               "through rollwise.envs.build.make_env)")
    return JudgeBuilder(cfg, template, name, where, model_dir, builtin, tok_dir, places.remote_engine)


# --------------------------------------------------------------------------------------------- the reward model


@dataclass
class RewardModelBuilder:
    """A reward model's directories, checked; `build()` loads it."""

    what: ClassVar[str] = "reward model"
    cfg: RewardModelConfig
    name: str
    model_dir: Path
    tokenizer_dir: Path | None

    def inputs(self, task: Task, completion: Any) -> dict[str, Any]:
        return {"kind": "reward_model", "prompt": task.prompt, "completion": completion}

    def build(self) -> Callable[[Sequence[Task], Sequence[Any]], list[Score]]:
        from rollwise.rewards.reward_model import load_reward_model

        c = self.cfg
        rm = load_reward_model(str(self.model_dir), str(self.tokenizer_dir) if self.tokenizer_dir else None,
                               name=self.name, normalize=c.normalize, batch_size=c.batch_size, max_length=c.max_length)
        return rm.score_batch


def reward_model_builder(cfg: RewardModelConfig, *, name: str, where: str) -> RewardModelBuilder:
    model_dir = _model_dir(cfg.path, f"{where}.path")
    tok_dir = _tokenizer_dir(cfg.tokenizer, f"{where}.tokenizer") if cfg.tokenizer is not None else None
    return RewardModelBuilder(cfg, name, model_dir, tok_dir)


# --------------------------------------------------------------------------------------------- the reward


@dataclass
class ModelReward:
    """A judge or reward model with the shape of a user reward (`rewards.user`), cached per input."""

    builder: JudgeBuilder | RewardModelBuilder
    name: str
    cache: ScoreCache = field(default_factory=ScoreCache)
    _scorer: Callable[[Sequence[Task], Sequence[Any]], list[Score]] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"builder": self.builder, "name": self.name}  # the model and the cache stay where they were made

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["builder"], state["name"])  # type: ignore[misc]

    def _scorer_now(self) -> Callable[[Sequence[Task], Sequence[Any]], list[Score]]:
        with self._lock:  # one load, whoever scores first
            if self._scorer is None:
                self._scorer = self.builder.build()
            return self._scorer

    def score_batch(self, tasks: Sequence[Task], completions: Sequence[Any],
                    completion_ids: Sequence[Sequence[int]] | None = None, *,
                    extra: dict[str, list[Any]] | None = None) -> list[Score]:
        """Scores of `completions[i]` for `tasks[i]`, in order; never raises (a failed model errors the samples it
        was asked about, naming the reward)."""
        if len(tasks) != len(completions):
            raise ValueError(f"score_batch: {len(tasks)} tasks for {len(completions)} completions")
        keys = [input_key(self.builder.inputs(t, c)) for t, c in zip(tasks, completions)]

        def compute(idx: list[int]) -> list[Score]:
            try:
                got = self._scorer_now()([tasks[i] for i in idx], [completions[i] for i in idx])
            except Exception as e:  # noqa: BLE001 - the engine or model failed: not the completions' fault
                return [Score(0.0, error=f"{self.name}: the {self.builder.what} failed: {describe(e)}") for _ in idx]
            return [s if s.error is None or s.error.startswith(f"{self.name}:") else
                    Score(s.value, s.parts, f"{self.name}: {s.error}", s.info) for s in got]

        return self.cache.scores(keys, compute)

    def __call__(self, task: Task, completion: Any) -> Score:
        return self.score_batch([task], [completion])[0]


def default_name(kind: str, section: JudgeConfig | RewardModelConfig) -> str:
    """The part's name when the config gives none: 'judge', or the reward model directory's name (TRL's)."""
    if isinstance(section, RewardModelConfig):
        return Path(section.path.rstrip("/")).name or "reward_model"
    return "judge"


def make_model_reward(kind: str, section: JudgeConfig | RewardModelConfig | dict[str, Any], *, name: str | None = None,
                      where: str = "env.reward", places: ModelPlaces | None = None) -> ModelReward:
    """The reward `env.reward.<kind>` (or `env.rewards[i].<kind>`, `where`) names; ModelRewardError (one line) when
    what it names cannot be used."""
    places = places or ModelPlaces()
    key = f"{where}.{kind}"
    if kind == "judge":
        cfg = section if isinstance(section, JudgeConfig) else JudgeConfig.model_validate(section)
        nm = name or default_name(kind, cfg)
        return ModelReward(judge_builder(cfg, name=nm, where=key, places=places), nm)
    if kind == "reward_model":
        rcfg = section if isinstance(section, RewardModelConfig) else RewardModelConfig.model_validate(section)
        nm = name or default_name(kind, rcfg)
        return ModelReward(reward_model_builder(rcfg, name=nm, where=key), nm)
    raise ModelRewardError(f"{where}: unknown kind of model reward {kind!r} (judge or reward_model)")


__all__ = ["ModelPlaces", "ModelReward", "ModelRewardError", "default_name", "judge_builder", "make_model_reward",
           "read_template", "reward_model_builder"]
