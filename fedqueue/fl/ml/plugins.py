"""The seam for user code: models, datasets, local steps and aggregation rules, named by import path.

Built-ins are reached the same way (`"mlp"` is shorthand for `fedqueue.fl.ml.models:mlp`),
so a user's plugin takes exactly the path a built-in takes.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fedqueue.errors import ConfigError, DataError

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import Tensor, nn


Options = Mapping[str, Any]
# (device id, number of samples, trained weights)
Update = tuple[int, int, Mapping[str, "Tensor"]]

IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

BUILTINS: dict[str, dict[str, str]] = {
    "model": {
        "mlp": "fedqueue.fl.ml.models:mlp",
        "cnn": "fedqueue.fl.ml.models:cnn",
        "resnet18": "fedqueue.fl.ml.models:resnet18",
        "resnet18_fedrevive": "fedqueue.fl.ml.stat_resnet:resnet18_fedrevive",
    },
    "dataset": {
        "digits": "fedqueue.fl.ml.data:digits",
        "cifar10": "fedqueue.fl.ml.data:cifar10",
        "cifar100": "fedqueue.fl.ml.data:cifar100",
        "synthetic": "fedqueue.fl.ml.data:synthetic",
    },
    "local_step": {"cross_entropy": "fedqueue.fl.ml.train:cross_entropy_step"},
    "aggregate": {"fedavg": "fedqueue.fl.ml.aggregate:fedavg_rule"},
}


# A dataset's tensors, as loaders return them and training takes them. eq=False: field-wise == on tensors is ambiguous; these compare by identity.
@dataclass(frozen=True, eq=False)
class TensorData:
    """Inputs x (float32, N x ...) and labels y (int64, N)."""

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise DataError(f"{self.x.shape[0]} inputs but {self.y.shape[0]} labels")

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True)
class DatasetRequest:
    """What a dataset loader is told about the run."""

    root: str | None
    seed: int
    num_devices: int
    samples_per_device: int | None
    options: Options


@dataclass(frozen=True, eq=False)
class LoadedDataset:
    """A loader's answer. `partitions[d]` lists device d's indices into `train` (a sequence of ints or an integer
    array, as fedqueue's own `partition_indices` gives); None lets fedqueue split."""

    train: TensorData
    test: TensorData
    num_classes: int
    partitions: Sequence[Sequence[int] | np.ndarray] | None = None


class ModelBuilder(Protocol):
    def __call__(self, input_shape: tuple[int, ...], num_classes: int, options: Options) -> nn.Module: ...


class DatasetLoader(Protocol):
    def __call__(self, request: DatasetRequest) -> LoadedDataset: ...


class LocalStep(Protocol):
    """Loss of one mini-batch; fedqueue runs backward() and the optimizer step."""

    def __call__(
        self, model: nn.Module, batch: tuple[Tensor, Tensor], global_state: Mapping[str, Tensor], options: Options
    ) -> Tensor: ...


class AggregateRule(Protocol):
    """The new global state from a round's updates, sorted by device.

    fedqueue passes a sequence that reads each update from storage when it is indexed:
    go through it once, keeping only what the rule needs, and a round of any size fits
    in memory.
    """

    def __call__(
        self, global_state: Mapping[str, Tensor], updates: Sequence[Update], global_lr: float, options: Options
    ) -> dict[str, Tensor]: ...


def is_valid_name(kind: str, name: str) -> bool:
    """A built-in name or something shaped like `package.module:attribute` (not imported here)."""
    return name in BUILTINS[kind] or bool(IMPORT_PATH.match(name))


def describe_choices(kind: str) -> str:
    return f"{', '.join(BUILTINS[kind])}, or module:attribute"


@functools.lru_cache(maxsize=64)
def resolve(kind: str, name: str) -> Any:
    """The callable behind a built-in name or an import path; ConfigError naming `kind` otherwise."""
    path = BUILTINS[kind].get(name, name)
    if not IMPORT_PATH.match(path):
        raise ConfigError(f"{kind}: unknown {kind} {name!r} (choose from {describe_choices(kind)})")
    module_name, _, attribute = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as err:  # a plugin's import can fail in any way; the user sees which and why
        raise ConfigError(f"{kind}: cannot import {module_name!r} ({type(err).__name__}: {err})") from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"{kind}: {module_name!r} has no attribute {attribute!r}") from None
    if not callable(target):
        raise ConfigError(f"{kind}: {path!r} is not callable")
    return target


def check_options(kind: str, plugin: Any, options: Options) -> None:
    """Let a plugin that declares `validate_options(options)` refuse its `[plugin]` settings."""
    validate = getattr(plugin, "validate_options", None)
    if validate is None:
        return
    try:
        validate(dict(options))
    except (ValueError, TypeError, KeyError) as err:
        raise ConfigError(f"plugin: {err} (checked by the {kind} plugin)") from None
