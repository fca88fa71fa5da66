"""Exact/numeric match, regex format, length penalty, weighted composition, LLM judge, error capture."""

from __future__ import annotations

import math
import time

import pytest

from rollwise.envs.base import Task
from rollwise.rewards import (
    ExactMatch, LengthPenalty, NumericMatch, RegexFormat, Weighted, as_score, call_reward, score_many,
)
from rollwise.rewards.judge import LLMJudge
from rollwise.rewards.math import math_equal
from rollwise.types import CompletionOutput, RequestOutput, Score

T = Task(id="t", prompt="2+2=", answer="4")


def test_rounded_decimals_match_only_to_their_precision():
    assert math_equal("0.33", "1/3") and math_equal("0.333", "1/3")
    assert not math_equal("0.3", "1/3") and not math_equal("0.34", "1/3")


def test_exact_and_numeric_match():
    assert ExactMatch()(T, " 4 \n").value == 1.0
    assert ExactMatch()(T, "four").value == 0.0
    assert ExactMatch(ignore_case=True)(Task("t", "", "Paris"), "paris").value == 1.0
    assert NumericMatch()(T, "4.0").value == 1.0
    assert NumericMatch()(T, "4.01").value == 0.0
    assert NumericMatch(rel_tol=0.01)(T, "4.01").value == 1.0
    with pytest.raises(ValueError, match="not a number"):
        NumericMatch()(Task("t", "", "many"), "4")


def test_regex_format_modes_and_bad_pattern():
    think = RegexFormat(r"<think>.*</think>\s*<answer>.*</answer>", mode="fullmatch")
    assert think(T, "<think>hm</think> <answer>4</answer>").value == 1.0
    assert think(T, "<answer>4</answer>").value == 0.0
    assert RegexFormat(r"\d")(T, "the 4").value == 1.0
    assert RegexFormat(r"\d", mode="match")(T, "the 4").value == 0.0
    with pytest.raises(ValueError, match="bad pattern"):
        RegexFormat("(")
    with pytest.raises(ValueError, match="mode"):
        RegexFormat("x", mode="find")


def test_length_penalty_shape():
    lp = LengthPenalty(target=10, limit=20)
    assert [lp(T, "x" * n).value for n in (0, 10, 15, 20, 99)] == [0.0, 0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError):
        LengthPenalty(target=5, limit=5)


def test_weighted_keeps_parts_and_surfaces_errors():
    def broken(task, completion):
        raise RuntimeError("judge offline")

    w = Weighted([("correct", ExactMatch(), 1.0), ("format", RegexFormat(r"^\d+$"), 0.5), ("len", LengthPenalty(1, 3), 0.1)])
    s = w(T, "4")
    assert s.value == pytest.approx(1.5) and s.parts == {"correct": 1.0, "format": 1.0, "len": 0.0} and s.error is None
    s = Weighted([("correct", ExactMatch(), 1.0), ("judge", broken, 1.0)])(T, "4")
    assert s.error == f"judge: RuntimeError: judge offline (at {__file__}:58)" and s.parts["correct"] == 1.0
    with pytest.raises(ValueError, match="unique"):
        Weighted([("a", ExactMatch(), 1.0), ("a", ExactMatch(), 1.0)])


def test_call_reward_turns_failures_into_errored_scores():
    """An exception raised in the user's code (here, this file) is named with its file and line."""
    assert call_reward(lambda t, c: 1, T, "x") == Score(1.0)
    assert call_reward(lambda t, c: True, T, "x").value == 1.0
    s = call_reward(lambda t, c: 1 / 0, T, "x")
    assert s.value == 0.0 and s.error == f"ZeroDivisionError: division by zero (at {__file__}:73)"
    assert "expected a Score or a number" in call_reward(lambda t, c: "good", T, "x").error
    assert call_reward(lambda t, c: math.nan, T, "x").error
    assert as_score(Score(float("nan"))).error


def test_score_many_orders_results_and_times_out_per_call():
    def fn(task, completion):
        if completion == "hang":
            time.sleep(3)
        if completion == "raise":
            raise KeyError("missing")
        return float(completion)

    items = [(T, "1"), (T, "hang"), (T, "0.5"), (T, "raise"), (T, "hang"), (T, "0")]
    t0 = time.monotonic()
    out = score_many(fn, items, max_workers=2, timeout_s=0.3)
    assert time.monotonic() - t0 < 2.0  # two hung calls did not hold up the rest
    assert [s.value for s in out] == [1.0, 0.0, 0.5, 0.0, 0.0, 0.0]
    assert [s.error for s in out] == [None, "timed out after 0.3s", None, f"KeyError: 'missing' (at {__file__}:85)", "timed out after 0.3s", None]
    assert score_many(fn, [], max_workers=2) == []
    with pytest.raises(ValueError):
        score_many(fn, items, max_workers=0)


def test_score_many_accepts_environments():
    class Env:
        name = "env"

        def score(self, task, completion):
            return Score(float(completion == task.answer), parts={"ok": 1.0})

    out = score_many(Env(), [(T, "4"), (T, "5")] * 50, max_workers=4)
    assert [s.value for s in out] == [1.0, 0.0] * 50


class FakeEngine:
    """The engine protocol's generate(), replying with fixed text; records prompts."""

    def __init__(self, reply: str):
        self.reply, self.prompts = reply, []

    def generate(self, prompts, params):
        self.prompts += prompts
        return [RequestOutput(str(i), [], [CompletionOutput(0, [1, 2], [0.0, 0.0], "stop", self.reply)]) for i, _ in enumerate(prompts)]


class CharTok:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_llm_judge_reads_scores_and_reports_unreadable_replies():
    engine = FakeEngine(" Score: 8")
    s = LLMJudge(engine, max_score=10)(T, "4")
    assert s.value == pytest.approx(0.8) and s.info["raw_score"] == 8.0 and s.error is None
    assert "Answer: 4" in engine.prompts[0] and "2+2=" in engine.prompts[0]
    tok_engine = FakeEngine("")
    tok_engine.reply = ""  # text empty: the judge decodes token ids through the tokenizer
    s2 = LLMJudge(tok_engine, tokenizer=CharTok(), score_pattern=r"(\d+)")(T, "4")
    # An unreadable reply is a wrong answer with its reason, never errored: a completion that talks the judge out
    # of grading must not escape the wrong answer's penalty.
    assert isinstance(tok_engine.prompts[0], list) and s2.error is None and "no score" in s2.info["reason"]
    s3 = LLMJudge(FakeEngine("I refuse"))(T, "4")
    assert s3.value == 0.0 and s3.error is None and "no score" in s3.info["reason"]
    assert LLMJudge(FakeEngine("Score: 99"))(T, "4").value == 1.0  # clipped to [0, 1]
    with pytest.raises(TypeError, match="generate"):
        LLMJudge(object())


def test_a_reward_error_names_the_users_line_not_rollwise_or_a_library(tmp_path):
    """The innermost frame in the user's own file, past the standard library it called; none when rollwise raised."""
    from rollwise.rewards.base import describe_at

    (tmp_path / "r.py").write_text("import json\n\ndef reward(task, completion):\n    return json.loads(completion)\n")
    from rollwise.rewards.user import load_reward

    s = load_reward(f"{tmp_path}/r.py:reward")(T, "not json")
    assert s.error.startswith("reward: JSONDecodeError: ") and s.error.endswith(f"(at {tmp_path}/r.py:4)")
    from rollwise.config import load_config
    from rollwise.rewards.base import describe

    with pytest.raises(ValueError) as raised:
        load_config(None, ["train.no_such_key=1"])  # raised inside rollwise: its own message, no user line
    assert describe_at(raised.value) == describe(raised.value) and "(at " not in describe(raised.value)
