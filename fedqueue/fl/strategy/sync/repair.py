"""Bring a synchronous run's rounds back in line with its store: the strategy's part of the repair pass.

Run every few seconds by whoever holds the run's lease (fedqueue.fl.scheduler.reconcile). It finds device tasks that neither finished nor are running
(their worker died, or Redis restarted and forgot its queue) and enqueues them
again, republishes what Redis lost, re-sends aggregations whose aggregator died, and
starts a round that a crash between rounds never started. Every action is
idempotent: results are keyed by (run, round, device), rounds are claimed once.
"""

from __future__ import annotations

import logging
import time

from fedqueue.core.codec import BlobRef
from fedqueue.core.runs.lost import find_lost
from fedqueue.core.services import Services
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import DEVICES_QUEUE, DeviceTask, aggregate_key
from fedqueue.fl.packs.tasks import tasks_of_round
from fedqueue.fl.store.results import claim_is_stale, count_done, delete_result, device_tasks, list_rounds
from fedqueue.fl.store.schema import RoundRow
from fedqueue.fl.strategy.base import Strategy
from fedqueue.fl.strategy.common import checkpoint_bytes
from fedqueue.fl.strategy.sync.requests import request_aggregation
from fedqueue.fl.strategy.sync.rounds import round_key, start_next, start_round
from fedqueue.fl.worker.device_task import give_up_on

log = logging.getLogger(__name__)

# A round recorded this long ago whose tasks are not all on the queue lost its starter mid-way.
ENQUEUE_GRACE_S = 30.0


def repair_rounds(
    services: Services, run_id: str, config: RunConfig, broker_lost: bool, strategy: Strategy
) -> list[str]:
    """One pass over the run's open rounds (`strategy` is told of devices stored failed): the latest, and the one
    before it while that one still closes (a round starts the next before its checkpoint commits)."""
    rounds = list_rounds(services.store, run_id)
    if not rounds:
        start_round(services, run_id, config, 1, checkpoint_bytes(services, run_id, 0))
        return ["round 1 was never started: started"]
    closing = rounds[-2] if len(rounds) > 1 and rounds[-2].state != "done" else None
    actions = [] if closing is None else _repair_round(services, run_id, config, closing, broker_lost, strategy)
    return actions + _repair_round(services, run_id, config, rounds[-1], broker_lost, strategy, closing is not None)


def _repair_round(
    services: Services,
    run_id: str,
    config: RunConfig,
    current: RoundRow,
    broker_lost: bool,
    strategy: Strategy,
    previous_open: bool = False,
) -> list[str]:
    if current.state == "done":
        # Its aggregator starts the next round (or finishes the run) right after closing this one, which may take
        # a while (a model that goes to the store): the round was never started only once that aggregator is gone.
        aggregator = aggregate_key(run_id, current.round_index)
        if services.ledger.running_of([aggregator])[aggregator]:
            return []
        if start_next(
            services, run_id, config, current.round_index, checkpoint_bytes(services, run_id, current.round_index)
        ):
            if services.store.get_run(run_id).state == "running":
                return [f"round {current.round_index + 1} was never started: started"]
            return ["the last round was done but the run not finished: finished"]
        return []
    if current.state == "aggregating":
        if claim_is_stale(current, services.settings.heartbeat_ttl_s) and request_aggregation(
            services, run_id, current.round_index
        ):
            return [f"round {current.round_index}: aggregation claim no longer renewed; taken over"]
        return []
    if current.state != "training":
        return []
    actions = _repair_training_round(services, run_id, config, current, broker_lost, strategy, previous_open)
    if broker_lost:
        # An aggregation request may have been lost with the queue.
        services.ledger.forget_request(aggregate_key(run_id, current.round_index))
    complete = count_done(services.store, run_id, current.round_index) >= len(current.selected)
    if complete and request_aggregation(services, run_id, current.round_index):
        actions.append(f"round {current.round_index}: all results stored; aggregation requested")
    return actions


def _repair_training_round(
    services: Services,
    run_id: str,
    config: RunConfig,
    current: RoundRow,
    broker_lost: bool,
    strategy: Strategy,
    previous_open: bool,
) -> list[str]:
    actions: list[str] = []
    model = BlobRef(key=current.model_key, sha256=current.model_sha256, nbytes=current.model_nbytes)
    if not services.blobs.exists(model.key):
        if previous_open:
            # Its model's checkpoint is not in yet: whoever closes the round before it publishes the model again.
            # Results whose updates the broker lost are forgotten now (a later pass would not know of the loss);
            # the devices go out again once the model is back.
            _unstored(services, run_id, current, check_blobs=broker_lost)
            return [f"round {current.round_index}: global model {current.version} waits on its round's close"]
        services.blobs.put(model.key, checkpoint_bytes(services, run_id, current.version))
        actions.append(f"round {current.round_index}: global model {current.version} republished")
    # A round recorded but not (fully) enqueued: its starter died in between.
    group = round_key(run_id, current.round_index)
    unsent = not services.ledger.was_enqueued(group) and time.time() - current.enqueued_at > ENQUEUE_GRACE_S
    if unsent:
        actions.append(f"round {current.round_index} was never fully enqueued")
    waiting = set(_unstored(services, run_id, current, check_blobs=broker_lost))
    tasks = _expected_tasks(services, run_id, config, current, model, waiting)

    def unstored_now() -> set[str]:
        unstored = set(_unstored(services, run_id, current, check_blobs=False))
        return {task.attempt_key for task in tasks if unstored.intersection(task.devices)}

    found = find_lost(services, tasks, DEVICES_QUEUE, unstored_now, requeue_unstarted=broker_lost or unsent)
    for task, tries, reason in found.exhausted:
        give_up_on(services, task, "scheduler", tries, reason, strategy)
        if task.pack is None:
            actions.append(f"round {current.round_index}: device {task.devices[0]} failed after {tries} attempts")
        else:
            actions.append(f"round {current.round_index}: {task.pack} failed {tries} attempts; its devices go alone")
    lost = found.requeue
    if lost:
        services.enqueue(lost)
        devices = [device for task in lost for device in task.devices]
        listed = ", ".join(str(device) for device in devices[:20]) + (" ..." if len(devices) > 20 else "")
        actions.append(f"round {current.round_index}: enqueued again {len(devices)} devices: {listed}")
    if broker_lost or unsent:
        services.ledger.mark_enqueued(group)
    return actions


def _expected_tasks(
    services: Services, run_id: str, config: RunConfig, current: RoundRow, model: BlobRef, waiting: set[int]
) -> list[DeviceTask]:
    """The round's tasks that still have devices to store: its packs, or the devices of a pack that gave up.

    A pack whose attempts are used up (and that no worker runs) was split: its devices go alone.
    """
    now = time.time()
    packs = [
        task
        for task in tasks_of_round(run_id, current.round_index, config, current.selected, model, now)
        if waiting.intersection(task.devices)
    ]
    keys = [task.attempt_key for task in packs if len(task.devices) > 1]
    attempts, running = services.ledger.attempts_of(keys), services.ledger.running_of(keys)
    tasks: list[DeviceTask] = []
    for task in packs:
        key = task.attempt_key
        split = key in attempts and attempts[key] >= services.settings.max_attempts and not running[key]
        if split:
            tasks += [task.alone(device, now) for device in task.devices if device in waiting]
        else:
            tasks.append(task)
    return tasks


def _unstored(services: Services, run_id: str, current: RoundRow, check_blobs: bool) -> list[int]:
    """Selected devices with no stored result.

    With `check_blobs` (after Redis lost its data), a result whose update blob is gone is forgotten.
    """
    stored = set()
    for task in device_tasks(services.store, run_id, current.round_index):
        lost_update = check_blobs and task.state == "done" and task.update_key
        if lost_update and not services.blobs.exists(task.update_key or ""):
            # Its update went with Redis: train the device again (same seed, same update).
            delete_result(services.store, run_id, current.round_index, task.device)
            log.warning(
                "run %s round %d: device %d's update was lost; retraining", run_id, current.round_index, task.device
            )
            continue
        stored.add(task.device)
    return [device for device in current.selected if device not in stored]
