"""A device task that trains (almost) nothing, for bench/overhead.py and bench/scaling.py.

One sample per device, a model with one parameter, one local step: what is left of a
task's time is fedqueue's own per-task work.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fedqueue.fl.ml.plugins import DatasetRequest, LoadedDataset, TensorData


def load(request: DatasetRequest) -> LoadedDataset:
    """One sample per device (and a few held out), two classes."""
    count = request.num_devices
    train = TensorData(torch.ones(count, 1), torch.zeros(count, dtype=torch.int64))
    test = TensorData(torch.ones(4, 1), torch.zeros(4, dtype=torch.int64))
    return LoadedDataset(train=train, test=test, num_classes=2, partitions=[[device] for device in range(count)])


class OneWeight(nn.Module):
    """Two logits from one weight: w*x and -w*x."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaled = x * self.weight
        return torch.cat([scaled, -scaled], dim=1)


def build(input_shape: tuple[int, ...], num_classes: int, options: Any) -> nn.Module:
    return OneWeight()


CONFIG = {
    "dataset": "noop_plugin:load",
    "model": "noop_plugin:build",
    "local_iters": 1,
    "local_batch_size": 1,
    "eval_every": 1,
    # One device per task: what these benchmarks time is the per-task path (the default may pack devices).
    "pack_size": 1,
    "pack_mode": "sequential",
}
