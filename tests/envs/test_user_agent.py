"""The user's agent function as a rollout source (`env.agent`): the recording endpoint, the sequence rule, the
failure rule, and training on what it records (token-exact, log-probs equal to the trainer's at version 0)."""

from __future__ import annotations

import math
import re
import time

import pytest

from rollwise.envs.agent_endpoint import AgentEndpoint
from rollwise.envs.agent_record import AGENT_TOKEN_VERSION, AgentCall, assemble
from rollwise.envs.user_agent import AgentEpisodes, UserAgentEnv
from rollwise.models.prompting import PromptFormat
from rollwise.types import CompletionOutput, RequestOutput, Rollout, RolloutGroup, SamplingParams, Score, Task

pytest.importorskip("openai")


# ------------------------------------------------------------------------------------------------ the sequence rule
def _call(prompt, completion, lp=-0.5):
    return AgentCall(list(prompt), list(completion), [lp] * len(completion), [0] * len(completion))


def test_calls_that_extend_each_other_are_one_sequence_with_the_agents_tokens_masked():
    segs = assemble([_call([1, 2], [3, 4]), _call([1, 2, 3, 4, 9, 9], [5]), _call([1, 2, 3, 4, 9, 9, 5], [6, 7])])
    assert len(segs) == 1
    s = segs[0]
    assert s.prompt_token_ids == [1, 2] and s.completion_token_ids == [3, 4, 9, 9, 5, 6, 7]
    assert s.loss_mask == [1, 1, 0, 0, 1, 1, 1]
    assert s.logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, -0.5, -0.5]
    assert s.weight_versions == [0, 0, AGENT_TOKEN_VERSION, AGENT_TOKEN_VERSION, 0, 0, 0] and s.reason == ""


def test_a_call_that_rewrites_history_starts_a_segment_with_its_reason_and_a_side_call_keeps_the_main_one_whole():
    main1, side, main2, rewrite = (_call([1, 2], [3]), _call([8, 8], [4]), _call([1, 2, 3, 5], [6]),
                                   _call([1, 7], [9]))
    segs = assemble([main1, side, main2, rewrite])
    assert [s.prompt_token_ids for s in segs] == [[1, 2], [8, 8], [1, 7]]
    assert segs[0].completion_token_ids == [3, 5, 6] and segs[0].loss_mask == [1, 0, 1]
    assert segs[1].reason == "prompt departs from the previous call's tokens at 0 of 3"
    assert segs[2].reason == "prompt departs from the previous call's tokens at 1 of 5"
    # every completion token is trained exactly once
    assert sum(sum(s.loss_mask) for s in segs) == 4


# ------------------------------------------------------------------------------------------------ a scripted engine
class FakeEngine:
    """Answers every prompt with the same few token ids, or raises when told to (the engine dying)."""

    def __init__(self, reply=(5, 6, 7), fail=False):
        self.reply, self.fail, self.batches = list(reply), fail, []
        self.tokenizer = None

    def generate(self, prompts, params):
        if self.fail:
            raise RuntimeError("engine died")
        plist = params if isinstance(params, list) else [params] * len(prompts)
        self.batches.append(len(prompts))
        outs = []
        for i, (p, sp) in enumerate(zip(prompts, plist)):
            ids = self.reply[: sp.max_tokens]
            text = "".join(chr(ord("a") + t % 26) for t in ids)
            outs.append(RequestOutput(str(i), list(p), [CompletionOutput(0, ids, [-0.25] * len(ids), "stop", text,
                                                                         [3] * len(ids))]))
        return outs


@pytest.fixture(scope="module")
def char_tok():
    from rollwise.models.tokenizer import build_char_tokenizer

    return build_char_tokenizer("abcdefghijklmnopqrstuvwxyz0123456789+=?:. \n")


class _Data:
    name = "toy"

    def load(self, split="train", n=None, seed=0):
        return [Task(f"t{i}", f"{i}+{i}=", 2 * i) for i in range(2)]

    def score(self, task, completion):
        return Score(float(completion.strip() == str(task.answer)))


def _episodes(tok, agent, **kw):
    ep = AgentEndpoint(tok, PromptFormat())
    return AgentEpisodes(UserAgentEnv(_Data(), agent, "test"), ep, lambda t: list(tok.encode(str(t.prompt))), **kw)


def _run(tok, agent, engine=None, n=2, **kw):
    runner = _episodes(tok, agent, **kw)
    try:
        return runner.run(engine or FakeEngine(), _Data().load(), [SamplingParams(n=n, max_tokens=4, seed=0)] * 2)
    finally:
        runner.close()


def test_completions_agent_extending_its_text_gives_one_sequence_and_its_answer_is_scored(char_tok):
    def agent(client, row):
        r1 = client.completions.create(model="policy", prompt=row["prompt"], max_tokens=3)
        r2 = client.completions.create(model="policy", prompt=row["prompt"] + r1.choices[0].text + "\nok:")
        return r2.choices[0].text

    eps = _run(char_tok, agent)
    assert len(eps) == 4
    for ep in eps:
        assert ep.score.error is None and ep.turns == 2 and not ep.segments
        assert ep.token_ids[:3] == [5, 6, 7] and ep.loss_mask == [1, 1, 1, 0, 0, 0, 0, 1, 1, 1]
        assert ep.score.info["agent_calls"] == 2 and ep.score.info["agent_segments"] == 1


def test_many_episodes_run_at_once_and_their_calls_share_engine_batches(char_tok):
    eng = FakeEngine()

    def agent(client, row):
        time.sleep(0.05)
        return client.completions.create(model="p", prompt=row["prompt"]).choices[0].text

    runner = _episodes(char_tok, agent)
    runner.endpoint.batch_wait_s = 0.2
    try:
        eps = runner.run(eng, _Data().load(), [SamplingParams(n=4, max_tokens=4, seed=0)] * 2)
    finally:
        runner.close()
    assert len(eps) == 8 and sum(eng.batches) == 8 and max(eng.batches) > 1


def test_the_runs_sampling_applies_whatever_the_agent_asks(char_tok):
    seen = []

    class Recording(FakeEngine):
        def generate(self, prompts, params):
            seen.extend(params)
            return super().generate(prompts, params)

    def agent(client, row):
        return client.completions.create(model="p", prompt=row["prompt"], temperature=0.1, top_p=0.5,
                                         max_tokens=100).choices[0].text

    eps = _run(char_tok, agent, Recording(), n=1)
    assert all(p.temperature == 1.0 and p.top_p == 1.0 and p.max_tokens == 4 for p in seen)
    assert len({p.seed for p in seen}) == len(seen)  # each call its own seed
    assert eps[0].score.info["agent_sampling_overridden"] == 1


def test_a_chat_agent_gets_tool_calls_and_sending_the_message_back_extends_the_sequence(char_tok):
    import json as _json

    class Caller(FakeEngine):
        def generate(self, prompts, params):
            outs = super().generate(prompts, params)
            for o in outs:
                o.outputs[0].text = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
            return outs

    def agent(client, row):
        msgs = [{"role": "user", "content": row["prompt"]}]
        tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
        msg = client.chat.completions.create(model="p", messages=msgs, tools=tools).choices[0].message
        call = msg.tool_calls[0]
        args = _json.loads(call.function.arguments)
        msgs += [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id,
                                                     "content": str(args["a"] + args["b"])}]
        return client.chat.completions.create(model="p", messages=msgs, tools=tools).choices[0].message.content

    eps = _run(char_tok, agent, Caller(), n=1)
    for ep in eps:
        assert ep.score.error is None and ep.score.info["agent_extended"] == 1 and not ep.segments


# ------------------------------------------------------------------------------------------------ the failure rule
@pytest.mark.parametrize("case, reason", [
    ("raises", "agent raised ValueError: cannot parse the model's answer"),
    ("timeout", "agent ran past env.agent_timeout_s=0.5s"),
    ("cap", "agent made more than env.agent_max_calls=2 model calls"),
    ("cap_caught", "agent made more than env.agent_max_calls=2 model calls"),
    ("garbage", "agent returned a list; return a string, a number, a dict or None"),
    ("nan", "agent returned the reward nan"),
    ("no_call", "agent made no model call"),
])
def test_a_failing_agent_is_its_episodes_errored_outcome_and_the_others_go_on(char_tok, case, reason):
    def agent(client, row):
        if row["prompt"] == "0+0=":  # only task 0's episodes fail
            if case == "no_call":
                return "0"
            client.completions.create(model="p", prompt=row["prompt"])
            if case == "raises":
                raise ValueError("cannot parse the model's answer")
            if case == "timeout":
                time.sleep(3)
            if case in ("cap", "cap_caught"):
                for _ in range(3):
                    try:
                        client.completions.create(model="p", prompt="x")
                    except Exception:
                        if case == "cap":
                            raise
                return "0"  # the right answer: the cap's penalty still holds
            if case == "garbage":
                return [1, 2]
            if case == "nan":
                return math.nan
        return client.completions.create(model="p", prompt=row["prompt"]).choices[0].text

    eps = _run(char_tok, agent, timeout_s=0.5, max_calls=2)
    bad, good = eps[:2], eps[2:]
    assert all(ep.score.error == reason and ep.finish_reason == "stop" for ep in bad), [ep.score.error for ep in bad]
    assert all(ep.score.error is None for ep in good)
    r = bad[0].to_rollout()
    assert r.status == "errored" and r.status_reason == reason
    from rollwise import filter as room

    assert room.scored_as_wrong(r)  # algo.errored_reward scores it as a wrong answer


def test_the_engine_failing_is_outside_the_episodes_and_stops_the_run(char_tok):
    def agent(client, row):
        try:
            return client.completions.create(model="p", prompt=row["prompt"]).choices[0].text
        except Exception:
            return "0"  # an agent that swallows errors cannot hide the engine's death

    with pytest.raises(RuntimeError, match="the engine serving the agent's calls failed: RuntimeError: engine died"):
        _run(char_tok, agent, FakeEngine(fail=True))


def test_a_closed_episodes_late_calls_are_refused(char_tok):
    import openai

    runner = _episodes(char_tok, lambda c, r: "x")
    try:
        log = runner.endpoint.open(SamplingParams(max_tokens=4), 4, 64)
        runner.endpoint.finish(log)
        client = openai.OpenAI(base_url=runner.endpoint.base_url(log.episode_id), api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as e:
            client.completions.create(model="p", prompt="1+1=")
        assert e.value.status_code == 410
    finally:
        runner.close()


# ------------------------------------------------------------------------------------------------ store and batch
def _segmented_rollout():
    from rollwise.types import RolloutSegment

    seg = RolloutSegment([9, 9], [4, 5], [-0.1, -0.2], [0, 0], [1, 1], "prompt departs from the previous call's tokens")
    return Rollout("p", "g", 0, [1, 2], [3, 7, 8], [-0.3, 0.0, -0.4], [0, -1, 0], [1, 0, 1], reward=1.0, advantage=0.5,
                   segments=[seg])


def test_segments_round_trip_through_the_store_schema():
    from rollwise.store.schema import rollout_to_row, row_to_rollout, rows_to_table, table_to_rollouts

    r = _segmented_rollout()
    table = rows_to_table([rollout_to_row(r, run="x"), rollout_to_row(Rollout("p", "g", 1, [1], [2], [-1.0], [0], [1]),
                                                                      run="x")])
    back = table_to_rollouts(table)
    assert back[0].segments == r.segments and back[1].segments is None
    assert table.column("num_generated").to_pylist() == [4, 1]
    with pytest.raises(ValueError, match="segment 0 has 1 logprobs for 2 completion tokens"):
        bad = _segmented_rollout()
        bad.segments[0].logprobs = [-0.1]
        rollout_to_row(bad, run="x")
    assert row_to_rollout({**rollout_to_row(r, run="x"), "segments": None}).segments is None


def test_each_segment_trains_as_a_sequence_with_its_episodes_advantage():
    from rollwise.train.advantages import assign_advantages
    from rollwise.train.batch import TrainBatch

    r = _segmented_rollout()
    other = Rollout("p", "g", 1, [1, 2], [3], [-0.3], [0], [1], reward=0.0)
    assign_advantages([RolloutGroup("p", "g", [r, other])], "grpo")  # one outcome per episode
    batch = TrainBatch.from_rollouts([r, other], 64)
    assert batch.num_sequences == 3
    assert batch.advantages.tolist() == [pytest.approx(r.advantage)] * 2 + [pytest.approx(other.advantage)]
    assert r.advantage > 0 > other.advantage
    assert batch.loss_mask[1].tolist()[:2] == [1.0, 1.0] and batch.tokens[1] == [9, 9, 4, 5]


# ------------------------------------------------------------------------------------------------ the real engine
CALC = {"type": "function", "function": {"name": "calculator", "description": "Evaluate a + b.",
                                         "parameters": {"type": "object", "properties": {
                                             "expression": {"type": "string"}}, "required": ["expression"]}}}


def calculator(expression: str) -> str:
    a, b = map(int, re.findall(r"\d+", expression)[:2])
    return str(a + b)


def tool_agent(client, row):
    """A plain agent with a tool loop of its own: asks, runs its calculator, sends the result back, asks again."""
    question = row["prompt"]
    msgs = [{"role": "user", "content": question}]
    got = []
    for _ in range(2):
        r = client.chat.completions.create(model="policy", messages=msgs, tools=[CALC], max_tokens=6)
        msg = r.choices[0].message
        got.append((r.model_extra["prompt_token_ids"], r.choices[0].model_extra["token_ids"]))
        msgs.append({"role": "assistant", "content": msg.content})
        msgs.append({"role": "tool", "content": calculator(question)})
    row["_calls"][str(client.base_url)] = got
    return {"completion": msg.content, "tool_result": calculator(question)}


def rewriting_agent(client, row):
    """Asks, then asks again about the answer in a fresh conversation: two segments."""
    first = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}],
                                           max_tokens=5).choices[0].message.content
    second = client.chat.completions.create(model="policy", messages=[
        {"role": "user", "content": f"Check this answer: {first}"}], max_tokens=5).choices[0].message.content
    return float(len(second) % 2)



def _real_run(path, agent, tasks, calls_box):
    from transformers import AutoTokenizer

    from rollwise.engine.llm import LLM
    from rollwise.train.advantages import assign_advantages

    tok = AutoTokenizer.from_pretrained(path)
    llm = LLM(str(path), device="cpu", dtype="float32", max_num_seqs=16, kv_cache_gb=0.05)

    class Data(_Data):
        def load(self, split="train", n=None, seed=0):
            return tasks

    def wrapped(client, row):
        return agent(client, {**row, "_calls": calls_box})

    runner = AgentEpisodes(UserAgentEnv(Data(), wrapped, "test"), AgentEndpoint(tok, PromptFormat()),
                           PromptFormat().task_encoder(tok), max_total_tokens=512)
    try:
        eps = runner.run(llm, tasks, [SamplingParams(n=2, max_tokens=6, seed=1)] * len(tasks))
    finally:
        runner.close()
    groups = [RolloutGroup(t.id, t.id, [ep.to_rollout() for ep in eps[2 * i: 2 * i + 2]]) for i, t in enumerate(tasks)]
    for g in groups:
        for r in g.rollouts:
            r.reward = float(r.reward or 0.0) + 0.1 * r.sample_index  # a signal, so the update is not zero
    assign_advantages(groups, "grpo")
    return eps, [r for g in groups for r in g.rollouts]


def test_a_tool_loop_agent_trains_token_exact_with_the_engines_log_probs(smol_tiny):
    from rollwise.config import TrainConfig
    from rollwise.train.batch import TrainBatch
    from rollwise.train.losses import LOSSES, LossConfig
    from rollwise.train.trainer import Trainer

    tasks = [Task("a", "What is 12 + 30?", 42), Task("b", "What is 7 + 8?", 15)]
    calls: dict = {}
    eps, rollouts = _real_run(smol_tiny, tool_agent, tasks, calls)
    for ep in eps:
        assert ep.score.error is None, ep.score.error
        assert not ep.segments and ep.turns == 2 and ep.score.info["agent_extended"] == 1
    served = list(calls.values())
    assert len(served) == len(eps) == 4
    for (p1, c1), (p2, c2) in served:  # each call's prompt extends the previous call's prompt + completion
        assert p2[: len(p1) + len(c1)] == p1 + c1 and len(p2) > len(p1) + len(c1)
    # the trained sequence is the last call's prompt + completion, token for token, with the policy's tokens (and
    # only those) under the loss mask
    want = sorted((p2 + c2, c1 + c2) for (_, c1), (p2, c2) in served)
    got = sorted((ep.prompt_token_ids + ep.token_ids, [t for t, m in zip(ep.token_ids, ep.loss_mask) if m])
                 for ep in eps)
    assert got == want
    tr = Trainer(smol_tiny, TrainConfig(lr=1e-3), temperature=1.0)
    batch = TrainBatch.from_rollouts(rollouts, 2048)
    diff = ((tr.compute_logprobs(batch) - batch.old_logprobs).abs() * batch.loss_mask).max().item()
    assert diff < 1e-4
    m = tr.train_step(batch, LOSSES["grpo"], LossConfig())
    assert m["logprob_diff_max"] < 1e-4 and math.isfinite(m["loss"])


def test_calls_that_do_not_extend_each_other_give_counted_segments_that_train(smol_tiny):
    from rollwise.config import TrainConfig
    from rollwise.train.batch import TrainBatch
    from rollwise.train.losses import LOSSES, LossConfig
    from rollwise.train.trainer import Trainer

    tasks = [Task("a", "What is 12 + 30?", 42)]
    eps, rollouts = _real_run(smol_tiny, rewriting_agent, tasks, {})
    for ep, r in zip(eps, rollouts):
        assert ep.score.error is None and ep.score.info["agent_segments"] == 2
        assert len(r.segments) == 1 and r.segments[0].reason.startswith("prompt departs from the previous call's")
        assert r.env_info["agent_segments"] == 2
    tr = Trainer(smol_tiny, TrainConfig(lr=1e-3), temperature=1.0)
    batch = TrainBatch.from_rollouts(rollouts, 2048)
    assert batch.num_sequences == 4
    diff = ((tr.compute_logprobs(batch) - batch.old_logprobs).abs() * batch.loss_mask).max().item()
    assert diff < 1e-4
    assert math.isfinite(tr.train_step(batch, LOSSES["grpo"], LossConfig())["loss"])


def test_a_segmented_rollout_is_replayed_and_restored_on_resume_whole(tmp_path):
    from rollwise.run.resume import StoredRollouts
    from rollwise.store.replay import ReplayBuffer, ReplayConfig, reuse_rollouts, rollout_version
    from rollwise.store.writer import RolloutStore

    r = _segmented_rollout()
    r.step = 1
    r.segments[0].weight_versions = [1, 0]
    r.weight_versions = [2, -1, 3]
    assert rollout_version(r) == 0  # the segment's policy tokens count
    store = RolloutStore(tmp_path)
    store.write_step(1, [r])
    buf = ReplayBuffer(ReplayConfig(max_age=10))
    assert buf.add([r]) == 1
    again = ReplayBuffer(ReplayConfig(max_age=10))
    again.load_state_dict(buf.state_dict(), StoredRollouts(store).get)  # what a resume does
    [copy] = reuse_rollouts(again, 1, version=1)
    assert copy.segments == r.segments and copy.num_generated == r.num_generated == 4


def test_a_conversation_past_the_episode_budget_is_truncated_not_a_crash(char_tok):
    import openai

    def agent(client, row):
        text = row["prompt"]
        try:
            for _ in range(6):
                text += client.completions.create(model="p", prompt=text).choices[0].text
        except openai.BadRequestError as e:
            assert "budget" in str(e)
        return text

    eps = _run(char_tok, agent, max_total_tokens=14, max_calls=8)
    for ep in eps:
        assert ep.finish_reason == "length" and ep.score.error is None
        assert ep.to_rollout().status == "truncated"
        assert len(ep.prompt_token_ids) + len(ep.token_ids) <= 14


def test_an_abandoned_agents_late_call_is_refused_and_the_next_step_runs(char_tok):
    late = []

    def agent(client, row):
        client.completions.create(model="p", prompt=row["prompt"])
        if row["prompt"] == "0+0=":
            time.sleep(0.6)  # past the timeout: this thread is abandoned, its next call comes after the step
            try:
                client.completions.create(model="p", prompt=row["prompt"])
            except Exception as e:  # noqa: BLE001 - recorded for the assertion
                late.append(getattr(e, "status_code", None))
        return "0"

    runner = _episodes(char_tok, agent, timeout_s=0.3)
    try:
        params = [SamplingParams(n=1, max_tokens=4, seed=0)] * 2
        first = runner.run(FakeEngine(), _Data().load(), params)
        assert first[0].score.error == "agent ran past env.agent_timeout_s=0.3s" and first[1].score.error is None
        time.sleep(0.6)
        assert late == [410] and runner.endpoint.failure is None
        runner.timeout_s = 5.0
        second = runner.run(FakeEngine(), _Data().load()[1:], params[:1])
        assert second[0].score.error is None
    finally:
        runner.close()


# ------------------------------------------------------------------------------------------------ configuration
def test_env_agent_is_checked_where_it_enters(tmp_path):
    from rollwise.config import build_config, load_config
    from rollwise.envs.user_agent import AgentSpecError, is_agent_env
    from rollwise.run.setup import make_env

    (tmp_path / "a.py").write_text("def agent(client, row):\n    return 'x'\n\ndef nullary():\n    return 1\n"
                                   "async def later(client, row):\n    return 'x'\n")
    env = make_env(load_config(None, [f"env.agent={tmp_path / 'a.py'}:agent"]).env)
    assert is_agent_env(env) and env.load("train", n=2)  # the tasks of env.name (arithmetic by default)
    with pytest.raises(AgentSpecError, match="must take \\(client, row\\)"):
        make_env(load_config(None, [f"env.agent={tmp_path / 'a.py'}:nullary"]).env)
    with pytest.raises(AgentSpecError, match="async function"):
        make_env(load_config(None, [f"env.agent={tmp_path / 'a.py'}:later"]).env)
    with pytest.raises(ValueError, match="env.agent and env.environment both"):
        make_env(load_config(None, [f"env.agent={tmp_path / 'a.py'}:agent",
                                    f"env.environment={tmp_path / 'a.py'}:agent"]).env)

    def mine(client, row):
        return "x"

    cfg = build_config({"env": {"agent": mine}})  # the Python API: the function itself, a placeholder in dumps
    assert "in-memory" in repr(cfg.env.agent) and is_agent_env(make_env(cfg.env))
    for key, bad in (("agent_timeout_s", "0"), ("agent_max_calls", "0"), ("agent_concurrency", "0")):
        with pytest.raises(Exception, match=key):
            load_config(None, [f"env.{key}={bad}"])


def test_step_metrics_count_every_segment_of_an_episode():
    """Response lengths and useful tokens take an agent episode's segments too (3 + 2 completion tokens)."""
    from types import SimpleNamespace

    from rollwise.filter import FilterRules
    from rollwise.run.loop import _useful_tokens, step_metrics

    r = _segmented_rollout()
    books = SimpleNamespace(generated_tokens=4, gen_s=1.0, score_s=0.1, metrics=lambda: {})
    rec = step_metrics([r], 1, 0, books, {}, gen_wait_s=0.0, producer_wait_s=0.0, sync_s=0.0, step_s=1.0,
                       weight_version=1, staleness_bound=0, engine_counters={}, useful=5)
    assert rec["resp_len_mean"] == 5 and rec["resp_len_max"] == 5 and rec["completions/min_length"] == 5
    assert _useful_tokens([r], lambda _: False, FilterRules()) == 5
