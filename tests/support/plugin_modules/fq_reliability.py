"""Test plugins that make device tasks slow, make one device kill its worker, hang or raise, or make aggregation
or evaluation raise.

The training ones leave the mathematics of training untouched, so runs that use them must end
with exactly the weights of the built-in cross-entropy step.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedqueue.fl.ml.data import _digits, partition_indices
from fedqueue.fl.ml.plugins import DatasetRequest, LoadedDataset

POISON_MARK = 1e9  # a pixel value no real image has


def slow_step(
    model: nn.Module,
    batch: tuple[torch.Tensor, torch.Tensor],
    global_state: Mapping[str, torch.Tensor],
    options: Mapping[str, Any],
) -> torch.Tensor:
    """Cross-entropy after a pause: a task long enough to be killed, stopped or redelivered mid-way."""
    time.sleep(float(options.get("step_sleep", 0.0)))
    inputs, labels = batch
    if float(inputs.max()) >= POISON_MARK:
        if options.get("poison_mode") == "hang":
            threading.Event().wait()  # the poisoned device never finishes: only a time limit ends it
        if options.get("poison_mode") == "raise":
            raise RuntimeError("poisoned sample")  # the poisoned device fails every attempt
        os.kill(os.getpid(), signal.SIGKILL)  # the poisoned device takes its worker down, every time
    return F.cross_entropy(model(inputs), labels)


def poisoned_digits(request: DatasetRequest) -> LoadedDataset:
    """Digits split by fedqueue's own iid partition, with one device's samples marked as poison."""
    train, test = _digits(request.seed)
    partitions = partition_indices(train.y.numpy(), request.num_devices, "iid", 0.5, request.seed, None)
    x = train.x.clone()
    poisoned = int(request.options["poison_device"])
    x[torch.from_numpy(partitions[poisoned]), 0, 0, 0] = POISON_MARK
    return LoadedDataset(train=type(train)(x, train.y), test=test, num_classes=10, partitions=partitions)


def raising_rule(
    global_state: Mapping[str, torch.Tensor], updates: Any, global_lr: float, options: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """An aggregation rule that fails every time."""
    raise RuntimeError("this rule fails on purpose")


class _TrainsOnly(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if not self.training:
            raise RuntimeError("this model refuses to evaluate")
        return self.inner(inputs)


def eval_refusing_mlp(input_shape: tuple[int, ...], num_classes: int, options: Mapping[str, Any]) -> nn.Module:
    """The built-in MLP, except that it fails in eval mode: devices train, every aggregation's evaluation fails."""
    from fedqueue.fl.ml.models import build_model

    return _TrainsOnly(build_model("mlp", input_shape, num_classes))


def slow_rule(
    global_state: Mapping[str, torch.Tensor], updates: Any, global_lr: float, options: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """FedAvg after a pause: an aggregation long enough for its worker to be killed while it holds the round."""
    from fedqueue.fl.ml.aggregate import fedavg

    time.sleep(float(options.get("aggregate_sleep", 0.0)))
    return fedavg(global_state, updates, global_lr)


class _SlowToEvaluate(nn.Module):
    def __init__(self, inner: nn.Module, pause_s: float) -> None:
        super().__init__()
        self.inner = inner
        self.pause_s = pause_s

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if not self.training:
            time.sleep(self.pause_s)
        return self.inner(inputs)


def slow_eval_mlp(input_shape: tuple[int, ...], num_classes: int, options: Mapping[str, Any]) -> nn.Module:
    """The built-in MLP, pausing in each evaluation: a fold pass long enough to be killed while it holds the run."""
    from fedqueue.fl.ml.models import build_model

    return _SlowToEvaluate(build_model("mlp", input_shape, num_classes), float(options.get("eval_sleep", 0.0)))
