"""FedBuff's config section: the buffer, concurrency and staleness keys, read by the buffered modes."""

from __future__ import annotations

from dataclasses import dataclass

from fedqueue.errors import ConfigError
from fedqueue.fl.sections.base import Run, choice, positive
from fedqueue.fl.strategy.fedbuff.staleness import STALENESS_WEIGHTS


@dataclass(frozen=True)
class FedBuffSection:
    """Buffered asynchronous FL (`mode = "fedbuff"`, and FedRevive's and FedAsync's too)."""

    concurrency: int | None = None
    """Buffered modes: devices training at once (none: `devices_per_round`; FLARE's `device_selection_size`)."""
    buffer_size: int = 10
    """Buffered modes: updates folded into each new version (FLARE's `num_updates_for_model`)."""
    staleness_weight: str = "none"
    """Weight w(s) of an update s versions stale: `none` (1), `polynomial` ((1 + s)^-a, a =
    `staleness_exponent`), `sqrt` (1 / (1 + sqrt(s))), `flare_sqrt` (FLARE's 1 / (1 + sqrt(s + 1))) or `afl_dw`
    (FedRevive's cosine down-weighting, `staleness_s_max`)."""
    staleness_exponent: float = 0.5
    """The exponent a of `staleness_weight = "polynomial"`."""
    max_staleness: int | None = None
    """Drop updates more than this many versions stale (none keeps all)."""
    device_reuse: bool = True
    """A device that reported may be sampled again (never twice on the same version); false: each device trains
    once."""
    min_refill: int = 1
    """Slots that must be free before new devices are sampled (FLARE's `min_hole_to_fill`)."""
    staleness_s_max: float = 75.0
    """The s_max of `staleness_weight = "afl_dw"`: w(s) = (1 + cos(pi s / (2 s_max))) / 2 up to s = 2 s_max, then 0
    (FedRevive's `adaptive_beta_factor`)."""

    def resolved_concurrency(self, run: Run) -> int:
        """Devices training at once: `concurrency`, else the run's `devices_per_round`."""
        return self.concurrency if self.concurrency is not None else run.devices_per_round

    def check(self, run: Run) -> None:
        for key in ("concurrency", "buffer_size", "min_refill"):
            if getattr(self, key) is not None:
                positive(key, getattr(self, key))
        choice("staleness_weight", self.staleness_weight, STALENESS_WEIGHTS)
        concurrency = self.resolved_concurrency(run)
        if concurrency > run.num_devices:
            raise ConfigError(
                f"concurrency: {concurrency} devices at once is more than num_devices = {run.num_devices}"
            )
        if self.buffer_size > concurrency:
            # A version would wait for more updates than are ever in flight beside each other.
            source = "concurrency" if self.concurrency is not None else "concurrency (devices_per_round)"
            raise ConfigError(
                f"buffer_size: {self.buffer_size} updates per version is more than {source} = {concurrency} devices"
                f" training at once; set buffer_size to at most {concurrency} or raise concurrency"
            )
        if self.min_refill > concurrency:
            raise ConfigError(f"min_refill: {self.min_refill} is more than concurrency = {concurrency}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ConfigError(f"max_staleness: must be 0 or more, got {self.max_staleness}")
        if self.staleness_exponent < 0:
            raise ConfigError(f"staleness_exponent: must be 0 or more, got {self.staleness_exponent}")
        if not self.staleness_s_max > 0:
            raise ConfigError(f"staleness_s_max: must be greater than 0, got {self.staleness_s_max}")
        last = run.last_version
        if not self.device_reuse and last is not None and run.num_devices < self.buffer_size * last:
            raise ConfigError(
                f"device_reuse: false uses each device once, and {last} versions of "
                f"buffer_size = {self.buffer_size} need {self.buffer_size * last} devices "
                f"(num_devices = {run.num_devices})"
            )
