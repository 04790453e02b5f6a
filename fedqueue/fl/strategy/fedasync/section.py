"""FedAsync's run-config keys: flat in the file beside the others, read and checked here (stdlib only: the run
config and the views read it without loading a strategy).

Xie, Koyejo and Gupta (2019) mix an update trained from version tau into version t - 1 with the share
alpha_t = alpha * s(t - tau), for a staleness function s: constant (1), polynomial ((1 + s)^-a) or hinge
(1 up to staleness b, then 1 / (a (s - b) + 1)).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from fedqueue.errors import ConfigError

STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")


@dataclass(frozen=True)
class FedAsyncSection:
    fedasync_alpha: float = 0.6
    """FedAsync: the mixing share alpha in (0, 1]: a fresh update moves the model this far towards its own."""
    fedasync_staleness: str = "polynomial"
    """FedAsync: the staleness function s of `alpha_t = alpha * s(staleness)`: `constant` (1), `polynomial`
    ((1 + s)^-a) or `hinge` (1 up to staleness b, then 1 / (a (s - b) + 1))."""
    fedasync_a: float = 0.5
    """FedAsync: the a of the `polynomial` and `hinge` staleness functions (the paper's 0.5 and 10)."""
    fedasync_b: int = 4
    """FedAsync: the b of the `hinge` staleness function: updates at most this stale weigh 1."""

    @classmethod
    def read(cls, values: Mapping[str, Any]) -> FedAsyncSection:
        """The section the keys give (the others at their defaults); ConfigError naming a key at fault."""
        for key in ("fedasync_alpha", "fedasync_a"):
            if key in values and (isinstance(values[key], bool) or not isinstance(values[key], int | float)):
                raise ConfigError(f"{key}: expected a number, got {type(values[key]).__name__} {values[key]!r}")
        if "fedasync_staleness" in values and not isinstance(values["fedasync_staleness"], str):
            raise ConfigError(f"fedasync_staleness: expected a string, got {values['fedasync_staleness']!r}")
        b = values.get("fedasync_b", cls.fedasync_b)
        if isinstance(b, bool) or not isinstance(b, int):
            raise ConfigError(f"fedasync_b: expected an integer, got {type(b).__name__} {b!r}")
        section = cls(
            fedasync_alpha=float(values.get("fedasync_alpha", cls.fedasync_alpha)),
            fedasync_staleness=values.get("fedasync_staleness", cls.fedasync_staleness),
            fedasync_a=float(values.get("fedasync_a", cls.fedasync_a)),
            fedasync_b=b,
        )
        section._check(values)
        return section

    def _check(self, given: Mapping[str, Any]) -> None:
        if not (math.isfinite(self.fedasync_alpha) and 0 < self.fedasync_alpha <= 1):
            raise ConfigError(f"fedasync_alpha: a share in (0, 1], got {self.fedasync_alpha}")
        if self.fedasync_staleness not in STALENESS_FUNCTIONS:
            raise ConfigError(
                f"fedasync_staleness: unknown fedasync_staleness {self.fedasync_staleness!r}"
                f" (choose from {', '.join(STALENESS_FUNCTIONS)})"
            )
        if not (math.isfinite(self.fedasync_a) and self.fedasync_a >= 0):
            raise ConfigError(f"fedasync_a: must be 0 or more, got {self.fedasync_a}")
        if self.fedasync_b < 0:
            raise ConfigError(f"fedasync_b: must be 0 or more, got {self.fedasync_b}")
        if "fedasync_a" in given and self.fedasync_staleness == "constant":
            raise ConfigError('fedasync_a: applies to fedasync_staleness = "polynomial" or "hinge"')
        if "fedasync_b" in given and self.fedasync_staleness != "hinge":
            raise ConfigError('fedasync_b: applies to fedasync_staleness = "hinge"')

    def weight(self, staleness: int) -> float:
        """s(staleness): how much of alpha an update this many versions stale is mixed in with."""
        if self.fedasync_staleness == "polynomial":
            return float((1.0 + staleness) ** -self.fedasync_a)
        if self.fedasync_staleness == "hinge" and staleness > self.fedasync_b:
            return 1.0 / (self.fedasync_a * (staleness - self.fedasync_b) + 1.0)
        return 1.0

    def to_values(self) -> dict[str, Any]:
        return {spec.name: getattr(self, spec.name) for spec in fields(self)}
