"""Chat messages -> prompt text, through the one prompt builder train, eval and generate use too.

`render_chat` is `rollwise.models.prompting.PromptFormat().render` on a message list: the tokenizer's own chat
template with the generation prompt, or, for tokenizers without one (the tiny char-level checkpoints
rollwise builds; transformers refuses to guess a template), a plain documented fallback that clients and
tests can reproduce exactly:

    "{role}: {content}\n" for each message, then "assistant: "
"""

from __future__ import annotations

from typing import Any

from rollwise.models.prompting import FALLBACK_ASSISTANT_PREFIX, PromptFormat

__all__ = ["FALLBACK_ASSISTANT_PREFIX", "render_chat"]

_CHAT = PromptFormat()  # "auto": the template when the tokenizer has one; a request's messages are used as given


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The prompt text for `messages`, ending where the assistant's reply begins."""
    text, _ = _CHAT.render(tokenizer, messages)
    return text
