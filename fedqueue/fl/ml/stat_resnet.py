"""FedRevive's ResNet-18: no BatchNorm; identity StatTracker layers record feature statistics instead.

A tracker after each convolution keeps a running per-channel mean and (biased) variance of the
convolution's output in train mode and passes its input through unchanged. A device's returned
model thus carries statistics of its own data, which the data-free synthesis matches (fl/ml/
synthesis.py reads trackers where it reads BatchNorm); the global model's trackers are reset to
0/1 after every aggregation (`reset_trackers`), so they never average statistics across devices.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedqueue.errors import ConfigError
from fedqueue.fl.ml.plugins import Options

TRACKER_MOMENTUM = 0.1


class StatTracker(nn.Module):
    """Identity; in train mode it also folds the batch's per-channel mean and biased variance into its buffers."""

    running_mean: Tensor
    running_var: Tensor

    def __init__(self, channels: int, momentum: float = TRACKER_MOMENTUM) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            with torch.no_grad():
                mean = x.mean(dim=(0, 2, 3))
                var = x.var(dim=(0, 2, 3), unbiased=False)
                self.running_mean.mul_(1 - self.momentum).add_(mean, alpha=self.momentum)
                self.running_var.mul_(1 - self.momentum).add_(var, alpha=self.momentum)
        return x


def _conv3x3(inputs: int, outputs: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inputs, outputs, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """conv, tracker, ReLU, conv, tracker, plus the shortcut (a 1x1 conv and its tracker where the shape changes)."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = _conv3x3(inputs, outputs, stride)
        self.stat_track1 = StatTracker(outputs)
        self.conv2 = _conv3x3(outputs, outputs)
        self.stat_track2 = StatTracker(outputs)
        self.shortcut: nn.Module = nn.Sequential()
        if stride != 1 or inputs != outputs:
            # Named as in FedRevive's state dicts: layer2.0.shortcut.conv.weight, ...shortcut.stat_track.*
            conv = nn.Conv2d(inputs, outputs, kernel_size=1, stride=stride, bias=False)
            self.shortcut = nn.Sequential(OrderedDict(conv=conv, stat_track=StatTracker(outputs)))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.stat_track1(self.conv1(x)))
        out = self.stat_track2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class TrackedResNet(nn.Module):
    """3x3 stem without max-pool, four stages of two blocks, a 4x4 average pool, a linear head without bias."""

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = _conv3x3(channels, 64)
        self.stat_track1 = StatTracker(64)
        stages, inputs = [], 64
        for outputs, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(BasicBlock(inputs, outputs, stride), BasicBlock(outputs, outputs, 1)))
            inputs = outputs
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.linear = nn.Linear(512, num_classes, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.stat_track1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.avg_pool2d(out, 4)
        logits: Tensor = self.linear(out.flatten(1))
        return logits


def resnet18_fedrevive(input_shape: tuple[int, ...], num_classes: int, options: Options) -> nn.Module:
    """Built-in: FedRevive's ResNet-18 for 32x32 images, StatTrackers in place of BatchNorm (20 of them)."""
    if len(input_shape) != 3 or tuple(input_shape[1:]) != (32, 32):
        raise ConfigError(f"model: resnet18_fedrevive needs (channels, 32, 32) images, got {tuple(input_shape)}")
    return TrackedResNet(int(input_shape[0]), num_classes)


def _is_tracker_buffer(name: str) -> bool:
    owner, _, buffer = name.rpartition(".")
    return buffer in ("running_mean", "running_var") and owner.rpartition(".")[2].startswith("stat_track")


def reset_trackers(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The state with every tracker at 0 mean and 1 variance; a state without trackers comes back as it was.

    Trackers are found by FedRevive's names (a module named stat_track*), since only the state is at hand.
    """
    if not any(_is_tracker_buffer(name) for name in state):
        return dict(state)
    reset = dict(state)
    for name, value in state.items():
        if _is_tracker_buffer(name):
            reset[name] = torch.zeros_like(value) if name.endswith("mean") else torch.ones_like(value)
    return reset
