"""The two other clocks: FedRevive's per-phase distributions and FLARE's per-trip tiers.

Like the per-sample clock (trips.py), every draw comes from its own stream seeded by
(seed, what, ...): a device's means by (seed, phase), a trip's phase time by (seed, phase,
round, device). So a trip's time depends on the config alone, never on the workers, and
changing one phase's table leaves the other phases' draws as they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fedqueue.fl.clock.delays import PHASE_KEYS, PhaseDelay
from fedqueue.fl.clock.trips import Delay, DeviceClock, DeviceSpeed, TripTime

_MEAN_STREAM = 0x3EA7  # a device's mean for a phase
_PHASE_STREAM = 0x9A5E  # a trip's time for a phase
_FLARE_STREAM = 0xF1A2  # a trip's speed and communication delay under FLARE's model


class TripClock(Protocol):
    """What the schedules ask a clock: a trip's phases, and their sum."""

    def trip(self, round_index: int, device: int) -> TripTime: ...

    def trip_seconds(self, round_index: int, device: int, _dispatched: float = 0.0) -> float: ...


def draw(kind: str, mean: float, std: float, rng: np.random.Generator, size: int | None = None) -> float | np.ndarray:
    """One phase time (or `size` of them) of the given type around `mean` (see fl/delays.py)."""
    if kind == "constant":
        return mean if size is None else np.full(size, mean)
    if kind == "exponential":
        values = rng.exponential(mean, size)
    elif kind == "uniform":
        values = rng.uniform(max(0.0, mean - std), mean + std, size)
    elif kind == "normal":
        values = np.maximum(0.0, rng.normal(mean, std, size))
    else:
        raise ValueError(f"unknown delay type {kind!r}")
    return float(values) if size is None else values


def device_means(phase: PhaseDelay, rng: np.random.Generator, count: int) -> np.ndarray:
    """Each device's mean, drawn once: the first mixture entry whose cumulative share reaches a uniform draw.

    As FedRevive's clients pick theirs; device d's draw is the stream's d-th, whatever `count` is.
    """
    cumulative = np.cumsum(phase.shares)
    picked = np.searchsorted(cumulative, rng.random(count), side="left")
    # Shares add up to 1 only up to rounding: a draw past the last sum takes the last mean, as theirs does.
    return np.asarray(phase.means)[np.minimum(picked, len(phase.means) - 1)]


class PhaseClock:
    """FedRevive's clock: a trip = download + training + upload, each drawn per trip around the device's mean.

    Training time does not depend on the device's data: a device is slow or fast by its drawn mean.
    """

    def __init__(self, seed: int, phases: Sequence[PhaseDelay], num_devices: int) -> None:
        """`phases`: download, training, upload (the order of fl/delays.py PHASE_KEYS)."""
        if len(phases) != len(PHASE_KEYS):
            raise ValueError(f"a trip has {len(PHASE_KEYS)} phases, got {len(phases)}")
        self.seed, self.phases = seed, tuple(phases)
        self._means = [
            device_means(phase, np.random.default_rng([seed, _MEAN_STREAM, index]), num_devices)
            for index, phase in enumerate(self.phases)
        ]

    def mean(self, phase: int, device: int) -> float:
        """The mean device `device` drew for phase `phase` (0 download, 1 training, 2 upload)."""
        return float(self._means[phase][device])

    def phase_time(self, phase: int, round_index: int, device: int) -> float:
        spec = self.phases[phase]
        mean = self.mean(phase, device)
        if spec.type == "constant":  # no draw: skip building its stream
            return mean
        rng = np.random.default_rng([self.seed, _PHASE_STREAM, phase, round_index, device])
        return float(draw(spec.type, mean, spec.std, rng))

    def trip(self, round_index: int, device: int) -> TripTime:
        download, train, upload = (self.phase_time(phase, round_index, device) for phase in range(3))
        return TripTime(download=download, train=train, upload=upload)

    def trip_seconds(self, round_index: int, device: int, _dispatched: float = 0.0) -> float:
        return self.trip(round_index, device).total


class FlareClock(DeviceClock):
    """NVIDIA FLARE's edge simulator: `device_speed` in seconds per trip, one tier per device (equal odds
    unless `share` says otherwise), and one communication delay per trip:

        max(0, normal(mean[tier], std[tier])) + max(0, normal(communication mean, std))

    FLARE sleeps both after training; here the first is the trip's training, the second its upload.
    """

    def __init__(self, seed: int, speed: DeviceSpeed, delay: Delay, num_devices: int) -> None:
        super().__init__(seed, speed, delay, work=[], num_devices=num_devices)

    def trip(self, round_index: int, device: int) -> TripTime:
        rng = np.random.default_rng([self.seed, _FLARE_STREAM, round_index, device])
        tier = self.speed_class(device)
        speed = max(0.0, float(rng.normal(self.speed.mean[tier], self.speed.std[tier])))
        communication = max(0.0, float(rng.normal(self.delay.mean, self.delay.std)))
        return TripTime(download=0.0, train=speed, upload=communication)
