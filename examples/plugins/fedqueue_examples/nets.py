"""A custom model plugin: a small CNN with GroupNorm, which (unlike BatchNorm) suits non-IID devices."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn


def groupnorm_cnn(input_shape: tuple[int, ...], num_classes: int, options: Mapping[str, Any]) -> nn.Module:
    channels, height, width_px = input_shape
    width = int(options.get("width", 16))
    return nn.Sequential(
        nn.Conv2d(channels, width, kernel_size=3, padding=1),
        nn.GroupNorm(4, width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, width, kernel_size=3, padding=1),
        nn.GroupNorm(4, width),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(width * (height // 2) * (width_px // 2), num_classes),
    )
