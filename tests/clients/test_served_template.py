"""A serving engine's chat template against the one rollwise trains with (clients/template_check.py): the probe
conversation rendered here and through the server's `POST /tokenize` (vLLM's), compared token by token."""

from __future__ import annotations

import copy
import json

import pytest

from rollwise.clients.remote_check import RemoteEngineError
from rollwise.clients.template_check import served_template_problem
from rollwise.models.prompting import PromptFormat

TOOLS = [{"type": "function", "function": {"name": "increment", "description": "Increment the counter.",
                                           "parameters": {"type": "object", "properties": {"step": {"type": "integer"}},
                                                          "required": ["step"]}}}]


class FakeVLLM:
    """`POST /tokenize` with messages, as vLLM answers it: its own tokenizer's template (tool-call arguments parsed
    back from JSON strings)."""

    base_url = "http://fake:8000"

    def __init__(self, tok, fail=False):
        self.tok, self.fail, self.payloads = tok, fail, []

    def json(self, method, path, payload=None, *, deadline_s):
        self.payloads.append(payload)
        if self.fail:
            raise RemoteEngineError(f"{method} {self.base_url}{path} -> HTTP 404: Not Found")
        msgs = copy.deepcopy(payload["messages"])
        for m in msgs:
            for c in m.get("tool_calls") or []:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        text = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=payload["add_generation_prompt"],
                                            **({"tools": payload["tools"]} if "tools" in payload else {}))
        return {"tokens": self.tok.encode(text, add_special_tokens=False)}


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def test_the_same_template_on_the_server_is_no_problem(tok):
    fmt = PromptFormat(system_prompt="Be brief.", tools=TOOLS)
    server = FakeVLLM(tok)
    assert served_template_problem(server, "m", tok, fmt, tool_turns=True) == (True, None)
    roles = [m["role"] for m in server.payloads[0]["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]  # the run's shape, to the last user


def test_another_template_on_the_server_is_named_with_the_first_differing_token(tok):
    other = copy.deepcopy(tok)
    other.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}: {{ m.content }}<|im_end|>\n{% endfor %}"
                           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    fmt = PromptFormat(tools=TOOLS)
    checked, problem = served_template_problem(FakeVLLM(other), "m", tok, fmt, tool_turns=True)
    assert checked and problem is not None and problem.startswith("at token ")
    assert "rollwise's template has" in problem and "the server's has" in problem


def test_a_server_without_the_route_is_unchecked_not_refused(tok):
    assert served_template_problem(FakeVLLM(tok, fail=True), None, tok, PromptFormat(), tool_turns=False) == (False, None)
