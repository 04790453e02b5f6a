"""FedAsync's config section: FedBuff's keys with a version per update, and its own mixing keys.

Xie, Koyejo and Gupta (2019) mix an update trained from version tau into version t - 1 with the share
alpha_t = alpha * s(t - tau), for a staleness function s: constant (1), polynomial ((1 + s)^-a) or hinge
(1 up to staleness b, then 1 / (a (s - b) + 1)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedqueue.errors import ConfigError
from fedqueue.fl.sections.base import Run, choice, default_of
from fedqueue.fl.strategy.fedbuff.section import FedBuffSection

STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")
# FedBuff's keys whose value FedAsync's rule fixes: a version per update, weighed by s and mixed in by alpha
# alone. Another value is refused naming the key.
FIXED = {"buffer_size": 1, "staleness_weight": "none"}


@dataclass(frozen=True)
class FedAsyncSection(FedBuffSection):
    """FedAsync (`mode = "fedasync"`): FedBuff's keys, a version per update (`buffer_size = 1`), and these."""

    buffer_size: int = 1
    fedasync_alpha: float = 0.6
    """FedAsync: the mixing share alpha in (0, 1]: a fresh update moves the model this far towards its own."""
    fedasync_staleness: str = "polynomial"
    """FedAsync: the staleness function s of `alpha_t = alpha * s(staleness)`: `constant` (1), `polynomial`
    ((1 + s)^-a) or `hinge` (1 up to staleness b, then 1 / (a (s - b) + 1))."""
    fedasync_a: float = 0.5
    """FedAsync: the a of the `polynomial` and `hinge` staleness functions (the paper's 0.5 and 10)."""
    fedasync_b: int = 4
    """FedAsync: the b of the `hinge` staleness function: updates at most this stale weigh 1."""

    def check(self, run: Run) -> None:
        for key, fixed in FIXED.items():
            if getattr(self, key) != fixed:
                raise ConfigError(
                    f"{key}: mode = {run.mode!r} sets it to {fixed!r}; remove it, got {getattr(self, key)!r}"
                )
        if run.global_lr != 1.0:
            # alpha is the server's whole step: a second one would scale it again.
            raise ConfigError(f"global_lr: mode = {run.mode!r} sets it to 1.0; remove it, got {run.global_lr!r}")
        super().check(run)
        if not (math.isfinite(self.fedasync_alpha) and 0 < self.fedasync_alpha <= 1):
            raise ConfigError(f"fedasync_alpha: a share in (0, 1], got {self.fedasync_alpha}")
        choice("fedasync_staleness", self.fedasync_staleness, STALENESS_FUNCTIONS)
        if not (math.isfinite(self.fedasync_a) and self.fedasync_a >= 0):
            raise ConfigError(f"fedasync_a: must be 0 or more, got {self.fedasync_a}")
        if self.fedasync_b < 0:
            raise ConfigError(f"fedasync_b: must be 0 or more, got {self.fedasync_b}")
        # A knob its staleness function never reads, set away from its default, is a mistake worth naming.
        if self.fedasync_a != default_of(FedAsyncSection, "fedasync_a") and self.fedasync_staleness == "constant":
            raise ConfigError('fedasync_a: applies to fedasync_staleness = "polynomial" or "hinge"')
        if self.fedasync_b != default_of(FedAsyncSection, "fedasync_b") and self.fedasync_staleness != "hinge":
            raise ConfigError('fedasync_b: applies to fedasync_staleness = "hinge"')

    def weight(self, staleness: int) -> float:
        """s(staleness): how much of alpha an update this many versions stale is mixed in with."""
        if self.fedasync_staleness == "polynomial":
            return float((1.0 + staleness) ** -self.fedasync_a)
        if self.fedasync_staleness == "hinge" and staleness > self.fedasync_b:
            return 1.0 / (self.fedasync_a * (staleness - self.fedasync_b) + 1.0)
        return 1.0
