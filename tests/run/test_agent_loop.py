"""A user's tool class in `rollwise train`: SFT on demonstrations first (with the base model evaluated), then RL steps
whose episodes call the tools, with the tool turns loss-masked and the reward computed from `environments=`."""

from __future__ import annotations

import json
import re

import pytest

from rollwise.config import load_config
from rollwise.run.loop import train
from rollwise.store.writer import RolloutStore
from rollwise.types import CompletionOutput, RequestOutput

ENV_FILE = '''
class Calc:
    def reset(self, **row):
        self.results = []

    def multiply(self, a: int, b: int) -> str:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        self.results.append(a * b)
        return str(a * b)

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: The first term.
            b: The second term.
        """
        self.results.append(a + b)
        return str(a + b)
'''

REWARD_FILE = '''
import re

def correct(completions, environments, answer, **kwargs):
    out = []
    for turns, env, a in zip(completions, environments, answer):
        final = [t["content"] for t in turns if t["role"] == "assistant"][-1]
        nums = re.findall(r"-?\\d+", final)
        out.append(1.0 if env.results and nums and int(nums[-1]) == int(a) else 0.0)
    return out
'''



def write_files(tmp_path):
    (tmp_path / "calc_env.py").write_text(ENV_FILE)
    (tmp_path / "reward.py").write_text(REWARD_FILE)
    pairs = [(12, 34), (56, 78), (23, 45), (67, 89), (31, 42), (53, 64)]
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} * {b}?"}], "answer": a * b} for a, b in pairs]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[4:]))
    demos = [{"messages": [r["prompt"][0],
                           {"role": "assistant", "content": "", "tool_calls": [
                               {"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}]},
                           {"role": "tool", "content": str(a * b)},
                           {"role": "assistant", "content": f"{a} * {b} = {a * b}"}]}
             for r, (a, b) in zip(rows[:4], pairs)]
    (tmp_path / "demos.jsonl").write_text("".join(json.dumps(d) + "\n" for d in demos))


def agent_config(tmp_path, model, *extra):
    return load_config(None, [
        f"model.path={model}", "env.name=dataset", f"env.kwargs.path={tmp_path / 'train.jsonl'}",
        f"env.kwargs.test_path={tmp_path / 'test.jsonl'}", f"env.environment={tmp_path / 'calc_env.py'}:Calc",
        f"env.reward={tmp_path / 'reward.py'}:correct", "env.max_turns=3", "env.eval_size=2",
        "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2", "rollout.max_tokens=40", "train.steps=2",
        "train.lr=1e-4", "engine.kv_cache_gb=0.05", f"run.out_dir={tmp_path / 'run'}", "run.loggers=[jsonl]",
        "model.device=cpu", "algo.skip_zero_variance=false", *extra])


class ScriptedPolicy:
    """A stand-in engine: the first turn calls multiply on the prompt's numbers, the next one answers (right for
    even samples, wrong for odd ones: in the second round each live episode is one prompt, in task-major order);
    each turn's ids are the tokenizer's, ended by the end-of-turn token."""

    def __init__(self, tok):
        self.tok, self.eot = tok, tok.convert_tokens_to_ids("<|im_end|>")
        self.max_model_len = 2048
        self.loads = 0

    def _text(self, conv: str, j: int) -> str:
        a, b = map(int, re.findall(r"What is (\d+) \* (\d+)\?", conv)[-1])
        if "<|im_start|>tool" not in conv:
            return '<tool_call>{"name": "multiply", "arguments": {"a": %d, "b": %d}}</tool_call>' % (a, b)
        return f"{a} * {b} = {a * b + (j % 2)}"

    def generate(self, prompts, params):
        plist = params if isinstance(params, list) else [params] * len(prompts)
        outs = []
        for i, (p, sp) in enumerate(zip(prompts, plist)):
            conv = self.tok.decode(p)
            samples = []
            for j in range(sp.n):
                ids = self.tok.encode(self._text(conv, i + j), add_special_tokens=False) + [self.eot]
                samples.append(CompletionOutput(j, ids, [-1.0] * len(ids), "stop", self.tok.decode(ids, skip_special_tokens=True),
                                                [0] * len(ids)))
            outs.append(RequestOutput(str(i), list(p), samples))
        return outs

    def load_weights(self, weights, version=None):
        self.loads += 1
        return version

    def counters(self):
        return {}


def test_a_tool_class_trains_after_sft_with_tools_called_results_masked_and_rewards_from_environments(
        tmp_path, smol_tiny, monkeypatch):
    import rollwise.run.setup as setup
    from transformers import AutoTokenizer

    write_files(tmp_path)
    tok = AutoTokenizer.from_pretrained(smol_tiny)
    policy = ScriptedPolicy(tok)
    monkeypatch.setattr(setup, "make_engine", lambda *a, **k: policy)
    cfg = agent_config(tmp_path, smol_tiny, f"sft.path={tmp_path / 'demos.jsonl'}", "sft.steps=2", "sft.batch_size=2",
                       "sft.lr=1e-4", "sft.eval_base=true")
    summary = train(cfg, log=lambda s: None)
    out = tmp_path / "run"
    # SFT ran first, inside `rollwise train`, and RL started from its model; the base model was evaluated too
    assert (out / "sft" / "done.json").is_file() and summary["sft"]["steps"] == 2
    assert summary["sft_model"].endswith("sft/checkpoints/step-2") and "accuracy_greedy" in summary["eval_base"]
    assert [json.loads(x)["step"] for x in (out / "sft" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    rows = RolloutStore(out).read()
    assert len(rows) == 2 * 2 * 2
    for r in rows:
        assert r.env_info["tool_calls"] == 1 and r.env_info["tool_errors"] == 0 and r.env_info["turns"] == 2
        env_ids = [t for t, m in zip(r.completion_token_ids, r.loss_mask) if m == 0]
        answer = int(re.findall(r"What is (\d+) \* (\d+)", tok.decode(r.prompt_token_ids))[-1][0]) * \
            int(re.findall(r"What is (\d+) \* (\d+)", tok.decode(r.prompt_token_ids))[-1][1])
        assert tok.decode(env_ids) == f"\n<|im_start|>tool\n{answer}<|im_end|>\n<|im_start|>assistant\n"  # masked
        assert r.reward == (1.0 if r.sample_index % 2 == 0 else 0.0)  # from environments= and the final turn
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["tool_calls_mean"] == 1.0 and m["tool_errors_mean"] == 0.0 and m["turns_mean"] == 2.0
        assert m["loss"] != 0.0 and m["reward_mean"] == 0.5
    assert policy.loads == 2  # one weight sync per RL step


def test_without_a_reward_a_tool_class_is_refused_with_one_line(tmp_path, smol_tiny):
    from rollwise.run.setup import make_env

    write_files(tmp_path)
    cfg = agent_config(tmp_path, smol_tiny)
    cfg.env.reward = None
    with pytest.raises(ValueError, match="needs env.reward or env.rewards"):
        make_env(cfg.env)


def test_sft_keys_without_sft_path_are_refused(tmp_path, smol_tiny):
    write_files(tmp_path)
    with pytest.raises(ValueError, match="'sft.steps' is set but has no effect unless sft.path is set"):
        from rollwise.config import load_config as lc

        lc(None, ["sft.steps=3"])
