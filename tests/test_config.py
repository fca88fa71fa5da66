"""Run config: embedded default, YAML files, dotted overrides, one-line errors with the closest valid key."""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest
import yaml

from rollwise.config import (
    AlgoConfig,
    ConfigError,
    RunConfig,
    config_hash,
    default_config_path,
    dump_config,
    load_config,
    valid_keys,
)


def test_embedded_default_loads_and_is_documented():
    cfg = load_config(None, [])
    assert cfg.model.path == "builtin:tiny"
    assert cfg.rollout.samples_per_prompt >= 2  # GRPO needs groups
    assert cfg.warmup.enabled
    text = default_config_path().read_text()
    assert "# Peak AdamW learning rate" in text  # every field carries its docstring as a comment
    for model in (RunConfig, *[f.annotation for f in RunConfig.model_fields.values()]):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"


def test_user_file_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  lr: 3.0e-5\n  lora: {enabled: true, r: 4}\nrollout:\n  max_tokens: 64\nenv:\n  name: gsm8k\n")
    cfg = load_config(p, ["train.lr=1e-4", "algo.loss=dapo", "env.kwargs.data=/x.jsonl", "train.grad_clip=null",
                          "train.betas=[0.9, 0.95]", "run.tensorboard=false", "train.lora.target_modules=[q_proj]"])
    assert cfg.train.lr == 1e-4 and isinstance(cfg.train.lr, float)
    assert cfg.train.lora.enabled and cfg.train.lora.r == 4 and cfg.train.lora.target_modules == ["q_proj"]
    assert cfg.algo.loss == "dapo" and cfg.env.name == "gsm8k" and cfg.env.kwargs == {"data": "/x.jsonl"}
    assert cfg.train.grad_clip is None and cfg.train.betas == (0.9, 0.95) and cfg.run.tensorboard is False
    assert cfg.rollout.max_tokens == 64
    assert cfg.model.path == "builtin:tiny"  # sections left out take field defaults


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr_rate=1", "unknown config key 'train.lr_rate' (did you mean 'train.lr'?)"),
        ("trian.lr=1", "unknown config key 'trian.lr' (did you mean 'train.lr'?)"),
        ("lr=1", "unknown config key 'lr' (did you mean 'train.lr'?)"),
        ("rollout.lr=1", "unknown config key 'rollout.lr' (did you mean 'train.lr'?)"),
        ("train.lora.rank=4", "unknown config key 'train.lora.rank' (did you mean 'train.lora.r'?)"),
        ("algo.cliip_eps_low=0.1", "unknown config key 'algo.cliip_eps_low' (did you mean 'algo.clip_eps_low'?)"),
        ("rollout.temperature=-1", "bad value for config key 'rollout.temperature': Input should be greater than or equal to 0 (got -1)"),
        ("algo.loss=grpoo", "(did you mean 'grpo'?)"),
        ("train.lr=abc", "bad value for config key 'train.lr'"),
        ("train.lr=", "bad value for config key 'train.lr'"),
        ("train.betas=[0.9, 1.5]", "bad value for config key 'train.betas': betas must be in [0, 1)"),
        ("train.betas=[0.9]", "bad value for config key 'train.betas': too few items"),
        ("model.device=gpu", "bad value for config key 'model.device'"),
        ("model.path=builtin:huge", "bad value for config key 'model.path'"),
        ("model.builtin.num_heads=3", "bad value for config key 'model.builtin': num_heads (3) must divide hidden_size"),
        ("rollout.top_p=0", "bad value for config key 'rollout.top_p'"),
        ("train.lr.x=1", "bad value for config key 'train.lr'"),
        ("rollout.samples_per_prompt=2.5", "bad value for config key 'rollout.samples_per_prompt'"),
        ("noequals", "bad override 'noequals': expected KEY=VALUE"),
        ("train..lr=1", "bad override"),
        ("train.lr=[1", "bad override 'train.lr=[1': value is not a YAML scalar"),
    ],
)
def test_bad_overrides_fail_with_one_line(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    text = str(info.value)
    assert message in text
    assert "\n" not in text
    assert isinstance(info.value, ValueError)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lr: [1\n")
    with pytest.raises(ConfigError, match="invalid YAML at line"):
        load_config(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(bad)
    bad.write_text("train:\n  lr: 1e-4\n  warmup_step: 3\n")
    with pytest.raises(ConfigError, match=r"^unknown config key 'train.warmup_step' \(did you mean 'train.warmup_steps'\?\)$"):
        load_config(bad)
    bad.write_text("train:\n  lora:\n    alpah: 3\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'train.lora.alpah' \(did you mean 'train.lora.alpha'\?\)"):
        load_config(bad)
    bad.write_text("run:\n  backend: slurm\n")
    with pytest.raises(ConfigError, match="bad value for config key 'run.backend'"):
        load_config(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == RunConfig()


def test_dump_roundtrip_and_hash(tmp_path):
    cfg = load_config(None, ["train.lr=2e-4", "env.kwargs.digits=3", "train.betas=[0.8, 0.9]"])
    p = tmp_path / "config.yaml"
    p.write_text(dump_config(cfg))
    again = load_config(p)
    assert again == cfg
    assert config_hash(again) == config_hash(cfg)
    assert config_hash(load_config(None, ["train.lr=3e-4"])) != config_hash(cfg)
    # hashing a subset ignores the rest
    a, b = load_config(None, ["train.lr=3e-4"]), load_config(None, ["train.lr=4e-4"])
    assert config_hash(a, ["model", "warmup"]) == config_hash(b, ["model", "warmup"])
    with pytest.raises(ConfigError, match="unknown section"):
        config_hash(a, ["modle"])
    assert yaml.safe_load(dump_config(cfg))["train"]["betas"] == [0.8, 0.9]


def test_valid_keys_lists_nested():
    keys = valid_keys()
    assert "train.lr" in keys and "train.lora.r" in keys and "model.builtin.hidden_size" in keys


def test_registries_match_literals():
    from rollwise.train.advantages import ADVANTAGES
    from rollwise.train.losses import LOSSES

    assert set(typing.get_args(AlgoConfig.model_fields["advantage"].annotation)) == set(ADVANTAGES)
    assert set(typing.get_args(AlgoConfig.model_fields["loss"].annotation)) == set(LOSSES)


def test_config_module_does_not_import_torch():
    code = "import sys, rollwise.config as c; c.load_config(None, []); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
