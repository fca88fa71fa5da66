"""A sequence-classification reward model gives TRL's numbers: the logit of its one label on prompt + completion (text
prompts joined, message prompts through its chat template), the same in any batch size; sigmoid on request; cached
per input; long inputs cut to the model's length."""

from __future__ import annotations

import pytest
import torch

from rollwise.config_rewards import RewardModelConfig
from rollwise.rewards.model_rewards import make_model_reward
from rollwise.rewards.reward_model import load_reward_model
from rollwise.types import Task

TASKS = [Task(f"t{i}", f"{i}+{i}=", str(2 * i)) for i in range(6)]
COMPLETIONS = ["0", "2", "5", "six", "8 ", "10!"]


def _trl_rewards(model_dir, prompts, completions):
    """TRL 1.16's `_calculate_rewards` for a model reward function on text prompts."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.config.pad_token_id = tok.pad_token_id
    texts = [p + c for p, c in zip(prompts, completions)]
    inputs = tok(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    with torch.inference_mode():
        return model(**inputs).logits[:, 0].tolist()


def test_the_reward_is_trls_logit_whatever_the_batch_size(tiny_reward_model):
    want = _trl_rewards(tiny_reward_model, [t.prompt for t in TASKS], COMPLETIONS)
    assert len(set(round(w, 6) for w in want)) > 3  # a random model still tells the inputs apart
    for bs in (1, 4, 8):
        rm = load_reward_model(str(tiny_reward_model), batch_size=bs, name="rm")
        got = rm.score_batch(TASKS, COMPLETIONS)
        assert [s.value for s in got] == pytest.approx(want, abs=1e-5)
        assert all(s.error is None and s.parts == {"rm": s.value} and s.info["logit"] == s.value for s in got)


def test_message_prompts_go_through_the_reward_models_chat_template(tmp_path, make_reward_model):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rollwise.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer("abcdefghijklmnopqrstuvwxyz0123456789 +=?:\n")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}")
    d = make_reward_model(tmp_path / "chat-rm", tokenizer=tok)
    chat = [Task(f"c{i}", [{"role": "user", "content": f"what is {i}+{i}?"}], str(2 * i)) for i in range(3)]
    rm = load_reward_model(str(d))
    got = [s.value for s in rm.score_batch(chat, ["0", "2", "4"])]
    model = AutoModelForSequenceClassification.from_pretrained(d, num_labels=1)
    t = AutoTokenizer.from_pretrained(d)
    for task, c, g in zip(chat, ["0", "2", "4"], got):  # TRL: apply_chat_template over prompt + completion messages
        text = t.apply_chat_template([*task.prompt, {"role": "assistant", "content": c}], tokenize=False)
        with torch.inference_mode():
            want = model(**t(text=[text], return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()
        assert g == pytest.approx(want, abs=1e-5)


def test_sigmoid_normalisation_and_the_cut_to_max_length(tiny_reward_model):
    raw = load_reward_model(str(tiny_reward_model)).score_batch(TASKS[:2], COMPLETIONS[:2])
    sig = load_reward_model(str(tiny_reward_model), normalize="sigmoid").score_batch(TASKS[:2], COMPLETIONS[:2])
    for r, s in zip(raw, sig):
        assert s.value == pytest.approx(1 / (1 + torch.exp(torch.tensor(-r.value)).item()))
        assert 0 < s.value < 1 and s.info["logit"] == pytest.approx(r.value)
    long = Task("long", "1+1=" * 40, "2")
    cut = load_reward_model(str(tiny_reward_model), max_length=16).score_batch([long, TASKS[0]], ["2", "0"])
    assert cut[0].info["truncated_to"] == 16 and "truncated_to" not in cut[1].info
    # the first 16 tokens are what was read: the same as a prompt of those characters alone
    same = load_reward_model(str(tiny_reward_model)).score_batch([Task("p", ("1+1=" * 40)[:16], "2")], [""])
    assert cut[0].value == pytest.approx(same[0].value, abs=1e-5)


def test_from_config_each_input_is_read_once(tiny_reward_model, monkeypatch):
    r = make_model_reward("reward_model", RewardModelConfig(path=str(tiny_reward_model), batch_size=2))
    assert r.name == tiny_reward_model.name  # TRL's name: the model directory's
    first = r.score_batch(TASKS[:3] * 2, COMPLETIONS[:3] * 2)
    rm = r._scorer.__self__  # the loaded SequenceClassifierReward
    seen: list[int] = []
    real = rm._logits
    monkeypatch.setattr(rm, "_logits", lambda seqs: (seen.append(len(seqs)), real(seqs))[1])
    again = r.score_batch(TASKS[:4], COMPLETIONS[:4])
    assert seen == [1]  # only the new input went through the model
    assert [s.info["judge_calls"] for s in first] == [1, 1, 1, 0, 0, 0]
    assert [s.info["judge_cache_hits"] for s in again] == [1, 1, 1, 0]
    assert [s.value for s in first[:3]] == [s.value for s in again[:3]]


def test_a_reward_model_that_cannot_load_errors_the_samples_naming_it(tmp_path):
    d = tmp_path / "broken"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama"}')  # no weights, no tokenizer
    r = make_model_reward("reward_model", RewardModelConfig(path=str(d)), where="env.rewards[1]")
    got = r.score_batch(TASKS[:2], COMPLETIONS[:2])
    assert all(s.error and s.error.startswith("broken: the reward model failed: ") for s in got), got[0].error
