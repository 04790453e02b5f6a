"""Whether a buffered run's fold pass was never asked for: the repair pass's test, free of races with the fold.

The fold hands a stored head on in one direction, and each holder takes it before the one before lets go:
the device task that stored the head's result (marked running until a heartbeat after it ends) asks for a
pass (the request's mark); a pass claims the schedule before it takes the request, and saves the schedule
past the head before it lets the claim go. Read in that same order (the result, the task's running mark, the
request, the schedule again), a hand-over between two reads shows in a later read: the head looks forgotten
only when nobody holds it, never because a pass just ran or a task is about to ask.
"""

from __future__ import annotations

import time

from fedqueue.core.codec import BlobRef
from fedqueue.core.services import Services
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import fold_key
from fedqueue.fl.store import schedule_rows
from fedqueue.fl.store.results import get_round
from fedqueue.fl.strategy.fedbuff.fold import dispatch_tasks, head_of
from fedqueue.fl.strategy.fedbuff.schedule import ScheduleState, Trip


def fold_forgotten(services: Services, run_id: str, config: RunConfig, read: ScheduleState) -> bool:
    """The head of `read` (the schedule as the repair first read it, unclaimed) has its result stored and nobody
    will fold it: the task that stored it is gone, no pass is asked for, and the schedule, unclaimed, still
    waits on it."""
    head = head_of(read)
    if head is None:
        return False
    # The buffer whole too: else nothing moves until its lost update is stored again, and that result asks.
    trips = [head, *(arrival.trip for arrival in read.buffer)]
    rows = schedule_rows.stored_results(
        services.store, run_id, {trip.round_index for trip in trips}, {trip.device for trip in trips}
    )
    stored = {(row.round_index, row.device) for row in rows}
    if any((trip.round_index, trip.device) not in stored for trip in trips):
        return False
    storers = _storer_keys(services, run_id, config, head)
    if not storers or any(services.ledger.running_of(storers).values()):
        return False  # it asks for the pass itself once stored (or runs it, and is still at it)
    if services.ledger.is_requested(fold_key(run_id)):
        return False
    row = schedule_rows.get_schedule(services.store, run_id)
    return row is not None and row.claim_owner is None and head_of(ScheduleState.from_dict(row.state)) == head


def _storer_keys(services: Services, run_id: str, config: RunConfig, head: Trip) -> list[str]:
    """The tasks that may have stored the head's result: its pack's, or its own once the pack went alone.

    None when the round the head trains in is not recorded: no task was sent for it.
    """
    row = get_round(services.store, run_id, head.round_index)
    if row is None:
        return []
    model = BlobRef(key=row.model_key, sha256=row.model_sha256, nbytes=row.model_nbytes)
    (task,) = dispatch_tasks(run_id, config, head.round_index, [head.pack], model, time.time())
    return list(dict.fromkeys([task.attempt_key, task.alone(head.device, task.enqueued_at).attempt_key]))
