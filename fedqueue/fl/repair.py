"""Bring a run's queue back in line with its store: the scheduler's repair pass.

Run every few seconds by whoever holds the run's lease: the process that
follows it (`fedqueue run`, `fedqueue resume`), or else a `fedqueue worker`
launcher that adopted it. It finds device tasks that neither finished nor are running
(their worker died, or Redis restarted and forgot its queue) and enqueues them
again, republishes what Redis lost, re-sends aggregations whose aggregator died, and
starts a round that a crash between rounds never started. Every action is
idempotent: results are keyed by (run, round, device), rounds are claimed once.
"""

from __future__ import annotations

import logging
import time

from fedqueue.core.codec import BlobRef
from fedqueue.core.lost import find_lost
from fedqueue.core.services import Services
from fedqueue.fl.config import RunConfig
from fedqueue.fl.device_task import give_up_on
from fedqueue.fl.messages import DEVICES_QUEUE, DeviceTask, aggregate_key
from fedqueue.fl.requests import request_aggregation
from fedqueue.fl.results import count_done, delete_result, device_tasks, list_rounds, load_checkpoint
from fedqueue.fl.rounds import pack_tasks, round_key, start_next, start_round
from fedqueue.fl.schema import RoundRow
from fedqueue.fl.strategy import strategy_for

log = logging.getLogger(__name__)

# A round recorded this long ago whose tasks are not all on the queue lost its starter mid-way.
ENQUEUE_GRACE_S = 30.0


def reconcile(services: Services, run_id: str) -> list[str]:
    """One repair pass; returns what it did, one line per action (empty when all is well)."""
    run = services.store.get_run(run_id)
    if run.state != "running":
        return []
    config = RunConfig.from_dict(run.config)
    actions: list[str] = []
    # Redis's own run_id changes when it restarts; without persistence its queue and blobs are gone.
    broker_id = services.ledger.broker_id()
    broker_lost = run.broker_id is not None and run.broker_id != broker_id
    if broker_lost:
        actions.append("broker restarted (its run_id changed): checking the current round")
    actions += strategy_for(config).repair(services, run_id, config, broker_lost)
    if run.broker_id != broker_id:
        services.store.set_broker_id(run_id, broker_id)
    return actions


def repair_rounds(services: Services, run_id: str, config: RunConfig, broker_lost: bool) -> list[str]:
    rounds = list_rounds(services.store, run_id)
    if not rounds:
        start_round(services, run_id, config, 1, checkpoint_bytes(services, run_id, 0))
        return ["round 1 was never started: started"]
    current = rounds[-1]
    if current.state == "done":
        # Its aggregator died between closing the round and starting the next (or finishing the run).
        if start_next(
            services, run_id, config, current.round_index, checkpoint_bytes(services, run_id, current.round_index)
        ):
            if current.round_index < config.rounds:
                return [f"round {current.round_index + 1} was never started: started"]
            return ["the last round was done but the run not finished: finished"]
        return []
    if current.state == "aggregating":
        stale = (current.claimed_at or 0) < time.time() - services.settings.heartbeat_ttl_s
        if stale and request_aggregation(services, run_id, current.round_index):
            return [f"round {current.round_index}: aggregation claim no longer renewed; taken over"]
        return []
    if current.state != "training":
        return []
    actions = _repair_training_round(services, run_id, config, current, broker_lost)
    if broker_lost:
        # An aggregation request may have been lost with the queue.
        services.ledger.forget_request(aggregate_key(run_id, current.round_index))
    complete = count_done(services.store, run_id, current.round_index) >= len(current.selected)
    if complete and request_aggregation(services, run_id, current.round_index):
        actions.append(f"round {current.round_index}: all results stored; aggregation requested")
    return actions


def _repair_training_round(
    services: Services, run_id: str, config: RunConfig, current: RoundRow, broker_lost: bool
) -> list[str]:
    actions: list[str] = []
    model = BlobRef(key=current.model_key, sha256=current.model_sha256, nbytes=current.model_nbytes)
    if not services.blobs.exists(model.key):
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
        give_up_on(services, task, "scheduler", tries, reason)
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
        for task in pack_tasks(run_id, current.round_index, config, current.selected, model, now)
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


def checkpoint_bytes(services: Services, run_id: str, version: int) -> bytes:
    checkpoint = load_checkpoint(services.store, run_id)
    if checkpoint is None or checkpoint.version != version:
        found = None if checkpoint is None else checkpoint.version
        raise RuntimeError(f"run {run_id}: checkpoint of version {version} needed, store has {found}")
    return bytes(checkpoint.data)


__all__ = ["reconcile"]
