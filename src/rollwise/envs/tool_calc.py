"""tool_calc: multi-turn tool use. The policy calls a calculator (or, optionally, Python in the sandbox).

Call format (documented for prompts and parsers alike):
    <calc>EXPRESSION</calc>      -> observation "<result>VALUE</result>\\n" (or "<error>REASON</error>\\n")
    <python>CODE</python>        -> observation "<result>STDOUT</result>\\n" (only with `python_tool=True`)
    <answer>N</answer>           -> the episode ends; scored against the task's answer
A turn with no call and no answer also ends the episode. Tasks are multi-step integer arithmetic problems
("What is 347 * 29 + 1234?") generated deterministically from the seed, with hashed train/test splits.
The runner (`envs.multiturn`) stops each policy turn at a closing tag via `stop` below.

The Python tool runs each call in a fresh jail (`rollwise.sandbox`, isolation `required` unless
`isolation` says 'auto' / 'off', which warn loudly). Its output is only an observation: the reward is the
`<answer>` checked here, in the trusted process, never anything the program prints or returns; a jail
that cannot be built raises `SandboxUnavailable` (reported by the jail itself, not read from the output).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from rollwise.envs.base import EpisodeState, Task, split_of
from rollwise.envs.calc import CalcError, evaluate, format_number
from rollwise.rewards.base import wrong
from rollwise.rewards.math import AUDIT_CHARS, check_answer, extract_answer
from rollwise.rewards.text import tag_contents
from rollwise.types import Score

_CALL = re.compile(r"<(calc|python)>(.*?)(?:</\1>|$)", re.DOTALL)  # linear: an unclosed call runs to the end


def _answers(text: str) -> list[str]:
    """The contents of every <answer> tag (an unclosed last one runs to the end), in linear time."""
    return tag_contents(text, "<answer>", "</answer>", to_end=True)
MAX_OBSERVATION_CHARS = 400


@dataclass
class ToolCalcEnv:
    """Arithmetic word problems that are easy with a calculator and hard without one."""

    terms: int = 3
    digits: int = 3
    python_tool: bool = False
    test_fraction: float = 0.1
    name: str = "tool_calc"
    stop: tuple[str, ...] = ("</calc>", "</python>", "</answer>")
    isolation: str | None = None
    _sandbox: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.python_tool:  # check isolation now: a machine without the jail is reported at start-up
            self.sandbox()

    def sandbox(self) -> Any:
        """The Python tool's sandbox (built on first use; its `describe()` says what isolation it has)."""
        if self._sandbox is None:
            from rollwise.sandbox import Sandbox

            self._sandbox = Sandbox(isolation=self.isolation)  # type: ignore[arg-type]
        return self._sandbox

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"tool_calc has splits 'train' and 'test', got {split!r}")
        want = 500 if n is None else n
        rng = random.Random(f"tool_calc/{seed}/{split}")
        tasks: list[Task] = []
        seen: set[str] = set()
        for _ in range(100 * want + 100):
            if len(tasks) >= want:
                break
            hi = 10**self.digits - 1
            nums = [rng.randint(2, hi) for _ in range(self.terms)]
            ops = [rng.choice("+-*") for _ in range(self.terms - 1)]
            expr = " ".join(f"{a} {o}" for a, o in zip(nums, ops)) + f" {nums[-1]}"
            if expr in seen or split_of(expr, self.test_fraction) != split:
                continue
            seen.add(expr)
            value, _ = evaluate(expr)
            tools = "<calc>EXPR</calc>" + (" or <python>CODE</python>" if self.python_tool else "")
            prompt = f"What is {expr}? You may call {tools}. Give the final answer as <answer>N</answer>.\n"
            tasks.append(Task(id=f"tool_calc/{expr}", prompt=prompt, answer=int(value), metadata={"expr": expr}))
        return tasks

    # -- episode protocol -------------------------------------------------------------------------------
    def reset(self, task: Task) -> EpisodeState:
        return EpisodeState(task=task, data={"calls": 0, "answer": None})

    def step(self, state: EpisodeState, completion: str) -> str | None:
        """The observation for the policy's turn, or None when it answered or made no call."""
        state.transcript.append(("policy", completion))
        state.turn += 1
        ans = _answers(completion)
        if ans:
            state.data["answer"] = ans[-1].strip()
            state.done = True
            return None
        calls = _CALL.findall(completion)
        if not calls:
            state.done = True
            return None
        kind, body = calls[-1]
        state.data["calls"] += 1
        obs = self._run_tool(kind, body)
        state.transcript.append(("env", obs))
        return obs

    def _run_tool(self, kind: str, body: str) -> str:
        if kind == "calc":
            try:
                value, _ = evaluate(body)
            except CalcError as e:
                return f"<error>{e}</error>\n"
            return f"<result>{format_number(value)}</result>\n"
        if not self.python_tool:
            return "<error>python tool is not enabled</error>\n"
        from rollwise.sandbox import SandboxLimits

        res = self.sandbox().run_python(body, limits=SandboxLimits(wall_s=5.0, output_bytes=16 << 10))
        if res.timed_out:
            return "<error>timed out</error>\n"
        out = (res.stdout if res.exit_code == 0 else (res.stderr.strip().splitlines() or ["error"])[-1])
        tag = "result" if res.exit_code == 0 else "error"
        return f"<{tag}>{out.strip()[:MAX_OBSERVATION_CHARS]}</{tag}>\n"

    def score_episode(self, state: EpisodeState) -> Score:
        """1.0 for the right answer; parts keep how many tool calls were made."""
        calls = float(state.data.get("calls", 0))
        return _score_answer(state.data.get("answer"), state.task, {"tool_calls": calls})

    def score(self, task: Task, completion: str) -> Score:
        """Single-string form: the answer tag if present, else the final answer found in the text."""
        ans = _answers(completion)
        return _score_answer(ans[-1].strip() if ans else extract_answer(completion), task, {})


def _score_answer(given: str | None, task: Task, parts: dict[str, float]) -> Score:
    """1.0 for the right answer; an answer that cannot be checked (`rewards.math.check_answer`: over the size
    limits, math-verify timed out on it) is wrong with its reason, never errored."""
    v = check_answer(given, str(task.answer)) if given is not None else None
    ok = v is not None and v.correct
    shown = given if given is None or len(given) <= AUDIT_CHARS else given[:AUDIT_CHARS] + "..."
    if v is not None and v.reason:
        return wrong(v.reason, parts={"correct": 0.0, **parts}, answer=shown)
    return Score(float(ok), parts={"correct": float(ok), **parts}, info={"answer": shown})
