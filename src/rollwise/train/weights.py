"""What the trainer trains: every weight (`FullWeights`) or LoRA adapters on a frozen base (`LoraWeights`).

The choice is made once, when the `Trainer` is built (`weight_mode(cfg)`); everything that differs between the two
lives here: which parameters train, where the KL penalty's reference policy comes from, the weights an engine
loads after a step, what a checkpoint stores and what a resume restores.

- Full weights: the reference is a frozen copy of the initial policy; the engine gets the live weights (aliased,
  no copy); a checkpoint is the HF model itself.
- LoRA: the reference is the same model with its adapters disabled (no copy); the engine and checkpoints get the
  weights with the adapters merged in, under the plain HF names, without touching the live weights; a resume
  restores the adapter tensors. FSDP2 does not shard adapters, so LoRA is refused there.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from rollwise.config import LoraConfig
from rollwise.train.causal_lm import as_causal_lm
from rollwise.train.errors import TrainerError
from rollwise.train.parallel import Single

if TYPE_CHECKING:  # pragma: no cover
    from peft import PeftModel
    from transformers import GenerationConfig, PretrainedConfig, PreTrainedModel


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """`model` in eval mode with no parameter requiring gradient (a reference policy)."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def save_plain_hf(base: torch.nn.Module, state_dict: dict[str, torch.Tensor], out: Path) -> None:
    """Save merged weights under the plain HF names with the base config, as save_pretrained would."""
    from safetensors.torch import save_file

    cfg: PretrainedConfig = as_causal_lm(base).config
    seen: dict[int, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    for k, v in state_dict.items():
        # tied parameters (lm_head <-> embed_tokens) are stored once, as save_pretrained does
        ptr = v.data_ptr()
        if ptr in seen:
            continue
        seen[ptr] = k
        tensors[k] = v.contiguous().cpu()
    if getattr(cfg, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    cfg.save_pretrained(str(out))
    gen: GenerationConfig | None = getattr(base, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(str(out))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


class WeightMode(Protocol):
    """What differs between full-weight and LoRA training, asked of the mode chosen once per trainer."""

    lora: bool

    def prepare(self, model: torch.nn.Module, sync: Single, seed: int) -> torch.nn.Module:
        """The model to train (LoRA: wrapped in adapters); refuses what the mode cannot do under `sync`."""
        ...

    def gradient_checkpointing(self, model: torch.nn.Module) -> None:
        """Turn on activation recomputation in backward."""
        ...

    def frozen_reference(self, model: torch.nn.Module, sync: Single) -> torch.nn.Module | None:
        """A separate frozen copy of the initial policy for the KL penalty, or None when the mode needs none."""
        ...

    def reference(self, model: torch.nn.Module, frozen: torch.nn.Module | None) -> contextlib.AbstractContextManager[torch.nn.Module]:
        """The reference policy to run a forward under (entered as a context)."""
        ...

    def weights_for_sync(self, model: torch.nn.Module, sync: Single) -> dict[str, torch.Tensor]:
        """The full HF-named weights an engine loads."""
        ...

    def save_weights(self, model: torch.nn.Module, sync: Single, out: Path) -> None:
        """The HF weights of a checkpoint (single process or replicas; FSDP2 saves its gathered state)."""
        ...

    def save_adapter(self, model: torch.nn.Module, path: Path) -> None: ...

    def trainable_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """What a resume restores besides the HF weights."""
        ...

    def check_full_load(self) -> None:
        """Refuse loading full HF weights where the mode restores something else."""
        ...


class FullWeights:
    """Every parameter trains."""

    lora = False

    def prepare(self, model: torch.nn.Module, sync: Single, seed: int) -> torch.nn.Module:
        return model

    def gradient_checkpointing(self, model: torch.nn.Module) -> None:
        _as_pretrained(model).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def frozen_reference(self, model: torch.nn.Module, sync: Single) -> torch.nn.Module | None:
        ref = freeze(copy.deepcopy(model))
        return sync.wrap(ref) if sync.lockstep else ref

    @contextlib.contextmanager
    def reference(self, model: torch.nn.Module, frozen: torch.nn.Module | None) -> Iterator[torch.nn.Module]:
        if frozen is None:
            raise TrainerError("the KL penalty needs a reference model: build the Trainer with reference=True")
        yield frozen

    def weights_for_sync(self, model: torch.nn.Module, sync: Single) -> dict[str, torch.Tensor]:
        return sync.full_model_state(model)  # under FSDP2 a gather every rank joins; rank 0 gets the weights

    def save_weights(self, model: torch.nn.Module, sync: Single, out: Path) -> None:
        as_causal_lm(model).save_pretrained(str(out))

    def save_adapter(self, model: torch.nn.Module, path: Path) -> None:
        raise TrainerError("save_adapter needs train.lora.enabled (a full-weight trainer has no adapter)")

    def trainable_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {}

    def check_full_load(self) -> None:
        return None


class LoraWeights:
    """LoRA adapters (peft) train; the base weights stay frozen and serve as the reference policy."""

    lora = True
    ADAPTER = "default"
    PREFIX = "base_model.model."

    def __init__(self, cfg: LoraConfig) -> None:
        self.cfg = cfg

    def prepare(self, model: torch.nn.Module, sync: Single, seed: int) -> torch.nn.Module:
        if sync.lockstep:
            raise TrainerError("train.parallel: fsdp2 does not shard LoRA adapters yet: use train.parallel: ddp")
        try:
            import peft
        except ImportError:
            raise TrainerError("train.lora.enabled needs peft: pip install 'rollwise[lora]' (or pip install peft)") from None
        lc = self.cfg
        names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        missing = [t for t in lc.target_modules if t not in names]
        if missing:
            raise TrainerError(f"train.lora.target_modules: no module named {missing[0]!r} in this model")
        # peft declares lora_alpha an int; it only ever divides by it, and the config allows a fractional alpha
        pcfg = peft.LoraConfig(r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout,  # type: ignore[arg-type]
                               target_modules=list(lc.target_modules), bias="none", task_type="CAUSAL_LM")
        with torch.random.fork_rng(devices=[]):  # adapter init must not disturb the caller's RNG stream
            torch.manual_seed(seed)
            return peft.get_peft_model(_as_pretrained(model), pcfg)

    def gradient_checkpointing(self, model: torch.nn.Module) -> None:
        lm = _peft(model)  # forwards both calls to the transformers model inside
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        lm.enable_input_require_grads()  # the frozen embeddings' output must carry gradient

    def frozen_reference(self, model: torch.nn.Module, sync: Single) -> torch.nn.Module | None:
        return None  # the base model, adapters disabled

    @contextlib.contextmanager
    def reference(self, model: torch.nn.Module, frozen: torch.nn.Module | None) -> Iterator[torch.nn.Module]:
        with _peft(model).disable_adapter():
            yield model

    @torch.no_grad()
    def weights_for_sync(self, model: torch.nn.Module, sync: Single) -> dict[str, torch.Tensor]:
        from peft.tuners.lora import LoraLayer

        sd: dict[str, torch.Tensor] = {}
        for name, t in model.state_dict().items():
            if "lora_" in name:
                continue
            sd[name.removeprefix(self.PREFIX).replace(".base_layer.", ".")] = t.detach()
        for mname, mod in model.named_modules():
            if isinstance(mod, LoraLayer) and self.ADAPTER in getattr(mod, "lora_A", {}):
                key = mname.removeprefix(self.PREFIX) + ".weight"
                # every concrete LoraLayer (Linear, Embedding, Conv) defines get_delta_weight; the base class does not
                delta: torch.Tensor = mod.get_delta_weight(self.ADAPTER)  # type: ignore[attr-defined]
                sd[key] = sd[key] + delta.to(sd[key].dtype)
        return sd

    def save_weights(self, model: torch.nn.Module, sync: Single, out: Path) -> None:
        merged = {k: v.detach().clone() for k, v in self.weights_for_sync(model, sync).items()}
        save_plain_hf(_peft(model).get_base_model(), merged, out)

    def save_adapter(self, model: torch.nn.Module, path: Path) -> None:
        _peft(model).save_pretrained(str(path))

    def trainable_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def check_full_load(self) -> None:
        raise TrainerError("load_full_weights: a LoRA trainer restores its adapter, not full weights")


def weight_mode(cfg: LoraConfig) -> WeightMode:
    """The mode `train.lora` asks for."""
    return LoraWeights(cfg) if cfg.enabled else FullWeights()


def _as_pretrained(model: torch.nn.Module) -> PreTrainedModel:
    """Narrowed for the transformers calls made on the model before any wrapping."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise TrainerError(f"{type(model).__name__} is not a transformers PreTrainedModel")
    return model


def _peft(model: torch.nn.Module) -> PeftModel:
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        raise TrainerError(f"a LoRA trainer's model must be a PEFT model, got {type(model).__name__}")
    return model
