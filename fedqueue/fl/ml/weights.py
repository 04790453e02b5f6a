"""Model weights as bytes: safetensors, so a blob never carries code (unlike a pickle)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def encode_state(state: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({name: tensor.contiguous() for name, tensor in state.items()})


def decode_state(data: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(data)
