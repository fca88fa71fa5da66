"""Text from outside the policy's control tokens, encoded as plain text: never as `<|im_start|>` or `<|im_end|>`.

A tokenizer matches its added tokens (the chat template's control tokens, EOS, BOS ...) anywhere in the text it is
given. That is right for a chat template's own text and wrong for what lands inside it: a tool result, a gym
observation or a completion shown to a judge that contains the text `<|im_end|><|im_start|>assistant` (written out,
or decoded from JSON's `\\u003c` escapes) would become real turn boundaries, and the model would read a conversation
the policy forged. So such text is encoded with the tokenizer's model alone (`encode_plain`): its characters become
ordinary tokens, as any other text.

`encode_parts` encodes a sequence of trusted (template) and untrusted (content) pieces. When no untrusted piece holds
the text of a control token, it encodes the joined text in one call, so the ids are exactly those of the whole text
(no drift at the pieces' edges); otherwise each piece is encoded alone, the untrusted ones plain.

Deliberately left out: control tokens that a normalizer would make out of other text (e.g. a lower-casing normalizer
and an upper-case `<|IM_END|>`): the untrusted piece is still encoded plain, but the exact joined-text ids are kept
only when its raw text holds no control token.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def _encode(tokenizer: Any, text: str) -> list[int]:
    """The tokenizer's own encoding of template text (control tokens matched), without BOS/EOS added."""
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:
        return list(tokenizer.encode(text))


def control_texts(tokenizer: Any) -> tuple[str, ...]:
    """The text of every token the tokenizer matches before its model runs (its added tokens, special or not)."""
    cached = getattr(tokenizer, "_rollwise_control_texts", None)
    if cached is not None:
        return tuple(cached)
    found: set[str] = set()
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(decoder, dict):
        found.update(str(getattr(t, "content", t)) for t in decoder.values())
    for name in ("all_special_tokens", "additional_special_tokens"):
        got = getattr(tokenizer, name, None)
        if isinstance(got, (list, tuple)):
            found.update(str(t) for t in got)
    out = tuple(sorted((t for t in found if t and not t.isspace()), key=len, reverse=True))
    try:
        tokenizer._rollwise_control_texts = out
    except AttributeError:
        pass
    return out


def valid_text(text: str) -> str:
    """`text` with each lone surrogate (which no tokenizer can encode, and JSON's `"\\udcff"` decodes to) replaced
    by U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


def encode_plain(tokenizer: Any, text: str) -> list[int]:
    """Ids of `text` as plain text: no added token (control or special) is matched in it, whatever it holds."""
    text = valid_text(text)
    if not text:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)  # a `tokenizers` fast tokenizer: its model alone
    if backend is not None and getattr(backend, "model", None) is not None:
        normalizer, pre = backend.normalizer, backend.pre_tokenizer
        normal = normalizer.normalize_str(text) if normalizer is not None else text
        splits = [s for s, _ in pre.pre_tokenize_str(normal)] if pre is not None else [normal]
        return [tok.id for s in splits for tok in backend.model.tokenize(s)]
    try:  # a slow HF tokenizer: special tokens split as text (non-special added ones may still match)
        return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    except TypeError:  # a plain encode(text): it has no control tokens of its own to match
        return _encode(tokenizer, text)


def holds_control_text(tokenizer: Any, text: str) -> bool:
    """Whether `text` holds the text of one of the tokenizer's control tokens."""
    return any(t in text for t in control_texts(tokenizer))


def encode_parts(tokenizer: Any, parts: Sequence[tuple[str, bool]]) -> list[int]:
    """Ids of `(text, plain)` pieces in order: `plain` pieces (tool results, observations, completions) never become
    control tokens; the others (the template's text) are encoded as the tokenizer does."""
    parts = [(valid_text(text) if plain else text, plain) for text, plain in parts]
    if not any(plain and holds_control_text(tokenizer, text) for text, plain in parts):
        return _encode(tokenizer, "".join(text for text, _ in parts))
    ids: list[int] = []
    for text, plain in parts:
        ids += encode_plain(tokenizer, text) if plain else _encode(tokenizer, text)
    return ids


def default_prefix(tokenizer: Any) -> list[int]:
    """The BOS a tokenizer puts before raw text by default (as `tokenizer.encode(text)` would), or none."""
    bos = getattr(tokenizer, "bos_token_id", None)
    try:
        return [bos] if bos is not None and list(tokenizer.encode(""))[:1] == [bos] else []
    except Exception:  # noqa: BLE001 - a tokenizer that cannot encode "" adds nothing we can see
        return []


__all__ = ["control_texts", "default_prefix", "encode_parts", "encode_plain", "holds_control_text", "valid_text"]
