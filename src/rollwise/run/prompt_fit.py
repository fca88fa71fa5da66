"""Prompts that cannot fit the model's context, found before the first step instead of at the first request.

The engine refuses a prompt of `max_model_len` tokens or more (no room to generate a token), with a message
that names neither the task nor the row. `check_prompts_fit` encodes the prompts as the run will (`encode`:
chat template, system prompt) and raises one line naming the first task that does not fit (a dataset task's
id carries its file and row) and how many others do not.

Encoding every prompt through a chat template costs about a millisecond each (seconds for GSM8K's 7,473), so
a prompt is encoded only when a cheap bound says it might not fit: a prompt's tokens are at most its UTF-8
bytes for byte-level BPE, SentencePiece and character tokenizers, and the bound takes twice that plus the
template's own tokens. A prompt the bound wrongly skips is still refused by the engine, as before.

Deliberately left out: prompts within the context but over a token budget (the engine's chunked prefill handles
those) and multi-turn episodes' later turns (bounded by `env.max_episode_tokens`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from rollwise.types import Task

MESSAGE_SLACK = 32
"""Tokens allowed per chat message for role markers and separators in the cheap bound."""


def engine_context(engine: object) -> int | None:
    """The longest sequence (prompt + output) an engine takes, when it says: `LLM.engine.max_model_len` or an
    engine's own `max_model_len`; None for engines that do not say (a remote server checks its own)."""
    for obj in (engine, getattr(engine, "engine", None)):
        n = getattr(obj, "max_model_len", None)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


def _bytes_and_messages(prompt: Any) -> tuple[int, int]:
    if isinstance(prompt, str):
        return len(prompt.encode("utf-8", "surrogatepass")), 1
    if isinstance(prompt, list):
        return sum(len(str(m.get("content", "")).encode("utf-8", "surrogatepass")) if isinstance(m, dict) else 0
                   for m in prompt), len(prompt)
    return len(str(prompt).encode("utf-8", "surrogatepass")), 1


def check_prompts_fit(tasks: Sequence[Task], encode: Callable[[Task], list[int]], max_model_len: int | None,
                      what: str = "prompt") -> None:
    """ValueError, one line, when some task's encoded prompt has `max_model_len` tokens or more (see the module
    docstring); nothing when all fit or the context is unknown."""
    if not max_model_len or not tasks:
        return
    overhead = len(encode(Task(id="probe", prompt="x", answer=None)))  # template and system prompt tokens
    too_long: list[tuple[Task, int]] = []
    for t in tasks:
        nbytes, nmsg = _bytes_and_messages(t.prompt)
        if 2 * nbytes + overhead + MESSAGE_SLACK * nmsg < max_model_len:
            continue
        n = len(encode(t))
        if n >= max_model_len:
            too_long.append((t, n))
    if too_long:
        t, n = too_long[0]
        k = len(too_long) - 1
        more = f"; {k} more {what}{'s do' if k > 1 else ' does'} not fit either" if k else ""
        raise ValueError(f"{what} of task {t.id} is {n} tokens as encoded for the model, which leaves no room to "
                         f"generate within its context of {max_model_len} tokens (engine.max_model_len): shorten it "
                         f"or drop the row{more}")
