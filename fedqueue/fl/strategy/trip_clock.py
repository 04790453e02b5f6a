"""A run's simulated trip times (its device clock) and the data spec the clock may read, without torch.

The per-sample clock needs each device's sample count: shards of exactly `client_data_size` have it from the
config, so a process that only schedules (the command that submits and follows a run) never loads the data, nor
torch; the other partitions load the data (torch) for it.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from fedqueue.fl.clock.delays import FLARE_CLOCK, PHASE_KEYS, phase_delay
from fedqueue.fl.clock.phases import FlareClock, PhaseClock, TripClock
from fedqueue.fl.clock.trips import Delay, DeviceClock, DeviceSpeed, samples_processed
from fedqueue.fl.config import RunConfig

if TYPE_CHECKING:
    from fedqueue.fl.ml.data import DataSpec, FederatedData


def data_spec(config: RunConfig) -> DataSpec:
    from fedqueue.fl.ml.data import DataSpec  # torch

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
    """Fixed-size shards (partition = "dirichlet_fixed" or its _per_device form); the others keep their old spec."""
    if not config.data.fixed_shards:
        return {}
    return {
        "client_data_size": config.data.client_data_size,
        "val_fraction": config.data.val_split,
        "kd_fraction": config.kd_split,
    }


def _floats(value: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in (value if isinstance(value, list) else [value]))


def run_clock(config: RunConfig) -> TripClock:
    """The run's device clock, built once per process and config (a fold pass asks on every pass)."""
    return _clock_of(json.dumps(config.to_dict(), sort_keys=True))


@functools.lru_cache(maxsize=8)
def _clock_of(config_json: str) -> TripClock:
    config = RunConfig.from_dict(json.loads(config_json))
    # Only the per-sample clock reads the devices' data sizes: the others need no partition.
    return clock_of_sizes(config, device_sizes(config) if config.timing.per_sample else None)


def device_sizes(config: RunConfig) -> np.ndarray:
    """Every device's sample count: from the config for fixed-size shards, else from the loaded partition."""
    if config.data.fixed_shards and config.data.client_data_size is not None:
        return np.full(config.num_devices, config.data.client_data_size, dtype=np.int64)
    from fedqueue.fl.ml.data import load_federated, partition_sizes  # torch

    return partition_sizes(load_federated(data_spec(config)))


def device_clock(config: RunConfig, data: FederatedData | None) -> TripClock:
    """The run's simulated trip times: FedRevive's phases, FLARE's tiers, or (per_sample) its speed
    classes and delays and each device's training work (from `data`)."""
    if data is None:
        return clock_of_sizes(config, None)
    from fedqueue.fl.ml.data import partition_sizes  # torch

    return clock_of_sizes(config, partition_sizes(data))


def clock_of_sizes(config: RunConfig, sizes: np.ndarray | None) -> TripClock:
    """device_clock, from every device's sample count (`sizes`, needed by the per-sample clock alone)."""
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
    if sizes is None:
        raise ValueError("the per-sample clock needs the devices' data sizes")
    # Per distinct size, not per device: a million fixed shards have one size.
    training = config.training
    distinct, which = np.unique(sizes, return_inverse=True)
    work = np.array(
        [
            samples_processed(int(size), training.local_batch_size, training.local_iters, training.effective_epochs)
            for size in distinct
        ],
        dtype=np.int64,
    )
    return DeviceClock(config.seed, speed, delay, work[which.reshape(-1)])
