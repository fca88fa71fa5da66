"""An agent written against an OpenAI client, trained by rollwise as it is (docs/agents.md).

    env:
      agent: recipes/agents/calc_agent.py:agent
      reward: recipes/agents/calc_agent.py:correct

The rows carry a `prompt` and an `answer` column; the agent may call its own `add` tool before answering.
"""

from __future__ import annotations

import json
import re
from typing import Any

CALC = {"type": "function", "function": {"name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}}


def agent(client: Any, row: dict[str, Any]) -> str | None:
    """client: openai.OpenAI on the current policy; row: the dataset row ("prompt" and every other column)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": row["prompt"]}]
    msg = None
    for _ in range(4):
        msg = client.chat.completions.create(model="policy", messages=messages, tools=[CALC],
                                             max_tokens=128).choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return msg.content  # the final answer: the reward scores it
        for call in msg.tool_calls:  # the agent's own tool; bad arguments are the policy's answer to live with
            try:
                args = json.loads(call.function.arguments)
                result = str(int(args["a"]) + int(args["b"]))
            except (ValueError, KeyError, TypeError) as e:
                result = f"error: {e}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return msg.content if msg is not None else None


def correct(prompts: list[Any], completions: list[str], answer: list[Any], **_: Any) -> list[float]:
    """1.0 when the last integer of the completion is the row's answer (TRL's reward signature)."""
    out = []
    for text, want in zip(completions, answer):
        found = re.findall(r"-?\d+", text or "")
        out.append(1.0 if found and found[-1] == str(want).strip() else 0.0)
    return out
