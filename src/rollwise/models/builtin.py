"""The built-in tiny policy: a Llama-shaped model with a character tokenizer, built locally (no hub).

`rollwise train` with no config uses it, so the whole product runs on a laptop with nothing downloaded.
It is saved as an ordinary HF checkpoint directory, so the engine, the trainer and any HF tool load it
like any other model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollwise.models.tokenizer import build_char_tokenizer


def build_builtin_model(out_dir: str | Path, charset: str, *, hidden_size: int = 128, num_layers: int = 3,
                        num_heads: int = 4, num_kv_heads: int = 4, intermediate_size: int = 512,
                        max_position_embeddings: int = 256, seed: int = 0) -> Path:
    """Write a randomly initialised model + char tokenizer over `charset` to `out_dir`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_char_tokenizer(charset)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def builtin_kwargs(builtin_cfg: Any) -> dict[str, int]:
    """Constructor arguments from a `rollwise.config.BuiltinModelConfig`."""
    return dict(hidden_size=builtin_cfg.hidden_size, num_layers=builtin_cfg.num_layers,
                num_heads=builtin_cfg.num_heads, num_kv_heads=builtin_cfg.num_kv_heads,
                intermediate_size=builtin_cfg.intermediate_size,
                max_position_embeddings=builtin_cfg.max_position_embeddings)
