"""From a run config to what the torch code takes: specs and resolved plugins, for workers and scheduler alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedqueue.errors import ConfigError, FedqueueError
from fedqueue.fl.config import RunConfig
from fedqueue.fl.ml.augment import augmentation
from fedqueue.fl.ml.data import blank_pixel
from fedqueue.fl.ml.plugins import AggregateRule, LocalStep, check_options, resolve
from fedqueue.fl.ml.train import LocalTrainConfig

# Torch-free, where a process that only schedules finds them; named here too, beside what the torch code takes.
from fedqueue.fl.strategy.trip_clock import data_spec as data_spec
from fedqueue.fl.strategy.trip_clock import device_clock as device_clock
from fedqueue.fl.strategy.trip_clock import run_clock as run_clock


def train_config(config: RunConfig) -> LocalTrainConfig:
    training = config.training
    return LocalTrainConfig(
        local_iters=training.local_iters,
        local_epochs=training.effective_epochs,
        batch_size=training.local_batch_size,
        optimizer=training.local_optimizer,
        lr=training.local_lr,
        momentum=training.local_momentum,
        augment=augmentation(config.data.augment, blank_pixel(config.data.dataset)),
    )


@dataclass(frozen=True)
class Plugins:
    """The callables a run uses, resolved from its config."""

    local_step: LocalStep
    aggregate: AggregateRule
    options: dict[str, Any]


def resolve_plugins(config: RunConfig) -> Plugins:
    return Plugins(
        local_step=resolve("local_step", config.training.local_step),
        aggregate=resolve("aggregate", config.plugin_names()["aggregate"]),
        options=dict(config.plugin),
    )


def check_plugins(config: RunConfig) -> None:
    """Import every plugin the run names and let each check its options: before anything is written."""
    for kind, name in config.plugin_names().items():
        check_options(kind, resolve(kind, name), config.plugin)


def call_plugin(kind: str, name: str, function: Any, *args: Any) -> Any:
    """Run plugin code in the submitting process; its failure becomes one line naming the plugin."""
    try:
        return function(*args)
    except FedqueueError:
        raise
    except Exception as err:  # user code: any exception is a refusal of this run, not a crash
        raise ConfigError(f"{kind}: {name!r} failed: {type(err).__name__}: {err}") from None
