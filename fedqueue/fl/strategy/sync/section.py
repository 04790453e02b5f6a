"""FedAvg's config section: the keys only synchronous rounds read."""

from __future__ import annotations

from dataclasses import dataclass

from fedqueue.errors import ConfigError
from fedqueue.fl.ml.plugins import describe_choices, is_valid_name
from fedqueue.fl.sections.base import Run


@dataclass(frozen=True)
class FedAvgSection:
    """Synchronous rounds (`mode = "fedavg"`)."""

    aggregate: str = "fedavg"
    """The server's rule in synchronous rounds: `fedavg`, or a plugin."""

    def check(self, run: Run) -> None:
        if not is_valid_name("aggregate", self.aggregate):
            raise ConfigError(
                f"aggregate: unknown aggregate {self.aggregate!r} (choose from {describe_choices('aggregate')})"
            )
