"""Config of the rewards a model computes: an LLM judge (`judge`) and a sequence-classification reward model
(`reward_model`), named in `env.reward` or as a part of `env.rewards`.

    env:
      reward:
        judge: {model: smollm2-135m, template_file: judge.txt, max_score: 10}
      # or a part of a weighted sum, beside reward functions:
      rewards:
        - {fn: "format.py:has_answer", weight: 0.2}
        - {reward_model: {path: models/my-rm, normalize: sigmoid}, weight: 1.0}

Everything here is checked without touching the filesystem or importing torch (`rollwise.config` runs before any
heavy import); paths, template files and models are checked when the reward is built (`rewards.model_rewards`).
`Section`, the base of every config section, lives here too: `rollwise.config` builds on this module.

Deliberately left out: pairwise judges and votes of several samples (compose several judges in `env.rewards`).
"""

from __future__ import annotations

import re
import string
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class Section(BaseModel):
    """A config section: extra keys forbidden, assignments validated, inf/nan refused in every float field."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True, frozen=False,
                              allow_inf_nan=False)


DEFAULT_SCORE_PATTERN = r"score\s*[:=]\s*(-?\d+(?:\.\d+)?)"
"""The judge's default score regex: the number after 'Score:' (any case). A reply that only mentions numbers (a small
model answering the question itself: '47 + 38 = 85') has no score, so it is a wrong answer, not a full mark."""

TEMPLATE_FIELDS = ("prompt", "answer", "completion", "max_score")
"""Fields every judge template may use; any other name is a column of the dataset row (`Task.metadata`)."""


def template_fields(template: str, where: str = "template") -> list[str]:
    """The field names `template` uses, after checking it is a format string whose fields are plain names and
    that it shows the judge the completion. ValueError (one line) otherwise."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        raise ValueError(f"{where} is not a valid format string ({e}); write literal braces as {{{{ and }}}}") from None
    for name in names:
        if not name.isidentifier():
            raise ValueError(f"{where}: field {{{name}}} must be a plain name ({', '.join(TEMPLATE_FIELDS)} or a "
                             "dataset column)")
    if "completion" not in names:
        raise ValueError(f"{where} must contain {{completion}}: the judge has to see what it grades")
    return names


def check_score_pattern(pattern: str) -> re.Pattern[str]:
    """The compiled score regex; ValueError (one line) when it does not compile or captures no group."""
    try:
        rx = re.compile(pattern, re.IGNORECASE)
    except re.error as e:
        raise ValueError(f"score_pattern {pattern!r} is not a regular expression: {e}") from None
    if rx.groups < 1:
        raise ValueError(f"score_pattern {pattern!r} needs a group around the number, e.g. 'Score: (\\d+)'")
    return rx


class JudgeConfig(Section):
    """An LLM judge (`rewards.judge`): a model reads a prompt made from `template` and replies with a score, read by
    `score_pattern`. A reply without a readable score is a wrong answer (0.0), never errored; an engine or server
    that fails to answer errors the sample (a judge failing on every sample stops the run, `run.guard`)."""

    engine: Literal["local", "remote"] = "local"
    """'local': rollwise's in-process engine (`rollwise.LLM`) on `model`; 'remote': an OpenAI-compatible server at
    `url` (rollwise serve, vLLM, SGLang)."""
    model: str | None = None
    """local: an HF checkpoint directory, a .gguf file, 'smollm2-135m', or 'builtin:tiny' (the run's built-in model
    as its warm-up left it; needs model.path builtin:tiny); remote: the served model's name (default: the server's
    first)."""
    url: str | None = None
    """remote: the server's base URL, e.g. http://127.0.0.1:8000."""
    tokenizer: str | None = None
    """The judge model's tokenizer directory (or a model name that resolves to one); default: the local model's own.
    A remote judge needs it: the prompt goes as token ids with the completion encoded as plain text, so text such as
    `<|im_end|>` written in a completion never becomes the judge's control token."""
    template: str | None = None
    """The judge's prompt: must contain {completion}; may use {prompt}, {answer}, {max_score} and any dataset column
    by name; literal braces are written {{ and }}. Every field is filled in as plain text. Default: a
    0-to-max_score grading prompt asking for 'Score: N' (`rewards.judge.DEFAULT_TEMPLATE`)."""
    template_file: str | None = None
    """A text file holding the template instead of `template` (read when the reward is built)."""
    chat_template: Literal["auto"] | bool = "auto"
    """Send the filled template as a user message through the judge tokenizer's chat template: 'auto' (when the
    tokenizer has one), true, or false (the raw text)."""
    score_pattern: str = DEFAULT_SCORE_PATTERN
    """Regular expression (case-insensitive) whose first group is the score, searched in the judge's reply; by
    default the number after 'Score:'."""
    score_match: Literal["first", "last"] = "last"
    """Which match counts when the reply has several: 'last' (a judge that reasons, or quotes the judged text, gives
    its verdict last) or 'first'."""
    max_score: float = Field(10.0, gt=0)
    """The top of the judge's scale: the reward is score / max_score, clipped to [0, 1]."""
    temperature: float = Field(0.0, ge=0)
    """The judge's sampling temperature; 0 is greedy (the same completion always gets the same verdict)."""
    max_tokens: int = Field(16, ge=1)
    """Most tokens of the judge's reply."""
    device: str = "cpu"
    """local: where the judge runs: 'cpu', 'cuda' or 'cuda:N'."""
    timeout_s: float = Field(120.0, gt=0)
    """remote: the longest one request to the judge's server may take."""

    @field_validator("template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None:
            template_fields(v)
        return v

    @field_validator("score_pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        check_score_pattern(v)
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v in ("cpu", "cuda") or (v.startswith("cuda:") and v[5:].isdigit()):
            return v
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {v!r}")

    @model_validator(mode="after")
    def _engine(self) -> JudgeConfig:
        if self.template is not None and self.template_file is not None:
            raise ValueError("set template or template_file, not both")
        if self.engine == "local":
            if not self.model:
                raise ValueError("a local judge needs model: an HF checkpoint directory, a .gguf file, 'smollm2-135m' "
                                 "or 'builtin:tiny'")
            if self.url is not None:
                raise ValueError("url is for engine 'remote'; a local judge loads model in this process")
        else:
            if not self.url:
                raise ValueError("a remote judge needs url: the OpenAI-compatible server's base URL, e.g. "
                                 "http://127.0.0.1:8000")
            if not self.tokenizer:
                raise ValueError("a remote judge needs tokenizer (the served model's tokenizer directory): the "
                                 "completion goes as plain-text token ids, so it cannot close the judge's turn")
            if self.model == "builtin:tiny":
                raise ValueError("'builtin:tiny' is a local model: set engine 'local'")
        return self


class RewardModelConfig(Section):
    """A sequence-classification reward model (TRL's `reward_funcs="path"`): prompt and completion are read by an HF
    `AutoModelForSequenceClassification` with one label, and the reward is that label's logit. Runs on the CPU, in
    batches; text prompts are joined to the completion as TRL does, message prompts go through the reward model's
    chat template with the completion as the assistant's turn."""

    path: str
    """The model's HF directory (or a hub id where a hub is reachable)."""
    tokenizer: str | None = None
    """Its tokenizer directory; default: the model's own."""
    normalize: Literal["none", "sigmoid"] = "none"
    """'none': the raw logit, as TRL; 'sigmoid': the logit squashed into (0, 1) (then env.pass_threshold can read
    it as a probability)."""
    batch_size: int = Field(8, ge=1)
    """Sequences per forward pass."""
    max_length: int | None = Field(None, ge=2)
    """Most tokens of prompt + completion read; a longer sequence keeps its first max_length tokens (default: the
    model's max_position_embeddings)."""


class ModelRewardConfig(Section):
    """`env.reward` computed by a model instead of a function: set `judge` or `reward_model`."""

    judge: JudgeConfig | None = None
    """An LLM judge (`rollwise.config_rewards.JudgeConfig`)."""
    reward_model: RewardModelConfig | None = None
    """A sequence-classification reward model (`rollwise.config_rewards.RewardModelConfig`)."""
    name: str | None = None
    """The reward's name in reward_parts and metrics; default 'judge', or the reward model directory's name (TRL's)."""

    @model_validator(mode="after")
    def _one(self) -> ModelRewardConfig:
        if (self.judge is None) == (self.reward_model is None):
            raise ValueError("set one of judge or reward_model")
        return self


MODEL_KINDS = ("judge", "reward_model")
"""The keys of a reward computed by a model, in `env.reward` and in an `env.rewards` item."""


def _first_error(e: ValidationError, where: str) -> str:
    """One line for a ValidationError of a section validated inside another validator."""
    err = e.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).rstrip(".").replace("\n", " ").removeprefix("Value error, ")
    key = f"{where}.{loc}" if loc else where
    if err["type"] == "missing":
        return f"{key} is missing"
    got = err.get("input")
    shown = "" if err["type"] == "value_error" or isinstance(got, dict) else f" (got {got!r})"
    return f"{key}: {msg}{shown}"


def check_reward_item(item: dict[str, Any], i: int) -> dict[str, Any]:
    """An `env.rewards` item that names a model (`judge` or `reward_model`, with optional weight and name), its
    model section validated and written out in full; ValueError (one line, naming env.rewards[i]) otherwise."""
    kinds = [k for k in MODEL_KINDS if k in item]
    if len(kinds) + ("fn" in item) != 1:
        raise ValueError(f"env.rewards[{i}] needs exactly one of fn, judge or reward_model")
    kind = kinds[0]
    extra = set(item) - {kind, "weight", "name"}
    if extra:
        raise ValueError(f"env.rewards[{i}]: unknown keys {sorted(extra)} (allowed: {kind}, weight, name)")
    cls = JudgeConfig if kind == "judge" else RewardModelConfig
    value = item[kind]
    if not isinstance(value, (dict, cls)):
        raise ValueError(f"env.rewards[{i}].{kind} must be a mapping of its keys, got {type(value).__name__}")
    try:
        section = value if isinstance(value, cls) else cls.model_validate(value)
    except ValidationError as e:
        raise ValueError(_first_error(e, f"env.rewards[{i}].{kind}")) from None
    name = item.get("name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"env.rewards[{i}].name must be a string, got {name!r}")
    return {**item, kind: section.model_dump()}


def judges_in(reward: Any, rewards: list[dict[str, Any]] | None) -> list[tuple[str, JudgeConfig]]:
    """The LLM judges an `env` section names, each with its dotted key (`env.reward.judge`, `env.rewards[i].judge`)."""
    out: list[tuple[str, JudgeConfig]] = []
    if isinstance(reward, ModelRewardConfig) and reward.judge is not None:
        out.append(("env.reward.judge", reward.judge))
    for i, item in enumerate(rewards or []):
        if isinstance(item, dict) and isinstance(item.get("judge"), dict):
            out.append((f"env.rewards[{i}].judge", JudgeConfig.model_validate(item["judge"])))
    return out


__all__ = ["DEFAULT_SCORE_PATTERN", "JudgeConfig", "Section", "MODEL_KINDS", "ModelRewardConfig", "RewardModelConfig",
           "TEMPLATE_FIELDS", "check_reward_item", "check_score_pattern", "judges_in", "template_fields"]
