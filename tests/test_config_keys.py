"""A config a user can start from: TRL's names answered with rollwise's keys, every unknown key in one error, dumps
of the defaults (and of the embedded recipe) that load for any model, and every key's description."""

from __future__ import annotations

import pytest
import yaml

from rollwise.cli.main import main
from rollwise.config import ConfigError, RunConfig, field_of, load_config, valid_keys
from rollwise.config_doc import dump_config_doc, explain
from rollwise.trl_names import TRL_FIELDS, config_keys_for


@pytest.mark.parametrize("override, suggested", [
    ("learning_rate=1e-5", "train.lr"),
    ("num_generations=4", "rollout.samples_per_prompt"),
    ("rollout.num_generations=4", "rollout.samples_per_prompt"),
    ("beta=0.1", "algo.kl_coef"),
    ("algo.beta=0.1", "algo.kl_coef"),  # not Adam's train.betas
    ("max_completion_length=64", "rollout.max_tokens"),
    ("temperature=0.7", "rollout.temperature"),
    ("per_device_train_batch_size=8", "rollout.prompts_per_step' and 'rollout.samples_per_prompt"),
    ("num_train_epochs=1", "train.steps"),
    ("max_steps=10", "train.steps"),
    ("gradient_accumulation_steps=2", "train.micro_batch_tokens"),
    ("epsilon=0.2", "algo.clip_eps_low"),
    ("algo.epsilon_high=0.28", "algo.clip_eps_high"),
    ("loss_type=dapo", "algo.loss"),
    ("seed=1", "train.seed"),
    ("output_dir=runs/x", "run.out_dir"),
    ("report_to=wandb", "run.loggers"),
    ("logging_steps=5", "run.log_every"),
    ("run_name=x", "run.run_name"),
    ("lr_scheduler_type=cosine", "train.schedule"),
    ("warmup_ratio=0.1", "train.warmup_steps"),
    ("max_grad_norm=1.0", "train.grad_clip"),
    ("scale_rewards=none", "algo.advantage"),
    # the same knob in the section written: warm-up and SFT have their own learning rate and step count
    ("warmup.learning_rate=1e-3", "warmup.lr"),
    ("sft.max_steps=5", "sft.steps"),
    ("train.lr_scheduler_type=cosine", "train.schedule"),
    ("train.beta=[0.9, 0.99]", "train.betas"),  # in the optimiser's section: Adam's betas, not the KL weight
])
def test_trl_names_suggest_rollwise_keys_wherever_written(override, suggested):
    with pytest.raises(ConfigError, match=rf"did you mean '{suggested}'\?"):
        load_config(None, [override])


def test_a_trl_name_in_a_file_gets_the_same_answer(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("algo:\n  beta: 0.04\n")
    with pytest.raises(ConfigError, match=r"^unknown config key 'algo.beta' \(did you mean 'algo.kl_coef'\? 'beta' "
                                          r"is TRL's name\)$"):
        load_config(p)


def test_every_trl_suggestion_names_a_real_key():
    keys = set(valid_keys())
    targets = {k for name in TRL_FIELDS for k in config_keys_for(name)}
    targets |= {k for name in ("logging_steps", "run_name", "project", "warmup_ratio") for k in config_keys_for(name)}
    # run.log_every belongs to the loop's log cadence and may not be in this schema yet
    assert targets - keys <= {"run.log_every"}


def test_every_unknown_key_is_reported_at_once(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("learning_rate: 1.0e-5\ntrain:\n  lr_rate: 1\nrollout:\n  num_generations: 4\n")
    with pytest.raises(ConfigError) as e:
        load_config(p, ["beta=0.1", "train.lr=1e-5", "trian.steps=3"])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("5 unknown config keys: ")
    for part in ("'learning_rate' (did you mean 'train.lr'?", "'train.lr_rate' (did you mean 'train.lr'?)",
                 "'rollout.num_generations' (did you mean 'rollout.samples_per_prompt'?",
                 "'beta' (did you mean 'algo.kl_coef'?", "'trian.steps' (did you mean 'train.steps'?)"):
        assert part in msg
    # one unknown key reads as before
    with pytest.raises(ConfigError, match=r"^unknown config key 'train.lr_rate' \(did you mean 'train.lr'\?\)$"):
        load_config(None, ["train.lr_rate=1"])


def test_the_python_api_reports_every_unknown_key_too():
    from rollwise.config import build_config

    with pytest.raises(ConfigError, match=r"^2 unknown config keys: 'train.learning_rate' .*; 'algo.beta' "):
        build_config(None, {"train.learning_rate": 1e-5, "algo.beta": 0.1})


# ------------------------------------------------------------------------------------------- dumps to start from


def _dump(capsys, *argv: str) -> str:
    assert main(["train", "--print-config", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("model", ["smollm2-135m", "builtin:tiny"])
@pytest.mark.parametrize("flags", [["--defaults"], [], ["--defaults", "--doc"], ["--doc"]])
def test_a_dump_loads_back_for_any_model(tmp_path, capsys, model, flags):
    p = tmp_path / "dumped.yaml"
    p.write_text(_dump(capsys, *flags))
    out = _dump(capsys, "--config", str(p), "--set", f"model.path={model}")
    assert yaml.safe_load(out)["model"]["path"] == model


def test_defaults_are_the_documented_field_defaults(capsys):
    data = yaml.safe_load(_dump(capsys, "--defaults"))
    assert data == RunConfig().model_dump(mode="json")
    assert data["train"]["lr"] == 1e-6  # not the tiny model's recipe (3e-4)
    assert yaml.safe_load(_dump(capsys))["train"]["lr"] == 3e-4
    # --defaults takes overrides, not a config file
    assert yaml.safe_load(_dump(capsys, "--defaults", "--set", "train.lr=1e-5"))["train"]["lr"] == 1e-5
    assert main(["train", "x.yaml", "--defaults", "--print-config"]) == 2
    assert "give one" in capsys.readouterr().err


def test_a_value_of_the_users_own_where_it_has_no_effect_is_still_refused(tmp_path, capsys):
    p = tmp_path / "dumped.yaml"
    p.write_text(_dump(capsys))
    with pytest.raises(ConfigError, match=r"'warmup.steps' is set but has no effect unless model.path"):
        load_config(p, ["model.path=smollm2-135m", "warmup.steps=10"])


def test_the_doc_dump_comments_every_key_and_loads_as_the_same_config(tmp_path):
    cfg = load_config(None)
    text = dump_config_doc(cfg)
    p = tmp_path / "doc.yaml"
    p.write_text(text)
    assert load_config(p) == cfg
    lines = text.splitlines()
    i = lines.index("  lr: 0.0003")
    assert lines[i - 1].endswith("(default: 1.0e-06)") and "Peak AdamW learning rate" in "".join(lines[i - 3:i])
    assert all(len(line) <= 116 for line in lines if line.lstrip().startswith("#"))
    # every key (sections included) has its description above it
    for k, line in enumerate(lines):
        if line.strip() and not line.lstrip().startswith("#") and k:
            assert lines[k - 1].lstrip().startswith("#"), line


def test_every_key_has_a_description():
    missing = []
    for key in valid_keys():
        model, dotted = field_of(key)
        if not model.model_fields[dotted.rsplit(".", 1)[-1]].description:
            missing.append(key)
    assert not missing


# ------------------------------------------------------------------------------------------- config explain


def test_explain_prints_key_type_default_and_description(capsys):
    assert main(["config", "explain", "rollout.speculative.source"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:3] == ["rollout.speculative.source", "  type:    'off' | 'past' | 'ngram' | 'both'",
                                    "  default: 'off'"]
    assert "Where drafts come from" in out
    text = explain("train.lr")
    assert "type:    float, > 0" in text and "default: 1.0e-06" in text
    section = explain("train.lora")
    assert "type:    section" in section and "train.lora.r: Adapter rank." in section
    assert explain("env.kwargs.path").startswith("env.kwargs  (env.kwargs.path is a key inside")


def test_explain_an_unknown_key_names_the_closest(capsys):
    assert main(["config", "explain", "learning_rate"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "rollwise config: error: unknown config key 'learning_rate' (did you mean 'train.lr'? " \
                  "'learning_rate' is TRL's name)"
    assert main(["config", "explain", "train.lr_rate"]) == 2
    assert "did you mean 'train.lr'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- documented strings


def test_speculative_source_off_is_the_word_off_in_set_and_in_a_file(tmp_path, capsys):
    assert load_config(None, ["rollout.speculative.source=off"]).rollout.speculative.source == "off"
    assert load_config(None, ["rollout.speculative.source=past"]).rollout.speculative.source == "past"
    p = tmp_path / "c.yaml"
    p.write_text("rollout:\n  speculative:\n    source: off\n")
    assert load_config(p).rollout.speculative.source == "off"
    p.write_text("rollout:\n  speculative: {source: ngram, k: 4}\n")
    assert load_config(p).rollout.speculative.source == "ngram"
    # boolean fields still take the YAML 1.1 words
    assert load_config(None, ["replay.enabled=yes"]).replay.enabled is True
    assert load_config(None, ["engine.enable_prefix_caching=off"]).engine.enable_prefix_caching is False
    assert _dump(capsys, "--set", "rollout.speculative.source=off").count("source: 'off'") == 1
