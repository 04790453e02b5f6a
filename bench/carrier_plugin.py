"""A model with ResNet-18's state size and almost no compute, for bench/data_plane.py.

The digits MLP plus one flat parameter (the carrier) of `carrier_floats` float32 values: the
MLP learns, and the carrier rides along in every state sent. It scales the logits by
(1 + its mean), so every step gives each of its values a tiny gradient and every update
differs from the model it trained from in all its bytes, as a real model's would; the
extra work per step is a mean, its backward and the optimizer's pass over the carrier.
"""

from __future__ import annotations

import torch
from torch import nn

from fedqueue.fl.ml.models import mlp
from fedqueue.fl.ml.plugins import Options

# ResNet-18 (`resnet18_fedrevive`, 10 classes) holds 11,173,952 floats; the digits MLP 9,610 of them.
DEFAULT_FLOATS = 11_173_952 - 9_610


class Carried(nn.Module):
    def __init__(self, inner: nn.Module, floats: int) -> None:
        super().__init__()
        self.inner = inner
        # Small values, so the logits' scale stays close to 1 at every step.
        self.carrier = nn.Parameter(torch.randn(floats) * 1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * (1 + self.carrier.mean())


def build(input_shape: tuple[int, ...], num_classes: int, options: Options) -> nn.Module:
    return Carried(mlp(input_shape, num_classes, options), int(options.get("carrier_floats", DEFAULT_FLOATS)))
