"""How much a stale update counts: pure functions of its staleness, no I/O.

Staleness s is how many model versions were made between the version a device trained on and
the one its update is folded into (0 for an update on the current version).
"""

from __future__ import annotations

import math

# The staleness weightings fedqueue knows, by the name the run config gives them.
STALENESS_WEIGHTS = ("none", "polynomial", "sqrt")


def staleness_weight(rule: str, staleness: int, exponent: float = 0.5) -> float:
    """The factor an update of this staleness is multiplied by.

    - `none`: 1 whatever the staleness.
    - `polynomial`: (1 + s) ** -exponent (FedBuff's and FedAsync's polynomial decay).
    - `sqrt`: 1 / (1 + sqrt(s)) (NVIDIA FLARE's edge model manager).
    """
    if staleness < 0:
        raise ValueError(f"staleness must be 0 or more, got {staleness}")
    if rule == "none":
        return 1.0
    if rule == "polynomial":
        return float((1.0 + staleness) ** -exponent)
    if rule == "sqrt":
        return 1.0 / (1.0 + math.sqrt(staleness))
    raise ValueError(f"unknown staleness weighting {rule!r} (choose from {', '.join(STALENESS_WEIGHTS)})")


def is_too_stale(staleness: int, max_staleness: int | None) -> bool:
    """An update older than `max_staleness` versions is dropped (None keeps every update)."""
    return max_staleness is not None and staleness > max_staleness
