"""Which device tasks a worker takes: only those its run's scheduler sent, read from the store, never the message.

A message on the queue says which run, round, devices and model it trains; anyone who can write to Redis
can write one. A worker compares it with what the store recorded when the round (or a buffered-async
dispatch) sent its devices off, and refuses the rest before training: the store's own check
(fedqueue.fl.store.results) refuses their results anyway, so the work would be wasted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedqueue.core.services import Services
from fedqueue.fl.messages import DeviceTask
from fedqueue.fl.packs.tasks import cut_packs
from fedqueue.fl.store.results import get_round

if TYPE_CHECKING:
    from fedqueue.fl.strategy.base import Strategy
    from fedqueue.fl.worker.cache import WorkerCache


def refusal(services: Services, cache: WorkerCache, task: DeviceTask, strategy: Strategy) -> str | None:
    """Why the task is not one its run sent (None: it is); `strategy` runs the run (the kind hands it over)."""
    row = get_round(services.store, task.run_id, task.round_index)
    if row is None:
        return f"run {task.run_id} has no round {task.round_index}"
    unsent = sorted(set(task.devices) - set(row.selected))
    if unsent:
        listed = ", ".join(map(str, unsent[:10])) + (", ..." if len(unsent) > 10 else "")
        return f"run {task.run_id} round {task.round_index} never sent out device {listed}"
    # The key alone: the blob read checks the content against the task's sha256.
    if task.model.key != row.model_key:
        return f"run {task.run_id} round {task.round_index} trains {row.model_key}, not {task.model.key}"
    config = cache.run_config(services, task.run_id)
    mode = config.packing.resolved_mode if len(task.devices) > 1 else "sequential"
    if task.mode != mode:
        return f"run {task.run_id} trains packs of {len(task.devices)} devices {mode}, not {task.mode}"
    if not strategy.keeps_rounds:
        return None
    if task.round_size != len(row.selected):
        return f"run {task.run_id} round {task.round_index} has {len(row.selected)} devices, not {task.round_size}"
    if len(task.devices) > 1 and task.devices not in cut_packs(row.selected, config.packing.resolved_size):
        return f"run {task.run_id} round {task.round_index} sent no pack of devices {task.pack}"
    return None
