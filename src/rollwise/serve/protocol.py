"""Request parsing and response shaping for the OpenAI-compatible server. Pure: JSON in, dataclasses out.

Why its own module: every check a client can fail lives here, at the boundary, as an `APIError` with a
one-line message and an HTTP status; the HTTP layer (app.py) and the engine thread (worker.py) never see
an unvalidated field. No torch and no tokenizer calls here (the caller passes a `ModelInfo`).

Field names follow vLLM's OpenAI-compatible server (`vllm/entrypoints/openai/protocol.py`:
CompletionRequest, ChatCompletionRequest and their responses). Unknown fields are ignored, as vLLM does;
known OpenAI/vLLM fields that rollwise cannot honour (beam search, penalties, logit bias, echo, guided
decoding ...) are rejected with 400 unless they carry their neutral default, so a client never gets
silently different sampling than it asked for.

Left out on purpose: prompt log-probs, alternatives in `top_logprobs` (the engine computes the sampled
token's log-prob only; each top_logprobs entry holds that token alone), tools and response formats.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rollwise.types import CompletionOutput, SamplingParams

MAX_LOGPROBS = 20
"""Largest `logprobs` / `top_logprobs` accepted (vLLM's default --max-logprobs)."""
MAX_N = 1024
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


class APIError(Exception):
    """A client mistake (4xx) or a server failure (5xx), rendered as OpenAI's error JSON."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
             404: "not_found_error", 405: "invalid_request_error", 411: "invalid_request_error",
             408: "timeout_error", 413: "invalid_request_error", 414: "invalid_request_error",
             431: "invalid_request_error", 500: "internal_error", 501: "invalid_request_error",
             503: "service_unavailable", 505: "invalid_request_error"}

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def to_json(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.status}}


@dataclass
class ModelInfo:
    """What request validation needs to know about the served model."""

    name: str
    max_model_len: int
    vocab_size: int
    max_num_seqs: int
    has_tokenizer: bool


@dataclass
class GenerationRequest:
    """A validated /v1/completions or /v1/chat/completions request. Prompts are still text or token ids."""

    model: str
    prompts: list[str | list[int]]  # one entry per prompt; chat requests hold the rendered conversation
    params: SamplingParams
    max_tokens: int | None  # None: fill the context (chat default); resolved per prompt by `resolve_max_tokens`
    logprobs: int | None  # None: no log-probs; k: sampled token's log-prob (+ k-sized top list, see docstring)
    stream: bool = False
    include_usage: bool = False
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False
    add_special_tokens: bool = True
    messages: list[dict[str, str]] = field(default_factory=list)  # chat only
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


# ---------------------------------------------------------------------------------------------- checks
def _bad(msg: str, param: str | None = None) -> APIError:
    return APIError(400, msg, param)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(body: dict, name: str, default: int | None, lo: int | None = None, hi: int | None = None) -> int | None:
    v = body.get(name, default)
    if v is None:
        return None
    if not _is_int(v):
        raise _bad(f"'{name}' must be an integer, got {type(v).__name__} {v!r}", name)
    if lo is not None and v < lo:
        raise _bad(f"'{name}' must be >= {lo}, got {v}", name)
    if hi is not None and v > hi:
        raise _bad(f"'{name}' must be <= {hi}, got {v}", name)
    return v


def _float(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not _is_num(v):
        raise _bad(f"'{name}' must be a number, got {type(v).__name__} {v!r}", name)
    if v != v or (v <= lo if lo_open else v < lo) or v > hi:
        lo_txt = f"> {lo}" if lo_open else f">= {lo}"
        raise _bad(f"'{name}' must be {lo_txt} and <= {hi}, got {v}", name)
    return float(v)


def _bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(f"'{name}' must be true or false, got {type(v).__name__} {v!r}", name)
    return v


def _unsupported(body: dict) -> None:
    """Reject OpenAI/vLLM features rollwise does not implement, unless they hold their neutral value."""
    neutral: dict[str, tuple[Any, ...]] = {
        "echo": (None, False), "suffix": (None, ""), "logit_bias": (None, {}), "presence_penalty": (None, 0, 0.0),
        "frequency_penalty": (None, 0, 0.0), "repetition_penalty": (None, 1, 1.0), "min_p": (None, 0, 0.0),
        "min_tokens": (None, 0), "use_beam_search": (None, False), "prompt_logprobs": (None,),
        "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
        "tools": (None, []), "prompt_embeds": (None,), "allowed_token_ids": (None,), "bad_words": (None, []),
        "include_stop_str_in_output": (None, False), "truncate_prompt_tokens": (None,), "length_penalty": (None, 1, 1.0),
        "continue_final_message": (None, False),
    }
    for name, ok in neutral.items():
        v = body.get(name)
        if name in body and not any(v is o or (type(v) is type(o) and v == o) for o in ok):
            raise _bad(f"'{name}' is not supported by rollwise serve (got {body[name]!r})", name)
    rf = body.get("response_format")
    if rf is not None and rf != {"type": "text"}:
        raise _bad("'response_format' other than {'type': 'text'} is not supported by rollwise serve", "response_format")


def _check_model(body: dict, info: ModelInfo) -> str:
    model = body.get("model")
    if model is None:
        raise _bad(f"'model' is required; this server serves {info.name!r}", "model")
    if not isinstance(model, str):
        raise _bad(f"'model' must be a string, got {type(model).__name__}", "model")
    if model != info.name:
        raise APIError(404, f"model {model!r} does not exist; this server serves {info.name!r}", "model")
    return model


def _sampling(body: dict, info: ModelInfo, n_default: int = 1) -> tuple[SamplingParams, int | None]:
    """SamplingParams from the shared sampling fields, with max_tokens left for per-prompt resolution."""
    n = _int(body, "n", n_default, 1, min(MAX_N, info.max_num_seqs))
    best_of = _int(body, "best_of", None)
    if best_of is not None and best_of != n:
        raise _bad("'best_of' other than n is not supported by rollwise serve", "best_of")
    temperature = _float(body, "temperature", 1.0, 0.0, 100.0)
    top_p = _float(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    top_k = _int(body, "top_k", -1, -1, info.vocab_size)
    seed = _int(body, "seed", None, _LONG_MIN, _LONG_MAX)
    stop = body.get("stop")
    if stop is None or stop == []:
        stops = None
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise _bad("'stop' must be a string or a list of strings", "stop")
    if stops is not None:
        if any(s == "" for s in stops):
            raise _bad("'stop' strings must be non-empty", "stop")
        if len(stops) > 64:
            raise _bad(f"at most 64 'stop' strings are allowed, got {len(stops)}", "stop")
        if not info.has_tokenizer:
            raise _bad("'stop' strings need a tokenizer and this model has none; use 'stop_token_ids'", "stop")
    sti = body.get("stop_token_ids")
    if sti is None or sti == []:
        stop_ids = None
    elif isinstance(sti, list) and all(_is_int(t) for t in sti):
        bad = [t for t in sti if not 0 <= t < info.vocab_size]
        if bad:
            raise _bad(f"'stop_token_ids' has ids outside the vocabulary [0, {info.vocab_size}): {bad[:5]}",
                       "stop_token_ids")
        stop_ids = list(sti)
    else:
        raise _bad("'stop_token_ids' must be a list of integers", "stop_token_ids")
    ignore_eos = _bool(body, "ignore_eos", False)
    max_tokens = _int(body, "max_tokens", None)
    mct = _int(body, "max_completion_tokens", None)
    if mct is not None:
        max_tokens = mct
    if max_tokens is not None and max_tokens < 1:
        raise _bad(f"'max_tokens' must be at least 1, got {max_tokens}", "max_tokens")
    if max_tokens is not None and max_tokens > info.max_model_len:
        raise _bad(f"'max_tokens' is {max_tokens} but this model's maximum context length is "
                   f"{info.max_model_len} tokens", "max_tokens")
    # max_tokens=1 is a placeholder: the real value is set per prompt by `resolve_max_tokens`.
    sp = SamplingParams(n=n, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens or 1,
                        stop_token_ids=stop_ids, stop=stops, seed=seed, logprobs=True, ignore_eos=ignore_eos)
    return sp, max_tokens


def _stream_options(body: dict, stream: bool) -> bool:
    so = body.get("stream_options")
    if so is None:
        return False
    if not isinstance(so, dict):
        raise _bad("'stream_options' must be an object", "stream_options")
    if not stream:
        raise _bad("'stream_options' can only be set when 'stream' is true", "stream_options")
    return _bool(so, "include_usage", False)


def _token_list(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(_is_int(t) for t in v)


def parse_completion(body: Any, info: ModelInfo) -> GenerationRequest:
    """Validate a /v1/completions body. Prompt: str, list[str], list[int] or list[list[int]] (as vLLM)."""
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    model = _check_model(body, info)
    _unsupported(body)
    p = body.get("prompt")
    if p is None:
        raise _bad("'prompt' is required", "prompt")
    if isinstance(p, str):
        prompts: list[str | list[int]] = [p]
    elif _token_list(p):
        prompts = [list(p)]
    elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        prompts = list(p)
    elif isinstance(p, list) and p and all(_token_list(x) for x in p):
        prompts = [list(x) for x in p]
    else:
        raise _bad("'prompt' must be a non-empty string, list of strings, list of token ids, or list of token-id"
                   " lists", "prompt")
    if len(prompts) > 4096:
        raise _bad(f"at most 4096 prompts per request, got {len(prompts)}", "prompt")
    for x in prompts:
        if isinstance(x, str):
            if not info.has_tokenizer:
                raise _bad("this model has no tokenizer: send 'prompt' as token ids", "prompt")
            if x == "":
                raise _bad("'prompt' must not be empty", "prompt")
        else:
            bad = [t for t in x if not 0 <= t < info.vocab_size]
            if bad:
                raise _bad(f"'prompt' has token ids outside the vocabulary [0, {info.vocab_size}): {bad[:5]}",
                           "prompt")
    sp, max_tokens = _sampling(body, info)
    lp = _int(body, "logprobs", None, 0, MAX_LOGPROBS)
    stream = _bool(body, "stream", False)
    return GenerationRequest(
        model=model, prompts=prompts, params=sp, max_tokens=max_tokens if max_tokens is not None else 16,
        logprobs=lp, stream=stream, include_usage=_stream_options(body, stream),
        return_tokens_as_token_ids=_bool(body, "return_tokens_as_token_ids", False),
        return_token_ids=_bool(body, "return_token_ids", False),
        add_special_tokens=_bool(body, "add_special_tokens", True),
    )


_ROLES = ("system", "user", "assistant", "tool", "developer")


def _message_text(m: Any, i: int) -> dict[str, str]:
    if not isinstance(m, dict):
        raise _bad(f"messages[{i}] must be an object with 'role' and 'content'", "messages")
    role = m.get("role")
    if role not in _ROLES:
        raise _bad(f"messages[{i}].role must be one of {', '.join(_ROLES)}, got {role!r}", "messages")
    c = m.get("content")
    if c is None:
        c = ""
    if isinstance(c, list):  # OpenAI content parts: only text parts are supported
        parts = []
        for part in c:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise _bad(f"messages[{i}].content parts must be {{'type': 'text', 'text': ...}}", "messages")
            parts.append(part["text"])
        c = "".join(parts)
    if not isinstance(c, str):
        raise _bad(f"messages[{i}].content must be a string or a list of text parts", "messages")
    return {"role": role, "content": c}


def parse_chat(body: Any, info: ModelInfo) -> GenerationRequest:
    """Validate a /v1/chat/completions body; the caller renders `messages` into `prompts[0]`."""
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    model = _check_model(body, info)
    _unsupported(body)
    if not info.has_tokenizer:
        raise _bad("chat completions need a tokenizer and this model has none; use /v1/completions with token ids")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("'messages' must be a non-empty list", "messages")
    messages = [_message_text(m, i) for i, m in enumerate(msgs)]
    sp, max_tokens = _sampling(body, info)
    want_lp = _bool(body, "logprobs", False)
    top = _int(body, "top_logprobs", None, 0, MAX_LOGPROBS)
    if top and not want_lp:
        raise _bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    stream = _bool(body, "stream", False)
    return GenerationRequest(
        model=model, prompts=[""], params=sp, max_tokens=max_tokens, logprobs=(top or 0) if want_lp else None,
        stream=stream, include_usage=_stream_options(body, stream),
        return_tokens_as_token_ids=_bool(body, "return_tokens_as_token_ids", False),
        return_token_ids=_bool(body, "return_token_ids", False),
        add_special_tokens=_bool(body, "add_special_tokens", False), messages=messages,
    )


def resolve_max_tokens(req: GenerationRequest, prompt_len: int, info: ModelInfo) -> int:
    """max_tokens for one prompt, or a 400 naming the lengths when prompt + output cannot fit the context."""
    if prompt_len >= info.max_model_len:
        raise _bad(f"the prompt has {prompt_len} tokens but this model's maximum context length is "
                   f"{info.max_model_len} tokens (prompt + output)", "prompt")
    room = info.max_model_len - prompt_len
    if req.max_tokens is None:
        return room
    if req.max_tokens > room:
        raise _bad(f"this model's maximum context length is {info.max_model_len} tokens, but you requested "
                   f"{prompt_len + req.max_tokens} ({prompt_len} in the prompt, {req.max_tokens} for the output);"
                   f" lower 'max_tokens' or shorten the prompt", "max_tokens")
    return req.max_tokens


# ---------------------------------------------------------------------------------------------- responses
@dataclass
class TokenText:
    """Per-token strings of one sample (tokenizer output), for log-prob objects."""

    pieces: list[str]  # [num_tokens]


def stop_reason(out: CompletionOutput, params: SamplingParams, full_text: str | None,
                eos_ids: frozenset[int]) -> int | str | None:
    """vLLM's `stop_reason`: the stop string or stop token id that ended the sample; None for EOS/length."""
    if out.finish_reason != "stop" or not out.token_ids:
        return None
    last = out.token_ids[-1]
    if params.stop_token_ids and last in params.stop_token_ids and not (last in eos_ids and not params.ignore_eos):
        return last
    if params.stop and full_text is not None:
        for s in params.stop:
            if full_text.startswith(s, len(out.text)):
                return s
    return None


def _lp(x: float) -> float:
    """JSON has no -inf: a token whose probability underflowed reports vLLM's floor, -9999.0."""
    return x if math.isfinite(x) else -9999.0


def _tok_str(tid: int, piece: str, as_ids: bool) -> str:
    return f"token_id:{tid}" if as_ids else piece


def completion_logprobs(ids: list[int], lps: list[float], pieces: list[str], k: int, as_ids: bool,
                        offset0: int = 0, text_pieces: list[str] | None = None) -> dict[str, Any]:
    """OpenAI legacy completions `logprobs` object: tokens, token_logprobs, text_offset, top_logprobs.

    `text_pieces` are the tokens' shares of the completion text (special tokens add nothing to it), so
    `text_offset[i]` is where token i starts in `text`, counted from the completion's start (no echo)."""
    tokens = [_tok_str(t, p, as_ids) for t, p in zip(ids, pieces)]
    offsets, pos = [], offset0
    for p in text_pieces if text_pieces is not None else pieces:
        offsets.append(pos)
        pos += len(p)
    lps = [_lp(x) for x in lps]
    top = [{tok: lp} if k > 0 else None for tok, lp in zip(tokens, lps)]
    return {"tokens": tokens, "token_logprobs": lps, "text_offset": offsets, "top_logprobs": top}


def chat_logprobs(ids: list[int], lps: list[float], pieces: list[str], k: int, as_ids: bool) -> dict[str, Any]:
    """OpenAI chat `logprobs` object: content[] = {token, logprob, bytes, top_logprobs}."""
    content = []
    for t, p, lp in zip(ids, pieces, lps):
        tok = _tok_str(t, p, as_ids)
        entry = {"token": tok, "logprob": _lp(lp), "bytes": list(tok.encode("utf-8"))}
        entry["top_logprobs"] = [dict(entry)] if k > 0 else []
        content.append(entry)
    return {"content": content}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
