"""FedRevive's config section: its distillation's kd_* keys and the `dfkd` table, on top of FedBuff's keys."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fedqueue.errors import ConfigError
from fedqueue.fl.sections.base import Run, check_table, choice, positive
from fedqueue.fl.strategy.fedbuff.section import FedBuffSection


@dataclass(frozen=True)
class FedReviveSection(FedBuffSection):
    """FedRevive (`mode = "fedrevive"`): FedBuff's keys, and these, named as in its code."""

    kd_buffer_size: int = 8
    """FedRevive: the teachers, the local models of this many last folded updates (this one included)."""
    kd_iters: int = 10
    """FedRevive: Adam steps of distillation per update (their `nb_of_iters`)."""
    kd_lr: float = 0.0003
    """FedRevive: the distillation's learning rate."""
    kd_batch_size: int = 32
    """FedRevive: samples per distillation step and teacher."""
    kd_temperature: float = 2.0
    """FedRevive: the softening temperature T; the loss is KL(student, teacher) x T^2."""
    kd_version: str = "distribution_match_batch"
    """FedRevive: how the teachers are asked: `distribution_match_batch` (each on a batch drawn like its device's
    labels), `avg_logits` (one batch, the teachers' mean logits) or `avg_loss` (one batch, the mean loss)."""
    kd_beta: float | str = field(default=0.5, metadata={"expected": "a number or a schedule name"})
    """FedRevive: how much of an update the distilled change replaces: a constant in [0, 1], or a schedule of
    staleness, `cosine`, `exponential`, `linear` or `stepwise`, scaled by `kd_beta_factor`."""
    kd_beta_factor: float = 75.0
    """FedRevive: the factor of the `kd_beta` schedules (their `adaptive_beta_factor`)."""
    # Where the distillation's inputs come from: "simple_kd" (the held-out kd_split) or "dfkd"
    # (images a generator learns from the teachers, fl/ml/synthesis.py), with the generator's knobs
    # and freeze_rounds in the `dfkd` table, named as in FedRevive's dfkd_settings.
    kd_augmentation: str = "simple_kd"
    """FedRevive: what the distillation runs on: the held-out `kd_split` (`simple_kd`), or images synthesised from
    the teachers (`dfkd`)."""
    dfkd: dict[str, Any] = field(default_factory=dict)
    """FedRevive with `kd_augmentation = "dfkd"`: the synthesizer's knobs, a table (FedRevive's `dfkd_settings`)."""

    @property
    def data_free(self) -> bool:
        """Distilling on synthesised images (`kd_augmentation = "dfkd"`), with no held-out share."""
        return self.kd_augmentation == "dfkd"

    def check(self, run: Run) -> None:
        super().check(run)
        # torch: every command reads a run config; FedRevive's names load with its math, for a FedRevive config only
        from fedqueue.fl.ml.distill import BETA_SCHEDULES, KD_AUGMENTATIONS, KD_VERSIONS

        choice("kd_augmentation", self.kd_augmentation, KD_AUGMENTATIONS)
        if not self.data_free and not 0 < run.kd_split < 1:
            raise ConfigError(f"kd_split: a share of the training set in (0, 1), got {run.kd_split}")
        if self.dfkd and not self.data_free:
            raise ConfigError('dfkd: these settings apply to kd_augmentation = "dfkd"')
        _check_dfkd(self.dfkd)
        for key in ("kd_buffer_size", "kd_iters", "kd_batch_size"):
            positive(key, getattr(self, key))
        for key in ("kd_lr", "kd_temperature", "kd_beta_factor"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) > 0):
                raise ConfigError(f"{key}: must be greater than 0, got {getattr(self, key)}")
        choice("kd_version", self.kd_version, KD_VERSIONS)
        if isinstance(self.kd_beta, str):
            choice("kd_beta", self.kd_beta, BETA_SCHEDULES)
        elif not 0 <= self.kd_beta <= 1:
            raise ConfigError(f"kd_beta: a number in [0, 1] or one of {', '.join(BETA_SCHEDULES)}, got {self.kd_beta}")


def _check_dfkd(table: dict[str, Any]) -> None:
    """dfkd = {...}: each key a knob of the synthesizer or the server step, each value of its default's type."""
    # torch, as above
    from fedqueue.fl.ml.distill import PROPORTION_SOURCES, dfkd_defaults
    from fedqueue.fl.ml.synthesis import ADV_GATES

    if not table:
        return
    defaults = dfkd_defaults()
    check_table("dfkd", table, tuple(defaults))
    choices = {"adv_gate": ADV_GATES, "class_proportion_source": PROPORTION_SOURCES}
    for name, value in table.items():
        default = defaults[name]
        if isinstance(default, str):
            choice(f"dfkd.{name}", value, choices[name])
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"dfkd.{name}: a whole number of at least 0, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"dfkd.{name}: a number of at least 0, got {value!r}")
    for name in ("synthesis_interval", "proxy_uploads", "proxy_probes"):
        if table.get(name) == 0:
            raise ConfigError(f"dfkd.{name}: must be at least 1, got 0")
