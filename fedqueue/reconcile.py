"""Bring a run's queue back in line with its store: the scheduler's repair pass.

Run every few seconds by the process that follows a run (`fedqueue run`,
`fedqueue resume`). It finds device tasks that neither finished nor are running
(their worker died, or Redis restarted and forgot its queue) and enqueues them
again, republishes what Redis lost, finishes rounds whose aggregator died, and
starts a round that a crash between rounds never started. Every action is
idempotent: results are keyed by (run, round, device), rounds are claimed once.
"""

from __future__ import annotations

import logging
import time

from fedqueue.device_task import record_failure
from fedqueue.messages import BlobRef, DeviceTask
from fedqueue.runconfig import RunConfig
from fedqueue.scheduler import finish_round, start_round
from fedqueue.services import Services
from fedqueue.store.schema import RoundRow

log = logging.getLogger(__name__)

# An aggregation claimed longer ago than this is taken to have died with its worker.
AGGREGATION_STALE_S = 120.0
# A round recorded this long ago whose tasks are not all on the queue lost its starter mid-way.
ENQUEUE_GRACE_S = 30.0


def reconcile(services: Services, run_id: str) -> list[str]:
    """One repair pass; returns what it did, one line per action (empty when all is well)."""
    run = services.store.get_run(run_id)
    if run.state != "running":
        return []
    config = RunConfig.from_dict(run.config)
    actions: list[str] = []
    broker_lost = services.broker_state_lost(run_id)
    if broker_lost:
        actions.append("broker state missing (Redis restarted?): checking the current round")
    rounds = services.store.list_rounds(run_id)
    if not rounds:
        start_round(services, run_id, config, 1, _checkpoint_bytes(services, run_id, 0))
        return actions + ["round 1 was never started: started"]
    current = rounds[-1]
    if current.state == "done":
        if current.round_index < config.rounds:
            start_round(services, run_id, config, current.round_index + 1,
                        _checkpoint_bytes(services, run_id, current.round_index))
            actions.append(f"round {current.round_index + 1} was never started: started")
        return actions
    if current.state == "aggregating":
        if finish_round(services, run_id, current.round_index, stale_before=time.time() - AGGREGATION_STALE_S):
            actions.append(f"round {current.round_index}: aggregation taken over from a lost worker")
        return actions
    actions += _repair_training_round(services, run_id, config, current, broker_lost)
    if finish_round(services, run_id, current.round_index):
        actions.append(f"round {current.round_index}: aggregated")
    return actions


def _repair_training_round(
    services: Services, run_id: str, config: RunConfig, current: RoundRow, broker_lost: bool
) -> list[str]:
    actions: list[str] = []
    model = BlobRef(key=current.model_key, sha256=current.model_sha256, nbytes=current.model_nbytes)
    if not services.blobs.exists(model.key):
        services.blobs.put(model.key, _checkpoint_bytes(services, run_id, current.version))
        actions.append(f"round {current.round_index}: global model {current.version} republished")
    # A round recorded but not (fully) enqueued: its starter died in between.
    unsent = (
        not services.was_enqueued(run_id, current.round_index)
        and time.time() - current.enqueued_at > ENQUEUE_GRACE_S
    )
    if unsent:
        actions.append(f"round {current.round_index} was never fully enqueued")
    requeue_unstarted = broker_lost or unsent
    # Read in this order: attempts, then heartbeats, then results. A task seen started (attempts)
    # and not running (no heartbeat) has either stored its result before its heartbeat went,
    # and so shows up in the results read last, or is lost.
    queue_empty = services.queue_length() == 0
    candidates = _unstored(services, run_id, current, check_blobs=broker_lost)
    attempts = services.attempts_of(run_id, current.round_index, candidates)
    running = services.running_of(run_id, current.round_index, candidates)
    requeued = services.requeued_of(run_id, current.round_index, candidates)
    stored = set(candidates) - set(_unstored(services, run_id, current, check_blobs=False))
    lost = []
    for device in candidates:
        if device in stored or running[device]:
            continue
        tries = attempts[device]
        if requeue_unstarted:
            pass
        elif tries == 0:
            # Never started: waiting its turn on the queue, unless the queue is empty and it
            # stays unstarted (its worker died holding the message).
            if not (queue_empty and services.stranded_long_enough(run_id, current.round_index, device)):
                continue
        elif requeued[device] == tries:
            # Already enqueued again after the last lost attempt: wait for that delivery.
            continue
        task = DeviceTask(run_id=run_id, round_index=current.round_index, device=device, model=model,
                          enqueued_at=time.time(), round_size=len(current.selected))
        if tries >= services.settings.max_attempts:
            record_failure(services, task, "scheduler", tries,
                           f"worker lost during each of {tries} attempts (crashed or killed)")
            actions.append(f"round {current.round_index}: device {device} failed after {tries} attempts")
            continue
        lost.append(task)
        services.mark_requeued(run_id, current.round_index, device, tries)
    if lost:
        services.enqueue(lost)
        devices = ", ".join(str(task.device) for task in lost[:20]) + (" ..." if len(lost) > 20 else "")
        actions.append(f"round {current.round_index}: enqueued again {len(lost)} devices: {devices}")
    if requeue_unstarted:
        services.mark_enqueued(run_id, current.round_index)
    return actions


def _unstored(services: Services, run_id: str, current: RoundRow, check_blobs: bool) -> list[int]:
    """Selected devices with no stored result.

    With `check_blobs` (after Redis lost its data), a result whose update blob is gone is forgotten.
    """
    stored = set()
    for task in services.store.device_tasks(run_id, current.round_index):
        lost_update = check_blobs and task.state == "done" and task.update_key
        if lost_update and not services.blobs.exists(task.update_key or ""):
            # Its update went with Redis: train the device again (same seed, same update).
            services.store.delete_result(run_id, current.round_index, task.device)
            log.warning("run %s round %d: device %d's update was lost; retraining", run_id,
                        current.round_index, task.device)
            continue
        stored.add(task.device)
    return [device for device in current.selected if device not in stored]


def _checkpoint_bytes(services: Services, run_id: str, version: int) -> bytes:
    checkpoint = services.store.load_checkpoint(run_id)
    if checkpoint is None or checkpoint.version != version:
        found = None if checkpoint is None else checkpoint.version
        raise RuntimeError(f"run {run_id}: checkpoint of version {version} needed, store has {found}")
    return bytes(checkpoint.data)


__all__ = ["reconcile"]
