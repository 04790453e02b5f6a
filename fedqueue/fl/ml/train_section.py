"""Local training's config section: how each device trains its update, the keys fl/setup.py turns into the
LocalTrainConfig that train.py and pack_train.py train with.

Torch-free, as the config that holds it: the optimizers train.py builds are named here.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedqueue.errors import ConfigError
from fedqueue.fl.ml.plugins import describe_choices, is_valid_name
from fedqueue.fl.sections.base import Run, choice, positive

OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class TrainingSection:
    """Local training (every mode)."""

    local_iters: int | None = None
    """Local optimizer steps per device task; set this or `local_epochs`, not both (neither: one epoch)."""
    local_epochs: int | None = None
    """Passes over the device's data per device task; set this or `local_iters` (neither: one epoch)."""
    local_batch_size: int = 16
    """Local mini-batch size."""
    local_optimizer: str = "sgd"
    """The devices' optimizer: `sgd` or `adam`."""
    local_lr: float = 0.05
    """The devices' learning rate."""
    local_momentum: float = 0.0
    """SGD's momentum, in [0, 1)."""
    local_step: str = "cross_entropy"
    """The devices' objective: `cross_entropy`, or a plugin's `package.module:attribute`."""

    @property
    def effective_epochs(self) -> int | None:
        """The passes a device makes: `local_epochs`, one when neither it nor `local_iters` is set (the common
        default), None when `local_iters` counts steps instead."""
        if self.local_iters is None and self.local_epochs is None:
            return 1
        return self.local_epochs

    def check(self, run: Run) -> None:
        positive("local_batch_size", self.local_batch_size)
        for key, count in (("local_iters", self.local_iters), ("local_epochs", self.local_epochs)):
            if count is not None:
                positive(key, count)
        if self.local_iters is not None and self.local_epochs is not None:
            raise ConfigError("local_iters: set either local_iters or local_epochs, not both")
        if not is_valid_name("local_step", self.local_step):
            raise ConfigError(
                f"local_step: unknown local_step {self.local_step!r} (choose from {describe_choices('local_step')})"
            )
        choice("local_optimizer", self.local_optimizer, OPTIMIZERS)
        if not self.local_lr > 0:
            raise ConfigError(f"local_lr: must be greater than 0, got {self.local_lr}")
        if not 0 <= self.local_momentum < 1:
            raise ConfigError(f"local_momentum: must be in [0, 1), got {self.local_momentum}")
