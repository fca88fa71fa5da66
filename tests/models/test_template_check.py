"""The chat template checked on the run's real shape (models/template_check.py): SmolLM2's passes with a tool turn,
a template that re-renders earlier turns is refused with the first differing tokens, and a template TRL's wheel
ships a training version of is swapped for it (TRL's templates as fixtures on SmolLM2's tokenizer)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from rollwise.models.prompting import PromptFormat
from rollwise.models.template_check import (TemplateError, compare_rendering, ensure_prefix_preserving,
                                            known_training_template, prefix_problem, probe_conversation)

TOOLS = [{"type": "function", "function": {"name": "increment", "description": "Increment the counter.",
                                           "parameters": {"type": "object", "properties": {"step": {"type": "integer"}},
                                                          "required": ["step"]}}}]

# Renders only the last assistant turn with its reasoning: every later turn rewrites the earlier ones.
LAST_ONLY = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
             "{% if m.role == 'assistant' and loop.last %}[final] {% endif %}{{ m.content }}<|im_end|>\n"
             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def trl_template(name: str) -> str:
    spec = importlib.util.find_spec("trl")
    if spec is None:
        pytest.skip("trl is not installed")
    return (Path(spec.origin).parent / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


@pytest.fixture()
def tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)  # a fresh one per test: some tests set its template


def test_smollm2s_template_passes_with_a_system_prompt_and_a_tool_turn(tok):
    fmt = PromptFormat(system_prompt="Be brief.", tools=TOOLS)
    msgs = probe_conversation(tok, fmt, tool_turns=True)
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert msgs[1]["content"].startswith('<tool_call>{"name": "increment", "arguments": {"step": 6}}')  # fallback
    assert prefix_problem(tok, msgs, fmt) is None
    assert ensure_prefix_preserving(tok, fmt, tool_turns=True).problem is None


def test_a_non_prefix_preserving_template_is_refused_with_the_first_differing_tokens(tok):
    tok.chat_template = LAST_ONLY
    with pytest.raises(TemplateError) as e:
        ensure_prefix_preserving(tok, PromptFormat(tools=TOOLS), tool_turns=True)
    msg = str(e.value)
    assert "\n" not in msg and "not prefix-preserving for multi-turn rollouts" in msg
    assert "adding message 2 (tool) with the generation prompt re-renders" in msg
    assert "before has '" in msg and "[final]" in msg and "after has '" in msg  # the first differing tokens


def test_qwen3s_template_drops_past_reasoning_and_is_swapped_for_trls_training_version(tok):
    tok.chat_template = trl_template("qwen3")
    fmt = PromptFormat(tools=TOOLS)
    msgs = probe_conversation(tok, fmt, tool_turns=True)
    assert all("reasoning_content" in m for m in msgs if m["role"] == "assistant")  # the template has reasoning
    problem = prefix_problem(tok, msgs, fmt)
    assert problem is not None and "<think>" in problem
    assert known_training_template(tok.chat_template)[0] == "qwen3_training.jinja"
    said = []
    verdict = ensure_prefix_preserving(tok, fmt, tool_turns=True, log=said.append)
    assert verdict.replaced_by == "qwen3_training.jinja" and tok.chat_template == trl_template("qwen3_training")
    assert len(said) == 1 and "using TRL's qwen3_training.jinja" in said[0]


def test_a_template_trl_ships_no_fix_for_is_refused(tok):
    tok.chat_template = LAST_ONLY
    assert known_training_template(LAST_ONLY) is None


def test_compare_rendering_names_the_first_differing_token(tok):
    ours = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    theirs = tok.encode("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
                        add_special_tokens=False)
    assert compare_rendering(tok, ours, list(ours)) is None
    msg = compare_rendering(tok, ours, theirs)
    assert msg.startswith("at token 1 of") and "rollwise has '<|im_start|>user" in msg and "server has '<|im_start|>system" in msg


@pytest.fixture()
def bad_template_model(tmp_path, make_checkpoint, smollm2_dir):
    """A tiny random Llama with SmolLM2's tokenizer and the non-prefix-preserving template."""
    path = make_checkpoint(tmp_path / "m", "llama", vocab=49152)
    for f in smollm2_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, path / f.name)
    (path / "chat_template.jinja").write_text(LAST_ONLY)
    return path


class Counter:
    def reset(self, **kwargs) -> str:
        self.n = 0
        return "Count to 1."

    def get_reward(self) -> float:
        return float(self.n == 1)

    def bump(self) -> int:
        """Adds one."""
        self.n += 1
        return self.n


def test_a_run_refuses_the_template_at_set_up_for_rollouts_and_for_sft(tmp_path, bad_template_model):
    import json

    import rollwise

    base = {"model": {"path": str(bad_template_model), "device": "cpu"},
            "rollout": {"prompts_per_step": 1, "samples_per_prompt": 2, "max_tokens": 8},
            "train": {"steps": 1}, "run": {"loggers": ["jsonl"]}}
    with pytest.raises(TemplateError, match="not prefix-preserving for multi-turn rollouts: .* at token"):
        rollwise.train({**base, "env": {"name": "env_owned", "environment": Counter}}, out_dir=tmp_path / "a", log=None)
    demos = tmp_path / "demos.jsonl"
    demos.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
                                              {"role": "user", "content": "again"},
                                              {"role": "assistant", "content": "b"}]}) + "\n")
    with pytest.raises(TemplateError, match="not prefix-preserving for SFT demonstrations: .* at token"):
        rollwise.train({**base, "sft": {"path": str(demos), "steps": 1}}, out_dir=tmp_path / "b", log=None)
