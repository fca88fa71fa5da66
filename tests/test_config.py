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
    # default.yaml holds only what the recipe changes; everything else is the code's documented default.
    recipe = yaml.safe_load(default_config_path().read_text())
    assert recipe == {"rollout": {"max_tokens": 16}, "train": {"lr": 3e-4, "micro_batch_tokens": 512, "steps": 100},
                      "run": {"cpu_threads": 1}, "warmup": {"steps": 1500, "seconds": 400.0}}
    defaults = RunConfig()
    for section, keys in recipe.items():
        for k, v in keys.items():
            assert getattr(getattr(defaults, section), k) != v, f"{section}.{k} equals the default: drop it"
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
    assert cfg.train.grad_clip is None and cfg.train.betas == (0.9, 0.95) and cfg.run.loggers == ["jsonl"]
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
    bad.write_text("engine:\n  backend: slurm\n")
    with pytest.raises(ConfigError, match="bad value for config key 'engine.backend'"):
        load_config(bad)
    bad.write_text("run:\n  backend: ray\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'run.backend' \(did you mean 'engine.backend'\?\)"):
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
    from rollwise.train.advantages import ADVANTAGE_NAMES
    from rollwise.train.losses import LOSSES

    # the table estimators (ADVANTAGES) and the per-token ones (TOKEN_ADVANTAGES: tree)
    assert set(typing.get_args(AlgoConfig.model_fields["advantage"].annotation)) == set(ADVANTAGE_NAMES)
    assert set(typing.get_args(AlgoConfig.model_fields["loss"].annotation)) == set(LOSSES)


def test_config_module_does_not_import_torch():
    code = "import sys, rollwise.config as c; c.load_config(None, []); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------------------------------- schema walk


def _unread_keys(src_text: str) -> list[str]:
    import re

    from rollwise.config import _field_annotation, _unwrap_model

    out = []
    for k in valid_keys():
        if _unwrap_model(_field_annotation(tuple(k.split(".")))) is not None:
            continue  # a section, not a leaf
        name = k.rsplit(".", 1)[-1]
        if not re.search(rf"\.{re.escape(name)}\b", src_text) and not re.search(rf"[\"']{re.escape(name)}[\"']", src_text):
            out.append(k)
    return out


def test_every_config_key_is_read_somewhere():
    """Walk the schema: every leaf key's field is read by code outside config.py (an unread key is a silent no-op)."""
    from pathlib import Path

    import rollwise

    root = Path(rollwise.__file__).parent
    src = "\n".join(p.read_text() for p in root.rglob("*.py") if p.name != "config.py")
    assert _unread_keys(src) == []
    # The walk notices a key nobody reads: drop every reader of 'kv_cache_gb' and it is reported.
    stripped = src.replace(".kv_cache_gb", "").replace('"kv_cache_gb"', "")
    assert sorted(_unread_keys(stripped)) == ["engine.kv_cache_gb", "engine.vllm.kv_cache_gb"]


@pytest.mark.parametrize("overrides, message", [
    (["control.policy=early_stop", "engine.backend=ray"], "control.policy 'early_stop' needs engine.backend 'local'"),
    (["control.policy=partial", "engine.backend=ray"], "control.policy 'partial' needs engine.backend 'local' or 'remote'"),
    (["engine.backend=remote"], "engine.backend 'remote' needs engine.remote_urls"),
    (["rollout.temperature=0"], "RL needs temperature > 0"),
    (["control.confidence=0.5"], "'control.confidence' is set but has no effect unless control.policy is 'early_stop'"),
    (["engine.remote_urls=[http://h:1]"], "'engine.remote_urls' is set but has no effect unless engine.backend is 'remote'"),
    (["engine.num_engines=4"], "'engine.num_engines' is set but has no effect unless engine.backend is 'ray'"),
    (["replay.max_age=2"], "'replay.max_age' is set but has no effect unless replay.enabled is true"),
    (["model.path=/m", "warmup.steps=10"], "'warmup.steps' is set but has no effect unless model.path is 'builtin:tiny'"),
    (["train.lora.r=4"], "'train.lora.r' is set but has no effect unless train.lora.enabled is true"),
    (["algo.kl_estimator=k1"], "'algo.kl_estimator' is set but has no effect unless algo.kl_coef > 0"),
    # tree rollouts (docs/tree.md): the in-process engine, a request per group, nothing that resumes or drafts
    (["rollout.tree.branch=fixed", "engine.backend=remote", "engine.remote_urls=[http://h:1]"],
     "rollout.tree.branch 'fixed' needs engine.backend 'local'"),
    (["rollout.tree.branch=fixed", "control.policy=adaptive"],
     "rollout.tree.branch 'fixed' does not combine with control.policy 'adaptive'"),
    (["rollout.tree.branch=entropy", "control.policy=partial"], "does not combine with control.policy 'partial'"),
    (["rollout.tree.branch=fixed", "rollout.speculative.source=past"], "does not combine with rollout.speculative"),
    (["rollout.tree.branch=fixed", "rollout.samples_per_prompt=4", "rollout.tree.roots=4"],
     "rollout.tree.roots (4) must be smaller than rollout.samples_per_prompt (4)"),
    (["rollout.tree.first_segment_tokens=16"],
     "'rollout.tree.first_segment_tokens' is set but has no effect unless rollout.tree.branch is not 'off'"),
    (["rollout.tree.branch=fixed", "rollout.tree.entropy_threshold=2"],
     "'rollout.tree.entropy_threshold' is set but has no effect unless rollout.tree.branch is 'entropy'"),
    # PPO with a critic (docs/ppo.md): one advantage per token, one rank, and a baseline that is not the group's
    (["algo.advantage=gae", "algo.loss=gspo"], "algo.advantage 'gae' gives one advantage per token, and algo.loss "
                                               "'gspo' takes one per sequence"),
    (["algo.advantage=gae", "train.world_size=2"], "algo.advantage 'gae' trains its critic on one rank"),
    (["algo.critic.lr=1e-3"], "'algo.critic.lr' is set but has no effect unless algo.advantage is 'gae'"),
    (["algo.gae.lam=0.95"], "'algo.gae.lam' is set but has no effect unless algo.advantage is 'gae'"),
    (["algo.advantage=gae", "algo.skip_zero_variance=false"],
     "'algo.skip_zero_variance' is set but has no effect unless algo.advantage is not 'gae'"),
])
def test_combinations_that_cannot_work_are_refused_at_load(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_keys_that_take_effect_pass_and_a_saved_run_config_is_not_second_guessed(tmp_path):
    cfg = load_config(None, ["algo.advantage=gae", "algo.loss=ppo", "algo.gae.lam=0.95", "algo.critic.lr=1e-3",
                             "algo.critic.cliprange_value=null", "algo.critic.warmup_steps=2"])
    assert cfg.algo.gae.lam == 0.95 and cfg.algo.critic.cliprange_value is None and cfg.algo.critic.warmup_steps == 2
    cfg = load_config(None, ["control.policy=early_stop", "control.confidence=0.5", "engine.max_num_seqs=8",
                             "replay.enabled=true", "replay.max_age=2", "algo.kl_coef=0.1", "algo.kl_estimator=k1"])
    assert cfg.control.confidence == 0.5 and cfg.replay.max_age == 2
    # trees compose with the early-stop rule (it reads a tree's leaves as they end) and the posterior selector
    cfg = load_config(None, ["rollout.tree.branch=fixed", "rollout.tree.first_segment_tokens=16",
                             "control.policy=early_stop", "control.select=posterior"])
    assert cfg.rollout.tree.spec().first_segment_tokens == 16
    # The embedded recipe's own warm-up keys are not the user's choice: pointing it at a checkpoint is fine.
    assert load_config(None, ["model.path=/m"]).model.path == "/m"
    # A run's resolved config.yaml carries every key; it loads back as it is.
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(load_config(None, ["model.path=/m"])))
    assert load_config(saved, saved_run=True).model.path == "/m"
    # As a user's own file too: its warm-up keys are the embedded recipe's values, which every dump carries.
    assert load_config(saved).model.path == "/m"
    # A warm-up value of the user's own for a checkpoint model still has no effect, and is refused.
    with pytest.raises(ConfigError, match=r"'warmup\.steps' is set but has no effect"):
        load_config(saved, ["warmup.steps=10"])


def test_resume_conflicts_name_the_keys_that_change_results():
    from rollwise.config import resume_conflicts

    a = load_config(None, [])
    assert resume_conflicts(a, load_config(None, ["train.steps=200", "run.tensorboard=false", "engine.max_num_seqs=8"])) == []
    diffs = resume_conflicts(a, load_config(None, ["train.lr=1e-3", "rollout.samples_per_prompt=4"]))
    assert diffs == ["rollout.samples_per_prompt: 8 -> 4", "train.lr: 0.0003 -> 0.001"]


# ---------------------------------------------------------------- hostile YAML and non-finite numbers (issue 12)

BOMB = "\n".join(
    ["env:", "  name: arithmetic", "  kwargs:", '    a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    + [f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
) + "\n"


def _one_line_error(path, *overrides) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_deeply_nested_yaml_is_refused_in_one_line(tmp_path):
    p = tmp_path / "deep.yaml"
    p.write_text("env:\n  kwargs:\n    x: " + "[" * 10_000 + "]" * 10_000 + "\n")
    text = _one_line_error(p)
    assert text.startswith("bad config: ") and "nested deeper than" in text and "line 3" in text
    p.write_text("env:\n  kwargs:\n" + "".join("  " * (i + 2) + f"k{i}:\n" for i in range(2_000)))
    assert "nested deeper than" in _one_line_error(p)
    text = _one_line_error(None, "env.kwargs.x=" + "[" * 5_000 + "]" * 5_000)
    assert "nested deeper than" in text


def test_alias_bomb_is_refused_quickly(tmp_path):
    import time

    p = tmp_path / "bomb.yaml"
    p.write_text(BOMB)  # 9**9 = 387 million strings once expanded
    t0 = time.perf_counter()
    text = _one_line_error(p)
    assert time.perf_counter() - t0 < 5
    assert text.startswith("bad config: ") and "aliases expand to more than" in text
    # The same through the CLI's --print-config, as a user meets it: one line, exit 2, no hang.
    out = subprocess.run([sys.executable, "-m", "rollwise.cli.main", "train", str(p), "--print-config"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "aliases expand to more than" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    # A recursive alias (a list that contains itself) is refused, not turned into a cyclic object.
    p.write_text("env:\n  kwargs:\n    loop: &x [1, *x]\n")
    assert "refers to itself" in _one_line_error(p)


def test_ordinary_anchors_and_merge_keys_still_load(tmp_path):
    p = tmp_path / "anchors.yaml"
    p.write_text("env:\n  kwargs: &kw {digits: 2, seed: 3}\n"
                 "rollout:\n  temperature: 0.7\n"
                 "algo: {}\n")
    assert load_config(p).env.kwargs == {"digits": 2, "seed": 3}
    p.write_text("env:\n  kwargs:\n    base: &b {digits: 2, seed: 3}\n    more:\n      <<: *b\n      seed: 4\n")
    assert load_config(p).env.kwargs["more"] == {"digits": 2, "seed": 4}


def test_duplicate_keys_are_refused_with_their_lines(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("train:\n  lr: 1e-4\nrollout:\n  temperature: 0.5\ntrain:\n  lr: 3e-4\n")
    text = _one_line_error(p)
    assert text.startswith("bad config: ") and "at line 5: duplicate key 'train' (first at line 1)" in text
    p.write_text("train:\n  lr: 1e-4\n  weight_decay: 0.1\n  lr: 5e-4\n")
    assert "at line 4: duplicate key 'lr' (first at line 2)" in _one_line_error(p)
    p.write_text("env:\n  kwargs: {seed: 1, seed: 2}\n")
    assert "at line 2: duplicate key 'seed'" in _one_line_error(p)


@pytest.mark.parametrize("key", ["train.lr", "engine.kv_cache_gb", "rollout.temperature", "train.grad_clip",
                                 "algo.tis_cap", "control.oversample", "train.betas"])
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "inf", "nan"])
def test_non_finite_numbers_are_refused(key, value, tmp_path):
    val = f"[0.9, {value}]" if key == "train.betas" else value
    text = _one_line_error(None, f"{key}={val}")
    assert f"'{key}" in text and "finite" in text, text
    section, name = key.split(".")
    p = tmp_path / "c.yaml"
    p.write_text(f"{section}:\n  {name}: {val}\n")
    text = _one_line_error(p)
    assert f"'{key}" in text and "finite" in text, text


def _has_float(ann) -> bool:
    return ann is float or any(_has_float(a) for a in typing.get_args(ann) if not isinstance(a, str))


def test_every_float_field_refuses_non_finite():
    """All sections at once: every float-typed field of every section rejects inf (no field forgotten)."""
    import math

    from rollwise.config import _unwrap_model

    checked = 0
    for key in valid_keys():
        parts = key.split(".")
        model = RunConfig
        for p in parts[:-1]:
            model = _unwrap_model(model.model_fields[p].annotation)
        ann = model.model_fields[parts[-1]].annotation
        if not _has_float(ann):
            continue
        value = "[0.5, .inf]" if "tuple" in str(ann) else ".inf"
        with pytest.raises(ConfigError, match="finite"):
            load_config(None, [f"{key}={value}"])
        checked += 1
    assert checked >= 25, checked
    assert math.isfinite(load_config(None, ["train.lr=1e308"]).train.lr)


def test_alias_expansion_depth_is_bounded(tmp_path):
    """Each level under the limit as written, but an alias chain stacks them past it once expanded."""
    p = tmp_path / "chain.yaml"
    lines = ["env:", "  kwargs:", "    l0: &l0 " + "[" * 30 + "1" + "]" * 30]
    lines += [f"    l{i}: &l{i} " + "[" * 30 + f"*l{i - 1}" + "]" * 30 for i in range(1, 4)]
    p.write_text("\n".join(lines) + "\n")
    assert "nested deeper than 64 levels once aliases are expanded" in _one_line_error(p)
    p.write_text("\n".join(lines[:4]) + "\n")  # l0 and l1: 62 levels under env.kwargs, 64 in all
    assert load_config(p).env.kwargs["l1"][0][0]


def test_documented_words_are_values_not_yaml_booleans(tmp_path):
    """YAML 1.1 reads off / on / yes / no as booleans; a config reads them as the words they are (YAML 1.2), so a
    documented value like `source: off` works in a file and in --set, and a boolean field still takes them."""
    f = tmp_path / "c.yaml"
    f.write_text("rollout:\n  speculative:\n    source: off\nwarmup:\n  enabled: no\n")
    cfg = load_config(str(f))
    assert cfg.rollout.speculative.source == "off" and cfg.warmup.enabled is False
    cfg = load_config(None, ["rollout.speculative.source=off", "warmup.enabled=on"])
    assert cfg.rollout.speculative.source == "off" and cfg.warmup.enabled is True
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(dump_config(cfg))
    assert load_config(str(dumped)).rollout.speculative.source == "off"


def test_distillation_and_a_critic_are_refused_together():
    from rollwise.config import RunConfig

    with pytest.raises(ValueError, match="algo.distill.*gae"):
        RunConfig.model_validate({"algo": {"advantage": "gae", "distill": {"teacher": "x"}}})
