"""From a run config to what the torch code takes: specs and resolved plugins, for workers and scheduler alike."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fedqueue.errors import ConfigError, FedqueueError
from fedqueue.fl.config import RunConfig
from fedqueue.fl.data import DataSpec
from fedqueue.fl.plugins import AggregateRule, LocalStep, check_options, resolve
from fedqueue.fl.train import LocalTrainConfig


def data_spec(config: RunConfig) -> DataSpec:
    return DataSpec(
        dataset=config.dataset,
        root=config.data_root,
        seed=config.seed,
        num_devices=config.num_devices,
        partition=config.partition,
        alpha=config.alpha,
        samples_per_device=config.samples_per_device,
        options_json=json.dumps(config.plugin, sort_keys=True),
    )


def train_config(config: RunConfig) -> LocalTrainConfig:
    return LocalTrainConfig(
        local_iters=config.local_iters,
        local_epochs=config.effective_local_epochs,
        batch_size=config.local_batch_size,
        optimizer=config.local_optimizer,
        lr=config.local_lr,
        momentum=config.local_momentum,
    )


@dataclass(frozen=True)
class Plugins:
    """The callables a run uses, resolved from its config."""

    local_step: LocalStep
    aggregate: AggregateRule
    options: dict[str, Any]


def resolve_plugins(config: RunConfig) -> Plugins:
    return Plugins(
        local_step=resolve("local_step", config.local_step),
        aggregate=resolve("aggregate", config.aggregate),
        options=dict(config.plugin),
    )


def check_plugins(config: RunConfig) -> None:
    """Import every plugin the run names and let each check its options: before anything is written."""
    for kind in ("dataset", "model", "local_step", "aggregate"):
        check_options(kind, resolve(kind, getattr(config, kind)), config.plugin)


def call_plugin(kind: str, name: str, function: Any, *args: Any) -> Any:
    """Run plugin code in the submitting process; its failure becomes one line naming the plugin."""
    try:
        return function(*args)
    except FedqueueError:
        raise
    except Exception as err:  # user code: any exception is a refusal of this run, not a crash
        raise ConfigError(f"{kind}: {name!r} failed: {type(err).__name__}: {err}") from None
