"""On-policy distillation end to end on the built-in tiny model: the student moves toward a sharper teacher (the
reverse KL falls step after step), groups with equal rewards still train, a resume continues as if never stopped,
and a teacher with another tokenizer or a combination that cannot work is refused before any work."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from rollwise.config import ConfigError, load_config
from rollwise.run.loop import train
from rollwise.store.writer import RolloutStore


@pytest.fixture(scope="module")
def teacher(tiny_model, tmp_path_factory) -> Path:
    """The warmed-up tiny model with its LM head scaled by 1.5: the same tokenizer, a sharper (lower-temperature)
    distribution that the student can reach in a few steps."""
    out = tmp_path_factory.mktemp("teacher")
    for f in tiny_model.iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    sd = load_file(out / "model.safetensors")
    sd["lm_head.weight"] = sd["lm_head.weight"] * 1.5
    save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def exact_reverse_kl(student: Path, teacher: Path, rows) -> float:
    """KL(student || teacher) summed over the vocabulary at every completion position of `rows`, averaged: the exact
    quantity the per-token advantage estimates from one sampled token."""
    import torch
    from transformers import AutoModelForCausalLM

    s = AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32).eval()
    t = AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.float32).eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([list(r.prompt_token_ids) + list(r.completion_token_ids)])
            p, c = len(r.prompt_token_ids), len(r.completion_token_ids)
            ls = torch.log_softmax(s(input_ids=ids).logits[0, p - 1:p - 1 + c].float(), -1)
            lt = torch.log_softmax(t(input_ids=ids).logits[0, p - 1:p - 1 + c].float(), -1)
            kl = (ls.exp() * (ls - lt)).sum(-1)
            total, n = total + float(kl.sum()), n + c
    return total / n


def test_student_moves_toward_the_teacher(tmp_path, run_cfg, tiny_model, teacher):
    out = tmp_path / "distill"
    train(run_cfg(out, f"algo.distill.teacher={teacher}", "train.steps=12", "train.lr=3e-4",
                  "rollout.prompts_per_step=8", "rollout.samples_per_prompt=8", "run.checkpoint_every=6",
                  "algo.skip_zero_variance=true"), log=lambda s: None)
    # The exact reverse KL on the states the first step visited falls as training goes on. (The logged metric is
    # its one-sample estimate over each step's own samples: the same quantity, noisier.)
    first = [r for r in RolloutStore(out).read() if r.step == 1]
    kl = [exact_reverse_kl(d, teacher, first) for d in (tiny_model, out / "checkpoints" / "step-6",
                                                        out / "checkpoints" / "step-12")]
    assert kl[0] > kl[1] > kl[2] and kl[2] < 0.75 * kl[0], kl
    lines = _metrics(out)
    assert len(lines) == 12
    for m in lines:
        assert m["distill_reverse_kl"] > -0.5 and m["distill_teacher_logprob"] < 0 and m["time_teacher_s"] > 0
        assert "no_signal" not in m
    # groups whose rewards are all equal carry the teacher's signal: counted, never dropped
    assert any(m["zero_var_frac"] > 0 for m in lines)
    assert not any(r.status == "filtered" for r in RolloutStore(out).read())
    assert json.loads((out / "summary.json").read_text())["rollouts"]["filtered"] == 0


def test_resume_under_distillation_continues_as_if_never_stopped(tmp_path, run_cfg, teacher):
    args = [f"algo.distill.teacher={teacher}", "algo.distill.reward_weight=0.5", "run.checkpoint_every=2",
            "train.steps=4", "train.lr=1e-3"]
    full, part = tmp_path / "full", tmp_path / "part"
    train(run_cfg(full, *args), log=lambda s: None)
    assert train(run_cfg(part, *args), log=lambda s: None, stop_after=3) is None
    train(run_cfg(part, *args, "run.resume=true"), log=lambda s: None)
    a = load_file(full / "checkpoints" / "step-4" / "model.safetensors")
    b = load_file(part / "checkpoints" / "step-4" / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
    for x, y in zip(_metrics(full), _metrics(part)):
        assert abs(x["distill_reverse_kl"] - y["distill_reverse_kl"]) < 1e-6
        assert abs(x["loss"] - y["loss"]) < 1e-5
    # the teacher is part of what a step computes: a resume under another teacher is refused, naming the key
    with pytest.raises(ValueError, match="algo.distill.coef"):
        train(run_cfg(part, *args, "algo.distill.coef=2", "run.resume=true", "train.steps=5"), log=lambda s: None)


@pytest.fixture(scope="module")
def other_tokenizer_teacher(tmp_path_factory) -> Path:
    from rollwise.models.builtin import build_builtin_model

    return build_builtin_model(tmp_path_factory.mktemp("other") / "m", "abcdefghij0123456789 +=?",
                               hidden_size=32, num_layers=1, intermediate_size=64)


def test_a_teacher_with_another_tokenizer_is_refused_before_any_model_loads(tmp_path, run_cfg,
                                                                           other_tokenizer_teacher):
    out = tmp_path / "bad"
    with pytest.raises(ValueError) as e:
        train(run_cfg(out, f"algo.distill.teacher={other_tokenizer_teacher}"), log=lambda s: None)
    msg = str(e.value)
    assert "does not share the policy's tokenizer" in msg and "\n" not in msg
    assert not (out / "metrics.jsonl").exists()


def test_cli_refuses_another_tokenizer_in_one_line(tmp_path, tiny_model, other_tokenizer_teacher):
    r = subprocess.run([sys.executable, "-m", "rollwise.cli.main", "train", "--out", str(tmp_path / "x"),
                        "--set", f"model.path={tiny_model}", "--set", f"algo.distill.teacher={other_tokenizer_teacher}",
                        "--set", "model.device=cpu", "--set", "train.steps=1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "does not share the policy's tokenizer" in r.stderr


@pytest.mark.parametrize("overrides, message", [
    (["algo.distill.teacher=t", "algo.loss=gspo"], "takes one per sequence"),
    (["algo.distill.teacher=t", "control.policy=dynamic"], "reward_weight 0"),
    (["algo.distill.coef=2"], "has no effect unless algo.distill.teacher is set"),
])
def test_combinations_that_cannot_work_are_refused_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["model.path=x", *overrides])


def test_dynamic_sampling_is_accepted_when_the_reward_trains_too():
    cfg = load_config(None, ["model.path=x", "algo.distill.teacher=t", "algo.distill.reward_weight=1",
                             "control.policy=dynamic"])
    assert cfg.algo.distill.reward_weight == 1.0
