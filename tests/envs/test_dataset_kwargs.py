"""`env.kwargs` checked against the environment's constructor before anything runs (dataset and built-ins).

Attack: `env.kwargs: {digitz: 3}` passed `rollwise train --print-config` and died in `train` with a TypeError.
"""

from __future__ import annotations

import pytest

from rollwise.cli.main import main
from rollwise.envs.build import check_env_section
from rollwise.envs.registry import EnvSpecError, _REGISTRY, check_kwargs, get_env, register_env


def test_unknown_kwarg_names_the_closest_argument():
    with pytest.raises(EnvSpecError, match=r"unknown env.kwargs.digitz \(did you mean env.kwargs.digits\?\); its "
                                           r"arguments: digits, ops, operands, level, test_fraction, name"):
        check_env_section("arithmetic", {"digitz": 3})
    with pytest.raises(EnvSpecError, match=r"did you mean env.kwargs.test_size\?"):
        check_env_section("dataset", {"path": "x.jsonl", "test_sizee": 2})
    with pytest.raises(EnvSpecError, match=r"unknown env.kwargs.colour; its arguments"):  # nothing close: no guess
        check_env_section("arithmetic", {"colour": "red"})
    # the same message when the environment is built (Python API users who skip the CLI's check)
    with pytest.raises(EnvSpecError, match="did you mean env.kwargs.digits"):
        get_env("arithmetic", digitz=3)


def test_spec_error_is_a_value_error_and_a_type_error():
    # ValueError: the CLI prints it as one line; TypeError: what Python's own call raised before.
    assert issubclass(EnvSpecError, ValueError) and issubclass(EnvSpecError, TypeError)


def test_unknown_env_name_suggests_and_user_names_are_left_to_build_time():
    with pytest.raises(ValueError, match=r"unknown environment 'gsm8' \(did you mean 'gsm8k'\?\)"):
        check_env_section("gsm8")
    check_env_section("mypkg.envs:MyEnv", {"anything": 1})  # user code: not imported at config time
    check_env_section("registered_by_module", {"x": 1}, module="my_envs.py")  # env.module may register it


def test_required_and_var_keyword_factories():
    def needs(level: int, *, seed: int = 0):
        raise AssertionError("never called by check_kwargs")

    with pytest.raises(EnvSpecError, match=r"it needs env.kwargs.level"):
        check_kwargs(needs, "needs", {"seed": 1})
    check_kwargs(lambda **kw: None, "open", {"whatever": 1})  # **kwargs takes any name
    try:
        register_env("needs_level", needs)
        with pytest.raises(EnvSpecError, match="needs env.kwargs.level"):
            check_env_section("needs_level", {})
    finally:
        _REGISTRY.pop("needs_level", None)


def test_print_config_refuses_the_typo_and_writes_nothing(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"env:\n  kwargs: {{digitz: 3}}\nrun:\n  out_dir: {tmp_path / 'run'}\n")
    assert main(["train", str(cfg), "--print-config"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and "did you mean env.kwargs.digits" in cap.err
    assert not (tmp_path / "run").exists()
