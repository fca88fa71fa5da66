"""rollwise.rewards: verifiers and reward functions, all shaped `fn(task, completion) -> Score`.

math (answer extraction + math-verify), exact/numeric match, regex format, length penalty, weighted
composition, code tests in the sandbox, an LLM judge, and `score_many` for concurrent scoring with
per-call timeouts. Import the submodules directly; this file only re-exports the common names.
"""

from rollwise.rewards.base import RewardFn, as_score, call_reward
from rollwise.rewards.compose import Weighted
from rollwise.rewards.concurrent import score_many
from rollwise.rewards.format import LengthPenalty, RegexFormat
from rollwise.rewards.match import ExactMatch, NumericMatch, exact_match, numeric_match
from rollwise.rewards.math import extract_answer, math_equal, math_reward, verify_math

__all__ = [
    "RewardFn", "as_score", "call_reward", "Weighted", "score_many", "LengthPenalty", "RegexFormat",
    "ExactMatch", "NumericMatch", "exact_match", "numeric_match", "extract_answer", "math_equal",
    "math_reward", "verify_math",
]
