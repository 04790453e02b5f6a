"""How much a stale update counts: pure functions of its staleness, no I/O.

Staleness s is how many model versions were made between the version a device trained on and
the one its update is folded into (0 for an update on the current version).
"""

from __future__ import annotations

import math

# The staleness weightings fedqueue knows, by the name the run config gives them.
STALENESS_WEIGHTS = ("none", "polynomial", "sqrt", "flare_sqrt", "afl_dw")


def staleness_weight(rule: str, staleness: int, exponent: float = 0.5, s_max: float = 75.0) -> float:
    """The factor an update of this staleness is multiplied by.

    - `none`: 1 whatever the staleness.
    - `polynomial`: (1 + s) ** -exponent (FedBuff's and FedAsync's polynomial decay).
    - `sqrt`: 1 / (1 + sqrt(s)): FLARE's formula with staleness counted one lower than FLARE
      counts it, so a fresh update weighs 1 (fedqueue's rule since before `flare_sqrt`; kept so
      existing configs give the same versions).
    - `flare_sqrt`: 1 / (1 + sqrt(s + 1)), NVIDIA FLARE's edge model manager exactly: its version
      counter moves before it takes the weight, so a fresh update weighs 0.5.
    - `afl_dw`: (1 + cos(pi s / (2 s_max))) / 2 up to s = 2 s_max, then 0: FedRevive's AFL-DW
      (`async_downweighting`), 1 - beta with its cosine beta schedule.
    """
    if staleness < 0:
        raise ValueError(f"staleness must be 0 or more, got {staleness}")
    if rule == "none":
        return 1.0
    if rule == "polynomial":
        return float((1.0 + staleness) ** -exponent)
    if rule == "sqrt":
        return 1.0 / (1.0 + math.sqrt(staleness))
    if rule == "flare_sqrt":
        return 1.0 / (1.0 + math.sqrt(staleness + 1))
    if rule == "afl_dw":
        if staleness > 2 * s_max:
            return 0.0
        return 0.5 * (1.0 + math.cos(math.pi * staleness / (2.0 * s_max)))
    raise ValueError(f"unknown staleness weighting {rule!r} (choose from {', '.join(STALENESS_WEIGHTS)})")


def is_too_stale(staleness: int, max_staleness: int | None) -> bool:
    """An update older than `max_staleness` versions is dropped (None keeps every update)."""
    return max_staleness is not None and staleness > max_staleness
