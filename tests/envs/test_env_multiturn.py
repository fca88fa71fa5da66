"""Multi-turn runner with a fake engine: token ids kept as generated, env replies appended, masks and limits."""

from __future__ import annotations

import pytest

from rollwise.filter import scored_as_wrong
from rollwise.envs.base import EpisodeState, Task
from rollwise.envs.multiturn import ENV_WEIGHT_VERSION, encode_reply, run_episodes
from rollwise.envs.tool_calc import ToolCalcEnv
from rollwise.types import CompletionOutput, RequestOutput, SamplingParams, Score

MERGES = {"12": 1000, "</calc>": 1001}


class MergingTokenizer:
    """Chars are ord(c); `encode` merges "12" and "</calc>" into single ids, so encode(decode(ids)) != ids
    for char-by-char ids: any re-tokenization of the conversation would show up as different ids."""

    def encode(self, text, add_special_tokens=True):
        ids, i = [], 0
        while i < len(text):
            for piece, tid in MERGES.items():
                if text.startswith(piece, i):
                    ids.append(tid)
                    i += len(piece)
                    break
            else:
                ids.append(ord(text[i]))
                i += 1
        return ([7] if add_special_tokens else []) + ids  # 7 plays BOS

    def decode(self, ids):
        rev = {v: k for k, v in MERGES.items()}
        return "".join(rev.get(i, "" if i == 7 else chr(i)) for i in ids)


class ScriptedEngine:
    """engine.generate(): the policy's reply is script(conversation_text, sample_index), emitted char by char."""

    def __init__(self, tok, script, finish="stop", weight_version=5, bad_logprobs=False):
        self.tok, self.script, self.finish, self.wv, self.bad = tok, script, finish, weight_version, bad_logprobs
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []

    def generate(self, prompts, params):
        self.calls.append(([list(p) for p in prompts], params))
        plist = params if isinstance(params, list) else [params] * len(prompts)
        outs = []
        for i, (p, params) in enumerate(zip(prompts, plist)):
            samples = []
            for j in range(params.n):
                text = self.script(self.tok.decode(p), j)
                ids = [ord(c) for c in text][: params.max_tokens]
                finish = "length" if len(text) > params.max_tokens else self.finish
                lps = [-0.5] * (len(ids) - (1 if self.bad else 0))
                samples.append(CompletionOutput(j, ids, lps, finish, "".join(map(chr, ids)), [self.wv] * len(ids)))
            outs.append(RequestOutput(str(i), list(p), samples))
        return outs


def calc_then_answer(conv, j):
    return "<answer>10063</answer>" if "<result>" in conv else "<calc>347*29</calc>"


TASK = Task(id="t0", prompt="What is 347*29? ", answer=10063, metadata={})
SP = SamplingParams(n=1, temperature=1.0, max_tokens=64)


def test_tool_episode_tokens_mask_logprobs_and_score():
    tok = MergingTokenizer()
    engine = ScriptedEngine(tok, calc_then_answer)
    (ep,) = run_episodes(engine, tok, ToolCalcEnv(), [TASK], SP, max_turns=4, max_total_tokens=512)
    turn1 = [ord(c) for c in "<calc>347*29</calc>"]
    reply = encode_reply(tok, "<result>10063</result>\n")
    turn2 = [ord(c) for c in "<answer>10063</answer>"]
    assert ep.prompt_token_ids == tok.encode(TASK.prompt)
    assert ep.token_ids == turn1 + reply + turn2  # the policy's ids verbatim, the reply tokenized alone
    assert ep.loss_mask == [1] * len(turn1) + [0] * len(reply) + [1] * len(turn2)
    assert ep.logprobs == [-0.5] * len(turn1) + [0.0] * len(reply) + [-0.5] * len(turn2)
    assert ep.weight_versions == [5] * len(turn1) + [ENV_WEIGHT_VERSION] * len(reply) + [5] * len(turn2)
    assert (ep.finish_reason, ep.turns) == ("stop", 2)
    assert ep.score == Score(1.0, parts={"correct": 1.0, "tool_calls": 1.0}, info={"answer": "10063"})
    # Round 2 was sent exactly prompt + turn-1 ids + reply ids: never a re-encoding of the text.
    second_prompt = engine.calls[1][0][0]
    assert second_prompt == ep.prompt_token_ids + turn1 + reply
    assert tok.encode(tok.decode(second_prompt)) != second_prompt  # a re-tokenization *would* differ
    assert set(ToolCalcEnv.stop) <= set(engine.calls[0][1].stop)
    r = ep.to_rollout(group_id="g")
    assert (r.status, r.reward, r.num_generated, r.group_id) == ("kept", 1.0, len(turn1) + len(turn2), "g")
    assert len(r.completion_token_ids) == len(r.logprobs) == len(r.loss_mask) == len(r.weight_versions)


def test_max_turns_ends_a_runaway_episode():
    tok = MergingTokenizer()
    engine = ScriptedEngine(tok, lambda conv, j: "<calc>1+1</calc>")
    (ep,) = run_episodes(engine, tok, ToolCalcEnv(), [TASK], SP, max_turns=3, max_total_tokens=4096)
    assert ep.finish_reason == "max_turns" and ep.turns == 3 and ep.score.value == 0.0
    assert ep.score.parts["tool_calls"] == 3.0 and ep.to_rollout().status == "truncated"


def test_token_budget_truncates_and_ends():
    tok = MergingTokenizer()
    engine = ScriptedEngine(tok, lambda conv, j: "<calc>1+1</calc>")
    budget = len(tok.encode(TASK.prompt)) + 30
    (ep,) = run_episodes(engine, tok, ToolCalcEnv(), [TASK], SP, max_turns=10, max_total_tokens=budget)
    assert ep.finish_reason == "length" and ep.total_tokens <= budget
    assert all(p[1].max_tokens <= budget - len(p[0][0]) for p in engine.calls)


def test_policy_turn_cut_by_max_tokens_ends_as_length():
    tok = MergingTokenizer()
    engine = ScriptedEngine(tok, lambda conv, j: "x" * 100)
    (ep,) = run_episodes(engine, tok, ToolCalcEnv(), [TASK], SamplingParams(max_tokens=10), max_turns=4, max_total_tokens=512)
    assert ep.finish_reason == "length" and len(ep.token_ids) == 10 and ep.turns == 1


def test_n_samples_share_the_first_call_and_get_distinct_seeds_later():
    tok = MergingTokenizer()
    engine = ScriptedEngine(tok, lambda conv, j: f"<calc>{j}+1</calc>" if conv.count("<result>") < 2 else "<answer>1</answer>")
    tasks = [TASK, Task(id="t1", prompt="Another? ", answer=1, metadata={})]
    eps = run_episodes(engine, tok, ToolCalcEnv(), tasks, SamplingParams(n=3, seed=11, max_tokens=64), max_turns=5, max_total_tokens=512)
    assert [(e.task.id, e.sample_index) for e in eps] == [("t0", 0), ("t0", 1), ("t0", 2), ("t1", 0), ("t1", 1), ("t1", 2)]
    first_prompts, first_params = engine.calls[0]
    assert len(first_prompts) == 2 and first_params.n == 3 and first_params.seed == 11
    later = engine.calls[1:]
    assert len(later) == 2  # each later round is one batched call for every live episode
    round2 = later[0][1]
    assert isinstance(round2, list) and len(round2) == 6 and all(p.n == 1 for p in round2)
    assert len({p.seed for p in round2[:3]}) == 3  # one seed stream per sample index
    assert [e.score.value for e in eps] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]  # "1" is right for t1 only
    assert [e.texts[1][1] for e in eps[:3]] == ["<calc>0+1</calc>", "<calc>1+1</calc>", "<calc>2+1</calc>"]
    assert all(e.turns == 3 and e.finish_reason == "stop" for e in eps)


def test_unseeded_rounds_batch_every_live_episode_in_one_call():
    tok = MergingTokenizer()
    engine = ScriptedEngine(tok, calc_then_answer)
    run_episodes(engine, tok, ToolCalcEnv(), [TASK] * 4, SamplingParams(n=2, max_tokens=64), max_turns=4, max_total_tokens=512)
    assert [len(prompts) for prompts, _ in engine.calls] == [4, 8]


class ExplodingEnv(ToolCalcEnv):
    def step(self, state: EpisodeState, completion: str):
        raise RuntimeError("tool crashed")


class BadScoreEnv(ToolCalcEnv):
    def score_episode(self, state):
        raise KeyError("score")


def test_environment_failures_are_errored_scores():
    tok = MergingTokenizer()
    (ep,) = run_episodes(ScriptedEngine(tok, calc_then_answer), tok, ExplodingEnv(), [TASK], SP, 4, 512)
    # the policy's turn was whole and the environment failed on it: errored, and trained on as a wrong answer
    assert ep.finish_reason == "stop" and ep.score.error == "tool_calc.step raised RuntimeError: tool crashed"
    assert ep.to_rollout().status == "errored" and scored_as_wrong(ep.to_rollout())
    (ep,) = run_episodes(ScriptedEngine(tok, calc_then_answer), tok, BadScoreEnv(), [TASK], SP, 4, 512)
    assert ep.score.error == "KeyError: 'score'" and ep.score.value == 0.0


def test_engine_abort_and_bad_logprobs():
    tok = MergingTokenizer()
    (ep,) = run_episodes(ScriptedEngine(tok, calc_then_answer, finish="abort"), tok, ToolCalcEnv(), [TASK], SP, 4, 512)
    assert ep.finish_reason == "abort" and ep.to_rollout().status == "aborted"
    with pytest.raises(ValueError, match="log-probs for"):
        run_episodes(ScriptedEngine(tok, calc_then_answer, bad_logprobs=True), tok, ToolCalcEnv(), [TASK], SP, 4, 512)
    assert run_episodes(ScriptedEngine(tok, calc_then_answer), tok, ToolCalcEnv(), [], SP, 4, 512) == []
    with pytest.raises(ValueError, match="max_total_tokens"):
        run_episodes(ScriptedEngine(tok, calc_then_answer), tok, ToolCalcEnv(), [TASK], SP, 4, 5)


def test_tool_calc_env_steps_and_errors():
    env = ToolCalcEnv()
    task = env.load("train", n=1)[0]
    state = env.reset(task)
    assert env.step(state, "<calc>2*(3+4)</calc>") == "<result>14</result>\n"
    assert env.step(state, "<calc>1/0</calc>") == "<error>division by zero</error>\n"
    assert env.step(state, "<python>print(1)</python>") == "<error>python tool is not enabled</error>\n"
    assert env.step(state, "I give up") is None and state.done
    assert env.score(task, f"<answer>{task.answer}</answer>").value == 1.0
    assert env.score(task, f"it is {task.answer}").value == 1.0


def test_python_tool_runs_in_the_sandbox():
    from rollwise.sandbox import isolation_status

    ok, reason = isolation_status()
    if not ok:
        pytest.skip(f"sandbox isolation unavailable here: {reason}")
    env = ToolCalcEnv(python_tool=True)
    state = env.reset(TASK)
    assert env.step(state, "<python>print(347*29)</python>") == "<result>10063</result>\n"
    assert env.step(state, "<python>open('/etc/shadow').read()</python>").startswith("<error>FileNotFoundError")


class CuttingEngine(ScriptedEngine):
    """Like a real engine with stop strings: the stop string's tokens are kept, the text is cut before it."""

    def generate(self, prompts, params):
        outs = super().generate(prompts, params)
        plist = params if isinstance(params, list) else [params] * len(prompts)
        for o, params in zip(outs, plist):
            for c in o.outputs:
                for stop in params.stop or []:
                    if stop in c.text:
                        c.text = c.text[: c.text.index(stop)]
        return outs


def test_stop_strings_cut_from_text_still_parse():
    tok = MergingTokenizer()
    (ep,) = run_episodes(CuttingEngine(tok, calc_then_answer), tok, ToolCalcEnv(), [TASK], SP, 4, 512)
    assert ep.texts[1] == ("policy", "<calc>347*29")
    assert ep.score.value == 1.0 and ep.finish_reason == "stop"
    assert ep.token_ids[: len("<calc>347*29</calc>")] == [ord(c) for c in "<calc>347*29</calc>"]


def test_eos_ends_the_episode_even_after_a_call():
    class EosTok(MergingTokenizer):
        eos_token_id = ord("$")

    tok = EosTok()
    (ep,) = run_episodes(ScriptedEngine(tok, lambda conv, j: "<calc>1+1</calc>$"), tok, ToolCalcEnv(), [TASK], SP, 4, 512)
    assert ep.finish_reason == "stop" and ep.turns == 1 and ep.token_ids[-1] == ord("$") and all(ep.loss_mask)


def test_a_message_list_reply_without_a_chat_formatter_is_refused_in_one_line():
    """The plain formatter encodes text; chat messages (tool turns) need `control.episodes.chat_reply_formatter`."""
    from rollwise.envs.base import is_multi_turn

    class MessagesEnv(ToolCalcEnv):
        def step(self, state: EpisodeState, completion: str):
            return [{"role": "tool", "content": "2"}]

    assert is_multi_turn(MessagesEnv()) and not is_multi_turn(object())
    tok = MergingTokenizer()
    with pytest.raises(ValueError, match="format_reply"):
        run_episodes(ScriptedEngine(tok, calc_then_answer), tok, MessagesEnv(), [TASK], SP, 4, 512)
