"""Stop conditions, abort/interrupt/resume, load_weights, prefix sharing and checkpoint errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from conftest import make_tiny_checkpoint
from rollwise import LLM, SamplingParams
from rollwise.engine.core import EngineConfig, EngineCore
from rollwise.models.loader import CheckpointError
from rollwise.models.tokenizer import build_char_tokenizer

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [20, 21, 22, 23, 24]]


@pytest.fixture(scope="module")
def char_ckpt(tmp_path_factory):
    """A llama checkpoint with a char-level tokenizer saved beside it."""
    tok = build_char_tokenizer("0123456789+-*= abcdefghij\n")
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("char") / "m", "llama", vocab=len(tok))
    tok.save_pretrained(path)
    return path


def test_eos_and_stop_token_ids_end_samples(tiny_ckpts):
    llm = LLM(tiny_ckpts["llama"], block_size=4)
    free = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    # Use the 3rd greedy token of each prompt as a stop token: generation ends right there, token kept.
    for prompt, out in zip(PROMPTS, free):
        toks = out.outputs[0].token_ids
        stop_tok = toks[2]
        first = toks.index(stop_tok)
        got = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_tok]))[0]
        assert got.outputs[0].token_ids == toks[: first + 1]
        assert got.outputs[0].finish_reason == "stop"
    # EOS (id 2 in the config) ends a sample unless ignore_eos.
    eng = llm.engine
    assert 2 in eng.eos_token_ids


def test_max_tokens_and_max_model_len(tiny_ckpts):
    llm = LLM(tiny_ckpts["llama"], block_size=4, max_model_len=12)
    out = llm.generate([[5, 6, 7, 8, 9, 10, 11]], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 12 - 7
    assert out.outputs[0].finish_reason == "length"
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([list(range(5, 20))], SamplingParams(max_tokens=4))


def test_stop_strings_cut_text(char_ckpt):
    llm = LLM(char_ckpt, block_size=4)
    free = llm.generate(["12+34="], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0].outputs[0]
    assert free.text and len(free.text) == 16
    stop = free.text[3:5]
    cut = free.text.find(stop)
    got = llm.generate(["12+34="], SamplingParams(temperature=0, max_tokens=16, stop=[stop], ignore_eos=True))[0]
    o = got.outputs[0]
    assert o.finish_reason == "stop"
    assert o.text == free.text[:cut]
    assert o.token_ids == free.token_ids[: len(o.token_ids)] and len(o.token_ids) <= cut + len(stop)


def test_abort_interrupt_and_resume_reproduce_uninterrupted(tiny_ckpts):
    sp = SamplingParams(n=3, temperature=1.0, max_tokens=15, seed=7, ignore_eos=True)
    llm = LLM(tiny_ckpts["llama"], block_size=4)
    full = llm.generate(PROMPTS, sp)
    eng = llm.engine
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"r{i}", p, sp)
    for _ in range(6):
        eng.step()
    aborted_one = eng.abort("r1")
    assert aborted_one is not None and all(o.finish_reason == "abort" for o in aborted_one.outputs)
    partial = {o.request_id: o for o in eng.interrupt()}
    partial["r1"] = aborted_one
    assert not eng.has_unfinished() and eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    lens = [len(o.token_ids) for r in partial.values() for o in r.outputs]
    assert 0 < min(lens) and max(lens) < 15
    # Resubmit prompt + partial tokens: same weights and seed -> exactly the uninterrupted samples.
    resumed = llm.generate(PROMPTS, sp, partial=[partial[f"r{i}"].outputs for i in range(3)])
    for a, b in zip(full, resumed):
        for oa, ob in zip(a.outputs, b.outputs):
            assert oa.token_ids == ob.token_ids
            assert oa.finish_reason == ob.finish_reason == "length"
            assert max(abs(x - y) for x, y in zip(oa.logprobs, ob.logprobs)) < 1e-5


def test_load_weights_changes_outputs_and_versions(tiny_ckpts, tmp_path):
    src = tiny_ckpts["llama"]
    other = make_tiny_checkpoint(tmp_path / "other", "llama", seed=123)
    llm = LLM(src, block_size=4)
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    before = llm.generate(PROMPTS, sp)
    assert llm.weight_version == 0
    state = AutoModelForCausalLM.from_pretrained(other).state_dict()
    llm.load_weights(state)
    assert llm.weight_version == 1
    after = llm.generate(PROMPTS, sp)
    ref = LLM(other, block_size=4).generate(PROMPTS, sp)
    assert [o.outputs[0].token_ids for o in after] == [o.outputs[0].token_ids for o in ref]
    assert [o.outputs[0].token_ids for o in after] != [o.outputs[0].token_ids for o in before]
    assert all(v == 1 for o in after for v in o.outputs[0].weight_versions)
    with pytest.raises(CheckpointError, match="shape mismatch"):
        llm.load_weights({"model.norm.weight": torch.ones(3)})
    with pytest.raises(CheckpointError, match="unexpected parameter"):
        llm.load_weights({"model.bogus.weight": torch.ones(3)})


def test_weight_versions_recorded_across_update_mid_sample(tiny_ckpts, tmp_path):
    other = make_tiny_checkpoint(tmp_path / "o2", "llama", seed=5)
    eng = EngineCore.from_pretrained(tiny_ckpts["llama"], config=EngineConfig(block_size=4))
    eng.add_request("a", PROMPTS[0], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    for _ in range(4):
        eng.step()
    eng.load_weights(AutoModelForCausalLM.from_pretrained(other).state_dict())
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    versions = outs[0].outputs[0].weight_versions
    assert versions == [0] * 4 + [1] * 6


def test_group_prefill_shared_and_prefix_cache_hits(tiny_ckpts):
    eng = EngineCore.from_pretrained(tiny_ckpts["llama"], config=EngineConfig(block_size=4))
    prompt = list(range(5, 19))  # 14 tokens: 3 full blocks + a partial one
    eng.add_request("g", prompt, SamplingParams(n=8, temperature=1.0, max_tokens=4, seed=0, ignore_eos=True))
    eng.step()  # one prefill for the whole group
    assert eng.stats.prefill_tokens == len(prompt)
    assert len(eng.scheduler.running) == 8
    # The 3 full prompt blocks are shared by all 8 samples.
    shared = eng.scheduler.running[0].block_table[:3]
    assert all(s.block_table[:3] == shared for s in eng.scheduler.running)
    assert all(eng.block_manager.ref_count[b] == 8 for b in shared)
    while eng.has_unfinished():
        eng.step()
    # A second request with the same prefix is served from the prefix cache: only the tail is computed.
    eng.add_request("h", prompt, SamplingParams(n=1, temperature=0, max_tokens=2, ignore_eos=True))
    before = eng.stats.prefill_tokens
    while eng.has_unfinished():
        eng.step()
    assert eng.stats.prefill_tokens - before == len(prompt) - 12
    # After a weight update the cache is invalid: the whole prompt is recomputed.
    eng.load_weights({})
    eng.add_request("i", prompt, SamplingParams(n=1, temperature=0, max_tokens=2, ignore_eos=True))
    before = eng.stats.prefill_tokens
    while eng.has_unfinished():
        eng.step()
    assert eng.stats.prefill_tokens - before == len(prompt)


def test_prefix_cache_gives_same_outputs(tiny_ckpts):
    sp = SamplingParams(n=2, temperature=1.0, max_tokens=10, seed=11, ignore_eos=True)
    prompts = [list(range(5, 30)), list(range(5, 30)) + [40, 41]]
    on = LLM(tiny_ckpts["qwen3"], block_size=4).generate(prompts, sp)
    off = LLM(tiny_ckpts["qwen3"], block_size=4, enable_prefix_caching=False).generate(prompts, sp)
    for a, b in zip(on, off):
        for oa, ob in zip(a.outputs, b.outputs):
            assert oa.token_ids == ob.token_ids
            assert max(abs(x - y) for x, y in zip(oa.logprobs, ob.logprobs)) < 1e-4


def test_preemption_under_block_pressure_keeps_outputs(tiny_ckpts):
    sp = SamplingParams(n=4, temperature=1.0, max_tokens=24, seed=3, ignore_eos=True)
    big = LLM(tiny_ckpts["llama"], block_size=4).generate(PROMPTS, sp)
    small = LLM(tiny_ckpts["llama"], block_size=4, num_kv_blocks=24)
    outs = small.generate(PROMPTS, sp)
    assert small.engine.scheduler.num_preemptions > 0
    for a, b in zip(big, outs):
        assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]


def test_continuous_batching_refills_slots(tiny_ckpts):
    eng = EngineCore.from_pretrained(tiny_ckpts["llama"], config=EngineConfig(block_size=4, max_num_seqs=2))
    for i in range(5):
        eng.add_request(f"q{i}", PROMPTS[i % 3], SamplingParams(temperature=0, max_tokens=2 + 3 * i, ignore_eos=True))
    done = []
    while eng.has_unfinished():
        assert len(eng.scheduler.running) <= 2
        done += [o.request_id for o in eng.step()]
    assert sorted(done) == [f"q{i}" for i in range(5)]
    assert done[0] == "q0"  # the shortest finishes first and its slot goes to the next waiting request


def test_bad_requests_fail_clearly(tiny_ckpts):
    llm = LLM(tiny_ckpts["llama"])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[5, 100000]], SamplingParams())
    with pytest.raises(ValueError, match="empty prompt"):
        llm.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate(["text"], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    # The engine still works after rejected requests.
    assert llm.generate([[5, 6]], SamplingParams(max_tokens=3, ignore_eos=True))[0].outputs[0].token_ids


def test_checkpoint_errors_name_the_problem(tiny_ckpts, tmp_path):
    src = tiny_ckpts["llama"]
    with pytest.raises(CheckpointError, match="model directory not found"):
        LLM(tmp_path / "nope")
    d = tmp_path / "noweights"
    shutil.copytree(src, d)
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        LLM(d)
    d = tmp_path / "arch"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unsupported architecture model_type='gpt2'"):
        LLM(d)
    d = tmp_path / "shape"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape mismatch for 'model.layers.0.mlp.*_proj.weight'"):
        LLM(d)
    d = tmp_path / "missing"
    shutil.copytree(src, d)
    sd = load_file(d / "model.safetensors")
    del sd["model.norm.weight"]
    save_file(sd, d / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing parameters: norm.weight"):
        LLM(d)
    d = tmp_path / "corrupt"
    shutil.copytree(src, d)
    (d / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match="cannot read"):
        LLM(d)


def test_sharded_checkpoint_loads(tiny_ckpts, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_ckpts["qwen2"])
    d = tmp_path / "sharded"
    model.save_pretrained(d, max_shard_size="20KB")
    assert (d / "model.safetensors.index.json").is_file()
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    a = LLM(d).generate(PROMPTS, sp)
    b = LLM(tiny_ckpts["qwen2"]).generate(PROMPTS, sp)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    index = json.loads((d / "model.safetensors.index.json").read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    (d / first).unlink()
    with pytest.raises(CheckpointError, match=f"shard {first} listed"):
        LLM(d)


@pytest.mark.parametrize("rope", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
])
def test_rope_scaling_variants_match_transformers(tmp_path, rope):
    path = make_tiny_checkpoint(tmp_path / "rope", "llama", rope_scaling=dict(rope, rope_theta=10000.0))
    prompt = list(range(5, 90))
    out = LLM(path).generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                      pad_token_id=0)[0, len(prompt):].tolist()
    assert out.outputs[0].token_ids == ref
