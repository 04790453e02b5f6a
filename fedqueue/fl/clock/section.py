"""The clock's config section: how a simulated trip is timed, the keys fl/setup.py builds the run's clock from."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fedqueue.errors import ConfigError
from fedqueue.fl.clock.delays import CLOCKS, FEDREVIVE_CLOCK, FLARE_CLOCK, PER_SAMPLE_CLOCK, PHASE_KEYS, phase_delay
from fedqueue.fl.sections.base import Run, check_table, choice


@dataclass(frozen=True)
class ClockSection:
    """The simulated clock (every mode)."""

    # Simulated time: speed classes in seconds per training sample, and the one-way communication delay,
    # e.g. {mean = [0.01, 0.04], std = [0.001, 0.004], share = [0.7, 0.3]}.
    device_speed: dict[str, Any] = field(default_factory=dict)
    """Simulated speed classes, `{mean = [...], std = [...], share = [...]}`: seconds per training sample of each
    class (with `clock = "flare"`, seconds per trip), classes drawn by `share`; empty: 0.01 s per sample."""
    communication_delay: dict[str, Any] = field(default_factory=dict)
    """Simulated `{mean, std}` seconds of each one-way transfer (none when empty)."""
    # How a trip is timed (delays.py): "per_sample" (the two tables above), "flare" (FLARE's edge
    # simulator: device_speed in seconds per trip, one communication delay per trip) or "fedrevive"
    # (FedRevive's per-phase tables below, each {type, mean_distribution, std}; one left out is theirs).
    clock: str = PER_SAMPLE_CLOCK
    """How a simulated trip is timed: `per_sample` (`device_speed` per sample, plus `communication_delay`),
    `flare` (FLARE's edge simulator: seconds per trip) or `fedrevive` (FedRevive's per-phase tables)."""
    download_delay: dict[str, Any] = field(default_factory=dict)
    """With `clock = "fedrevive"`: the download phase, `{type, mean_distribution = [[share, mean], ...], std}`;
    empty: FedRevive's default."""
    localtrain_delay: dict[str, Any] = field(default_factory=dict)
    """With `clock = "fedrevive"`: the local-training phase, as `download_delay`; empty: FedRevive's default."""
    upload_delay: dict[str, Any] = field(default_factory=dict)
    """With `clock = "fedrevive"`: the upload phase, as `download_delay`; empty: FedRevive's default."""

    @property
    def phased(self) -> bool:
        """Trips timed by FedRevive's per-phase tables."""
        return self.clock == FEDREVIVE_CLOCK

    @property
    def per_sample(self) -> bool:
        """Trips timed by each device's training work: the clock reads the devices' data sizes."""
        return self.clock == PER_SAMPLE_CLOCK

    def phases(self) -> list[dict[str, Any]]:
        """The per-phase tables, in a trip's order (PHASE_KEYS)."""
        return [getattr(self, key) for key in PHASE_KEYS]

    def check(self, run: Run) -> None:
        _check_speed(self.device_speed, self.communication_delay)
        choice("clock", self.clock, CLOCKS)
        if self.phased:
            for key in ("device_speed", "communication_delay"):
                if getattr(self, key):
                    raise ConfigError(
                        f'{key}: applies to clock = "per_sample" or "flare"; clock = "fedrevive" times trips by'
                        f" {', '.join(PHASE_KEYS)}"
                    )
            for key, table in zip(PHASE_KEYS, self.phases(), strict=True):
                phase_delay(key, table)
            return
        for key in PHASE_KEYS:
            if getattr(self, key):
                raise ConfigError(f'{key}: applies to clock = "fedrevive", not {self.clock!r}')
        if self.clock == FLARE_CLOCK and not self.device_speed:
            raise ConfigError(
                'clock: "flare" needs device_speed = {mean = [...], std = [...]}, seconds per trip of each tier'
            )


def _check_speed(speed: dict[str, Any], delay: dict[str, Any]) -> None:
    """device_speed = {mean, std, share} (one entry per class) and communication_delay = {mean, std}."""
    check_table("device_speed", speed, ("mean", "std", "share"))
    if speed:
        if "mean" not in speed:
            raise ConfigError("device_speed.mean: required (seconds per training sample, one per speed class)")
        classes = len(_numbers("device_speed.mean", speed["mean"]))
        for name in ("std", "share"):
            if name in speed and len(_numbers(f"device_speed.{name}", speed[name])) != classes:
                raise ConfigError(f"device_speed.{name}: one value per speed class ({classes}), got {speed[name]!r}")
        if "share" in speed and sum(_numbers("device_speed.share", speed["share"])) <= 0:
            raise ConfigError("device_speed.share: the shares must add up to more than 0")
    check_table("communication_delay", delay, ("mean", "std"))
    for name in ("mean", "std"):
        if name in delay and len(_numbers(f"communication_delay.{name}", delay[name])) != 1:
            raise ConfigError(f"communication_delay.{name}: one number (seconds), got {delay[name]!r}")


def _numbers(key: str, value: Any, minimum: float = 0.0) -> list[float]:
    values = value if isinstance(value, list) else [value]
    if not values or any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        raise ConfigError(f"{key}: expected a number or a list of numbers, got {value!r}")
    if any(not math.isfinite(v) or v < minimum for v in values):
        raise ConfigError(f"{key}: every value must be a finite number of at least {minimum}, got {value!r}")
    return [float(v) for v in values]
