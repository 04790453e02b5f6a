"""Packing's config section: how many devices a task trains and how, or "auto", resolved at submit (trial.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedqueue.errors import ConfigError
from fedqueue.fl.messages import PACK_MAX, PACK_MODES
from fedqueue.fl.sections.base import Run, choice, positive

AUTO = "auto"


@dataclass(frozen=True)
class PackSection:
    """Packing devices into tasks (every mode)."""

    # Devices per task ("auto": chosen at submit from the round's size and the workers' slots), and
    # how a task trains its pack: "sequential" (back to back), "vmap" (one stacked step), or "auto"
    # (both timed at submit, see rules.py). The choice is written into the stored config.
    pack_size: int | str = field(default=AUTO, metadata={"expected": 'a positive integer or "auto"'})
    """Devices per task (1: one device per task), or `"auto"`: two packs per worker slot, chosen at submit."""
    pack_mode: str = AUTO
    """How a task trains its pack: `sequential` (back to back), `vmap` (one stacked step), or `"auto"` (both
    timed at submit)."""
    # Written at submit: how "auto" was resolved, for the config and the report to show.
    pack_choice: str = ""
    """Written at submit, not set by hand: how `"auto"` chose the pack size and mode, and the timings behind it."""

    @property
    def needs_workers(self) -> bool:
        """Whether the submit asks the workers: "auto" reads their slots (and whether they have GPUs)."""
        return AUTO in (self.pack_size, self.pack_mode)

    @property
    def resolved_size(self) -> int:
        """Devices per task; a stored run's config always holds a number (submit resolves "auto")."""
        if not isinstance(self.pack_size, int):
            raise ConfigError('pack_size: "auto" is resolved when the run is submitted')
        return self.pack_size

    @property
    def resolved_mode(self) -> str:
        """How packs train; a stored run's config always holds sequential or vmap (submit resolves "auto")."""
        if self.pack_mode not in PACK_MODES:
            raise ConfigError('pack_mode: "auto" is resolved when the run is submitted')
        return self.pack_mode

    def check(self, run: Run) -> None:
        choice("pack_mode", self.pack_mode, (*PACK_MODES, AUTO))
        if isinstance(self.pack_size, str) and self.pack_size != AUTO:
            raise ConfigError(f'pack_size: a positive integer or "auto", got {self.pack_size!r}')
        if isinstance(self.pack_size, int):
            positive("pack_size", self.pack_size)
            if self.pack_size > PACK_MAX:
                raise ConfigError(f"pack_size: at most {PACK_MAX}, got {self.pack_size}")
