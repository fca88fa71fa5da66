"""CUDA checks of the trainer (skipped without a GPU): packed == unpacked log-probs on CUDA, a bf16-autocast +
gradient-checkpointing step, and one RL step of a Qwen2.5-0.5B-shaped random model with its time split and peak
memory (printed; run with -s to see the figures)."""

from __future__ import annotations

import random
import time

import pytest
import torch

from rollwise.config import TrainConfig
from rollwise.train.batch import TrainBatch
from rollwise.train.losses import LOSSES, LossConfig
from rollwise.train.trainer import Trainer
from rollwise.types import Rollout

from .synthetic import make_rollouts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_packed_logprobs_equal_unpacked_on_cuda(tiny_llama):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tr = Trainer(tiny_llama, TrainConfig(bf16=False), device="cuda", temperature=0.7)  # fp32 vs the fp32 reference
    ros = make_rollouts(12, seed=11)
    got = tr.compute_logprobs(TrainBatch.from_rollouts(ros, 32))
    with torch.no_grad():
        rows = []
        for r in ros:
            ids = torch.tensor([r.prompt_token_ids + r.completion_token_ids], device="cuda")
            ls = torch.log_softmax(tr.model(input_ids=ids).logits[0].float() / 0.7, -1)
            p = len(r.prompt_token_ids)
            rows.append(torch.stack([ls[p + k - 1, t] for k, t in enumerate(r.completion_token_ids)]))
    diff = max((got[i, : len(x)] - x).abs().max().item() for i, x in enumerate(rows))
    print(f"\ncuda packed-vs-unpacked max |dlogp| = {diff:.2e}")
    assert diff < 1e-4


def test_bf16_autocast_and_gradient_checkpointing_step(tiny_llama):
    tr = Trainer(tiny_llama, TrainConfig(lr=1e-3, bf16=True, gradient_checkpointing=True), device="cuda")
    m = tr.train_step(TrainBatch.from_rollouts(make_rollouts(8, seed=12), 32), LOSSES["grpo"], LossConfig())
    assert all(v == v for v in m.values()) and m["skipped_steps"] == 0 and m["grad_norm"] > 0
    assert next(tr.model.parameters()).dtype == torch.float32  # fp32 master weights


@pytest.mark.slow
def test_qwen05b_shaped_rl_step_bf16(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                      intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768,
                      tie_word_embeddings=True, rope_theta=1e6, bos_token_id=151643, eos_token_id=151645)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "qwen")
    rng = random.Random(0)
    ros = []
    for g in range(8):  # 8 prompts x 8 samples, 128-token prompts, 32..512-token completions
        prompt = [rng.randrange(151000) for _ in range(128)]
        for k in range(8):
            n = rng.randint(32, 512)
            ros.append(Rollout(prompt_id=str(g), group_id=str(g), sample_index=k, prompt_token_ids=prompt,
                               completion_token_ids=[rng.randrange(151000) for _ in range(n)],
                               logprobs=[-11.9] * n, weight_versions=[0] * n, loss_mask=[1] * n,
                               advantage=rng.uniform(-1, 1)))
    batch = TrainBatch.from_rollouts(ros, 16384)
    tcfg = TrainConfig(lr=1e-6, bf16=True, gradient_checkpointing=True)
    t0 = time.perf_counter()
    tr = Trainer(tmp_path / "qwen", tcfg, device="cuda", reference=True)
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    figures = []
    for step in range(3):
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        m = tr.train_step(batch, LOSSES["grpo"], LossConfig(kl_coef=0.01))
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        sd = tr.state_dict_for_sync()
        flat = {k: v.to(torch.bfloat16) for k, v in sd.items()}  # what an engine in bf16 would copy
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        figures.append((t1 - t0, t2 - t1, torch.cuda.max_memory_allocated() / 2**30, m))
        del flat
    print(f"\nqwen2.5-0.5B-shaped: {batch.num_sequences} seqs, {batch.num_tokens} tokens in "
          f"{len(batch.micro_batches)} packed micro-batches; load {load_s:.1f}s")
    for i, (train_s, sync_s, peak, m) in enumerate(figures):
        print(f"step {i}: train_step {train_s:.2f}s (ref fwd {m['ref_s']:.2f}s, optimizer {m['optim_s']:.2f}s), sync-dict {sync_s * 1000:.0f} ms, "
              f"peak {peak:.1f} GiB, {m['train_tokens'] / train_s:.0f} tok/s, loss {m['loss']:.4f}, "
              f"grad_norm {m['grad_norm']:.3f}, kl {m.get('kl', 0):.2e}, entropy {m['entropy']:.2f}")
    assert all(f[3]["skipped_steps"] == 0 and f[3]["grad_norm"] == f[3]["grad_norm"] for f in figures)
