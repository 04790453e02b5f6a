"""Simulated time: how long a device's trip takes, drawn from the seed, never measured.

Each device belongs to a speed class, drawn once from the run's seed by the classes' shares.
One trip (a dispatch) takes a download delay, the training, and an upload delay:

    training = samples processed x seconds per sample, drawn from the class's normal
    delay    = max(0, normal(communication mean, std)), drawn for each direction

Every draw comes from its own stream seeded by (seed, what, round, device), so a trip's
time depends on nothing but the config: not on the machine, the workers or wall time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_CLASS_STREAM = 0xC1A5  # a device's speed class
_TRIP_STREAM = 0x7219  # a trip's training speed and delays
DEFAULT_SECONDS_PER_SAMPLE = 0.01  # devices' speed when the config gives none


@dataclass(frozen=True)
class DeviceSpeed:
    """Speed classes: seconds per training sample, as a normal (mean, std) per class, and each class's share."""

    mean: tuple[float, ...] = (DEFAULT_SECONDS_PER_SAMPLE,)
    std: tuple[float, ...] = (0.0,)
    share: tuple[float, ...] | None = None  # None: equal shares


@dataclass(frozen=True)
class Delay:
    """A one-way communication delay in seconds: max(0, normal(mean, std))."""

    mean: float = 0.0
    std: float = 0.0


@dataclass(frozen=True)
class TripTime:
    """A trip's simulated phases in seconds."""

    download: float
    train: float
    upload: float

    @property
    def total(self) -> float:
        return self.download + self.train + self.upload


class DeviceClock:
    """Modelled trip times of a run's devices."""

    def __init__(
        self,
        seed: int,
        speed: DeviceSpeed,
        delay: Delay,
        work: Sequence[int] | np.ndarray,
        num_devices: int | None = None,
    ) -> None:
        """`work[d]`: the samples device d processes in one local training (steps x batch, or epochs x samples)."""
        # numpy arrays, not lists: a million devices' Python ints would take seconds and tens of MB.
        self.seed, self.speed, self.delay = seed, speed, delay
        self.work = np.asarray(work, dtype=np.int64)
        count = len(self.work) if num_devices is None else num_devices
        shares = np.asarray(speed.share if speed.share is not None else [1.0] * len(speed.mean), dtype=float)
        rng = np.random.default_rng([seed, _CLASS_STREAM])
        self._classes = rng.choice(len(shares), size=count, p=shares / shares.sum()).astype(np.int32)

    def speed_class(self, device: int) -> int:
        return int(self._classes[device])

    def trip(self, round_index: int, device: int) -> TripTime:
        rng = np.random.default_rng([self.seed, _TRIP_STREAM, round_index, device])
        klass = self.speed_class(device)
        per_sample = max(0.0, float(rng.normal(self.speed.mean[klass], self.speed.std[klass])))
        download = max(0.0, float(rng.normal(self.delay.mean, self.delay.std)))
        upload = max(0.0, float(rng.normal(self.delay.mean, self.delay.std)))
        return TripTime(download=download, train=int(self.work[device]) * per_sample, upload=upload)

    def trip_seconds(self, round_index: int, device: int, _dispatched: float = 0.0) -> float:
        return self.trip(round_index, device).total


def samples_processed(count: int, batch_size: int, local_iters: int | None, local_epochs: int | None) -> int:
    """Samples a device holding `count` samples runs through in one local training."""
    if local_iters is not None:
        return local_iters * min(batch_size, count)
    return (local_epochs or 1) * count
