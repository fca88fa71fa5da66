"""Multi-turn environments in the loop: episodes are generated, stored and trained with their env tokens masked,
and the environment's replies join the conversation as chat turns on a real model's template."""

from __future__ import annotations

import json
import string
from dataclasses import dataclass

import pytest

from rollwise.envs import register_env
from rollwise.envs.base import EpisodeState, Task
from rollwise.envs.multiturn import ENV_WEIGHT_VERSION
from rollwise.run.loop import train
from rollwise.store.writer import RolloutStore
from rollwise.types import Score

CHARS = string.ascii_letters + string.digits + " <>/?.,:+-*=\n"


@dataclass
class EchoEnv:
    """Every policy turn gets the reply "ok" until the second turn; reward = parity of the policy's text length."""

    name: str = "echo_test"
    teardowns: int = 0
    stop: tuple[str, ...] = tuple("aeiou0123456789 ")
    """A policy turn ends at any of these (a random model hits one within a few tokens)."""

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return [Task(f"{split}{i}", f"Say {i}? ", None) for i in range(n or 8)]

    def reset(self, task: Task) -> EpisodeState:
        return EpisodeState(task)

    def step(self, state: EpisodeState, completion: str) -> str | None:
        state.turn += 1
        state.data.setdefault("policy", []).append(completion)
        return "ok\n" if state.turn < 2 else None

    def score_episode(self, state: EpisodeState) -> Score:
        n = sum(len(t) for t in state.data.get("policy", []))
        return Score(float(n % 2 == 0))

    def score(self, task: Task, completion: str) -> Score:
        return Score(float(len(completion) % 2 == 0))

    def teardown(self, state: EpisodeState) -> None:
        EchoEnv.teardowns += 1


@pytest.fixture(scope="module")
def char_model(tmp_path_factory, make_checkpoint):
    from rollwise.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(CHARS)
    path = make_checkpoint(tmp_path_factory.mktemp("mt") / "m", "llama", vocab=len(tok))
    tok.save_pretrained(path)
    return path


def test_multi_turn_env_trains_as_episodes(tmp_path, char_model, run_cfg):
    register_env("echo_test", EchoEnv, overwrite=True)
    out = tmp_path / "run"
    cfg = run_cfg(out, f"model.path={char_model}", "env.name=echo_test", "env.max_turns=3", "train.steps=2",
                  "rollout.max_tokens=16", "env.eval_size=4")
    summary = train(cfg, log=lambda s: None)
    rows = RolloutStore(out).read()
    assert len(rows) == summary["rollouts"]["total"] == 2 * 4 * 4
    two_turn = [r for r in rows if r.env_info.get("turns") == 2]
    assert two_turn, "no episode reached its second turn"
    for r in two_turn:  # the env reply sits between the turns as loss-masked ids, never re-tokenized policy text
        assert 0 in r.loss_mask and len(r.loss_mask) == len(r.completion_token_ids) == len(r.weight_versions)
        env_ix = [i for i, m in enumerate(r.loss_mask) if m == 0]
        assert all(r.weight_versions[i] == ENV_WEIGHT_VERSION and r.logprobs[i] == 0.0 for i in env_ix)
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    for m in lines:  # the ledger counts policy tokens only: env tokens were not generated
        assert m["control_generated_tokens"] == m["gen_tokens"] == sum(
            sum(r.loss_mask) for r in rows if r.step == m["step"])
    assert EchoEnv.teardowns >= len(rows)  # train episodes (+ evaluation ones)


def test_multi_turn_episodes_train_with_a_critic(tmp_path, char_model, run_cfg):
    """PPO with GAE on multi-turn episodes: the env reply's tokens are skipped by the recursion (docs/ppo.md), the
    critic trains on the policy's tokens, and its metrics are logged every step."""
    register_env("echo_test", EchoEnv, overwrite=True)
    out = tmp_path / "run"
    cfg = run_cfg(out, f"model.path={char_model}", "env.name=echo_test", "env.max_turns=3", "train.steps=2",
                  "rollout.max_tokens=16", "env.eval_size=4", "algo.advantage=gae", "algo.loss=ppo",
                  "algo.skip_zero_variance=true", "algo.critic.lr=1e-3")
    train(cfg, log=lambda s: None)
    rows = RolloutStore(out).read()
    assert any(r.env_info.get("turns") == 2 and 0 in r.loss_mask for r in rows)
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all("critic/value_loss" in m and "loss" in m for m in lines)
    assert lines[0]["critic/value_mean"] == 0.0 and lines[1]["critic/value_mean"] != 0.0  # the new head, then learnt


def test_multi_turn_env_refuses_per_sample_policies(tmp_path, char_model, run_cfg):
    register_env("echo_test", EchoEnv, overwrite=True)
    cfg = run_cfg(tmp_path / "r", f"model.path={char_model}", "env.name=echo_test", "control.policy=partial")
    with pytest.raises(ValueError, match="control.policy 'partial' works on single-turn environments only"):
        train(cfg, log=lambda s: None)


def test_env_replies_become_chat_turns_on_a_real_template(smollm2_dir):
    """The appended ids equal the template's own rendering of the longer conversation: no drift."""
    from transformers import AutoTokenizer

    from rollwise.control.episodes import chat_reply_formatter
    from rollwise.models.prompting import PromptFormat, end_of_turn_id

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    fmt = chat_reply_formatter(tok, True)
    q, a, reply = "What is 3*4? Use <calc>.", "<calc>3*4</calc>", "<result>12</result>"
    prompt = PromptFormat().encode(tok, q)
    eot = end_of_turn_id(tok)
    policy = tok.encode(a, add_special_tokens=False) + [eot]  # the turn ended at the end-of-turn token
    ids = prompt + policy + fmt(reply, policy)
    want = tok.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": a},
                                    {"role": "user", "content": reply}], tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids) == want
    # A turn cut at a tool call's closing tag (no end-of-turn token): the formatter closes it first.
    cut = tok.encode(a, add_special_tokens=False)
    assert tok.decode(prompt + cut + fmt(reply, cut)) == want
