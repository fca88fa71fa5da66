"""Chat messages -> prompt text: the tokenizer's own chat template, or a small documented fallback.

Why a fallback at all: the tiny char-level checkpoints rollwise builds carry no chat template, and
transformers refuses to guess one. The fallback is plain and stable so that clients (and tests) can
reproduce it exactly:

    "{role}: {content}\n" for each message, then "assistant: "
"""

from __future__ import annotations

from typing import Any

FALLBACK_ASSISTANT_PREFIX = "assistant: "


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The prompt text for `messages`, ending where the assistant's reply begins."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + FALLBACK_ASSISTANT_PREFIX
