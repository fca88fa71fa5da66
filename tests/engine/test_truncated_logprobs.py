"""Behaviour log-probs under top-k / top-p: log p of the sampled token under the truncated, renormalised
distribution it was drawn from, checked against a naive reference computed from transformers' logits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollwise import LLM, SamplingParams
from rollwise.engine.sampler import SamplingBatch, sample

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [40, 41, 42, 43, 44]]


def naive_truncated(logits_row: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """From the definition: softmax(logits / T); keep the k most likely; renormalise; keep the most likely tokens
    until their mass reaches p (the one crossing p included); renormalise. -> log-probs [V] (-inf outside)."""
    probs = torch.softmax(logits_row.double() / temperature, dim=-1).tolist()
    ranked = sorted(range(len(probs)), key=lambda i: -probs[i])
    if top_k > 0:
        ranked = ranked[:top_k]
    z = sum(probs[i] for i in ranked)
    kept, mass = [], 0.0
    for i in ranked:
        kept.append(i)
        mass += probs[i] / z
        if mass >= top_p:
            break
    zk = sum(probs[i] for i in kept)
    out = torch.full((len(probs),), float("-inf"), dtype=torch.float64)
    for i in kept:
        out[i] = torch.tensor(probs[i] / zk).log()
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("temperature,top_p,top_k", [(0.7, 0.8, -1), (1.0, 1.0, 5), (0.9, 0.6, 20)])
def test_engine_logprobs_are_of_the_truncated_distribution(tiny_ckpts, arch, temperature, top_p, top_k):
    path = tiny_ckpts[arch]
    llm = LLM(path, block_size=4)
    sp = SamplingParams(n=3, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=12, seed=11,
                        ignore_eos=True)
    outs = llm.generate(PROMPTS, sp)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    cut = 0
    for prompt, out in zip(PROMPTS, outs):
        for o in out.outputs:
            with torch.no_grad():
                logits = hf(torch.tensor([prompt + o.token_ids])).logits[0].float()
            for t, (tok, lp) in enumerate(zip(o.token_ids, o.logprobs)):
                ref = naive_truncated(logits[len(prompt) - 1 + t], temperature, top_p, top_k)
                assert ref[tok] > float("-inf"), "sampled a token outside the top-k/top-p set"
                assert abs(lp - ref[tok].item()) < 1e-4
                full = torch.log_softmax(logits[len(prompt) - 1 + t] / temperature, -1)[tok].item()
                cut += (lp - full) > 1e-3
    assert cut > 0  # the truncation really changed the numbers in this setting


def test_raw_logprobs_mode_and_top_p_one_cuts_nothing():
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3
    sb = SamplingBatch(temperature=torch.tensor([0.5, 0.5, 1.0, 0.0]), top_p=torch.tensor([1.0, 0.5, 1.0, 0.3]),
                       top_k=torch.tensor([-1, -1, 3, 2]), seeds=torch.arange(4), positions=torch.zeros(4, dtype=torch.long),
                       all_greedy=False, any_truncation=True)
    tok, lp = sample(logits, sb)
    full = torch.log_softmax(logits / torch.tensor([0.5, 0.5, 1.0, 1.0])[:, None], -1).gather(1, tok[:, None])[:, 0]
    assert lp[0].item() == pytest.approx(full[0].item(), abs=1e-6)  # top_p = 1, no top_k: untruncated
    assert lp[1] > full[1] and lp[2] > full[2]  # renormalised over a cut set
    assert tok[3] == logits[3].argmax() and lp[3].item() == pytest.approx(full[3].item(), abs=1e-6)  # greedy
    tok_raw, lp_raw = sample(logits, sb, "raw")
    assert torch.equal(tok_raw, tok)
    assert torch.allclose(lp_raw, torch.log_softmax(logits, -1).gather(1, tok[:, None])[:, 0])
    with pytest.raises(ValueError, match="logprobs_mode"):
        sample(logits, sb, "processed_logits")
