"""Buffered asynchronous FL behind the strategy seam: start, what a stored result asks for, the repair pass.

FedBuff is the fold with its plain version rule; FedRevive and FedAsync are the same fold with their own rules
(fedqueue.fl.strategy.fedbuff.rule).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fedqueue.core.codec import BlobRef
from fedqueue.core.runs.lost import find_lost
from fedqueue.core.services import Services
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import DEVICES_QUEUE, DeviceTask, fold_key
from fedqueue.fl.store import schedule_rows
from fedqueue.fl.store.results import delete_result, get_round
from fedqueue.fl.strategy.base import Entry
from fedqueue.fl.strategy.common import checkpoint_bytes
from fedqueue.fl.strategy.fedbuff.control import fold_handler
from fedqueue.fl.strategy.fedbuff.fold import (
    dispatch_tasks,
    oldest_needed,
    on_result_stored,
    request_fold,
    rules_of,
    start_buffered,
)
from fedqueue.fl.strategy.fedbuff.forgotten import fold_forgotten
from fedqueue.fl.strategy.fedbuff.rule import BUFFERED, VersionRule
from fedqueue.fl.strategy.fedbuff.schedule import Rules, ScheduleState, Trip
from fedqueue.fl.strategy.fedbuff.section import FedBuffSection
from fedqueue.fl.worker.device_task import give_up_on

if TYPE_CHECKING:
    from fedqueue.fl.worker.cache import WorkerCache


class BufferedAsync:
    """A stored result that the fold waits for starts a fold pass; the pass makes versions by `rule` and refills
    slots."""

    # A pack's devices may land in different versions: each stores its own update.
    presums_packs = False
    keeps_rounds = False

    def __init__(self, rule: VersionRule) -> None:
        self.rule = rule

    def rules(self, config: RunConfig) -> Rules:
        """The schedule's rules of a run of this strategy."""
        return rules_of(config, self.rule)

    def start(self, services: Services, run_id: str, config: RunConfig, model: bytes) -> None:
        start_buffered(services, run_id, config, model, self.rule)

    def on_stored(
        self, services: Services, task: DeviceTask, stored: int, worker: str, cache: WorkerCache | None = None
    ) -> None:
        on_result_stored(services, task, worker, cache, self.rule)

    def repair(self, services: Services, run_id: str, config: RunConfig, broker_lost: bool) -> list[str]:
        return repair_buffered(services, run_id, config, broker_lost, self)

    def rounds_total(self, config: RunConfig) -> int:
        # No total: a run bounded by max_sim_time alone.
        return config.last_version or 0

    def describe(self, config: RunConfig) -> str:
        last = config.last_version
        length = f"up to version {last}" if last is not None else "no version bound"
        settings = config.strategy(FedBuffSection)
        return (
            f"{length}, {settings.resolved_concurrency(config)} of {config.num_devices} devices at once,"
            f" {settings.buffer_size} updates per version"
        )


def buffered_entry(rule: VersionRule) -> Entry:
    """A strategy that is the fold with its own version rule, as the registry holds it."""
    return Entry(mode=rule.mode, strategy=BufferedAsync(rule), control=(fold_handler(rule),))


ENTRY = buffered_entry(BUFFERED)


def repair_buffered(
    services: Services, run_id: str, config: RunConfig, broker_lost: bool, strategy: BufferedAsync
) -> list[str]:
    """Start a schedule a crash never started, revive a fold pass that died or was never asked for,
    put back what a Redis restart lost (versions still needed, updates not yet in a version), and send
    lost device tasks again."""
    row = schedule_rows.get_schedule(services.store, run_id)
    if row is None:
        strategy.start(services, run_id, config, checkpoint_bytes(services, run_id, 0))
        return ["the schedule was never started: started"]
    state = ScheduleState.from_dict(row.state)
    actions: list[str] = []
    key = fold_key(run_id)
    if broker_lost:
        services.ledger.forget_request(key)
        actions += _republish(services, run_id, state)
        actions += _forget_lost_updates(services, run_id, _waiting_trips(state))
    claimed = row.claim_owner is not None
    stale = claimed and (row.claimed_at or 0) < time.time() - services.settings.heartbeat_ttl_s
    # Read after the schedule, and in the order the fold hands a head on: a pass that ran meanwhile is no lost one.
    forgotten = not claimed and fold_forgotten(services, run_id, config, state)
    if (stale or forgotten) and request_fold(services, run_id):
        actions.append("fold pass " + ("no longer renewed; taken over" if stale else "was not asked for: asked"))
    actions += _resend_lost(services, run_id, config, state, broker_lost, strategy)
    return actions


def _waiting_trips(state: ScheduleState) -> list[Trip]:
    """Trips whose results a version still needs: in flight, or taken into the buffer of the next version."""
    return state.in_flight + [arrival.trip for arrival in state.buffer]


def _forget_lost_updates(services: Services, run_id: str, trips: list[Trip]) -> list[str]:
    """Results whose update blobs went with Redis: forgotten, so their devices train again (same seed, same update)."""
    rows = schedule_rows.stored_results(
        services.store, run_id, {trip.round_index for trip in trips}, {trip.device for trip in trips}
    )
    wanted = {(trip.round_index, trip.device) for trip in trips}
    lost = [
        row
        for row in rows
        if (row.round_index, row.device) in wanted
        and row.state == "done"
        and row.update_key
        and not services.blobs.exists(row.update_key)
    ]
    for row in lost:
        delete_result(services.store, run_id, row.round_index, row.device)
    names = [f"{row.round_index}/{row.device}" for row in lost]
    return [f"updates lost with the broker, to train again (round/device): {', '.join(names[:20])}"] if lost else []


def _republish(services: Services, run_id: str, state: ScheduleState) -> list[str]:
    """Put back the versions a Redis restart lost that devices still train on or buffered updates came from."""
    republished = []
    for version in range(oldest_needed(state), state.version + 1):
        row = get_round(services.store, run_id, version + 1)
        if row is None or services.blobs.exists(row.model_key):
            continue
        kept = schedule_rows.kept_version(services.store, run_id, version)
        services.blobs.put(
            row.model_key, kept.data if kept is not None else checkpoint_bytes(services, run_id, version)
        )
        republished.append(str(version))
    return [f"global models {', '.join(republished)} republished"] if republished else []


def _unstored(services: Services, run_id: str, trips: list[Trip]) -> set[tuple[int, int]]:
    rows = schedule_rows.stored_results(
        services.store, run_id, {trip.round_index for trip in trips}, {trip.device for trip in trips}
    )
    stored = {(row.round_index, row.device) for row in rows}
    return {(trip.round_index, trip.device) for trip in trips} - stored


def _resend_lost(
    services: Services, run_id: str, config: RunConfig, state: ScheduleState, broker_lost: bool, strategy: BufferedAsync
) -> list[str]:
    trips = _waiting_trips(state)
    waiting = _unstored(services, run_id, trips)
    if not waiting:
        return []
    now = time.time()
    tasks: list[DeviceTask] = []
    packs = sorted({(trip.round_index, trip.pack) for trip in trips})
    for round_index, pack in packs:
        row = get_round(services.store, run_id, round_index)
        if row is None or not any((round_index, device) in waiting for device in pack):
            continue
        model = BlobRef(key=row.model_key, sha256=row.model_sha256, nbytes=row.model_nbytes)
        (task,) = dispatch_tasks(run_id, config, round_index, [pack], model, now)
        tasks += _split_if_exhausted(services, task, waiting, now)

    def unstored_now() -> set[str]:
        still = _unstored(services, run_id, trips)
        return {t.attempt_key for t in tasks if any((t.round_index, d) in still for d in t.devices)}

    found = find_lost(services, tasks, DEVICES_QUEUE, unstored_now, requeue_unstarted=broker_lost)
    actions = []
    for task, tries, reason in found.exhausted:
        give_up_on(services, task, "scheduler", tries, reason, strategy)
        actions.append(
            f"round {task.round_index}: {task.pack or f'device {task.devices[0]}'} failed after {tries} attempts"
        )
    if found.requeue:
        services.enqueue(found.requeue)
        devices = [f"{t.round_index}/{d}" for t in found.requeue for d in t.devices]
        actions.append(f"enqueued again {len(devices)} devices (round/device): {', '.join(devices[:20])}")
    return actions


def _split_if_exhausted(
    services: Services, task: DeviceTask, waiting: set[tuple[int, int]], now: float
) -> list[DeviceTask]:
    """A pack whose attempts are used up (and that no worker runs) was split: its devices go alone."""
    if len(task.devices) == 1:
        return [task]
    key = task.attempt_key
    if services.ledger.attempts(key) >= services.settings.max_attempts and not services.ledger.running_of([key])[key]:
        return [task.alone(device, now) for device in task.devices if (task.round_index, device) in waiting]
    return [task]
