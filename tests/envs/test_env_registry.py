"""Registry: built-ins by name, user registrations, user code by "module:attr" and "file.py:attr"."""

from __future__ import annotations

import sys
import textwrap

import pytest

from rollwise.envs import get_env, list_envs, load_reward_fn, register_env, with_reward
from rollwise.envs.arithmetic import ArithmeticEnv
from rollwise.envs.registry import _REGISTRY
from rollwise.types import Score

USER_MODULE = textwrap.dedent('''
    from dataclasses import dataclass
    from rollwise.envs.base import Task
    from rollwise.types import Score

    @dataclass
    class EchoEnv:
        word: str = "hi"
        name: str = "echo"
        def load(self, split="train", n=None, seed=0):
            return [Task(id=str(i), prompt="say", answer=self.word, metadata={}) for i in range(n or 3)]
        def score(self, task, completion):
            return Score(float(completion == task.answer))

    INSTANCE = EchoEnv(word="yo")

    def shout_reward(task, completion):
        return 1.0 if completion.isupper() else 0.0
''')


@pytest.fixture
def user_file(tmp_path, monkeypatch):
    f = tmp_path / "user_envs.py"
    f.write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f
    sys.modules.pop("user_envs", None)


def test_builtins_and_kwargs():
    assert {"arithmetic", "countdown", "gsm8k", "humaneval", "tool_calc"} <= set(list_envs())
    env = get_env("arithmetic", level=3)
    assert isinstance(env, ArithmeticEnv) and env.ops == "+-"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown environment 'nope'.*arithmetic"):
        get_env("nope")


def test_register_env_and_refuse_shadowing():
    try:
        register_env("arith3", lambda **kw: ArithmeticEnv(digits=3, **kw))
        assert get_env("arith3").digits == 3
        with pytest.raises(ValueError, match="already registered"):
            register_env("arith3", ArithmeticEnv)
        with pytest.raises(ValueError, match="already registered"):
            register_env("gsm8k", ArithmeticEnv)
        register_env("arith3", ArithmeticEnv, overwrite=True)
        assert get_env("arith3").digits == 2
        register_env("not_an_env", lambda: object())
        with pytest.raises(TypeError, match="lacks name, load, score"):
            get_env("not_an_env")
        with pytest.raises(ValueError, match="without ':'"):
            register_env("a:b", ArithmeticEnv)
    finally:
        _REGISTRY.pop("arith3", None)
        _REGISTRY.pop("not_an_env", None)


def test_module_and_file_specs(user_file):
    env = get_env("user_envs:EchoEnv", word="ok")
    assert env.score(env.load(n=1)[0], "ok").value == 1.0
    inst = get_env(f"{user_file}:INSTANCE")
    assert inst.load(n=1)[0].answer == "yo"
    with pytest.raises(ValueError, match="takes no arguments"):
        get_env(f"{user_file}:INSTANCE", word="x")
    with pytest.raises(ValueError, match="has no attribute"):
        get_env("user_envs:Missing")
    with pytest.raises(ValueError, match="cannot import module"):
        get_env("no_such_module_xyz:Env")
    with pytest.raises(FileNotFoundError):
        get_env("missing/dir/file.py:Env")
    with pytest.raises(TypeError, match="cannot construct"):
        get_env("user_envs:shout_reward")  # a reward function is not an environment factory
    with pytest.raises(TypeError, match="cannot construct it with arguments \\['colour'\\]"):
        get_env("arithmetic", colour="red")


def test_user_reward_functions_from_config(user_file):
    fn = load_reward_fn(f"{user_file}:shout_reward")
    env = with_reward(get_env("arithmetic"), f"{user_file}:shout_reward")
    task = env.load("train", n=1)[0]
    assert fn(task, "LOUD") == 1.0 and env.score(task, "LOUD") == Score(1.0) and env.score(task, "quiet").value == 0.0
    with pytest.raises(TypeError, match="not callable"):
        load_reward_fn("user_envs:INSTANCE.word")
