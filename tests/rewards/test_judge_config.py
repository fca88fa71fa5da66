"""Judges and reward models from config: what parses, what a dump reads back as, and every refusal in one line
(at config time when the config alone says it, when the reward is built when the filesystem does)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from rollwise.cli.main import main
from rollwise.config import ConfigError, dump_config, load_config
from rollwise.config_rewards import DEFAULT_SCORE_PATTERN, JudgeConfig, ModelRewardConfig, RewardModelConfig
from rollwise.rewards.model_rewards import ModelPlaces, ModelReward, ModelRewardError, make_model_reward
from rollwise.rewards.user import RewardSum, make_reward

REPO = Path(__file__).resolve().parents[2]


def _cfg(tmp_path, text: str, *overrides: str):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return load_config(p, list(overrides))


def test_a_judge_in_yaml_gets_greedy_defaults_and_dumps_back_the_same(tmp_path):
    cfg = _cfg(tmp_path, "env:\n  name: dataset\n  kwargs: {path: d.jsonl}\n  reward:\n    judge:\n"
                         "      model: smollm2-135m\n      template: 'Q {prompt} A {completion} Score:'\n")
    j = cfg.env.reward.judge
    assert isinstance(cfg.env.reward, ModelRewardConfig) and isinstance(j, JudgeConfig)
    assert (j.engine, j.temperature, j.max_score, j.max_tokens, j.chat_template) == ("local", 0.0, 10.0, 16, "auto")
    assert j.score_pattern == DEFAULT_SCORE_PATTERN and cfg.env.reward.reward_model is None
    again = _cfg(tmp_path, dump_config(cfg))
    assert again == cfg


def test_dotted_overrides_reach_every_judge_key():
    cfg = load_config(None, ["env.reward.judge.model=/m", "env.reward.judge.max_score=5", "env.reward.judge.max_tokens=4",
                             "env.reward.judge.temperature=0.7", "env.reward.name=grader"])
    assert (cfg.env.reward.judge.max_score, cfg.env.reward.judge.temperature, cfg.env.reward.name) == (5.0, 0.7, "grader")
    # a string reward replaced by a judge, and back
    cfg = load_config(None, ["env.reward=r.py:f", "env.reward.judge.model=/m"])
    assert cfg.env.reward.judge.model == "/m"
    assert load_config(None, ["env.reward=r.py:f"]).env.reward == "r.py:f"


def test_rewards_mix_functions_judges_and_reward_models_and_read_back(tmp_path):
    cfg = _cfg(tmp_path, "env:\n  rewards:\n    - {fn: 'f.py:g', weight: 0.5}\n"
                         "    - {judge: {model: /m, max_score: 5}, weight: 2, name: j}\n"
                         "    - {reward_model: {path: /rm}}\n")
    items = cfg.env.rewards
    assert items[0] == {"fn": "f.py:g", "weight": 0.5}
    assert items[1]["judge"]["max_score"] == 5.0 and items[1]["judge"]["temperature"] == 0.0 and items[1]["name"] == "j"
    assert items[2]["reward_model"] == {"path": "/rm", "tokenizer": None, "normalize": "none", "batch_size": 8,
                                        "max_length": None}
    assert _cfg(tmp_path, dump_config(cfg)) == cfg


def test_the_docs_examples_are_valid_configs():
    text = (REPO / "docs" / "data-and-rewards.md").read_text()
    start = text.index("## Judges and reward models")
    section = text[start:text.index("\n## ", start + 1)]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    from rollwise.config import RunConfig

    judge = RunConfig.model_validate(yaml.safe_load(blocks[0])).env.reward.judge
    assert judge.model == "smollm2-135m" and "{completion}" in judge.template and judge.max_score == 10
    assert re.compile(judge.score_pattern, re.I).search("Score: 7").group(1) == "7"
    parts = RunConfig.model_validate(yaml.safe_load(blocks[1])).env.rewards
    assert parts[1]["reward_model"]["normalize"] == "sigmoid"


REFUSED = [
    (["env.reward.judge.model=m", "env.reward.judge.engine=vllm"],
     r"^bad value for config key 'env.reward.judge.engine': Input should be 'local' or 'remote' \(got 'vllm'\)$"),
    (["env.reward.judge.model=m", "env.reward.judge.template='Grade {prompt}'"],
     r"^bad value for config key 'env.reward.judge.template': template must contain \{completion\}"),
    (["env.reward.judge.model=m", "env.reward.judge.template='{completion} {'"],
     r"'env.reward.judge.template': template is not a valid format string"),
    (["env.reward.judge.model=m", "env.reward.judge.template='{completion.__class__}'"],
     r"'env.reward.judge.template': template: field \{completion.__class__\} must be a plain name"),
    (["env.reward.judge.model=m", "env.reward.judge.score_pattern='(\\d+'"],
     r"^bad value for config key 'env.reward.judge.score_pattern': score_pattern .* is not a regular expression"),
    (["env.reward.judge.model=m", "env.reward.judge.score_pattern='\\d+'"],
     r"'env.reward.judge.score_pattern': .* needs a group around the number"),
    (["env.reward.judge.model=m", "env.reward.judge.max_score=0"],
     r"^bad value for config key 'env.reward.judge.max_score': Input should be greater than 0 \(got 0\)$"),
    (["env.reward.judge.model=m", "env.reward.judge.max_score=-3"], r"'env.reward.judge.max_score'"),
    (["env.reward.judge.template='{completion}'"], r"a local judge needs model"),
    (["env.reward.judge.engine=remote", "env.reward.judge.tokenizer=/t"], r"a remote judge needs url"),
    (["env.reward.judge.engine=remote", "env.reward.judge.url=http://127.0.0.1:9"], r"a remote judge needs tokenizer"),
    (["env.reward.judge.model=m", "env.reward.judge.template=x{completion}", "env.reward.judge.template_file=t.txt"],
     r"set template or template_file, not both"),
    (["env.reward.judge.model=builtin:tiny", "model.path=/some/checkpoint"],
     r"env.reward.judge.model 'builtin:tiny' is the run's own built-in model: it needs model.path builtin:tiny"),
    (["env.reward.judge.modle=m"], r"unknown config key 'env.reward.judge.modle' \(did you mean 'env.reward.judge.model'\?\)"),
    (["env.reward.reward_model.batch_size=2"], r"^missing config key 'env.reward.reward_model.path'$"),
    (["env.reward.reward_model.path=/rm", "env.reward.reward_model.normalize=softmax"],
     r"'env.reward.reward_model.normalize'"),
    (["env.reward.reward_model.path=/rm", "env.reward.judge.model=m"], r"set one of judge or reward_model"),
    (["env.reward={}"], r"set one of judge or reward_model"),
    (["env.rewards=[{judge: {model: m, max_score: 0}}]"],
     r"^bad config: env.rewards\[0\].judge.max_score: Input should be greater than 0 \(got 0\)$"),
    (["env.rewards=[{reward_model: {}}]"], r"env.rewards\[0\].reward_model.path is missing"),
    (["env.rewards=[{reward_model: {path: p}, fn: 'r.py:f'}]"], r"env.rewards\[0\] needs exactly one of fn, judge"),
    (["env.rewards=[{judge: {model: m}, weight: 1, typo: 2}]"], r"env.rewards\[0\]: unknown keys \['typo'\]"),
    (["env.rewards=[{judge: {model: m, engine: sglang}}]"], r"env.rewards\[0\].judge.engine: Input should be"),
]


@pytest.mark.parametrize("overrides,message", REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_a_bad_judge_or_reward_model_config_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    msg = str(e.value)
    assert "\n" not in msg and re.search(message, msg), msg


def test_the_cli_refuses_an_unknown_judge_engine_with_one_line(capsys):
    assert main(["train", "--print-config", "--set", "env.reward.judge.model=m", "--set",
                 "env.reward.judge.engine=openai"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "env.reward.judge.engine" in err[0] and "'local' or 'remote'" in err[0], err


# ------------------------------------------------------------------------------------- checked when built


def test_a_missing_model_tokenizer_or_template_file_is_refused_when_the_reward_is_built(tmp_path, tiny_model):
    with pytest.raises(ModelRewardError, match=r"^env.reward.judge.model: '/no/such/judge' does not exist; name an HF"):
        make_model_reward("judge", JudgeConfig(model="/no/such/judge"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelRewardError, match=r"is not an HF checkpoint directory \(no config.json\)"):
        make_model_reward("judge", JudgeConfig(model=str(tmp_path / "empty")))
    with pytest.raises(ModelRewardError, match=r"^env.rewards\[1\].reward_model.path: '/no/rm' does not exist"):
        make_model_reward("reward_model", RewardModelConfig(path="/no/rm"), where="env.rewards[1]")
    with pytest.raises(ModelRewardError, match=r"env.reward.judge.tokenizer: '/no/tok' is not a directory"):
        make_model_reward("judge", JudgeConfig(model=str(tiny_model), tokenizer="/no/tok"))
    with pytest.raises(ModelRewardError, match=r"env.reward.judge.template_file: cannot read"):
        make_model_reward("judge", JudgeConfig(model=str(tiny_model), template_file=str(tmp_path / "none.txt")))
    (tmp_path / "t.txt").write_text("Grade {prompt}\nScore:")
    with pytest.raises(ModelRewardError, match=r"template_file .*t.txt must contain \{completion\}"):
        make_model_reward("judge", JudgeConfig(model=str(tiny_model), template_file=str(tmp_path / "t.txt")))
    with pytest.raises(ModelRewardError, match=r"'builtin:tiny' is a training run's own built-in model"):
        make_model_reward("judge", JudgeConfig(model="builtin:tiny"))
    # nothing loaded yet: a checked judge holds no engine until its first score
    (tmp_path / "ok.txt").write_text("{prompt}{completion}=")
    r = make_model_reward("judge", JudgeConfig(model=str(tiny_model), template_file=str(tmp_path / "ok.txt")))
    assert isinstance(r, ModelReward) and r._scorer is None and r.builder.template == "{prompt}{completion}="
    assert make_model_reward("judge", JudgeConfig(model="builtin:tiny"),
                             places=ModelPlaces(builtin_dir=tmp_path / "later")).builder.builtin_dir == tmp_path / "later"


def test_make_reward_builds_a_judge_alone_or_as_a_named_part(tiny_model, tiny_reward_model, tmp_path):
    cfg = load_config(None, [f"env.reward.judge.model={tiny_model}"])
    r = make_reward(cfg.env.reward)
    assert isinstance(r, ModelReward) and r.name == "judge"
    (tmp_path / "f.py").write_text("def f(task, completion):\n    return 1.0\n")
    cfg = load_config(None, [f"env.rewards=[{{fn: '{tmp_path}/f.py:f'}}, {{judge: {{model: '{tiny_model}'}}, weight: 2}},"
                             f" {{reward_model: {{path: '{tiny_reward_model}'}}}}]"])
    s = make_reward(None, cfg.env.rewards)
    assert isinstance(s, RewardSum)
    assert [(n, w) for n, _, w in s.parts] == [("f", 1.0), ("judge", 2.0), (tiny_reward_model.name, 1.0)]
