"""Environment classes as users write them (envs/agent.py): tools from a class, every bad call an observation,
rewards with environments=, the gym adapter, and token-exact episodes on SmolLM2's real tokenizer."""

from __future__ import annotations

import json
import time

import pytest

from rollwise.envs.agent import EnvironmentClassError, GymEnv, ToolEnv, tool_schemas
from rollwise.envs.base import Task
from rollwise.envs.multiturn import ENV_WEIGHT_VERSION, run_episodes
from rollwise.models.tool_calls import parse_tool_calls, render_tool_call
from rollwise.rewards.user import load_reward
from rollwise.types import CompletionOutput, RequestOutput, SamplingParams


class Calc:
    """Two tools, one that raises and one that hangs; `reset` sees the row."""

    def reset(self, **row):
        self.row = row
        self.used = []
        return f"(numbers: {row['numbers']['a']} and {row['numbers']['b']})"

    def multiply(self, a: int, b: int) -> str:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        self.used.append("multiply")
        return str(a * b)

    def step(self, note: str) -> str:
        """A tool that happens to be called step (tools are recognised by config, not by name).

        Args:
            note: Anything.
        """
        self.used.append("step")
        return f"noted {note}"

    def explode(self) -> str:
        """Always fails."""
        raise RuntimeError("kaboom")

    def sleep(self, seconds: float) -> str:
        """Sleeps.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "woke"

    def _private(self) -> None:
        pass


class Data:
    name = "data"

    def load(self, split="train", n=None, seed=0):
        return [Task(f"{split}/0", [{"role": "user", "content": "What is 6 * 7?"}], 42,
                     metadata={"answer": 42, "numbers": {"a": 6, "b": 7}})]


def reward_fn(completions, environments, answer, **kw):
    return [float(bool(e.used) and str(a) in c[-1]["content"]) for c, e, a in zip(completions, environments, answer)]


def make_env(**kw):
    return ToolEnv(Data(), Calc, "Calc", load_reward(reward_fn), **kw)


def test_public_methods_become_tools_with_schemas_from_signature_and_docstring():
    schemas, methods = tool_schemas(Calc(), "Calc")
    assert sorted(methods) == ["explode", "multiply", "sleep", "step"]  # not reset, not _private
    mul = next(s for s in schemas if s["function"]["name"] == "multiply")["function"]
    assert mul["description"] == "Multiply two integers."
    assert mul["parameters"]["properties"]["a"] == {"type": "integer", "description": "The first factor."}
    assert mul["parameters"]["required"] == ["a", "b"]


def test_an_undocumented_tool_fails_at_start_naming_it():
    class Bad:
        def reset(self, **row):
            pass

        def go(self, x):
            return x

    with pytest.raises(EnvironmentClassError, match="tool 'go' cannot be described"):
        ToolEnv(Data(), Bad, "Bad", load_reward(reward_fn))


def test_reset_gets_the_row_nested_values_included_and_its_return_opens_the_episode():
    env = make_env()
    st = env.reset(Data().load()[0])
    assert st.data["obj"].row["numbers"] == {"a": 6, "b": 7} and st.data["obj"].row["answer"] == 42
    assert env.opening(st) == "(numbers: 6 and 7)"


@pytest.mark.parametrize("text, expect", [
    ('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>', "42"),
    ('<tool_call>{"name": "step", "arguments": {"note": "hi"}}</tool_call>', "noted hi"),
    ('<tool_call>{"name": multiply}</tool_call>', "error: tool call is not valid JSON"),
    ('<tool_call>["multiply"]</tool_call>', 'error: tool call must be a JSON object'),
    ('<tool_call>{"name": "divide", "arguments": {}}</tool_call>', "error: unknown tool 'divide'"),
    ('<tool_call>{"name": "multiply", "arguments": {"a": 6}}</tool_call>', "error: multiply: missing argument 'b'"),
    ('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7, "c": 1}}</tool_call>', "unknown argument 'c'"),
    ('<tool_call>{"name": "multiply", "arguments": {"a": "six", "b": 7}}</tool_call>', "'a' must be integer"),
    ('<tool_call>{"name": "multiply", "arguments": {"a": true, "b": 7}}</tool_call>', "'a' must be integer"),
    ('<tool_call>{"name": "multiply", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}</tool_call>', "6"),
    ('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}', "42"),  # unclosed at the end of the turn
])
def test_every_bad_call_is_an_observation_never_a_crash(text, expect):
    env = make_env(tool_timeout_s=0.3)
    st = env.reset(Data().load()[0])
    reply = env.step(st, "Let me see. " + text)
    assert isinstance(reply, list) and len(reply) == 1 and reply[0]["role"] == "tool"
    assert expect in reply[0]["content"]
    assert st.data["tool_calls"] == 1 and st.data["tool_errors"] == int(reply[0]["content"].startswith("error"))


def test_a_call_nested_a_thousand_levels_deep_is_an_observation():
    """The parser never raises, whatever the policy writes: JSON nested past the stack is a bad call like any other."""
    deep = '{"name": "multiply", "arguments": {"a": ' + "[" * 1000 + "]" * 1000 + ', "b": 1}}'
    as_string = json.dumps({"name": "multiply", "arguments": "[" * 999})  # arguments as a JSON string, nested
    for text in ("<tool_call>" + deep + "</tool_call>", "<tool_call>" + "[" * 1500 + "</tool_call>",
                 "<tool_call>" + as_string + "</tool_call>"):
        (call,) = parse_tool_calls(text)
        assert "nested more than 64 levels" in call.reason or "not valid JSON" in call.reason, call.reason
        env = make_env()
        st = env.reset(Data().load()[0])
        reply = env.step(st, text)
        assert reply[0]["content"].startswith("error: ") and st.data["tool_errors"] == 1


def test_too_many_calls_and_long_results_and_turn_budget():
    env = make_env(max_calls=2, max_result_chars=5, turn_budget_s=0.35, tool_timeout_s=0.4)
    st = env.reset(Data().load()[0])
    call = render_tool_call("multiply", {"a": 123456, "b": 1000})
    reply = env.step(st, call * 3)
    assert [r["content"] for r in reply[:2]] == ["12345... [cut at 5 characters]"] * 2
    assert "more than 2 tool calls" in reply[2]["content"]
    assert env.step(st, "The answer is 42.") is None  # no call: the episode is over
    env = make_env(turn_budget_s=0.0)
    st = env.reset(Data().load()[0])
    reply = env.step(st, render_tool_call("multiply", {"a": 1, "b": 1}))
    assert "tool time is used up" in reply[0]["content"]


def test_parser_is_linear_on_hostile_text():
    t0 = time.perf_counter()
    out = parse_tool_calls("<tool_call>" * 50_000 + "{" * 100_000)  # one unclosed call, far over the size limit
    many = parse_tool_calls("<tool_call>{</tool_call>" * 50_000)
    assert time.perf_counter() - t0 < 1.0
    assert len(out) == 1 and "over the 4000 limit" in out[0].reason
    assert len(many) == 9 and "more than 8 tool calls" in many[-1].reason


def test_rewards_get_environments_and_episode_metrics():
    env = make_env()
    states = [env.reset(t) for t in Data().load() * 2]
    env.step(states[0], render_tool_call("multiply", {"a": 6, "b": 7}))
    env.step(states[0], "6 * 7 = 42")
    env.step(states[1], "6 * 7 = 42")  # right answer without the tool: the reward says 0
    scores = env.score_episodes(states)
    assert [s.value for s in scores] == [1.0, 0.0]
    assert scores[0].info["tool_calls"] == 1 and scores[1].info["tool_calls"] == 0


class Walk:
    """Gym style: reach 3 by saying 'up'; 4-tuple step."""

    def reset(self):
        self.pos = 0
        return "You are at 0. Say up or down.", {}

    def step(self, action):
        self.pos += 1 if "up" in action else -1
        return f"You are at {self.pos}.", float(self.pos == 3), self.pos >= 3, {}


class Walk5(Walk):
    def step(self, action):
        obs, r, done, info = super().step(action)
        return obs, r, done, False, info


class TextEngine:
    """engine.generate(): each sample's text is script(conversation_text, round); ids are tokenizer.encode(text)
    (+ `end`), recording every prompt it was sent."""

    def __init__(self, tok, script, end=()):
        self.tok, self.script, self.end, self.prompts = tok, script, list(end), []

    def generate(self, prompts, params):
        plist = params if isinstance(params, list) else [params] * len(prompts)
        outs = []
        for i, (p, sp) in enumerate(zip(prompts, plist)):
            self.prompts.append(list(p))
            samples = []
            for j in range(sp.n):
                ids = self.script(self.tok.decode(p), p) + self.end
                samples.append(CompletionOutput(j, ids, [-0.5] * len(ids), "stop", self.tok.decode(ids), [3] * len(ids)))
            outs.append(RequestOutput(str(i), list(p), samples))
        return outs


@pytest.mark.parametrize("cls", [Walk, Walk5])
def test_gym_style_environments_run_through_the_adapter(cls):
    from rollwise.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer("abcdefghijklmnopqrstuvwxyzWY .,:?*()0123456789\n")
    env = GymEnv(Data(), cls, "Walk")
    eng = TextEngine(tok, lambda conv, ids: tok.encode("up", add_special_tokens=False))
    from rollwise.models.prompting import PromptFormat

    encode = PromptFormat(chat_template=False).task_encoder(tok)
    (ep,) = run_episodes(eng, tok, env, Data().load(), SamplingParams(n=1, max_tokens=8), 5, 400,
                         prompts=[encode(t) for t in Data().load()], encode=encode)
    assert "You are at 0" in tok.decode(eng.prompts[0])  # the first observation joined the first user turn
    assert ep.turns == 3 and ep.finish_reason == "stop" and ep.score.value == 1.0
    assert ep.state.data["obj"].pos == 3


@pytest.fixture(scope="module")
def smol_tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def test_turns_are_token_exact_on_the_real_tokenizer_even_mid_word(smol_tok):
    """Turn k+1's prompt is turn k's prompt + the generated ids + the tool turn's ids, byte for byte; the generated
    ids are kept even where re-tokenizing their text would give other ids (a turn that ends mid-word)."""
    from rollwise.control.episodes import chat_reply_formatter
    from rollwise.models.prompting import PromptFormat, end_of_turn_id
    from rollwise.models.turns import ChatTurns

    tok = smol_tok
    env = make_env()
    eot = end_of_turn_id(tok)
    fmt = PromptFormat(tools=env.tools)
    call = render_tool_call("multiply", {"a": 6, "b": 7})
    # Turn 1: a call, then a word cut in the middle ("multip" + "lic" as two odd pieces), then end of turn.
    odd = tok.convert_tokens_to_ids(["Ġmult", "ip"])
    turn1 = tok.encode(call, add_special_tokens=False) + odd
    assert tok.encode(tok.decode(turn1), add_special_tokens=False) != turn1  # re-tokenizing would drift here
    turn2 = tok.encode("6 * 7 = 42", add_special_tokens=False)
    script = lambda conv, ids: turn1 if "<|im_start|>tool" not in conv else turn2  # noqa: E731
    eng = TextEngine(tok, script, end=[eot])
    task = Data().load()[0]
    encode = fmt.task_encoder(tok)
    fmt_reply = chat_reply_formatter(tok, True)
    (ep,) = run_episodes(eng, tok, env, [task], SamplingParams(n=1, max_tokens=64), 4, 1024,
                         prompts=[encode(task)], format_reply=fmt_reply, turn_end_ids={eot}, encode=encode)
    p1, p2 = eng.prompts
    tool_ids = fmt_reply([{"role": "tool", "content": "42"}], turn1 + [eot])
    assert p2 == p1 + turn1 + [eot] + tool_ids  # exactly, no re-tokenization
    assert ep.token_ids == turn1 + [eot] + tool_ids + turn2 + [eot]
    assert ep.loss_mask == [1] * (len(turn1) + 1) + [0] * len(tool_ids) + [1] * (len(turn2) + 1)
    env_ix = [i for i, m in enumerate(ep.loss_mask) if m == 0]
    assert all(ep.logprobs[i] == 0.0 and ep.weight_versions[i] == ENV_WEIGHT_VERSION for i in env_ix)
    # the opening text from reset joined the first user turn; the tool turn is the template's own rendering
    assert "(numbers: 6 and 7)" in tok.decode(p1)
    assert tok.decode(tool_ids) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    assert ep.score.value == 1.0 and ep.score.info["tool_calls"] == 1 and ep.turns == 2
    # SFT renders a demonstration of the same conversation with the same ids (policy text canonical there)
    demo = [{"role": "user", "content": "What is 6 * 7?(numbers: 6 and 7)"},  # reset's text appended as it is (TRL)
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "multiply", "arguments": json.dumps({"a": 6, "b": 7})}}]},
            {"role": "tool", "content": "42"}, {"role": "assistant", "content": "6 * 7 = 42"}]
    prompt, ids, mask = ChatTurns(tok, fmt).render_conversation(demo)
    c1 = tok.encode(call, add_special_tokens=False)
    assert prompt == p1 and ids == c1 + [eot] + tool_ids + turn2 + [eot]
    assert mask == [1] * (len(c1) + 1) + [0] * len(tool_ids) + [1] * (len(turn2) + 1)
    full = tok.apply_chat_template(fmt.messages([{"role": "user", "content": demo[0]["content"]}])
                                   + [{"role": "assistant", "content": call}, {"role": "tool", "content": "42"},
                                      {"role": "assistant", "content": "6 * 7 = 42"}], tokenize=False)
    assert tok.decode(prompt + ids) + "\n" == full  # the template's own rendering of the whole conversation


def test_a_turn_cut_by_max_tokens_still_reaches_the_reward():
    from rollwise.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer("abcdefghijklmnopqrstuvwxyzW .,:?*()0123456789\n")
    env = make_env()
    cut = TextEngine(tok, lambda conv, ids: tok.encode("it is 42 and more", add_special_tokens=False))
    task = Data().load()[0]
    enc = lambda t: tok.encode("What is 6 * 7?")  # noqa: E731

    class Cut(TextEngine):
        def generate(self, prompts, params):
            outs = super().generate(prompts, params)
            for o in outs:
                for c in o.outputs:
                    c.finish_reason = "length"
            return outs

    cut.__class__ = Cut
    (ep,) = run_episodes(cut, tok, env, [task], SamplingParams(n=1, max_tokens=8), 3, 400, prompts=[enc(task)],
                         encode=enc)
    assert ep.finish_reason == "length" and ep.score.error is None and ep.score.value == 0.0  # scored, not errored
    assert ep.state.transcript == [("policy", "it is 42 and more")]


TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_template_that_renders_tools_is_used_for_prompts_calls_and_results(smollm2_dir):
    """Qwen/Hermes-style: the template writes the tool list, the calls and the results; rollwise follows it."""
    from transformers import AutoTokenizer

    from rollwise.models.prompting import PromptFormat
    from rollwise.models.tool_calls import template_renders_tools
    from rollwise.models.turns import ChatTurns

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    tok.chat_template = TOOL_TEMPLATE
    assert template_renders_tools(tok)
    env = make_env()
    fmt = PromptFormat(tools=env.tools)
    prompt_text = tok.decode(fmt.encode(tok, "What is 6 * 7?"))
    assert prompt_text.startswith("<|im_start|>system\n# Tools\n") and "Tools:\n- " not in prompt_text
    demo = [{"role": "user", "content": "What is 6 * 7?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "multiply", "arguments": {"a": 6, "b": 7}}}]},
            {"role": "tool", "content": "42"}, {"role": "assistant", "content": "42"}]
    turns = ChatTurns(tok, fmt)
    prompt, ids, mask = turns.render_conversation(demo)
    assert tok.decode(prompt + ids) == tok.apply_chat_template(demo, tools=env.tools, tokenize=False)
    policy = tok.decode([i for i, m in zip(ids, mask) if m])
    assert policy.startswith('<tool_call>\n{"name": "multiply"') and policy.endswith("42<|im_end|>")
    (call,) = parse_tool_calls(policy)  # the template's call syntax parses as a call
    assert call.name == "multiply" and call.arguments == {"a": 6, "b": 7}
    tool_turn = tok.decode([i for i, m in zip(ids, mask) if not m])
    assert tool_turn == "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|><|im_start|>assistant\n"


def test_a_user_reward_scores_a_registered_multi_turn_env_with_environments():
    """rollwise's own reset/step protocol (tool_calc) with a TRL-style reward: whole episodes, environments=."""
    import re
    import string

    from rollwise.envs.build import RewardedEpisodes
    from rollwise.envs.build import make_env as build
    from rollwise.models.tokenizer import build_char_tokenizer

    def reward(completions, environments, answer, **kw):
        return [float(e.data["calls"] >= 1 and f"<answer>{a}" in c) for c, e, a in zip(completions, environments, answer)]

    env = build("tool_calc", {"terms": 2, "digits": 2}, reward=reward)
    assert isinstance(env, RewardedEpisodes) and env.stop == ("</calc>", "</python>", "</answer>")
    tok = build_char_tokenizer(string.printable)

    def script(conv, ids):
        expr = re.findall(r"What is (.*?)\?", conv)[0]
        res = re.findall(r"<result>(-?\d+)</result>", conv)
        text = f"<calc>{expr}</calc>" if not res else f"<answer>{res[-1]}</answer>"
        return tok.encode(text, add_special_tokens=False)

    tasks = env.load("train", n=2)
    eps = run_episodes(TextEngine(tok, script), tok, env, tasks, SamplingParams(n=1, max_tokens=40), 4, 800)
    assert [ep.score.value for ep in eps] == [1.0, 1.0] and all(ep.turns == 2 for ep in eps)


class Tricky(Calc):
    """Tools whose failures are the tool's, on what the policy asked: they end the episode errored."""

    def power(self, a: int, b: int) -> int:
        """Raise a to the power b.

        Args:
            a: The base.
            b: The exponent.
        """
        return a ** b


def _tool_episode(cls, turn: str, gym: bool = False):
    """One episode of `cls` whose policy writes `turn`, then an answer; returns (episode, the engine's prompts)."""
    from rollwise.control.episodes import chat_reply_formatter
    from rollwise.models.prompting import PromptFormat
    from rollwise.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(''.join(chr(c) for c in range(32, 127)) + "\n")
    env = GymEnv(Data(), cls, cls.__name__) if gym else ToolEnv(Data(), cls, cls.__name__, load_reward(reward_fn))
    script = lambda conv, ids: tok.encode(turn if "42" not in conv else "42", add_special_tokens=False)  # noqa: E731
    eng = TextEngine(tok, script)
    encode = PromptFormat(chat_template=False).task_encoder(tok)
    tasks = Data().load()
    (ep,) = run_episodes(eng, tok, env, tasks, SamplingParams(n=1, max_tokens=200), 4, 2000,
                         prompts=[encode(t) for t in tasks], encode=encode,
                         format_reply=chat_reply_formatter(tok, False))
    return ep, eng.prompts


@pytest.mark.parametrize("turn, reason", [
    (render_tool_call("power", {"a": 10, "b": 5000}), "tool power: its result (int) cannot become text: ValueError"),
    (render_tool_call("explode", {}), "tool explode raised RuntimeError: kaboom"),
])
def test_a_tool_that_fails_on_the_policys_call_errors_the_episode_and_it_trains_as_wrong(turn, reason):
    """A tool's failure is the episode's outcome: errored with the reason, finished (not aborted), so it counts as a
    wrong answer in advantages and the loss; the model is not shown the exception and the episode ends there."""
    from rollwise.filter import scored_as_wrong

    ep, prompts = _tool_episode(Tricky, turn)
    r = ep.to_rollout()
    assert ep.score.error is not None and ep.score.error.startswith(reason), ep.score.error
    assert r.status == "errored" and r.finish_reason == "stop" and scored_as_wrong(r)
    assert len(prompts) == 1 and ep.state.data["tool_failure"] == ep.score.error
    assert ep.score.info["tool_calls"] == 1 and ep.score.info["tool_errors"] == 1


class Picky(Walk):
    """Gym style, and its step raises on some of the policy's text."""

    def step(self, action):
        if "boom" in action:
            raise ValueError("cannot parse " + action[:10])
        return super().step(action)


def test_a_gym_step_that_raises_on_the_policys_text_errors_the_episode_and_it_trains_as_wrong():
    from rollwise.filter import scored_as_wrong

    ep, _ = _tool_episode(Picky, "boom boom", gym=True)
    r = ep.to_rollout()
    assert ep.score.error == "data.step raised ValueError: cannot parse boom boom"
    assert r.status == "errored" and r.finish_reason == "stop" and scored_as_wrong(r)


class Heavy(Calc):
    """Tools and a reward that keep the GIL in one C call (a thread join cannot stop them), and an async tool."""

    def power(self, a: int, b: int) -> str:
        """Raise a to the power b.

        Args:
            a: The base.
            b: The exponent.
        """
        self.used.append("power")
        return "big" if pow(a, b) else "zero"

    async def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first.
            b: The second.
        """
        self.used.append("add")
        return a + b

    def crash(self) -> str:
        """Ends its process on the spot, as a segfault in a C extension would."""
        import os

        os._exit(3)

    def get_reward(self) -> float:
        if "power" in self.used:
            pow(3, 15_000_000)
        return float(len(self.used))


@pytest.mark.parametrize("timeout", [0.5])
def test_a_tool_holding_the_gil_is_killed_at_its_timeout(timeout):
    """`pow(3, 15_000_000)` holds the GIL for seconds: with the instance in its own process, the call ends at its
    timeout (the process is killed), and the episode is errored with the reason, trained on as a wrong answer."""
    env = ToolEnv(Data(), Heavy, "Heavy", None, tool_timeout_s=timeout)
    assert env.isolation == "process"
    st = env.reset(Data().load()[0])
    t0 = time.perf_counter()
    assert env.step(st, render_tool_call("power", {"a": 3, "b": 15_000_000})) is None
    took = time.perf_counter() - t0
    assert took < timeout + 0.4, took
    (sc,) = env.score_episodes([st])
    assert sc.error == f"tool power timed out after {timeout:.3g}s"
    env.teardown(st)


def test_state_comes_back_from_the_tool_process_and_a_slow_get_reward_is_killed():
    """Calls run in the episode's process (async ones too); the reward reads their effects on the same instance the
    episode started with, and a get_reward that holds the GIL is stopped at tool_timeout_s."""
    env = ToolEnv(Data(), Heavy, "Heavy", load_reward(reward_fn), tool_timeout_s=0.5)
    a, b = env.reset(Data().load()[0]), env.reset(Data().load()[0])
    obj_a = a.data["obj"]
    assert env.step(a, render_tool_call("add", {"a": 40, "b": 2}))[0]["content"] == "42"
    assert env.step(a, render_tool_call("multiply", {"a": 6, "b": 7}))[0]["content"] == "42"
    assert obj_a.used == []  # the calls ran in the episode's process, not here
    env.step(a, "6 * 7 = 42")
    env.step(b, render_tool_call("power", {"a": 2, "b": 3}))  # fast here; get_reward then spins past its time
    env.step(b, "42")
    t0 = time.perf_counter()
    sa, sb = env.score_episodes([a, b])
    assert time.perf_counter() - t0 < 2.0
    assert a.data["obj"] is obj_a and obj_a.used == ["add", "multiply"]  # state back, on the same object
    assert sa.error is None and sa.value == 1.0 + 2.0 and sa.parts == {"reward_fn": 1.0, "Heavy": 2.0}
    assert sb.error == "Heavy.get_reward: timed out after 0.5s"


def test_a_tool_that_kills_its_process_errors_its_episode_only():
    env = ToolEnv(Data(), Heavy, "Heavy", None, tool_timeout_s=5.0)
    st, ok = env.reset(Data().load()[0]), env.reset(Data().load()[0])
    assert env.step(st, render_tool_call("crash", {})) is None
    assert env.step(ok, render_tool_call("add", {"a": 1, "b": 2}))[0]["content"] == "3"
    bad, good = env.score_episodes([st, ok])
    assert bad.error == "tool crash: its process ended" and good.error is None and good.value == 1.0


class Stubborn(Walk):
    """Gym style: a step that holds the GIL on some text, and rewards that overflow when summed."""

    def step(self, action):
        if "power" in action:
            pow(3, 15_000_000)
        return "go on", 1e308, False, {}


def test_a_gym_step_holding_the_gil_is_stopped_and_its_episode_trains_as_wrong():
    from rollwise.filter import scored_as_wrong

    env = GymEnv(Data(), Stubborn, "Stubborn", step_timeout_s=0.5)
    assert env.isolation == "process"
    t0 = time.perf_counter()
    ep, _ = _tool_episode_with(env, "power")
    assert time.perf_counter() - t0 < 2.5
    r = ep.to_rollout()
    assert ep.score.error == "data.step raised TimeoutError: took longer than 0.5s (stopped)"
    assert r.status == "errored" and r.finish_reason == "stop" and scored_as_wrong(r)


def test_step_rewards_that_sum_to_inf_error_the_episode_not_its_group():
    env = GymEnv(Data(), Stubborn, "Stubborn")
    ep, _ = _tool_episode_with(env, "walk", turns=3)
    assert ep.score.error == "Stubborn: the sum of the step rewards is inf" and ep.score.value == 0.0


def _tool_episode_with(env, turn: str, turns: int = 2):
    from rollwise.models.prompting import PromptFormat
    from rollwise.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(''.join(chr(c) for c in range(32, 127)) + "\n")
    eng = TextEngine(tok, lambda conv, ids: tok.encode(turn, add_special_tokens=False))
    encode = PromptFormat(chat_template=False).task_encoder(tok)
    tasks = Data().load()
    (ep,) = run_episodes(eng, tok, env, tasks, SamplingParams(n=1, max_tokens=200), turns, 2000,
                         prompts=[encode(t) for t in tasks], encode=encode)
    return ep, eng.prompts


def test_out_of_processes_an_episode_runs_its_tools_here_and_says_so(monkeypatch):
    """Forks that fail (a small ulimit, a full process table) must not error every episode and stop the run: the
    episode's calls run in threads instead, with one warning."""
    import os

    def no_fork():
        raise OSError(24, "Too many open files")

    env = ToolEnv(Data(), Heavy, "Heavy", load_reward(reward_fn), tool_timeout_s=2.0)
    monkeypatch.setattr(os, "fork", no_fork)
    with pytest.warns(RuntimeWarning, match="could not start .*Too many open files.*run in threads"):
        st = env.reset(Data().load()[0])
        assert env.step(st, render_tool_call("multiply", {"a": 6, "b": 7}))[0]["content"] == "42"
    env.step(st, "6 * 7 = 42")
    (sc,) = env.score_episodes([st])
    assert sc.error is None and sc.parts == {"reward_fn": 1.0, "Heavy": 1.0}
