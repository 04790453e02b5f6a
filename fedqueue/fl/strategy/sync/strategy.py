"""Synchronous FedAvg rounds behind the strategy seam (fedqueue.fl.strategy.base), over the round machinery in rounds.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedqueue.core.services import Services
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import DeviceTask
from fedqueue.fl.strategy.base import Entry
from fedqueue.fl.strategy.sync.control import AGGREGATE
from fedqueue.fl.strategy.sync.mode import FEDAVG
from fedqueue.fl.strategy.sync.read_ahead import tail_started
from fedqueue.fl.strategy.sync.repair import repair_rounds
from fedqueue.fl.strategy.sync.requests import request_aggregation
from fedqueue.fl.strategy.sync.rounds import start_round

if TYPE_CHECKING:
    from fedqueue.fl.worker.cache import WorkerCache


class SynchronousRounds:
    """Round r trains version r - 1 on its selected devices; the round's last result asks for its aggregation."""

    presums_packs = True
    keeps_rounds = True

    def start(self, services: Services, run_id: str, config: RunConfig, model: bytes) -> None:
        start_round(services, run_id, config, 1, model)

    def on_stored(
        self, services: Services, task: DeviceTask, stored: int, worker: str, cache: WorkerCache | None = None
    ) -> None:
        """The worker that stored a round's last result (`stored` counts them) enqueues its aggregation.

        So does one that finds the round in its tail: the aggregator then reads the stored updates
        on an idle slot while the last devices train (fedqueue.fl.strategy.sync.read_ahead).
        """
        if stored >= task.round_size or tail_started(services, stored, task.round_size):
            request_aggregation(services, task.run_id, task.round_index)

    def repair(self, services: Services, run_id: str, config: RunConfig, broker_lost: bool) -> list[str]:
        return repair_rounds(services, run_id, config, broker_lost, self)

    def rounds_total(self, config: RunConfig) -> int:
        """Its rounds; within max_sim_time, those that end in it (known at submit)."""
        # torch: loaded by the process that submits, never by the repair pass.
        from fedqueue.fl.strategy.sync.sim_bound import rounds_within

        return rounds_within(config)

    def describe(self, config: RunConfig) -> str:
        return f"{config.rounds} rounds, {config.devices_per_round} of {config.num_devices} devices per round"


SYNCHRONOUS = SynchronousRounds()

ENTRY = Entry(mode=FEDAVG, strategy=SYNCHRONOUS, control=(AGGREGATE,))
