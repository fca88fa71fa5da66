"""TRL's environment contract as TRL 1.16's GRPOTrainer runs it, through `rollwise.trl` and the run config: the
environment classes of TRL's own documentation (GRPO trainer guide, "Agent Training") unchanged, on SmolLM2's real
tokenizer and chat template with rollwise's fallback tool-call format (SmolLM2's template does not render tools)."""

from __future__ import annotations

import asyncio
import json
import random
import re

import pytest

from rollwise.envs.agent import EnvironmentClassError, ToolEnv, make_class_env, tool_schemas
from rollwise.trl import GRPOConfig, GRPOTrainer, TRLArgumentError
from rollwise.types import CompletionOutput, RequestOutput, Task


# ------------------------------------------------------------------------------------ TRL's documented classes
# From TRL's GRPO trainer guide ("Environments"): the environment owns the data, reset() returns the prompt.
class IncrementEnv:
    # Reserved methods
    def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
        self.counter = 0
        self.target = random.randint(1, 6)  # self-sample the task
        return f"Increment the counter by {self.target}."  # returned string becomes the prompt

    def get_reward(self) -> float:  # optional: the environment scores itself from its own state
        return float(self.counter == self.target)

    # Public methods (exposed as tools)
    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


# From the same guide ("Providing an external dataset"): the row's `target` column reaches reset(target=...).
class DatasetIncrementEnv:
    def reset(self, target, **kwargs) -> None:  # the row's `target` column arrives as a keyword argument
        self.counter = 0
        self.target = target

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:  # exposed as a tool (see the full docstring above)
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


# From the same guide ("Multiple environments"): a dict of factories, routed by the rows' `environment` column.
class CodingEnv:
    def reset(self, **kwargs) -> str:
        n = random.randint(1, 20)
        return f"Compute the {n}th Fibonacci number."

    def run_code(self, code: str) -> str:  # exposed as a tool only for "coding" examples
        """Run the given Python code and return its stdout.

        Args:
            code: The Python source to execute.

        Returns:
            The captured standard output.
        """
        ...


class GameEnv:
    def reset(self, **kwargs) -> str:
        return "Reach the goal tile."

    def move(self, action: str) -> str:  # exposed as a tool only for "game" examples
        """Apply an action to the game and return the new observation.

        Args:
            action: One of "up", "down", "left", "right".

        Returns:
            The observation after the move.
        """
        ...


def format_reward(completions, **kwargs):  # the guide's trainer-owned reward beside get_reward ("Rewards")
    return [0.5 if any(m.get("role") == "tool" for m in c) else 0.0 for c in completions]


def reward_func(completions, environments, **kwargs):  # the multi-environment example's reward (left to the user)
    return [1.0 if isinstance(e, CodingEnv) else 0.5 for e in environments]


# ------------------------------------------------------------------------------------ the contract, class level
class Kinds:
    """Every kind of attribute a class may have, to see which become tools."""

    def reset(self, **kwargs):
        return None

    def get_reward(self) -> float:
        return 1.0

    def bound(self, x: int) -> int:
        """A method.

        Args:
            x: A number.
        """
        return x

    async def waits(self, x: int) -> int:
        """An async method.

        Args:
            x: A number.
        """
        await asyncio.sleep(0)
        return x + 1

    @staticmethod
    def static(x: int) -> int:
        """A static method (a plain function on the class: TRL offers it).

        Args:
            x: A number.
        """
        return x

    @classmethod
    def klass(cls, x: int) -> int:
        """A class method (not a function on the class: TRL does not offer it).

        Args:
            x: A number.
        """
        return x

    @property
    def prop(self) -> int:
        return 1

    helper = len  # a callable attribute, not a tool

    def _private(self) -> None:
        pass


class Rows:
    """A data environment: the given rows as tasks (metadata = every column but the prompt)."""

    name = "rows"

    def __init__(self, rows):
        self.rows = rows

    def load(self, split="train", n=None, seed=0):
        return [Task(f"{split}/{i}", r.get("prompt", [{"role": "user", "content": ""}]), None,
                     metadata={k: v for k, v in r.items() if k != "prompt"}) for i, r in enumerate(self.rows)]


def test_tools_are_what_trl_offers_public_functions_of_the_class_but_reset_and_get_reward():
    _, methods = tool_schemas(Kinds(), "Kinds")
    assert sorted(methods) == ["bound", "static", "waits"]
    import importlib.util
    import inspect
    from pathlib import Path

    spec = importlib.util.find_spec("trl")  # the installed TRL's own rule (its trainer does not import here)
    source = (Path(spec.origin).parent / "trainer" / "grpo_trainer.py").read_text()
    assert "inspect.getmembers(type(instance), predicate=inspect.isfunction)" in source
    trl_rule = [n for n, _ in inspect.getmembers(Kinds, predicate=inspect.isfunction)
                if n not in ("reset", "get_reward") and not n.startswith("_")]
    assert sorted(methods) == sorted(trl_rule)


def test_get_reward_is_a_reward_not_a_tool_and_makes_env_reward_optional():
    env = ToolEnv(Rows([{"prompt": [{"role": "user", "content": "go"}]}]), IncrementEnv, "IncrementEnv")
    assert env.methods == ["increment"]  # get_reward, even undocumented, is never described as a tool
    st = env.reset(env.load()[0])
    obj = st.data["obj"]
    env.step(st, '<tool_call>{"name": "increment", "arguments": {"step": %d}}</tool_call>' % obj.target)
    env.step(st, "done")
    (sc,) = env.score_episodes([st])
    assert sc.value == 1.0 and sc.parts == {"IncrementEnv": 1.0} and sc.error is None


def test_a_class_without_get_reward_still_needs_a_reward():
    with pytest.raises(EnvironmentClassError, match="needs env.reward or env.rewards, or a get_reward"):
        ToolEnv(Rows([{}]), GameEnv, "GameEnv")


def test_async_get_reward_and_async_tools_run_and_sum_with_the_configured_reward():
    from rollwise.rewards.user import load_reward

    class AsyncEnv:
        def reset(self, **kwargs):
            self.n = 0

        async def get_reward(self) -> float:
            await asyncio.sleep(0)
            return float(self.n)

        async def bump(self, by: int) -> int:
            """Adds.

            Args:
                by: How much.
            """
            await asyncio.sleep(0)
            self.n += by
            return self.n

    env = ToolEnv(Rows([{"prompt": [{"role": "user", "content": "go"}]}]), AsyncEnv, "AsyncEnv", load_reward(format_reward))
    st = env.reset(env.load()[0])
    (reply,) = env.step(st, '<tool_call>{"name": "bump", "arguments": {"by": 2}}</tool_call>')
    assert reply["content"] == "2" and reply["name"] == "bump"
    env.step(st, "ok")
    (sc,) = env.score_episodes([st])
    assert sc.value == 2.5 and sc.parts == {"format_reward": 0.5, "AsyncEnv": 2.0}


def test_instances_are_pooled_and_reset_not_rebuilt():
    built = []

    class Counted(IncrementEnv):
        def __init__(self):
            built.append(self)

    env = ToolEnv(Rows([{"prompt": "go"}]), Counted, "Counted")
    task = env.load()[0]
    for _ in range(3):  # three rounds of two concurrent episodes: two instances in all, each reset every time
        states = [env.reset(task), env.reset(task)]
        assert states[0].data["obj"] is not states[1].data["obj"]
        for st in states:
            env.teardown(st)
    assert len(built) == 2  # the probe seeded the pool; one more for the second concurrent episode


def test_a_dict_of_classes_routes_rows_by_their_environment_column_and_offers_only_their_tools(smol_tok):
    from rollwise.config import EnvConfig
    from rollwise.run.setup import prompt_encoder

    rows = [{"environment": "coding"}, {"environment": "game"}]
    from rollwise.rewards.user import load_reward

    env = make_class_env(Rows(rows), {"coding": CodingEnv, "game": GameEnv}, "tools", load_reward(reward_func))
    tasks = env.load()
    seen = {}
    for t in tasks:
        st = env.reset(t)
        assert "environment" not in st.data["obj"].__dict__  # the routing column is not passed to reset
        seen[env.environment_of(t)] = type(st.data["obj"])
    assert seen == {"coding": CodingEnv, "game": GameEnv}
    encode = prompt_encoder(EnvConfig(name="rows"), smol_tok, env)
    coding, game = (smol_tok.decode(encode(t)) for t in tasks)
    assert "run_code" in coding and "move" not in coding
    assert "move" in game and "run_code" not in game
    with pytest.raises(EnvironmentClassError, match="environment='chess' is not among"):
        make_class_env(Rows([{"environment": "chess"}]), {"coding": CodingEnv}, "tools",
                       load_reward(reward_func)).load()


# ------------------------------------------------------------------------------------ the TRL front end
def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=4,
                max_completion_length=24, max_steps=2, learning_rate=1e-4, logging_steps=1, save_strategy="no",
                report_to="none", use_cpu=True)
    return GRPOConfig(**{**base, **kw})


def test_without_a_dataset_the_environment_owns_the_data(tmp_path):
    t = GRPOTrainer(model="smollm2-135m", args=_args(tmp_path), environment_factory=IncrementEnv)
    cfg = t.config()
    assert cfg["env"]["name"] == "env_owned" and cfg["env"]["kwargs"] == {"rows": 2}
    assert cfg["env"]["rewards"] is None and cfg["env"]["environment"] is IncrementEnv
    with pytest.raises(TRLArgumentError, match="max_steps"):
        GRPOTrainer(model="smollm2-135m", args=_args(tmp_path, max_steps=-1), environment_factory=IncrementEnv)
    with pytest.raises(TRLArgumentError, match="'environment' column"):
        GRPOTrainer(model="smollm2-135m", args=_args(tmp_path), environment_factory={"coding": CodingEnv})
    with pytest.raises(TRLArgumentError, match="no reward source"):
        GRPOTrainer(model="smollm2-135m", args=_args(tmp_path), environment_factory=GameEnv)


def test_a_dict_factory_needs_each_row_to_name_one_of_its_environments(tmp_path):
    rows = [{"environment": "coding"}, {"environment": "game"}] * 2
    t = GRPOTrainer(model="smollm2-135m", args=_args(tmp_path), train_dataset=rows, reward_funcs=reward_func,
                    environment_factory={"coding": CodingEnv, "game": GameEnv})
    env = t.config()["env"]
    assert env["environment"] == {"coding": CodingEnv, "game": GameEnv}
    assert env["kwargs"]["path"][0]["prompt"] == [{"role": "user", "content": ""}]  # reset() fills it
    with pytest.raises(TRLArgumentError, match=r"train_dataset\[1\] has environment='chess'"):
        GRPOTrainer(model="smollm2-135m", args=_args(tmp_path), train_dataset=[rows[0], {"environment": "chess"}],
                    reward_funcs=reward_func, environment_factory={"coding": CodingEnv, "game": GameEnv})


# ------------------------------------------------------------------------------------ whole runs
@pytest.fixture(scope="module")
def smol_tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)



class IncrementPolicy:
    """A stand-in engine writing rollwise's fallback tool-call format: the first turn increments by the prompt's
    target (one call in two misses it by 1, so groups carry signal), the next one says it is done. `first`: what
    the first turn writes instead (a garbage call)."""

    def __init__(self, tok, first=None):
        self.tok, self.eot = tok, tok.convert_tokens_to_ids("<|im_end|>")
        self.first = first
        self.max_model_len = 2048
        self.prompts: list[str] = []
        self.calls = 0

    def _text(self, conv: str, j: int) -> str:
        if "<|im_start|>tool" in conv:
            return "Done."
        if self.first is not None:
            return self.first
        target = int(re.findall(r"Increment the counter (?:by|to) (\d+)", conv)[-1])
        self.calls += 1  # every other call misses the target
        return '<tool_call>{"name": "increment", "arguments": {"step": %d}}</tool_call>' % (target + self.calls % 2)

    def generate(self, prompts, params):
        plist = params if isinstance(params, list) else [params] * len(prompts)
        outs = []
        for i, (p, sp) in enumerate(zip(prompts, plist)):
            conv = self.tok.decode(p)
            self.prompts.append(conv)
            samples = []
            for j in range(sp.n):
                ids = self.tok.encode(self._text(conv, i + j), add_special_tokens=False) + [self.eot]
                samples.append(CompletionOutput(j, ids, [-1.0] * len(ids), "stop",
                                                self.tok.decode(ids, skip_special_tokens=True), [0] * len(ids)))
            outs.append(RequestOutput(str(i), list(p), samples))
        return outs

    def load_weights(self, weights, version=None):
        return version

    def counters(self):
        return {}


def _rollouts(run_dir):
    from rollwise.store.writer import RolloutStore

    return RolloutStore(run_dir).read()


def test_the_guides_increment_env_trains_without_a_dataset_on_smollm2_turns(tmp_path, smol_tiny, monkeypatch):
    import rollwise.run.setup as setup
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_tiny)
    policy = IncrementPolicy(tok)
    monkeypatch.setattr(setup, "make_engine", lambda *a, **k: policy)
    trainer = GRPOTrainer(model=str(smol_tiny), args=_args(tmp_path), environment_factory=IncrementEnv)
    trainer.train()
    first = policy.prompts[0]
    # reset()'s string is the user message itself; the tool is described in rollwise's fallback format
    assert re.search(r"<\|im_start\|>user\nIncrement the counter by \d\.<\|im_end\|>", first)
    assert "increment(step: integer)" in first and "<tool_call>" in first and "get_reward" not in first
    rows = _rollouts(tmp_path / "run")
    assert len(rows) == 2 * 2 * 2
    for r in rows:
        assert r.env_info["tool_calls"] == 1 and r.env_info["tool_errors"] == 0
        target = int(re.findall(r"counter by (\d+)", tok.decode(r.prompt_token_ids))[-1])
        step = int(re.findall(r'"step": (\d+)', r.text)[0])
        assert r.reward == float(step == target)  # get_reward(), from the instance's state
        assert r.reward_parts == {"IncrementEnv": r.reward}
    assert {r.reward for r in rows} == {0.0, 1.0}
    log = trainer.state.log_history
    assert 0.0 < log[0]["reward"] < 1.0 and "rewards/IncrementEnv/mean" in log[0]


def test_the_guides_dataset_increment_env_with_a_trainer_reward_beside_get_reward(tmp_path, smol_tiny, monkeypatch):
    import rollwise.run.setup as setup
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_tiny)
    monkeypatch.setattr(setup, "make_engine", lambda *a, **k: IncrementPolicy(tok))
    data = [{"prompt": [{"role": "user", "content": f"Increment the counter to {i}."}], "target": i}
            for i in range(1, 7)]
    trainer = GRPOTrainer(model=str(smol_tiny), args=_args(tmp_path), train_dataset=data,
                          reward_funcs=format_reward, environment_factory=DatasetIncrementEnv)
    trainer.train()
    rows = _rollouts(tmp_path / "run")
    for r in rows:  # both sources, summed (reward_weights weight reward_funcs only; get_reward has weight 1)
        assert set(r.reward_parts) == {"format_reward", "DatasetIncrementEnv"} and r.reward_parts["format_reward"] == 0.5
        assert r.reward == pytest.approx(sum(r.reward_parts.values()))
    assert {r.reward_parts["DatasetIncrementEnv"] for r in rows} == {0.0, 1.0}  # the row's target reached or not


@pytest.mark.parametrize("kind", ["tool raises", "get_reward raises", "garbage call"])
def test_a_failure_inside_an_episode_is_its_outcome_never_a_run_stop(tmp_path, smol_tiny, monkeypatch, kind):
    """A garbage call is an observation the model reads (as TRL); a tool that raises (unlike TRL, which shows the
    model its exception) and get_reward raising error that episode, which trains at algo.errored_reward with the
    reason recorded."""
    import rollwise
    import rollwise.run.setup as setup
    from transformers import AutoTokenizer

    class Fragile(IncrementEnv):
        resets = 0

        def reset(self, **kwargs) -> str | None:
            # every other episode (reset runs here; tools and get_reward in the episode's own process): a reward
            # that raises on every sample is a broken reward, and stops the run
            Fragile.resets += 1
            self.fragile = bool(Fragile.resets % 2)
            return super().reset(**kwargs)

        def get_reward(self) -> float:
            if kind == "get_reward raises" and self.fragile:
                raise RuntimeError("scoreboard offline")
            return super().get_reward()

        def increment(self, step: int) -> int:
            """
            Increment the internal counter.

            Args:
                step: Value to add to the counter.
            """
            if kind == "tool raises" and self.fragile:
                raise ValueError("counter jammed")
            return super().increment(step)

    tok = AutoTokenizer.from_pretrained(smol_tiny)
    first = '<tool_call>{"name": increment, 3}</tool_call>' if kind == "garbage call" else None
    monkeypatch.setattr(setup, "make_engine", lambda *a, **k: IncrementPolicy(tok, first=first))
    summary = rollwise.train({"model": {"path": str(smol_tiny), "device": "cpu"},
                              "env": {"name": "env_owned", "kwargs": {"rows": 2}, "environment": Fragile,
                                      "eval_size": 2},
                              "rollout": {"prompts_per_step": 2, "samples_per_prompt": 2, "max_tokens": 24},
                              "algo": {"errored_reward": 0.0, "skip_zero_variance": False},
                              "train": {"steps": 1, "lr": 1e-4}, "run": {"loggers": ["jsonl"]}},
                             out_dir=tmp_path / "run").summary
    rows = _rollouts(tmp_path / "run")
    assert summary["steps"] == 1 and len(rows) == 4
    if kind in ("get_reward raises", "tool raises"):
        errored = [r for r in rows if r.status == "errored"]
        reason = "scoreboard offline" if kind == "get_reward raises" else "tool increment raised ValueError: counter"
        assert len(errored) == 2 and all(reason in r.status_reason for r in errored), [r.status_reason for r in rows]
        assert all(r.advantage is not None for r in errored)  # trained on, as a wrong answer (errored_reward 0.0)
        return
    for r in rows:
        assert r.status == "kept" and r.reward == 0.0 and r.env_info["tool_errors"] == 1
        assert "not valid JSON" in r.env_info["tool_error"]


def test_a_tool_class_environment_pickles_without_its_pool():
    import pickle

    env = ToolEnv(Rows([{"prompt": [{"role": "user", "content": "go"}]}]), IncrementEnv, "IncrementEnv")
    back = pickle.loads(pickle.dumps(env))
    assert back.methods == ["increment"] and back.reset(back.load()[0]).data["obj"].counter == 0


ENVS_FILE = '''
import random

class CodingEnv:
    def reset(self, **kwargs) -> str:
        return f"Compute the {random.randint(1, 20)}th Fibonacci number."

    def run_code(self, code: str) -> str:
        """Run the given Python code and return its stdout.

        Args:
            code: The Python source to execute.
        """
        return ""

    def get_reward(self) -> float:
        return 1.0

class GameEnv:
    def reset(self, **kwargs) -> str:
        return "Reach the goal tile."

    def move(self, action: str) -> str:
        """Apply an action to the game.

        Args:
            action: One of "up", "down", "left", "right".
        """
        return "ok"

    def get_reward(self) -> float:
        return 0.0
'''


def test_a_yaml_config_names_several_classes_by_name(tmp_path):
    from rollwise.config import load_config
    from rollwise.run.setup import make_env

    (tmp_path / "envs.py").write_text(ENVS_FILE)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"environment": e, "prompt": [
        {"role": "user", "content": ""}]}) + "\n" for e in ["coding", "game"] * 2))
    (tmp_path / "run.yaml").write_text(f"""
env:
  name: dataset
  kwargs: {{path: {tmp_path / 'rows.jsonl'}, test_size: 0.5}}
  environment:
    coding: {tmp_path / 'envs.py'}:CodingEnv
    game: {tmp_path / 'envs.py'}:GameEnv
""")
    cfg = load_config(tmp_path / "run.yaml", [])
    env = make_env(cfg.env)  # no env.reward: both classes score themselves
    assert sorted(env.tool_sets) == ["coding", "game"] and env.tool_sets["game"][0]["function"]["name"] == "move"


@pytest.mark.slow
def test_the_guides_increment_env_runs_unchanged_on_the_real_smollm2(tmp_path, smollm2_dir):
    """The real SmolLM2-135M-Instruct, TRL's guide's IncrementEnv, no dataset, one RL step through rollwise.trl."""
    args = _args(tmp_path, max_steps=1, max_completion_length=24)
    trainer = GRPOTrainer(model="smollm2-135m", args=args, environment_factory=IncrementEnv)
    out = trainer.train()
    rows = _rollouts(tmp_path / "run")
    assert out.global_step == 1 and len(rows) == 4
    assert all(r.status in ("kept", "truncated") and r.reward in (0.0, 1.0) for r in rows)
    assert all(set(r.reward_parts) == {"IncrementEnv"} for r in rows)


def _thinking_template_copy(src, dst):
    """smol_tiny with a template that writes a marker in the system turn when `enable_thinking` is false."""
    import shutil

    shutil.copytree(src, dst)
    cfg_path = dst / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    template = cfg.get("chat_template") or (dst / "chat_template.jinja").read_text()
    marked = "{%- if enable_thinking is defined and not enable_thinking %}{{ '<no_think>' }}{%- endif %}" + template
    if "chat_template" in cfg:
        cfg["chat_template"] = marked
        cfg_path.write_text(json.dumps(cfg))
    else:
        (dst / "chat_template.jinja").write_text(marked)
    return dst


def test_chat_template_kwargs_reach_every_rendering_of_the_template(tmp_path, smol_tiny):
    from transformers import AutoTokenizer

    from rollwise.models.prompting import PromptFormat, with_template_kwargs
    from rollwise.models.turns import ChatTurns

    tok = AutoTokenizer.from_pretrained(_thinking_template_copy(smol_tiny, tmp_path / "m"))
    fmt = PromptFormat()
    plain = tok.decode(fmt.encode(tok, "What is 2 + 2?"))
    assert "<no_think>" not in plain
    wrapped = with_template_kwargs(tok, {"enable_thinking": False})
    assert tok.decode(fmt.encode(wrapped, "What is 2 + 2?")) == "<no_think>" + plain
    assert with_template_kwargs(tok, {}) is tok  # nothing to add: the tokenizer itself
    # a tool turn after the prompt still extends it token for token (the probe renders with the variable too)
    turns = ChatTurns(wrapped, fmt)
    prompt, ids, mask = turns.render_conversation([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                                                   {"role": "tool", "content": "4"}, {"role": "assistant", "content": "b"}])
    assert tok.decode(prompt).startswith("<no_think>") and sum(mask) < len(mask)
    wrapped.chat_template = tok.chat_template + " "  # assignment reaches the tokenizer (template swaps do this)
    assert tok.chat_template.endswith(" ")


@pytest.mark.parametrize("bad", [{"tools": []}, {"add_generation_prompt": True}, {"not an identifier": 1}])
def test_chat_template_kwargs_that_are_not_template_variables_are_refused_in_one_line(bad):
    from rollwise.config import RunConfig

    with pytest.raises(ValueError, match="chat_template_kwargs"):
        RunConfig.model_validate({"env": {"chat_template_kwargs": bad}})


def test_the_guides_chat_template_kwargs_line_runs_and_renders_with_the_variable(tmp_path, smol_tiny, monkeypatch):
    import rollwise.run.setup as setup
    from transformers import AutoTokenizer

    model = _thinking_template_copy(smol_tiny, tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(model)
    policy = IncrementPolicy(tok)
    monkeypatch.setattr(setup, "make_engine", lambda *a, **k: policy)
    args = _args(tmp_path, chat_template_kwargs={"enable_thinking": False})
    trainer = GRPOTrainer(model=str(model), args=args, environment_factory=IncrementEnv)
    assert trainer.config()["env"]["chat_template_kwargs"] == {"enable_thinking": False}
    trainer.train()
    assert policy.prompts and all(p.startswith("<no_think>") for p in policy.prompts)
    assert len(_rollouts(tmp_path / "run")) == 2 * 2 * 2


def increment(step: int) -> int:
    """
    Increment a counter that starts at zero.

    Args:
        step: Value to add to the counter.

    Returns:
        The counter after the increment.
    """
    return step


async def double(x: int) -> int:
    """
    Double a number.

    Args:
        x: The number.
    """
    return 2 * x


def reached_target(completions, target, **kwargs):
    """1.0 when the tool's result is the row's target."""
    return [float(any(m.get("role") == "tool" and str(m.get("content")) == str(t) for m in c))
            for c, t in zip(completions, target)]


def test_standalone_tools_run_as_trl_runs_them_without_an_environment(tmp_path, smol_tiny, monkeypatch):
    import rollwise.run.setup as setup
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_tiny)
    policy = IncrementPolicy(tok)
    monkeypatch.setattr(setup, "make_engine", lambda *a, **k: policy)
    data = [{"prompt": [{"role": "user", "content": f"Increment the counter to {i}."}], "target": i} for i in range(1, 7)]
    trainer = GRPOTrainer(model=str(smol_tiny), args=_args(tmp_path), train_dataset=data, reward_funcs=reached_target,
                          tools=[increment])
    trainer.train()
    assert "increment(step: integer)" in policy.prompts[0]
    rows = _rollouts(tmp_path / "run")
    assert len(rows) == 2 * 2 * 2 and all(r.env_info["tool_calls"] == 1 for r in rows)
    assert {r.reward for r in rows} == {0.0, 1.0}  # the tool's result reached the reward, right or off by one


def test_standalone_tools_join_each_environments_methods(tmp_path, smol_tiny, monkeypatch):
    import pickle

    import rollwise.run.setup as setup
    from transformers import AutoTokenizer

    from rollwise.trl import with_tools

    tok = AutoTokenizer.from_pretrained(smol_tiny)
    policy = IncrementPolicy(tok)
    monkeypatch.setattr(setup, "make_engine", lambda *a, **k: policy)
    trainer = GRPOTrainer(model=str(smol_tiny), args=_args(tmp_path), environment_factory=IncrementEnv,
                          tools=[double])
    trainer.train()
    assert "increment(step: integer)" in policy.prompts[0] and "double(x: integer)" in policy.prompts[0]
    rows = _rollouts(tmp_path / "run")
    assert {r.reward for r in rows} == {0.0, 1.0} and all(set(r.reward_parts) == {"IncrementEnv"} for r in rows)
    built = with_tools(lambda: IncrementEnv(), [double])()  # a factory function's instances get the tools too
    assert type(built).__name__ == "IncrementEnv" and isinstance(built, IncrementEnv) and asyncio.run(built.double(x=3)) == 6
    assert type(pickle.loads(pickle.dumps(built))) is type(built)


@pytest.mark.parametrize("bad", [[lambda x: x], [increment, increment], "increment"])
def test_tools_that_cannot_be_tools_are_refused_in_one_line(tmp_path, bad):
    with pytest.raises(TRLArgumentError, match="tools"):
        GRPOTrainer(model="smollm2-135m", args=_args(tmp_path), environment_factory=IncrementEnv, tools=bad)


def test_a_dict_where_only_some_classes_have_get_reward_needs_no_reward_and_errors_the_others_episodes(tmp_path):
    rows = [{"environment": "inc"}, {"environment": "game"}]
    env = make_class_env(Rows(rows), {"inc": IncrementEnv, "game": GameEnv}, "tools", None)
    tasks = env.load()
    states = [env.reset(t) for t in tasks]
    inc, game = env.score_episodes(states)
    assert inc.error is None and inc.parts == {"IncrementEnv": 0.0}  # get_reward(): the counter is not the target
    assert game.error and "no reward source" in game.error  # errored (trained with algo.errored_reward), as TRL's NaN
    with pytest.raises(EnvironmentClassError, match="needs env.reward"):  # no class scores itself: refused at set-up
        make_class_env(Rows(rows), {"coding": CodingEnv, "game": GameEnv}, "tools", None)
    data = [{"prompt": [{"role": "user", "content": "Go."}], "environment": r["environment"]} for r in rows]
    t = GRPOTrainer(model="smollm2-135m", args=_args(tmp_path), train_dataset=data,
                    environment_factory={"inc": IncrementEnv, "game": GameEnv})
    assert t.config()["env"]["rewards"] is None
    with pytest.raises(TRLArgumentError, match="no reward source"):
        GRPOTrainer(model="smollm2-135m", args=_args(tmp_path), train_dataset=data,
                    environment_factory={"inc": CodingEnv, "game": GameEnv})
