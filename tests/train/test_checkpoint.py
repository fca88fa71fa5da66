"""Checkpoints: HF-loadable, atomic, resumable to the same parameters as an uninterrupted run, and loud when
damaged."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from rollwise.config import LoraConfig, TrainConfig
from rollwise.train.batch import TrainBatch
from rollwise.train.checkpoint import (
    CheckpointError,
    file_sha256,
    find_latest_checkpoint,
    load_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from rollwise.train.losses import LOSSES, LossConfig
from rollwise.train.trainer import Trainer
from rollwise.types import Rollout


def _batch_from_global_rng(step):
    """Draw a batch from the GLOBAL RNGs, so that a resume reproduces data only if the RNG state was restored."""
    ros = []
    for i in range(6):
        p = random.randint(1, 5)
        c = int(np.random.randint(1, 8))
        ros.append(Rollout(prompt_id=str(i), group_id=str(i), sample_index=0,
                           prompt_token_ids=torch.randint(4, 64, (p,)).tolist(),
                           completion_token_ids=torch.randint(4, 64, (c,)).tolist(),
                           logprobs=(-torch.rand(c) * 4).tolist(), weight_versions=[step] * c, loss_mask=[1] * c,
                           advantage=float(np.random.randn())))
    return TrainBatch.from_rollouts(ros, 24)


def _params(tr):
    return torch.cat([p.detach().flatten() for p in tr.model.parameters()])


def _run(trainer, steps, start=0):
    for s in range(start, start + steps):
        trainer.train_step(_batch_from_global_rng(s), LOSSES["grpo"], LossConfig())


def _seed(s):
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


CFG = TrainConfig(lr=1e-3, schedule="cosine", warmup_steps=1, steps=4, weight_decay=0.01)


def test_resume_matches_uninterrupted_run(tiny_llama, tmp_path):
    _seed(0)
    full = Trainer(tiny_llama, CFG)
    _run(full, 4)

    _seed(0)
    first = Trainer(tiny_llama, CFG)
    _run(first, 2)
    path = save_checkpoint(first, tmp_path, 2, data_position={"index": 18, "gen": torch.Generator().manual_seed(5).get_state()})
    assert path == tmp_path / "checkpoints" / "step-2"
    _seed(123)  # the "new process" starts with different RNG state
    del first

    resumed = Trainer(tiny_llama, CFG)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.step == 2
    pos = restore_checkpoint(resumed, ckpt)
    assert pos["index"] == 18 and torch.equal(pos["gen"], torch.Generator().manual_seed(5).get_state())
    assert resumed.step == 2 and resumed.rl_step == 2
    _run(resumed, 2, start=2)
    torch.testing.assert_close(_params(resumed), _params(full), atol=1e-6, rtol=0)
    assert resumed.scheduler.get_last_lr() == pytest.approx(full.scheduler.get_last_lr())


def test_checkpoint_is_hf_loadable_and_latest_is_found(tiny_llama_tied, tmp_path):
    from transformers import AutoModelForCausalLM

    tr = Trainer(tiny_llama_tied, TrainConfig(lr=1e-3))
    _seed(1)
    _run(tr, 1)
    save_checkpoint(tr, tmp_path, 1)
    _run(tr, 1, start=1)
    p2 = save_checkpoint(tr, tmp_path, 2)
    (tmp_path / "checkpoints" / "step-9").mkdir()  # an incomplete one (no manifest) is ignored
    (tmp_path / "checkpoints" / ".tmp-step-10-1").mkdir()
    assert find_latest_checkpoint(tmp_path) == p2
    assert (p2 / "config.json").is_file() and (p2 / "model.safetensors").is_file()
    m = AutoModelForCausalLM.from_pretrained(str(p2), dtype=torch.float32)
    live = tr.state_dict_for_sync()
    for k, v in m.state_dict().items():
        assert torch.equal(v, live[k]), k
    save_checkpoint(tr, tmp_path, 3, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("step-") and (p / "checkpoint.json").exists()) == ["step-2", "step-3"]


def test_tokenizer_files_travel(tiny_llama, tmp_path):
    from rollwise.models.tokenizer import build_char_tokenizer

    model_dir = tmp_path / "with_tok"
    import shutil

    shutil.copytree(tiny_llama, model_dir)
    build_char_tokenizer("0123456789+=").save_pretrained(str(model_dir))
    tr = Trainer(model_dir)
    assert tr.tokenizer is not None
    path = save_checkpoint(tr, tmp_path / "run", 0)
    assert (path / "tokenizer.json").is_file()
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(path)).encode("1+2=", add_special_tokens=False) == tr.tokenizer.encode("1+2=", add_special_tokens=False)


def test_damaged_checkpoints_fail_with_one_line_naming_the_file(tiny_llama, tmp_path):
    tr = Trainer(tiny_llama)
    assert load_checkpoint(tmp_path) is None  # no checkpoint yet
    path = save_checkpoint(tr, tmp_path, 1)

    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    assert str(weights) in str(info.value) and "truncated" in str(info.value) and "\n" not in str(info.value)
    weights.write_bytes(data)

    state = path / "trainer_state.pt"
    raw = state.read_bytes()
    manifest = path / "checkpoint.json"
    man = json.loads(manifest.read_text())
    state.write_bytes(b"\0" * len(raw))  # same size, garbage content: the sha256 catches it
    with pytest.raises(CheckpointError, match=r"trainer_state.pt does not match the sha256"):
        load_checkpoint(tmp_path)
    # Garbage whose hash was written into the manifest too (a bad copy tool): the unpickling still refuses it.
    forged = json.loads(json.dumps(man))
    forged["files"]["trainer_state.pt"]["sha256"] = file_sha256(state)
    manifest.write_text(json.dumps(forged))
    with pytest.raises(CheckpointError, match=r"corrupt checkpoint file .*trainer_state.pt"):
        load_checkpoint(tmp_path)
    state.write_bytes(raw)

    weights.write_bytes(b"\1" * len(data))  # same size, garbage weights, hash forged: the weight loader refuses
    forged = json.loads(json.dumps(man))
    forged["files"]["model.safetensors"]["sha256"] = file_sha256(weights)
    manifest.write_text(json.dumps(forged))
    ckpt = load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match=r"corrupt checkpoint file .*model.safetensors"):
        restore_checkpoint(Trainer(tiny_llama), ckpt)
    weights.write_bytes(data)
    manifest.write_text(json.dumps(man)[:10])
    with pytest.raises(CheckpointError, match="corrupt checkpoint manifest"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="run directory not found"):
        load_checkpoint(tmp_path / "nope")


@pytest.mark.parametrize("files, version", [
    ({"model.safetensors": 5}, 2),                         # a v2 entry given as a number
    ({"model.safetensors": None}, 2),
    ({"model.safetensors": ["x"]}, 2),
    ({"model.safetensors": {"size": "5", "sha256": "ab"}}, 2),
    ({"model.safetensors": {"size": 5}}, 2),
    ({"model.safetensors": {"size": 5, "sha256": "ab"}}, 1),  # a v1 entry is a size
])
def test_a_manifest_entry_of_the_wrong_shape_is_one_line_naming_the_file(tmp_path, files, version):
    """An edited manifest whose file entry is a number, null, a list or a half object used to end in an
    AttributeError traceback; now it is a CheckpointError naming the manifest and the file."""
    from rollwise.train.checkpoint import verify_checkpoint

    path = tmp_path / "checkpoints" / "step-1"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"12345")
    (path / "checkpoint.json").write_text(json.dumps({"format_version": version, "step": 1, "files": files}))
    with pytest.raises(CheckpointError) as info:
        verify_checkpoint(path)
    msg = str(info.value)
    assert "checkpoint.json" in msg and "'model.safetensors'" in msg and "\n" not in msg
    (path / "checkpoint.json").write_text('{"files": ' + "[" * 100_000 + "]" * 100_000 + "}")  # nested past any stack
    with pytest.raises(CheckpointError, match="corrupt checkpoint manifest"):
        verify_checkpoint(path)


def test_lora_resume(tiny_llama, tmp_path):
    pytest.importorskip("peft")
    cfg = TrainConfig(lr=1e-2, lora=LoraConfig(enabled=True, r=4))
    _seed(2)
    full = Trainer(tiny_llama, cfg)
    _run(full, 3)
    _seed(2)
    first = Trainer(tiny_llama, cfg)
    _run(first, 2)
    path = save_checkpoint(first, tmp_path, 2)
    resumed = Trainer(tiny_llama, cfg)
    restore_checkpoint(resumed, load_checkpoint(tmp_path))
    _run(resumed, 1, start=2)
    torch.testing.assert_close(_params(resumed), _params(full), atol=1e-6, rtol=0)
    # the saved weights are the merged model, under plain HF names
    from safetensors.torch import load_file

    saved = load_file(str(path / "model.safetensors"))
    merged = first.state_dict_for_sync()
    assert set(saved) <= set(merged) and "model.layers.0.self_attn.q_proj.weight" in saved
    for k, v in saved.items():
        torch.testing.assert_close(v, merged[k])
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    for k, v in hf.state_dict().items():
        torch.testing.assert_close(v, merged[k], msg=k)
    assert hf.config.use_cache  # the saved config is the model's own, not the trainer's forward settings
    with pytest.raises(CheckpointError, match="lora"):
        restore_checkpoint(Trainer(tiny_llama), load_checkpoint(tmp_path))
