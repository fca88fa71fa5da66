"""rollwise.trl: TRL's GRPOConfig / GRPOTrainer translated onto a rollwise run config.

The translation is checked on its own (no training runs here): every field of the installed TRL's GRPOConfig is
accounted for, every argument rollwise cannot honour is refused at construction naming it, and a typical
quick-start config becomes the expected rollwise keys."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rollwise import trl as rt
from rollwise.trl import (
    TRL_FIELDS,
    DefaultOnly,
    GRPOConfig,
    GRPOTrainer,
    Inert,
    Mapped,
    TRLArgumentError,
    log_history,
    mapping_table,
    nested,
    render_docs,
    translate_args,
)

REPO = Path(__file__).resolve().parents[1]
DATA = [{"prompt": f"What is {i} + {i}?", "answer": 2 * i} for i in range(40)]
CHAT = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "answer": i + 1} for i in range(10)]


def sum_correct(completions, answer, **kwargs):
    return [1.0 if str(a) in (c if isinstance(c, str) else c[-1]["content"]) else 0.0
            for c, a in zip(completions, answer)]


def short(completions, **kwargs):
    return [-len(c) / 100 for c in completions]


def _trl():
    try:
        import trl
    except Exception as e:  # noqa: BLE001 - any import failure: the test cannot read TRL's fields
        pytest.skip(f"trl is not importable ({type(e).__name__}: {e}); pip install 'rollwise[dev]'")
    return trl


def _trl_fields():
    return {f.name: f for f in dataclasses.fields(_trl().GRPOConfig)}


def _trl_default(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()


# ------------------------------------------------------------------ every TRL field accounted for


def test_every_field_of_the_installed_trl_grpoconfig_is_mapped_refused_or_ignored():
    fields = _trl_fields()
    missing = sorted(set(fields) - set(TRL_FIELDS))
    assert not missing, f"TRL GRPOConfig fields with no entry in rollwise.trl.TRL_FIELDS: {missing}"
    stale = sorted(set(TRL_FIELDS) - set(fields))
    assert not stale, f"TRL_FIELDS names fields the installed TRL does not have: {stale}"


def test_defaults_match_the_installed_trl():
    """rollwise's GRPOConfig has TRL's defaults, and the fields accepted only at their default know TRL's."""
    fields = _trl_fields()
    ours = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    wrong = []
    for name, f in fields.items():
        want = _trl_default(f)
        if name in ours:
            got = ours[name].default if ours[name].default is not dataclasses.MISSING else ours[name].default_factory()
        else:
            got = rt._TRL_DEFAULTS.get(name, "<missing>")
        if got != want:
            wrong.append(f"{name}: rollwise {got!r}, TRL {want!r}")
    assert not wrong, "\n".join(wrong)


def test_mapped_fields_are_fields_of_rollwise_grpoconfig():
    own = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert {n for n, e in TRL_FIELDS.items() if isinstance(e, Mapped)} <= own


def test_the_real_trl_grpoconfig_translates_like_ours():
    trl = _trl()
    kw = dict(output_dir="runs/q", per_device_train_batch_size=16, gradient_accumulation_steps=2, num_generations=4,
              max_completion_length=64, learning_rate=3e-6, max_steps=12, seed=7, report_to="none", bf16=False)
    assert translate_args(trl.GRPOConfig(**kw)) == translate_args(GRPOConfig(**kw))
    with pytest.raises(TRLArgumentError, match="push_to_hub"):
        translate_args(trl.GRPOConfig(output_dir="runs/q", report_to="none", bf16=False, push_to_hub=True))


# ------------------------------------------------------------------ refusals at construction


REFUSED_CONFIGS = [
    ({"use_vllm": True, "vllm_mode": "colocate"}, "vllm_mode"),
    ({"use_vllm": True, "vllm_mode": "server", "vllm_importance_sampling_mode": "token_clip"},
     "vllm_importance_sampling_mode"),
    ({"use_vllm": True, "vllm_mode": "server", "vllm_importance_sampling_mode": "token_truncate",
      "vllm_importance_sampling_clip_max": None}, "vllm_importance_sampling_clip_max"),
    ({"use_vllm": True, "vllm_mode": "server", "vllm_importance_sampling_mode": "token_mask",
      "vllm_importance_sampling_clip_max": None}, "vllm_importance_sampling_clip_max"),
    ({"use_vllm": True, "vllm_mode": "server", "vllm_importance_sampling_clip_min": 4.0},
     "vllm_importance_sampling_clip_min"),
    ({"num_iterations": 2}, "num_iterations"),
    ({"loss_type": "bnpo"}, "loss_type"),
    ({"loss_type": "cispo"}, "loss_type"),
    ({"loss_type": "dapo", "importance_sampling_level": "sequence"}, "importance_sampling_level"),
    ({"scale_rewards": "batch"}, "scale_rewards"),
    ({"beta": 0.04}, "use_bias_correction_kl"),
    ({"optim": "sgd"}, "optim"),
    ({"lr_scheduler_type": "polynomial"}, "lr_scheduler_type"),
    ({"lr_scheduler_type": "constant", "warmup_steps": 5}, "lr_scheduler_type"),
    ({"save_strategy": "epoch"}, "save_strategy"),
    ({"eval_strategy": "epoch"}, "eval_strategy"),
    ({"report_to": "trackio"}, "report_to"),
    ({"report_to": ["wandb", "comet_ml"]}, "report_to"),
    ({"max_completion_length": None}, "max_completion_length"),
    ({"num_generations": 1}, "num_generations"),
    ({"push_to_hub": True}, "push_to_hub"),
    ({"min_p": 0.1}, "min_p"),
    ({"entropy_coef": 0.01}, "entropy_coef"),
    ({"fp16": True}, "fp16"),
    ({"deepspeed": "ds.json"}, "deepspeed"),
]


@pytest.mark.parametrize("kwargs,name", REFUSED_CONFIGS, ids=[n for _, n in REFUSED_CONFIGS])
def test_an_argument_rollwise_cannot_honour_is_refused_when_the_config_is_built(kwargs, name):
    with pytest.raises(TRLArgumentError) as e:
        GRPOConfig(**kwargs)
    msg = str(e.value)
    assert "\n" not in msg and name in msg, msg
    assert isinstance(e.value, ValueError)


def _changed(default):
    """A value other than `default` of a plausible type."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 1
    if default is None or default == "" or default == []:
        return "x" if default is None else ["x"]
    return f"{default}-changed"


def test_every_default_only_field_is_refused_when_changed_and_accepted_at_default():
    for name, entry in TRL_FIELDS.items():
        if not isinstance(entry, DefaultOnly):
            continue
        default = rt._TRL_DEFAULTS[name]
        GRPOConfig(**{name: default})
        changed = _changed(default)
        with pytest.raises(TRLArgumentError, match=name):
            GRPOConfig(**{name: changed})


def test_inert_fields_take_any_value():
    inert = [n for n, e in TRL_FIELDS.items() if isinstance(e, Inert)]
    assert "log_completions" in inert
    GRPOConfig(log_completions=True, disable_tqdm=True, dataloader_num_workers=4, eval_on_start=True)


def test_output_dir_may_be_positional_as_in_trl():
    assert GRPOConfig("runs/p").output_dir == "runs/p"
    with pytest.raises(TRLArgumentError, match="by name"):
        GRPOConfig("runs/p", 8)


def test_an_unknown_argument_is_refused_with_the_closest_name():
    with pytest.raises(TRLArgumentError, match="did you mean 'learning_rate'"):
        GRPOConfig(learnig_rate=1e-5)


@pytest.mark.parametrize("kwargs,name", [
    ({"steps_per_generation": 4, "max_steps": 10}, "max_steps"),
    ({"steps_per_generation": 4, "max_steps": 40, "save_steps": 10}, "save_steps"),
    ({"steps_per_generation": 4, "max_steps": 40, "eval_strategy": "steps", "eval_steps": 6}, "eval_steps"),
    ({"gradient_accumulation_steps": 4, "steps_per_generation": 6, "max_steps": 6}, "steps_per_generation"),
    ({"generation_batch_size": 64, "steps_per_generation": 4, "max_steps": 4}, "generation_batch_size"),
    ({"per_device_train_batch_size": 6, "num_generations": 4, "max_steps": 4}, "num_generations"),
])
def test_step_counts_and_batches_must_fall_on_rl_steps_and_groups(kwargs, name):
    with pytest.raises(TRLArgumentError, match=name):
        GRPOConfig(**kwargs)


def _trainer(**kw):
    args = kw.pop("args", None) or GRPOConfig(output_dir="runs/t", per_device_train_batch_size=16, num_generations=4,
                                              max_steps=5)
    base = dict(model="smollm2-135m", reward_funcs=sum_correct, args=args, train_dataset=DATA)
    base.update(kw)
    return GRPOTrainer(**base)


REFUSED_TRAINER = [
    ({"reward_funcs": type("PreTrainedModel", (), {"__call__": lambda self, **kw: []})()}, "reward_funcs"),
    ({"reward_funcs": [sum_correct, type("Module", (), {"__call__": lambda self, **kw: []})()]}, "reward_funcs[1]"),
    ({"reward_funcs": [sum_correct, 3]}, "reward_funcs[1]"),
    ({"reward_funcs": ""}, "reward_funcs"),
    ({"reward_funcs": []}, "reward_funcs"),
    ({"callbacks": [object()]}, "callbacks"),
    ({"rollout_func": lambda prompts, trainer: {}}, "rollout_func"),
    ({"tools": [sum_correct]}, "tools"),
    ({"processing_class": SimpleNamespace(name_or_path="gpt2")}, "processing_class"),
    ({"reward_funcs": "/some/rm", "reward_processing_classes": [object()]}, "reward_processing_classes"),
    ({"reward_funcs": [sum_correct, "/some/rm"], "reward_processing_classes": [None]}, "reward_processing_classes"),
    ({"optimizers": (object(), None)}, "optimizers"),
    ({"model": object()}, "model"),
    ({"train_dataset": None}, "train_dataset"),
    ({"train_dataset": [{"question": "1+1"}]}, "prompt"),
    ({"train_dataset": {"train": DATA}}, "train_dataset"),
    ({"eval_dataset": CHAT}, "eval_dataset"),
    ({"environment_factory": lambda: object()}, "environment_factory"),
    ({"peft_config": SimpleNamespace()}, "peft_config"),
    ({"args": GRPOConfig(reward_weights=[1.0, 2.0], max_steps=4)}, "reward_weights"),
]


@pytest.mark.parametrize("kwargs,name", REFUSED_TRAINER, ids=[n for _, n in REFUSED_TRAINER])
def test_a_trainer_argument_rollwise_cannot_honour_is_refused_at_construction(kwargs, name):
    with pytest.raises(TRLArgumentError) as e:
        _trainer(**kwargs)
    msg = str(e.value)
    assert "\n" not in msg and name in msg, msg


# ------------------------------------------------------------------ the translation


def test_a_quick_start_config_translates_to_the_expected_rollwise_keys():
    args = GRPOConfig(output_dir="runs/addition", per_device_train_batch_size=16, gradient_accumulation_steps=4,
                      num_generations=8, max_completion_length=32, learning_rate=1e-5, max_steps=20, seed=3,
                      warmup_steps=0.1, logging_steps=5, save_steps=10, report_to=["tensorboard"])
    out = translate_args(args)
    # TRL: 16 x 4 = 64 completions per optimizer step, one generation per step, 64 / 8 = 8 prompts
    assert out["rollout.prompts_per_step"] == 8 and out["rollout.samples_per_prompt"] == 8
    assert "train.updates_per_step" not in out
    assert out["rollout.max_tokens"] == 32 and out["rollout.top_k"] == -1
    # TRL's default dapo: the token-level normaliser, no clip-higher unless epsilon_high, no overlong shaping
    assert out["algo.loss"] == "dapo" and out["algo.clip_eps_low"] == out["algo.clip_eps_high"] == 0.2
    assert out["algo.overlong_filter"] is False and out["algo.overlong_penalty"] is False
    assert out["algo.advantage"] == "grpo" and out["algo.adv_eps"] == 1e-4 and out["algo.kl_coef"] == 0.0
    assert out["algo.skip_zero_variance"] is False and out["algo.errored_reward"] is None
    assert out["train.lr"] == 1e-5 and out["train.steps"] == 20 and out["train.seed"] == 3
    assert out["train.schedule"] == "linear" and out["train.min_lr_ratio"] == 0.0 and out["train.warmup_steps"] == 2
    assert out["train.grad_clip"] == 1.0 and out["train.betas"] == [0.9, 0.999]
    assert out["run.out_dir"] == "runs/addition" and out["run.checkpoint_every"] == 10
    assert out["run.loggers"] == ["jsonl", "tensorboard"] and out["run.eval_every"] == 0
    assert "engine.backend" not in out and "run.run_name" not in out


def test_run_name_is_the_trackers_run_name():
    out = translate_args(GRPOConfig(output_dir="runs/a", run_name="lr-1e-5", max_steps=2))
    assert out["run.out_dir"] == "runs/a" and out["run.run_name"] == "lr-1e-5"


def test_batch_arithmetic_with_several_optimizer_steps_per_generation():
    out = translate_args(GRPOConfig(per_device_train_batch_size=8, gradient_accumulation_steps=2,
                                    steps_per_generation=8, num_generations=4, max_steps=40, save_steps=20))
    # one generation of 8 x 8 = 64 completions (16 prompts), 8 / 2 = 4 optimizer steps from it
    assert out["rollout.prompts_per_step"] == 16 and out["train.updates_per_step"] == 4
    assert out["train.steps"] == 10 and out["run.checkpoint_every"] == 5
    same = translate_args(GRPOConfig(per_device_train_batch_size=8, gradient_accumulation_steps=2,
                                     generation_batch_size=64, num_generations=4, max_steps=40, save_steps=20))
    assert same == out


def test_loss_and_vllm_mapping():
    out = translate_args(GRPOConfig(loss_type="dapo", epsilon_high=0.28, mask_truncated_completions=True,
                                    scale_rewards=False, beta=0.04, use_bias_correction_kl=False, max_steps=2))
    assert out["algo.clip_eps_high"] == 0.28 and out["algo.overlong_filter"] is True
    assert out["algo.overlong_penalty"] is False and out["algo.advantage"] == "dr_grpo" and "algo.adv_eps" not in out
    assert out["algo.kl_coef"] == 0.04 and out["algo.kl_estimator"] == "k3"
    gspo = translate_args(GRPOConfig(loss_type="grpo", importance_sampling_level="sequence", max_steps=2))
    assert gspo["algo.loss"] == "gspo"
    assert translate_args(GRPOConfig(loss_type="dr_grpo", max_steps=2))["algo.loss"] == "dr_grpo"
    v = translate_args(GRPOConfig(use_vllm=True, vllm_mode="server", vllm_server_host="10.0.0.2", vllm_server_port=8001,
                                  vllm_importance_sampling_mode="token_truncate", max_steps=2))
    assert v["engine.backend"] == "remote" and v["engine.remote_server"] == "vllm"
    assert v["engine.remote_urls"] == ["http://10.0.0.2:8001"]
    assert (v["algo.correction.mode"], v["algo.correction.low"], v["algo.correction.high"]) == ("tis", None, 3.0)
    v2 = translate_args(GRPOConfig(use_vllm=True, vllm_mode="server", vllm_server_base_url="http://h:9/",
                                   vllm_importance_sampling_correction=False, max_steps=2))
    assert v2["engine.remote_urls"] == ["http://h:9"] and not any(k.startswith("algo.correction") for k in v2)
    # without use_vllm no correction applies, whatever the mode (TRL's rule)
    assert not any(k.startswith("algo.correction") for k in translate_args(GRPOConfig(max_steps=2)))


@pytest.mark.parametrize("mode, low, high, want", [
    ("sequence_mask", None, 3.0, "sequence_mask"),  # TRL's default
    ("token_truncate", 0.5, 2.0, "tis"),
    ("token_mask", 0.5, None, "token_mask"),
    ("sequence_truncate", None, 4.0, "sequence_truncate"),
])
def test_vllm_importance_sampling_modes_map_onto_corrections(mode, low, high, want):
    from rollwise.config import load_config
    from rollwise.train.corrections import build_correction
    from rollwise.train.losses import LossConfig

    out = translate_args(GRPOConfig(use_vllm=True, vllm_mode="server", vllm_importance_sampling_mode=mode,
                                    vllm_importance_sampling_clip_min=low, vllm_importance_sampling_clip_max=high,
                                    max_steps=2))
    assert (out["algo.correction.mode"], out["algo.correction.low"], out["algo.correction.high"]) == (want, low, high)
    sets = [f"{k}={'null' if v is None else v}" for k, v in out.items() if k.startswith("algo.correction")]
    algo = load_config(None, sets).algo
    assert LossConfig.from_algo(algo).correction == build_correction(want, low, high, "product")  # TRL's: product


def test_epochs_give_the_step_count_from_the_dataset():
    t = _trainer(args=GRPOConfig(per_device_train_batch_size=16, num_generations=4, num_train_epochs=2))
    # 40 prompts, 4 per RL step: 10 RL steps an epoch
    assert t.overrides["train.steps"] == 20 and t.state.max_steps == 20


def test_the_trainer_config_is_a_valid_rollwise_config():
    """The translation names only real rollwise keys, with valid values, none of them inert."""
    from rollwise.config import RunConfig, inert_keys

    t = _trainer(reward_funcs=[sum_correct, short], eval_dataset=DATA[:8],
                 args=GRPOConfig(output_dir="runs/t", per_device_train_batch_size=16, num_generations=4,
                                 max_steps=5, reward_weights=[1.0, 0.5], beta=0.1, use_bias_correction_kl=False,
                                 lr_scheduler_type="cosine", warmup_steps=2, eval_strategy="steps", eval_steps=2))
    dotted = dict(t.overrides)
    assert dotted["env.kwargs"]["path"] is DATA and len(dotted["env.kwargs"]["test_path"]) == 8
    assert dotted["env.eval_size"] == 8 and dotted["env.chat_template"] is False
    assert [(r["name"], r["weight"]) for r in dotted["env.rewards"]] == [("sum_correct", 1.0), ("short", 0.5)]
    # the in-memory objects as the strings a YAML config would hold
    dotted["env.kwargs"] = {**dotted["env.kwargs"], "path": "train.jsonl", "test_path": "test.jsonl"}
    dotted["env.rewards"] = [{**r, "fn": "rewards.py:" + r["name"]} for r in dotted["env.rewards"]]
    cfg = RunConfig.model_validate(nested(dotted))
    assert cfg.rollout.prompts_per_step == 4 and cfg.run.eval_every == 2 and cfg.train.schedule == "cosine"
    assert inert_keys(cfg, set(dotted)) == []
    assert t.config()["train"]["lr"] == 1e-6


def test_a_reward_model_path_in_reward_funcs_becomes_a_reward_model_part(tmp_path):
    """As TRL: a string is a reward model loaded with AutoModelForSequenceClassification (num_labels=1), named after
    the last part of its path, alone or beside functions, weighted by reward_weights."""
    from rollwise.config import build_config

    t = _trainer(reward_funcs="models/my-rm/")
    assert t.overrides["env.rewards"] == [{"reward_model": {"path": "models/my-rm/"}, "weight": 1.0, "name": "my-rm"}]
    tok_dir = tmp_path / "rm-tok"
    tok_dir.mkdir()
    t = _trainer(reward_funcs=[sum_correct, "org/reward-model", "org/reward-model"],
                 reward_processing_classes=[object(), SimpleNamespace(name_or_path=str(tok_dir)), None],
                 args=GRPOConfig(output_dir="runs/t", per_device_train_batch_size=16, num_generations=4, max_steps=5,
                                 reward_weights=[1.0, 0.5, 0.25]))
    items = t.overrides["env.rewards"]
    assert [(r.get("name"), r["weight"]) for r in items] == [("sum_correct", 1.0), ("reward-model", 0.5),
                                                             ("reward-model_2", 0.25)]
    assert items[0]["fn"] is sum_correct  # the entry for a function is ignored, as TRL
    assert items[1]["reward_model"] == {"path": "org/reward-model", "tokenizer": str(tok_dir)}
    assert items[2]["reward_model"] == {"path": "org/reward-model"}
    cfg = build_config(None, t.config())  # a valid rollwise config, the reward model's keys filled in
    assert cfg.env.rewards[1]["reward_model"]["normalize"] == "none" and cfg.env.rewards[1]["weight"] == 0.5


def test_a_single_processing_class_goes_with_a_single_reward_model(tmp_path):
    t = _trainer(reward_funcs=str(tmp_path), reward_processing_classes=SimpleNamespace(name_or_path=str(tmp_path)))
    assert t.overrides["env.rewards"][0]["reward_model"]["tokenizer"] == str(tmp_path)


def test_conversational_data_goes_through_the_chat_template():
    t = _trainer(train_dataset=CHAT, args=GRPOConfig(per_device_train_batch_size=8, num_generations=4, max_steps=2))
    assert t.overrides["env.chat_template"] is True
    assert t.overrides["env.kwargs"]["test_path"] is CHAT  # no eval_dataset: evaluated on the training prompts


def test_a_datasets_dataset_is_taken_as_it_is():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(DATA)
    t = _trainer(train_dataset=ds)
    assert t.overrides["env.kwargs"]["path"] is ds
    with pytest.raises(TRLArgumentError, match="IterableDataset"):
        _trainer(train_dataset=ds.to_iterable_dataset())


def test_async_reward_functions_run_as_sync_ones_with_their_signature():
    import inspect

    async def fast(completions, **kwargs):
        await asyncio.sleep(0)
        return [1.0] * len(completions)

    t = _trainer(reward_funcs=[fast, sum_correct])
    fn = t.overrides["env.rewards"][0]["fn"]
    assert fn.__name__ == "fast" and not inspect.iscoroutinefunction(fn)
    assert list(inspect.signature(fn).parameters) == ["completions", "kwargs"]
    assert fn(completions=["a", "b"]) == [1.0, 1.0]

    async def inside_a_loop():
        return fn(completions=["a"])

    assert asyncio.run(inside_a_loop()) == [1.0]


def test_peft_lora_config_maps_to_train_lora():
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, target_modules=["q_proj", "v_proj"])
    t = _trainer(peft_config=lora)
    assert t.overrides["train.lora.enabled"] is True and t.overrides["train.lora.r"] == 4
    assert t.overrides["train.lora.alpha"] == 8.0 and t.overrides["train.lora.target_modules"] == ["q_proj", "v_proj"]
    with pytest.raises(TRLArgumentError, match="use_dora"):
        _trainer(peft_config=peft.LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))


def test_an_environment_class_becomes_env_environment():
    class Calc:
        def reset(self, **row):
            return None

    assert _trainer(environment_factory=Calc).overrides["env.environment"] is Calc


# ------------------------------------------------------------------ train(), log_history, save_model


def test_train_calls_rollwise_train_with_the_config_and_reads_trls_metric_names(tmp_path, monkeypatch):
    import rollwise.api

    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints" / "step-4"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    seen = {}

    def fake_train(config, /, *, log=print, **overrides):
        seen["config"], seen["keywords"] = config, overrides
        lines = [{"step": s, "reward_mean": s / 10, "reward": s / 10, "loss": 0.5, "step_s": 1.0,
                  "rewards/sum_correct/mean": s / 10, "accuracy": 0.1} for s in range(1, 5)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        return SimpleNamespace(run_dir=run_dir, final_checkpoint=ckpt)

    monkeypatch.setattr(rollwise.api, "train", fake_train)
    t = _trainer(args=GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=16, num_generations=4,
                                 max_steps=4, logging_steps=2))
    out = t.train()
    assert seen["config"]["rollout"]["prompts_per_step"] == 4 and seen["keywords"]["train_dataset"] is DATA
    assert "path" not in seen["config"]["env"]["kwargs"]  # rows travel through the API's dataset keywords
    hist = t.state.log_history
    assert [h["step"] for h in hist] == [2, 4, 4]
    assert hist[0]["reward"] == pytest.approx(0.15) and hist[0]["rewards/sum_correct/mean"] == pytest.approx(0.15)
    assert "accuracy" not in hist[0] and hist[1]["epoch"] == pytest.approx(4 * 4 / 40)
    assert hist[-1]["train_runtime"] == 4.0 and out.global_step == 4 and out.training_loss == 0.5
    t.save_model()
    assert (tmp_path / "out" / "config.json").is_file()
    t.train(resume_from_checkpoint=True)
    assert seen["config"]["run"]["resume"] is True
    with pytest.raises(TRLArgumentError, match="resume_from_checkpoint"):
        t.train(resume_from_checkpoint=str(tmp_path / "elsewhere"))


def test_logging_steps_become_rl_steps_per_log_history_entry():
    assert rt.logging_window(GRPOConfig(logging_steps=10, max_steps=40), 40) == 10
    assert rt.logging_window(GRPOConfig(logging_steps=10, steps_per_generation=4, max_steps=40), 10) == 3
    assert rt.logging_window(GRPOConfig(logging_steps=0.25), 20) == 5


def test_log_history_windows_over_rl_steps():
    recs = [{"step": s, "loss": float(s), "kl": 0.1} for s in range(1, 6)]
    hist = log_history(recs, window=2, updates_per_step=3, prompts_per_step=4, num_prompts=8)
    assert [h["step"] for h in hist[:-1]] == [6, 12, 15] and hist[0]["loss"] == 1.5 and hist[2]["loss"] == 5.0
    assert hist[-1]["train_loss"] == 3.0


# ------------------------------------------------------------------ the docs


def test_the_docs_table_is_up_to_date():
    path = REPO / "docs" / "trl.md"
    text = path.read_text(encoding="utf-8")
    assert render_docs(text) == text, "docs/trl.md is stale: run PYTHONPATH=src python -m rollwise.trl docs/trl.md"


def test_the_table_has_both_directions_and_the_dapo_note():
    table = mapping_table()
    assert "| `loss_type` | `algo.loss`" in table and "| `algo.loss` | `loss_type`, `importance_sampling_level` |" in table
    assert "Same name, other meaning" in table and "algo.loss: dapo" in table
    for name, e in TRL_FIELDS.items():
        assert f"`{name}`" in table, name


# ------------------------------------------------------------------ the translation through the loop


REWARD_FILE = '''
def exact(completions, answer, **kwargs):
    return [1.0 if c.strip().startswith(str(a)) else 0.0 for c, a in zip(completions, answer)]
'''


@pytest.mark.slow
def test_a_translated_config_runs_in_the_rl_loop(tmp_path, tiny_model):
    """The keys a GRPOConfig becomes run as they are, with the in-memory objects written out as files (what
    rollwise.train takes in memory), and metrics.jsonl carries TRL's names, which log_history reads."""
    import yaml

    from rollwise.config import load_config
    from rollwise.run.loop import train
    from rollwise.train.metrics import read_metrics

    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10, 30) for b in (3, 7)]
    args = GRPOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=16, num_generations=4,
                      max_completion_length=6, learning_rate=3e-4, max_steps=2, logging_steps=1, use_cpu=True,
                      report_to="none")
    t = GRPOTrainer(model=str(tiny_model), reward_funcs=sum_correct, args=args, train_dataset=rows,
                    eval_dataset=rows[:8])
    dotted = dict(t.overrides)
    for name, data in (("path", rows), ("test_path", rows[:8])):
        f = tmp_path / f"{name}.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in data))
        dotted["env.kwargs"] = {**dotted["env.kwargs"], name: str(f)}
    (tmp_path / "reward.py").write_text(REWARD_FILE)
    dotted["env.rewards"] = [{"fn": f"{tmp_path / 'reward.py'}:exact", "weight": 1.0, "name": "exact"}]
    dotted["run.cpu_threads"] = 1
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(nested(dotted)))
    cfg = load_config(tmp_path / "cfg.yaml")
    assert cfg.algo.loss == "dapo" and cfg.algo.overlong_penalty is False and cfg.train.gradient_checkpointing
    train(cfg, log=lambda s: None)
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        for k in ("reward", "reward_std", "completions/mean_length", "rewards/exact/mean", "learning_rate", "loss"):
            assert k in r, (k, sorted(r))
        assert r["reward"] == r["reward_mean"] and r["rewards/exact/mean"] == r["reward_mean"]
    hist = log_history(recs, window=1, updates_per_step=1, prompts_per_step=4, num_prompts=len(rows))
    assert [h["step"] for h in hist] == [1, 2, 2] and "train_loss" in hist[-1]
