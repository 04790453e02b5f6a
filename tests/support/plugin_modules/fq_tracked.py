"""A tiny model with a StatTracker, so a run with real workers checks the trackers' reset quickly."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedqueue.fl.ml.stat_resnet import StatTracker


def tiny(input_shape: tuple[int, ...], num_classes: int, options: object) -> nn.Module:
    channels = int(input_shape[0])
    # Named stat_track: reset_trackers finds trackers by FedRevive's names in a state dict.
    layers = OrderedDict(
        conv=nn.Conv2d(channels, 4, 3, padding=1, bias=False),
        stat_track=StatTracker(4),
        relu=nn.ReLU(),
        flat=nn.Flatten(),
        linear=nn.Linear(4 * int(input_shape[1]) * int(input_shape[2]), num_classes),
    )
    return nn.Sequential(layers)
