"""What a remote engine's answer must look like before a token of it reaches the store or the trainer.

A remote server (vLLM, SGLang, `rollwise serve`, or anything that answers on its port) is outside rollwise's
trust: a bug, a version mismatch or a hostile process there must not train the policy on garbage. Every choice
of every response goes through `parse_choice`: token ids are integers inside the vocabulary, log-probs are finite
and not above 0, a sample is no longer than `max_tokens`, weight versions are ones this client loaded, and the
text is decoded by rollwise from the token ids (the server's `text` is never scored: it could say anything).

A violation raises `RemoteEngineError` naming the field and the value; the caller prefixes the server.

The server's own `text` is still compared with the decoded ids (`same_text`): a server whose text says something
else is counted (`TextTally`, the engine's `text_mismatch` counter in every step's metrics) and refused once more
than `TEXT_MISMATCH_MAX_FRACTION` of its samples disagree.

Deliberately left out: checking that log-probs are *right* (that needs the policy: `run.sync_check` does it after
every weight sync with a probe).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from rollwise.types import CompletionOutput

TEXT_MISMATCH_MAX_FRACTION = 0.2
"""A server whose text disagrees with its ids on more than this fraction of its samples is refused..."""
TEXT_MISMATCH_MIN_SAMPLES = 32
"""...once it has answered at least this many (a detokenizer's rare edge case is counted, never refused alone)."""
LOGPROB_SLACK = 1e-4
"""A log-prob may exceed 0 by float rounding (log_softmax of a near-certain token); more than this is garbage."""


class RemoteEngineError(RuntimeError):
    """A remote server failed, refused a request, answered garbage or did not answer in time; the message says
    which server and which field."""


@dataclass(frozen=True)
class ChoiceLimits:
    """Bounds one choice of one response must stay within."""

    max_tokens: int
    """The request's max_tokens (a longer sample is refused)."""
    vocab_size: int | None
    """Token ids must be in [0, vocab_size); None: only non-negative is checked (no tokenizer known)."""
    versions: tuple[int, int]
    """[lowest, highest] weight version this client has loaded and not yet superseded during the request."""


def _int_list(x: Any, field: str) -> list[int]:
    if not isinstance(x, list):
        raise RemoteEngineError(f"'{field}' is {type(x).__name__}, not a list")
    out = []
    for t in x:
        if isinstance(t, bool) or not isinstance(t, int):
            raise RemoteEngineError(f"'{field}' holds {t!r:.40}, not an integer")
        out.append(t)
    return out


def token_ids_of(ch: dict[str, Any], field_prefix: str) -> list[int]:
    """The choice's sampled token ids: vLLM's `token_ids`, else `logprobs.tokens` spelled `token_id:N`."""
    ids = ch.get("token_ids")
    if ids is not None:
        return _int_list(ids, f"{field_prefix}.token_ids")
    toks = (ch.get("logprobs") or {}).get("tokens") if isinstance(ch.get("logprobs"), dict) else None
    if toks is None:
        raise RemoteEngineError(f"{field_prefix} has no token ids: the server must support vLLM's "
                                "'return_token_ids' or 'return_tokens_as_token_ids'")
    out = []
    for t in toks if isinstance(toks, list) else [toks]:
        if not (isinstance(t, str) and t.startswith("token_id:") and t[9:].lstrip("-").isdigit()):
            raise RemoteEngineError(f"{field_prefix}.logprobs.tokens holds {t!r:.40}, not 'token_id:N'")
        out.append(int(t[9:]))
    return out


def logprobs_of(ch: dict[str, Any], field_prefix: str) -> list[float]:
    lp = ch.get("logprobs")
    if not isinstance(lp, dict) or "token_logprobs" not in lp:
        raise RemoteEngineError(f"{field_prefix} has no 'logprobs.token_logprobs' for a request with logprobs=1")
    vals = lp["token_logprobs"]
    if not isinstance(vals, list):
        raise RemoteEngineError(f"{field_prefix}.logprobs.token_logprobs is {type(vals).__name__}, not a list")
    out = []
    for x in vals:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise RemoteEngineError(f"{field_prefix}.logprobs.token_logprobs holds {x!r:.40}, not a number")
        if not math.isfinite(x) or x > LOGPROB_SLACK:
            raise RemoteEngineError(f"{field_prefix}.logprobs.token_logprobs holds {x!r}: a log-prob is finite and <= 0")
        out.append(min(float(x), 0.0))
    return out


def check_length(n: int, limits: ChoiceLimits, field: str) -> None:
    if n > limits.max_tokens:
        raise RemoteEngineError(f"{field}: {n} tokens for max_tokens={limits.max_tokens}")


def check_vocab(ids: list[int], limits: ChoiceLimits, field: str) -> None:
    for t in ids:
        if t < 0 or (limits.vocab_size is not None and t >= limits.vocab_size):
            raise RemoteEngineError(f"{field}: token id {t} is outside the vocabulary "
                                    f"[0, {limits.vocab_size if limits.vocab_size is not None else 'inf'})")


def chunk_tokens(ch: dict[str, Any], field: str) -> tuple[list[int], list[float]]:
    """The token ids and log-probs of one streamed chunk of a choice (both empty for a chunk that only ends it)."""
    lp = ch.get("logprobs")
    if ch.get("token_ids") is None and not (isinstance(lp, dict) and lp.get("tokens")):
        return [], []
    ids = token_ids_of(ch, field)
    lps = logprobs_of(ch, field) if ids else []
    if len(lps) != len(ids):
        raise RemoteEngineError(f"{field}: {len(ids)} token ids but {len(lps)} log-probs")
    return ids, lps


def versions_of(ch: dict[str, Any], top: Any, n: int, limits: ChoiceLimits, field: str) -> list[int]:
    """Per-token weight versions: the choice's own `weight_versions` (rollwise serve), else the response's
    `weight_version`, else the version this client had loaded; each must be one the client loaded."""
    lo, hi = limits.versions
    vs = ch.get("weight_versions")
    if vs is not None:
        vs = _int_list(vs, f"{field}.weight_versions")
        if len(vs) != n:
            raise RemoteEngineError(f"{field}.weight_versions has {len(vs)} entries for {n} tokens")
    elif top is not None:
        if isinstance(top, str) and top.isdigit():
            top = int(top)
        if isinstance(top, bool) or not isinstance(top, int):
            raise RemoteEngineError(f"'weight_version' is {top!r:.40}, not an integer")
        vs = [top] * n
    else:
        vs = [hi] * n
    for v in vs:
        if not lo <= v <= hi:
            raise RemoteEngineError(f"{field}: weight version {v} was never loaded through this client "
                                    f"(expected {lo}..{hi})")
    return vs


def parse_choice(ch: Any, j: int, top_version: Any, limits: ChoiceLimits,
                 decode: Callable[[list[int]], str] | None) -> CompletionOutput:
    """One validated `CompletionOutput` from choice `j` of a completions response."""
    field = f"choices[{j}]"
    if not isinstance(ch, dict):
        raise RemoteEngineError(f"{field} is {type(ch).__name__}, not an object")
    ids = token_ids_of(ch, field)
    lps = logprobs_of(ch, field)
    if len(lps) != len(ids):
        raise RemoteEngineError(f"{field}: {len(ids)} token ids but {len(lps)} log-probs")
    check_length(len(ids), limits, field)
    check_vocab(ids, limits, field)
    versions = versions_of(ch, top_version, len(ids), limits, field)
    reason = ch.get("finish_reason")
    if reason not in ("stop", "length", "abort", None):
        raise RemoteEngineError(f"{field}.finish_reason is {reason!r:.40}")
    text = decode(ids) if decode is not None else ""
    return CompletionOutput(index=j, token_ids=ids, logprobs=lps, finish_reason=reason or "stop", text=text,
                            weight_versions=versions)


def ordered_choices(data: Any, n: int) -> list[Any]:
    """The response's choices sorted by `index`, exactly one per index 0..n-1."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        raise RemoteEngineError(f"the response has no 'choices' list: {data!r:.200}")
    by_index: dict[int, Any] = {}
    for c in data["choices"]:
        i = c.get("index") if isinstance(c, dict) else None
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n or i in by_index:
            raise RemoteEngineError(f"choices: bad or repeated index {i!r:.20} for n={n}")
        by_index[i] = c
    if len(by_index) != n:
        raise RemoteEngineError(f"{len(by_index)} choices for n={n}")
    return [by_index[i] for i in range(n)]


def same_text(server_text: str, decoded: str) -> bool:
    """Whether the server's text says what the ids say, up to what honest detokenizers differ on: whitespace (the
    clean-up of spaces around punctuation) and an incomplete UTF-8 character held back at the end."""
    def norm(t: str) -> str:
        return "".join(t.split()).rstrip("\ufffd")

    return norm(server_text) == norm(decoded)


@dataclass
class TextTally:
    """One server's samples and how many of them came with a text that disagrees with their ids (thread-safe); the
    caller names the server in the error."""

    samples: int = 0
    mismatched: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, pairs: list[tuple[Any, str]]) -> None:
        """Count one answer's samples, each as (the server's text, the text decoded from its ids); raise
        RemoteEngineError when the server's text has disagreed too often. A missing or empty server text says
        nothing and is not a disagreement."""
        bad = sum(1 for said, decoded in pairs if isinstance(said, str) and said and not same_text(said, decoded))
        with self._lock:
            self.samples += len(pairs)
            self.mismatched += bad
            samples, mismatched = self.samples, self.mismatched
        if samples >= TEXT_MISMATCH_MIN_SAMPLES and mismatched > TEXT_MISMATCH_MAX_FRACTION * samples:
            raise RemoteEngineError(f"the text of {mismatched} of the server's {samples} samples disagrees "
                                    "with their token ids (the ids are what rollwise scores and trains on): a server "
                                    "that misreports what it generated is not used")
