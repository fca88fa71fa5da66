"""SmolLM2-135M-Instruct end to end: a 2-step GRPO run on a JSONL dataset with a TRL-style reward file, and a
multi-turn tool episode, both through the chat template."""

from __future__ import annotations

import json

import pytest

from rollwise.config import load_config
from rollwise.run.loop import train
from rollwise.store.writer import RolloutStore

REWARD = '''
import re

def sum_correct(prompts, completions, completion_ids, answer, **kwargs):
    assert len(prompts) == len(completions) == len(completion_ids) == len(answer)
    out = []
    for c, a in zip(completions, answer):
        nums = re.findall(r"-?\\d+", c)
        out.append(1.0 if nums and int(nums[-1]) == int(a) else 0.0)
    return out
'''


@pytest.mark.slow
def test_two_steps_on_a_real_model_with_a_jsonl_dataset_and_a_trl_reward(tmp_path, smollm2_dir):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": a + b}) + "\n"
                            for a, b in [(12, 30), (25, 17), (40, 41), (33, 22), (61, 18), (70, 29)]))
    (tmp_path / "reward.py").write_text(REWARD)
    out = tmp_path / "run"
    cfg = load_config(None, [
        f"model.path={smollm2_dir}", "env.name=dataset", f"env.kwargs.path={data}", "env.kwargs.test_size=2",
        "env.kwargs.prompt_key=prompt", "env.kwargs.answer_key=answer", f"env.reward={tmp_path / 'reward.py'}:sum_correct",
        "env.eval_size=2", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2", "rollout.max_tokens=12",
        "train.steps=2", "train.lr=1e-5", "engine.kv_cache_gb=0.05", f"run.out_dir={out}", "run.loggers=[jsonl]",
        "model.device=cpu", "algo.skip_zero_variance=false"])
    summary = train(cfg, log=lambda s: None)
    rows = RolloutStore(out).read()
    assert len(rows) == summary["rollouts"]["total"] == 2 * 2 * 2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    for r in rows:  # the exact prompt ids the template gives, and the reward from the user's file
        task_prompt = tok.decode(r.prompt_token_ids)
        assert task_prompt.startswith("<|im_start|>system") and task_prompt.endswith("<|im_start|>assistant\n")
        assert r.status in ("kept", "truncated", "filtered") and r.reward in (0.0, 1.0)
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2] and all(m["logprob_mismatch_mean"] < 1e-3 for m in lines)
    assert {"accuracy", "accuracy_greedy", "reward_mean", "reward_mean_greedy"} <= set(summary["eval_after"])


@pytest.mark.slow
def test_a_multi_turn_tool_episode_on_a_real_model(smollm2_dir):
    from rollwise import LLM, SamplingParams
    from rollwise.control.episodes import EpisodeRunner, chat_reply_formatter
    from rollwise.envs.tool_calc import ToolCalcEnv
    from rollwise.models.prompting import PromptFormat, stop_token_ids

    llm = LLM(smollm2_dir, kv_cache_gb=0.05)
    env = ToolCalcEnv()
    task = env.load("test", n=1)[0]
    fmt = PromptFormat()
    runner = EpisodeRunner(env, llm.tokenizer, lambda t: fmt.encode(llm.tokenizer, t.prompt),
                           chat_reply_formatter(llm.tokenizer, True), max_turns=2, max_total_tokens=400)
    stops = stop_token_ids(llm.tokenizer, smollm2_dir)
    (ep,) = runner.run(llm, [task], [SamplingParams(n=1, temperature=0.0, max_tokens=48, stop_token_ids=stops)])
    assert ep.turns >= 1 and ep.score is not None and ep.score.error is None
    assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.logprobs) == len(ep.weight_versions)
    if 0 in ep.loss_mask:  # the model called the tool: the reply is a chat turn, and the text round-trips
        text = llm.tokenizer.decode(ep.prompt_token_ids + ep.token_ids)
        assert "<|im_start|>user\n<result>" in text or "<|im_start|>user\n<error>" in text
