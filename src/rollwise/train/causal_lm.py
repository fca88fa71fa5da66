"""The transformers side of a policy, as the trainer and its rank strategies use it.

A trainer's model is a `torch.nn.Module` (an HF causal LM, possibly sharded by FSDP2 or wrapped by PEFT, which
forwards these calls to the HF model inside). These Protocols name the few HF calls made on it, so each call site
checks for the interface instead of trusting `Module.__getattr__`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from rollwise.train.errors import TrainerError

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PretrainedConfig


@runtime_checkable
class HasDecoder(Protocol):
    """A model whose decoder body (the stack of layers under the LM head) can be asked for."""

    def get_decoder(self) -> torch.nn.Module: ...


@runtime_checkable
class CausalLM(HasDecoder, Protocol):
    """An HF causal LM: config, decoder body, LM head, and saving in the HF layout."""

    config: PretrainedConfig

    def get_output_embeddings(self) -> torch.nn.Module | None: ...

    def save_pretrained(self, save_directory: str) -> None: ...


def as_causal_lm(model: torch.nn.Module) -> CausalLM:
    """`model` seen as an HF causal LM; a module without that interface is refused by name."""
    if not isinstance(model, CausalLM):
        raise TrainerError(f"{type(model).__name__} is not a transformers causal LM (no get_decoder / config)")
    return model
