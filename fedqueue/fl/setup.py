"""From a run config to what the torch code takes: specs and resolved plugins, for workers and scheduler alike."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedqueue.errors import ConfigError, FedqueueError
from fedqueue.fl.clock.delays import FLARE_CLOCK, PHASE_KEYS, phase_delay
from fedqueue.fl.clock.phases import FlareClock, PhaseClock, TripClock
from fedqueue.fl.clock.trips import Delay, DeviceClock, DeviceSpeed, samples_processed
from fedqueue.fl.config import RunConfig
from fedqueue.fl.ml.augment import augmentation
from fedqueue.fl.ml.data import DataSpec, FederatedData, blank_pixel, load_federated, partition_sizes
from fedqueue.fl.ml.plugins import AggregateRule, LocalStep, check_options, resolve
from fedqueue.fl.ml.train import LocalTrainConfig


def data_spec(config: RunConfig) -> DataSpec:
    data = config.data
    return DataSpec(
        dataset=data.dataset,
        root=data.data_root,
        seed=config.seed,
        num_devices=config.num_devices,
        partition=data.partition,
        alpha=data.alpha,
        samples_per_device=data.samples_per_device,
        server_fraction=config.held_out,
        **_fixed_shards(config),
        options_json=json.dumps(config.plugin, sort_keys=True),
    )


def _fixed_shards(config: RunConfig) -> dict[str, Any]:
    """FedRevive's shards (partition = "dirichlet_fixed"); other partitions keep the spec they always had."""
    if not config.data.fixed_shards:
        return {}
    return {
        "client_data_size": config.data.client_data_size,
        "val_fraction": config.data.val_split,
        "kd_fraction": config.kd_split,
    }


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


def _floats(value: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in (value if isinstance(value, list) else [value]))


def run_clock(config: RunConfig) -> TripClock:
    """The run's device clock, built once per process and config (a fold pass asks on every pass)."""
    return _clock_of(json.dumps(config.to_dict(), sort_keys=True))


@functools.lru_cache(maxsize=8)
def _clock_of(config_json: str) -> TripClock:
    config = RunConfig.from_dict(json.loads(config_json))
    # Only the per-sample clock reads the devices' data sizes: the others need no partition.
    return device_clock(config, load_federated(data_spec(config)) if config.timing.per_sample else None)


def device_clock(config: RunConfig, data: FederatedData | None) -> TripClock:
    """The run's simulated trip times: FedRevive's phases, FLARE's tiers, or (per_sample) its speed
    classes and delays and each device's training work (from `data`)."""
    timing = config.timing
    if timing.phased:
        phases = [phase_delay(key, table) for key, table in zip(PHASE_KEYS, timing.phases(), strict=True)]
        return PhaseClock(config.seed, phases, config.num_devices)
    speed = DeviceSpeed()
    if timing.device_speed:
        mean = _floats(timing.device_speed["mean"])
        std = _floats(timing.device_speed.get("std", [0.0] * len(mean)))
        share = _floats(timing.device_speed["share"]) if "share" in timing.device_speed else None
        speed = DeviceSpeed(mean=mean, std=std, share=share)
    delay = Delay(
        mean=float(timing.communication_delay.get("mean", 0.0)), std=float(timing.communication_delay.get("std", 0.0))
    )
    if timing.clock == FLARE_CLOCK:
        return FlareClock(config.seed, speed, delay, config.num_devices)
    if data is None:
        raise ValueError("the per-sample clock needs the devices' data sizes")
    # Per distinct size, not per device: a million fixed shards have one size.
    training = config.training
    sizes, which = np.unique(partition_sizes(data), return_inverse=True)
    work = np.array(
        [
            samples_processed(int(size), training.local_batch_size, training.local_iters, training.effective_epochs)
            for size in sizes
        ],
        dtype=np.int64,
    )
    return DeviceClock(config.seed, speed, delay, work[which.reshape(-1)])


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
