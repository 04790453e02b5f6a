"""One device's local training, reproducible from a seed even with tasks in parallel threads."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from fedqueue.errors import ConfigError, DataError
from fedqueue.fl.ml.augment import Augmentation, augment_batch, augment_generator
from fedqueue.fl.ml.plugins import LocalStep, Options, TensorData
from fedqueue.fl.ml.train_section import OPTIMIZERS


@dataclass(frozen=True)
class LocalTrainConfig:
    """Exactly one of local_iters (optimizer steps) and local_epochs (full passes) is set."""

    local_iters: int | None
    local_epochs: int | None
    batch_size: int
    optimizer: str  # "sgd" | "adam"
    lr: float
    momentum: float
    # Train-time augmentation of each batch (fl/ml/augment.py); None trains on the samples as they are.
    augment: Augmentation | None = None


@dataclass(frozen=True, eq=False)
class TrainOutcome:
    """Trained weights on the CPU, the sample count they were trained on, mean loss, steps."""

    state: dict[str, torch.Tensor]
    samples: int
    loss: float
    steps: int


def check_train_config(cfg: LocalTrainConfig) -> None:
    if (cfg.local_iters is None) == (cfg.local_epochs is None):
        raise ConfigError("local_iters: set exactly one of local_iters and local_epochs")
    if cfg.local_iters is not None and cfg.local_iters < 1:
        raise ConfigError(f"local_iters: must be >= 1, got {cfg.local_iters}")
    if cfg.local_epochs is not None and cfg.local_epochs < 1:
        raise ConfigError(f"local_epochs: must be >= 1, got {cfg.local_epochs}")
    if cfg.batch_size < 1:
        raise ConfigError(f"batch_size: must be >= 1, got {cfg.batch_size}")
    if cfg.optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer: unknown optimizer {cfg.optimizer!r} (choose from {', '.join(OPTIMIZERS)})")
    if not cfg.lr >= 0:
        raise ConfigError(f"lr: must be >= 0, got {cfg.lr}")


def make_optimizer(parameters: Iterable[torch.Tensor], cfg: LocalTrainConfig) -> torch.optim.Optimizer:
    """The optimizer a device trains with."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=cfg.lr, momentum=cfg.momentum)
    # Adam keeps its own moment estimates; momentum does not apply.
    return torch.optim.Adam(parameters, lr=cfg.lr)


class Stepper(Protocol):
    """What local training asks of its optimizer: torch.optim's, or the pack trial's stand-in."""

    @property
    def state(self) -> Mapping[Any, Any]: ...  # per parameter: its buffers (momentum, moments)

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> Any: ...


# What train_local and train_pack build their optimizer with: make_optimizer, or a stand-in that
# does the same element-wise work (the submit's pack-mode trial, fedqueue.fl.ml.trial_update).
OptimizerFactory = Callable[[Iterable[torch.Tensor], LocalTrainConfig], Stepper]


def local_schedule(count: int, cfg: LocalTrainConfig) -> tuple[int, int]:
    """(batch size, optimizer steps) of a device holding `count` samples."""
    if count == 0:
        raise DataError("train_local: the device has no training samples")
    batch_size = min(cfg.batch_size, count)
    if cfg.local_iters is not None:
        return batch_size, cfg.local_iters
    return batch_size, int(cfg.local_epochs or 0) * math.ceil(count / batch_size)


def batch_indices(count: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Endless mini-batch indices: shuffled epochs, back to back, last batch possibly short."""
    while True:
        order = torch.randperm(count, generator=generator)
        yield from order.split(batch_size)


def cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    # to("cpu") already copies device tensors; CPU ones must be cloned to detach from the model.
    copied = tensor.clone() if tensor.device.type == "cpu" else tensor.to("cpu")
    return copied.contiguous()


def _apart(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors on the CPU as they are, each with storage of its own: one that shares another's (tied
    weights) is copied, as encoders of a state refuse shared storage."""
    seen: set[int] = set()
    apart: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        tensor = value.detach().to("cpu")
        storage = tensor.untyped_storage().data_ptr()
        apart[key] = cpu_copy(tensor) if storage in seen or not storage else tensor
        seen.add(storage)
    return apart


def cross_entropy_step(
    model: nn.Module,
    batch: tuple[torch.Tensor, torch.Tensor],
    global_state: Mapping[str, torch.Tensor],
    options: Options,
) -> torch.Tensor:
    """Built-in local step: plain cross-entropy (FedAvg's local objective)."""
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)


def train_local(
    model: nn.Module,
    data: TensorData,
    cfg: LocalTrainConfig,
    seed: int,
    device: torch.device,
    step: LocalStep = cross_entropy_step,
    options: Options | None = None,
    optimizer_of: OptimizerFactory = make_optimizer,
    *,
    copy_out: bool = True,
) -> TrainOutcome:
    """Train `model` (already holding the global weights) on one device's data.

    `step` gives each mini-batch's loss; it sees the global weights (on `device`) and the
    run's plugin options, which is all FedProx-like objectives need.
    `copy_out=False`: the outcome's state is the model's own tensors where the model is on the CPU,
    valid until it trains again, for a caller that writes them out at once (a copy of a big state less).
    """
    check_train_config(cfg)
    count = len(data)
    batch_size, steps = local_schedule(count, cfg)

    model.to(device)
    # Taken before the first step: the weights the device started from. The built-in step never reads them,
    # and a big state's copy costs more than a small model's whole training.
    global_state = (
        {}
        if step is cross_entropy_step
        else {key: cpu_copy(value).to(device) for key, value in model.state_dict().items()}
    )
    options = dict(options or {})
    model.train()
    x = data.x.to(device)
    y = data.y.to(device)
    optimizer = optimizer_of(model.parameters(), cfg)
    # A private generator: the global RNG is shared by every task thread in the process.
    generator = torch.Generator(device="cpu").manual_seed(seed)
    batches = batch_indices(count, batch_size, generator)
    augmenting = None if cfg.augment is None else augment_generator(seed)

    # Summed on the device so the loop never waits for a loss value.
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for _ in range(steps):
        index = next(batches).to(device)
        optimizer.zero_grad(set_to_none=True)
        inputs = x[index]
        if cfg.augment is not None and augmenting is not None:
            inputs = augment_batch(cfg.augment, inputs, augmenting)
        loss = step(model, (inputs, y[index]), global_state, options)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach()

    trained = model.state_dict()
    state = {key: cpu_copy(value) for key, value in trained.items()} if copy_out else _apart(trained)
    mean_loss = float(loss_sum.item()) / steps
    return TrainOutcome(state=state, samples=count, loss=mean_loss, steps=steps)
