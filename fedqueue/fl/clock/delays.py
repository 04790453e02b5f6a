"""Trip-time distributions per phase, as FedRevive's configs write them: parsed and checked, no numpy.

With `clock = "fedrevive"` a trip is a download, a local training and an upload, each timed by
its own table `{type, mean_distribution, std}` (FedRevive's `download_delay`, `localtrain_delay`,
`upload_delay`). Each device's mean for a phase is drawn once from `mean_distribution`, a mixture
of `[share, mean]` pairs; each trip's time for the phase is then drawn around that mean:

    constant     the mean (std unused)
    exponential  exponential with that mean (std unused)
    uniform      uniform on [max(0, mean - std), mean + std]: std is the half-width
    normal       max(0, normal(mean, std)): fedqueue's own, FedRevive has none; the clip at 0
                 raises the mean above `mean` once std is a fair part of it
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedqueue.errors import ConfigError, did_you_mean

# How trips are timed: fedqueue's per-sample model (the default), FLARE's per-trip tiers, FedRevive's phases.
# The clocks are named after the simulators they follow; a clock is not a strategy (any mode runs on any).
PER_SAMPLE_CLOCK = "per_sample"
FLARE_CLOCK = "flare"
FEDREVIVE_CLOCK = "fedrevive"
CLOCKS = (PER_SAMPLE_CLOCK, FLARE_CLOCK, FEDREVIVE_CLOCK)
DELAY_TYPES = ("constant", "exponential", "uniform", "normal")
PHASE_KEYS = ("download_delay", "localtrain_delay", "upload_delay")  # in a trip's order
_TABLE_KEYS = ("type", "mean_distribution", "std")

# FedRevive's values (its config.py DEFAULT_CONFIG, and every CIFAR-10 sample config): a phase the
# run config leaves out is timed as theirs, as their loader fills in a block a JSON file leaves out.
FEDREVIVE_DELAYS: dict[str, dict[str, Any]] = {
    "download_delay": {"type": "constant", "mean_distribution": [[1.0, 0.1]], "std": 0.2},
    "localtrain_delay": {
        "type": "exponential",
        "mean_distribution": [[0.25, 1.0], [0.5, 1.3], [0.25, 1.6]],
        "std": 0.2,
    },
    "upload_delay": {"type": "uniform", "mean_distribution": [[0.5, 0.15], [0.5, 0.25]], "std": 0.02},
}
# A key left out of a table takes the value their delay generator falls back to.
_TABLE_DEFAULTS: dict[str, Any] = {"type": "constant", "mean_distribution": [[1.0, 1.0]], "std": 0.1}


@dataclass(frozen=True)
class PhaseDelay:
    """One phase's distribution: the mixture of per-device means (shares add up to 1) and the per-trip type."""

    type: str
    shares: tuple[float, ...]
    means: tuple[float, ...]
    std: float

    @property
    def expected_mean(self) -> float:
        """The phase's mean over devices, before any clip at 0 (uniform and normal)."""
        return sum(share * mean for share, mean in zip(self.shares, self.means, strict=True))


def phase_delay(key: str, table: Mapping[str, Any] | None) -> PhaseDelay:
    """The phase `key` of a run config (empty: FedRevive's); ConfigError names the field at fault."""
    if not table:
        table = FEDREVIVE_DELAYS[key]
    for name in table:
        if name not in _TABLE_KEYS:
            hint = did_you_mean(name, _TABLE_KEYS) or f" (known: {', '.join(_TABLE_KEYS)})"
            raise ConfigError(f"{key}: unknown setting {name!r}{hint}")
    full = {**_TABLE_DEFAULTS, **table}
    kind = full["type"]
    if not isinstance(kind, str) or kind not in DELAY_TYPES:
        raise ConfigError(f"{key}.type: unknown type {kind!r} (choose from {', '.join(DELAY_TYPES)})")
    shares, means = _mixture(f"{key}.mean_distribution", full["mean_distribution"])
    std = full["std"]
    if not _number(std) or std < 0:
        raise ConfigError(f"{key}.std: a finite number of at least 0, got {std!r}")
    total = sum(shares)
    return PhaseDelay(kind, tuple(share / total for share in shares), tuple(means), float(std))


def _number(value: Any) -> bool:
    # bool is an int in Python; `std = true` is still a mistake.
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _mixture(field: str, value: Any) -> tuple[list[float], list[float]]:
    pairs = value if isinstance(value, list | tuple) else None
    if not pairs or any(
        not isinstance(pair, list | tuple) or len(pair) != 2 or not all(_number(v) and v >= 0 for v in pair)
        for pair in pairs
    ):
        raise ConfigError(f"{field}: a list of [share, mean] pairs of finite numbers of at least 0, got {value!r}")
    shares = [float(share) for share, _ in pairs]
    if not 0 < sum(shares) < math.inf:
        raise ConfigError(f"{field}: the shares must add up to a finite number more than 0, got {value!r}")
    return shares, [float(mean) for _, mean in pairs]
