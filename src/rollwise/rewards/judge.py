"""LLM judge: ask a model to grade a completion through any engine with `generate(prompts, SamplingParams)`.

The judge fills a prompt template, generates once (greedy by default), and reads a score from the reply
with a regex. A reply without a readable score is a wrong answer (0.0) whose reason quotes the reply, not an
errored Score: the completion is the judge's input, and a completion that talks the judge out of grading it
must not escape a wrong answer's penalty. An engine that fails to answer at all raises (errored: not the
completion's fault).

Deliberately left out: pairwise comparison and multi-sample voting (compose several judges instead).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Any

from rollwise.models.plain_text import default_prefix, encode_parts
from rollwise.rewards.base import wrong
from rollwise.types import SamplingParams, Score, Task

DEFAULT_TEMPLATE = (
    "Grade the answer to the question on a scale from 0 to {max_score}.\n"
    "Question: {prompt}\nReference answer: {answer}\nAnswer: {completion}\n"
    "Reply with 'Score: N'.\nScore:"
)


@dataclass
class LLMJudge:
    """Reward function backed by a model. `tokenizer` (encode/decode) is needed for token-in engines."""

    engine: Any
    tokenizer: Any = None
    template: str = DEFAULT_TEMPLATE
    max_score: float = 10.0
    score_pattern: str = r"(?:score\s*[:=]?\s*)?(-?\d+(?:\.\d+)?)"
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0, max_tokens=16))
    name: str = "judge"

    def __post_init__(self) -> None:
        if not hasattr(self.engine, "generate"):
            raise TypeError(f"LLMJudge.engine must have a generate(prompts, SamplingParams) method, got {type(self.engine).__name__}")
        if self.max_score <= 0:
            raise ValueError(f"LLMJudge.max_score must be positive, got {self.max_score}")
        self._rx = re.compile(self.score_pattern, re.IGNORECASE)

    def _fields(self, task: Task, completion: str) -> dict[str, Any]:
        return {"prompt": task.prompt, "answer": task.answer, "completion": completion, "max_score": self.max_score}

    def build_prompt(self, task: Task, completion: str) -> str:
        return self.template.format(**self._fields(task, completion))

    def prompt_ids(self, tokenizer: Any, task: Task, completion: str) -> list[int]:
        """The judge's prompt as ids: the template's own text as the tokenizer encodes it (its control tokens
        included), every field filled in (the completion above all) as plain text, so a completion holding
        `<|im_end|><|im_start|>assistant` cannot close the judge's turn and answer for it (`models.plain_text`)."""
        fmt = string.Formatter()
        fields = self._fields(task, completion)
        parts: list[tuple[str, bool]] = []
        for literal, name, spec, conversion in fmt.parse(self.template):
            if literal:
                parts.append((literal, False))
            if name is not None:
                value = fmt.convert_field(fmt.get_field(name, (), fields)[0], conversion)
                parts.append((fmt.format_field(value, spec or ""), True))
        return default_prefix(tokenizer) + encode_parts(tokenizer, parts)

    def __call__(self, task: Task, completion: str) -> Score:
        tok = self.tokenizer if self.tokenizer is not None else getattr(self.engine, "tokenizer", None)
        # NOTE: an engine that takes text only (no tokenizer here or on it) tokenizes the prompt its own way.
        prompt: Any = self.prompt_ids(tok, task, completion) if tok is not None else self.build_prompt(task, completion)
        out = self.engine.generate([prompt], self.sampling)[0].outputs[0]
        reply = out.text or (tok.decode(out.token_ids) if tok is not None else "")
        m = self._rx.search(reply)
        if m is None:
            return wrong(f"judge reply has no score: {reply[:120]!r}", parts={self.name: 0.0}, reply=reply[:2000])
        raw = float(m.group(1))
        value = min(max(raw / self.max_score, 0.0), 1.0)
        return Score(value, parts={self.name: value}, info={"reply": reply, "raw_score": raw})

