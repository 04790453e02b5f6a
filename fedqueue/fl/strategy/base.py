"""The aggregation-strategy seam: what a run dispatches first, what a stored result triggers, how it is repaired.

How updates are folded into versions is each strategy's own: synchronous FedAvg aggregates a
round once all its devices are stored (fedqueue.fl.strategy.sync.rounds); FedBuff folds updates in simulated
arrival order as they come (fedqueue.fl.strategy.fedbuff.fold). The arithmetic of both is pure
(fedqueue.fl.ml.aggregate), as is FedBuff's schedule (fedqueue.fl.strategy.fedbuff.schedule).

Worker code never imports a strategy: the kind picks a run's (fedqueue.fl.strategy.registry) and hands
it to the device task, which calls it through this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fedqueue.core.jobs import TaskHandler
    from fedqueue.core.services import Services
    from fedqueue.fl.config import RunConfig
    from fedqueue.fl.messages import DeviceTask
    from fedqueue.fl.strategy.mode import Mode
    from fedqueue.fl.worker.cache import WorkerCache


class Strategy(Protocol):
    # Whether a vmapped pack may store one pre-summed update for its devices (their updates must
    # then be folded together, into the same version).
    presums_packs: bool
    # Whether a round's devices, packs and size stay as sent, so a device task must match them (a fold pass's
    # dispatches are not kept once sent).
    keeps_rounds: bool

    def rounds_total(self, config: RunConfig) -> int:
        """The most rounds or versions a run makes, known at submit (0: no bound but simulated time)."""

    def describe(self, config: RunConfig) -> str:
        """The run's shape, as `fedqueue run` announces it ("10 rounds, 5 of 20 devices per round")."""

    def start(self, services: Services, run_id: str, config: RunConfig, model: bytes) -> None:
        """Dispatch a new run's first work from version 0 (`model`, encoded). Idempotent."""

    def on_stored(
        self, services: Services, task: DeviceTask, stored: int, worker: str, cache: WorkerCache | None = None
    ) -> None:
        """`worker` stored results of `task` (`stored` counts its round's stored results): what follows.

        `cache` is the worker's own, where a worker process stored them (the scheduler storing a
        device that failed every attempt has none): work that follows may then run right there.
        """

    def repair(self, services: Services, run_id: str, config: RunConfig, broker_lost: bool) -> list[str]:
        """One repair pass over a running run; returns what it did, a line per action."""


@dataclass(frozen=True)
class Entry:
    """A strategy as the registry holds it: what callers may know of it, what runs it, the control tasks it
    sends (the kind registers them)."""

    mode: Mode
    strategy: Strategy
    control: tuple[TaskHandler, ...]
