"""Load a Hugging Face checkpoint directory into rollwise's `DecoderLM`.

A checkpoint directory holds `config.json`, the weights as `model.safetensors` or as shards listed in
`model.safetensors.index.json`, and usually tokenizer files. Everything a user can get wrong fails here
with a message that names the file, the parameter or the architecture, not deep inside the forward.

HF parameter names are the public weight format (also for `LLM.load_weights`): q/k/v and gate/up are
copied into rollwise's fused projections by `WeightMapper`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

import torch

from rollwise.models.decoder import ArchSpec, DecoderLM

SUPPORTED_MODEL_TYPES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message names the file or parameter."""


def read_hf_config(model_dir: str | Path):
    """Read config.json through transformers (so legacy RoPE formats are normalised)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"model directory not found: {model_dir}")
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"missing config.json in checkpoint directory {model_dir}")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from None
    mt = raw.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(
            f"{cfg_path}: unsupported architecture model_type={mt!r} "
            f"(rollwise's engine supports {', '.join(sorted(SUPPORTED_MODEL_TYPES))})"
        )
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(model_dir))


def arch_spec_from_config(cfg) -> ArchSpec:
    mt = cfg.model_type
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", False):
        raise CheckpointError(f"{mt} checkpoint uses sliding-window attention, which rollwise does not support")
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    attention_bias = bool(getattr(cfg, "attention_bias", False))
    return ArchSpec(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        rms_norm_eps=cfg.rms_norm_eps,
        qkv_bias=True if mt == "qwen2" else attention_bias,
        o_bias=attention_bias if mt != "qwen2" else False,
        mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
        qk_norm=mt == "qwen3",
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        max_position_embeddings=cfg.max_position_embeddings,
    )


def _rope_params(cfg) -> dict:
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return params if isinstance(params, dict) else {}


def rope_tables(cfg, max_len: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling for the config's RoPE variant (transformers' own math).

    NOTE: 'dynamic' and 'longrope' depend on the sequence length; transformers recomputes them per batch,
    which makes outputs depend on what else is batched. rollwise fixes them once for `max_len`, so within
    the original context length they equal the unscaled/short-factor tables, as in transformers.
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = _rope_params(cfg)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if getattr(cfg, "partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError(f"partial_rotary_factor={cfg.partial_rotary_factor} is not supported")
    if rope_type == "default" or (rope_type == "dynamic" and max_len <= cfg.max_position_embeddings):
        theta = params.get("rope_theta") or getattr(cfg, "rope_theta", None) or 10000.0
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)), 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise CheckpointError(f"unknown RoPE type {rope_type!r} in config")
    seq_len = max_len if rope_type in ("dynamic", "longrope") else None
    inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg, torch.device("cpu"), seq_len=seq_len)
    return inv.float(), float(scaling)


def _weight_files(model_dir: Path) -> list[Path]:
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index} is malformed ({e})") from None
        files = []
        for name in dict.fromkeys(weight_map.values()):
            p = model_dir / name
            if not p.is_file():
                raise CheckpointError(f"shard {name} listed in {index.name} is missing from {model_dir}")
            files.append(p)
        return files
    raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {model_dir}")


def iter_safetensors(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError
    from safetensors.torch import safe_open

    for f in _weight_files(Path(model_dir)):
        try:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    yield name, fh.get_tensor(name)
        except SafetensorError as e:
            raise CheckpointError(f"cannot read {f}: {e}") from None


class WeightMapper:
    """Copies HF-named tensors into the fused parameters of a `DecoderLM`, checking names and shapes."""

    def __init__(self, model: DecoderLM) -> None:
        self.model = model
        self.params = dict(model.named_parameters(remove_duplicate=False))
        s = model.spec
        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        self.qkv_offsets = {"q_proj": (0, q), "k_proj": (q, kv), "v_proj": (q + kv, kv)}
        self.gate_up_offsets = {"gate_proj": (0, s.intermediate_size), "up_proj": (s.intermediate_size, s.intermediate_size)}

    def _target(self, name: str) -> tuple[str, int, int] | None:
        """rollwise parameter name and (row offset, rows) for an HF name; None if it needs no copy."""
        if name.startswith("model."):
            name = name[len("model.") :]
        if name.endswith("rotary_emb.inv_freq"):
            return None
        parts = name.split(".")
        for i, p in enumerate(parts):
            if p in self.qkv_offsets:
                off, n = self.qkv_offsets[p]
                return ".".join(parts[:i] + ["qkv_proj"] + parts[i + 1 :]), off, n
            if p in self.gate_up_offsets:
                off, n = self.gate_up_offsets[p]
                return ".".join(parts[:i] + ["gate_up_proj"] + parts[i + 1 :]), off, n
        return name, 0, -1

    def _destination(self, hf_name: str, t: torch.Tensor, source: str) -> tuple[str, torch.Tensor] | None:
        """(rollwise parameter name, the view `t` is copied into), None when `t` needs no copy; CheckpointError
        for a name this architecture lacks or a shape that does not fit."""
        tgt = self._target(hf_name)
        if tgt is None:
            return None
        name, off, n = tgt
        if name == "lm_head.weight" and self.model.spec.tie_word_embeddings:
            return None  # tied: lm_head shares embed_tokens
        p = self.params.get(name)
        if p is None:
            raise CheckpointError(f"{source}unexpected parameter {hf_name!r} (not part of this architecture)")
        dst = p if n < 0 else p.narrow(0, off, n)
        if tuple(dst.shape) != tuple(t.shape):
            raise CheckpointError(
                f"{source}shape mismatch for {hf_name!r}: checkpoint has {tuple(t.shape)}, config expects {tuple(dst.shape)}"
            )
        return name, dst

    def check(self, tensors: Iterable[tuple[str, torch.Tensor]], source: str = "") -> dict[str, torch.dtype]:
        """What `load` would check, without copying anything: CheckpointError on the first bad name or shape.
        Returns {HF name: the dtype it would be stored in} for the tensors that would be copied."""
        return {hf_name: found[1].dtype for hf_name, t in tensors
                if (found := self._destination(hf_name, t, source)) is not None}

    @torch.no_grad()
    def load(self, tensors: Iterable[tuple[str, torch.Tensor]], strict: bool = True, source: str = "") -> int:
        """Copy tensors in as they come (a stream is never held whole). NOTE: not atomic: a bad tensor raises
        after the ones before it were copied; a caller taking untrusted input runs `check` on all of it first."""
        seen: set[str] = set()
        rows_filled: dict[str, int] = {}
        count = 0
        for hf_name, t in tensors:
            found = self._destination(hf_name, t, source)
            if found is None:
                continue
            name, dst = found
            dst.copy_(t.to(dtype=dst.dtype, device=dst.device))
            seen.add(name)
            rows_filled[name] = rows_filled.get(name, 0) + dst.shape[0]  # a fused slice fills its rows only
            count += 1
        if strict:
            missing = []
            for name, p in self.params.items():
                if name == "lm_head.weight" and self.model.spec.tie_word_embeddings:
                    continue
                if name not in seen or rows_filled.get(name, 0) != p.shape[0]:
                    missing.append(name)
            if missing:
                raise CheckpointError(f"{source}checkpoint is missing parameters: {', '.join(missing[:5])}"
                                      + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
        return count


def build_model(cfg, dtype: torch.dtype, device: torch.device | str, max_len: int) -> DecoderLM:
    spec = arch_spec_from_config(cfg)
    inv_freq, scaling = rope_tables(cfg, max_len)
    with torch.device("meta"):
        model = DecoderLM(spec)
    model = model.to_empty(device=device).to(dtype=dtype)
    if spec.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.init_rope(inv_freq, scaling, max_len)
    return model.requires_grad_(False).eval()


def load_model(model_dir: str | Path, dtype: torch.dtype, device: torch.device | str, max_len: int) -> tuple[DecoderLM, object]:
    cfg = read_hf_config(model_dir)
    model = build_model(cfg, dtype, device, max_len)
    WeightMapper(model).load(iter_safetensors(model_dir), strict=True, source=f"{model_dir}: ")
    return model, cfg
