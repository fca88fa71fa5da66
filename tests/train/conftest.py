"""Tiny random HF models for trainer tests (built once per session, a few hundred kB each)."""

from __future__ import annotations

import pytest
import torch


def build_tiny_llama(path, *, seed=0, tie=False, vocab=64, attn=None):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=vocab, max_position_embeddings=128,
                      tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if attn:
        cfg._attn_implementation = attn
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_llama_tied(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny_llama_tied"), seed=1, tie=True)


@pytest.fixture(autouse=True)
def _one_thread():
    """The models here are tiny: thread start-up costs more than it saves, and CI machines are shared."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def naive_logprobs(model, ros, t: int):
    """Each sequence alone through the plain HF forward (no packing, no mask), full float32 logits: the reference
    the packed, shared-prompt and tree layouts are tested against. -> [len(ros), t], 0 past each completion."""
    out = torch.zeros(len(ros), t)
    for i, r in enumerate(ros):
        ids = torch.tensor([list(r.prompt_token_ids) + list(r.completion_token_ids)])
        logits = model(input_ids=ids).logits[0].float()
        p, c = len(r.prompt_token_ids), len(r.completion_token_ids)
        out[i, :c] = torch.log_softmax(logits[p - 1:p - 1 + c], -1).gather(-1, ids[0, p:p + c, None])[:, 0]
    return out
