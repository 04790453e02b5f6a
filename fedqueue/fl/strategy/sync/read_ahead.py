"""A round's updates read while its last devices still train, so its aggregation starts with them at hand.

In a round's tail the device queue is empty: slots sit idle while the last devices train,
and then the aggregation reads every update back from the blob store while all slots wait.
A worker that stores a result and finds the device queue empty asks for the aggregation at
once; the aggregator takes an idle slot, reads and checks each update as soon as it is
stored, and sums them all in device order once the round is complete: the same arithmetic,
the same weights, only the reading moved earlier.

It gives the slot back as soon as a task waits on any queue (a retry, another run), the run
stops, or the tail lasts far longer than the round's tasks did; the aggregation is then
requested again when the round's last result is stored.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fedqueue.core import jobs
from fedqueue.core.broker.blobs import blobs_per_read
from fedqueue.core.codec import BlobRef
from fedqueue.core.services import Services
from fedqueue.fl.messages import DEVICES_QUEUE, aggregate_key
from fedqueue.fl.store.results import count_done, round_outcomes
from fedqueue.fl.worker.state_blobs import get_states

if TYPE_CHECKING:
    import torch
    from sqlalchemy.engine import Row

    from fedqueue.fl.strategy.sync.early_fold import EarlyFold

log = logging.getLogger(__name__)

READ_AHEAD_MAX_BYTES = 512 * 2**20  # memory a round's read-ahead may hold; later updates are read at the end
POLL_S = 0.01  # how often the store is asked whether more results are in
RUN_CHECK_S = 0.5  # how often the run itself is checked (cancelled, failed)
# The tail is given up once it lasts this many times the round's longest task so far, plus the margin.
TAIL_FACTOR = 3.0
TAIL_MARGIN_S = 2.0


@dataclass
class ReadAhead:
    """Updates read (checked against their sha256) and decoded before the round was complete, by update key,
    and FedAvg's sum begun over them (fedqueue.fl.strategy.sync.early_fold) where the round's rule is FedAvg."""

    states: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    read: set[str] = field(default_factory=set)  # keys read ahead, held or handed over
    count: int = 0  # updates read ahead in all
    early: EarlyFold | None = None
    _sizes: dict[str, int] = field(default_factory=dict, repr=False)  # of those held

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return sum(self._sizes.values())

    def take(self, key: str) -> dict[str, torch.Tensor] | None:
        """The update's weights, handed over once (the aggregation holds them only while it sums them)."""
        self._sizes.pop(key, None)
        return self.states.pop(key, None)

    def hold(self, ref: BlobRef, state: dict[str, torch.Tensor]) -> None:
        self.states[ref.key] = state
        self.read.add(ref.key)
        self._sizes[ref.key] = ref.nbytes
        self.count += 1

    def discard(self) -> None:
        """Give back a sum begun and not stepped (its memory is kept for the next fold)."""
        if self.early is not None:
            self.early.discard()


def tail_started(services: Services, stored: int, round_size: int) -> bool:
    """After a result is stored: is the round in its tail (results missing, no device task waiting)?"""
    return stored < round_size and services.ledger.queue_length(DEVICES_QUEUE) == 0


def _served_queues() -> list[str]:
    """Every queue a worker may serve: work waiting on any of them wants the slot this aggregator holds."""
    return sorted({jobs.CONTROL_QUEUE, *(handler.queue for _, handler in jobs.handlers())})


def _tail_limit_s(services: Services, run_id: str, round_index: int) -> float:
    done = [
        row.finished_at - row.started_at
        for row in services.store.task_timings(run_id, round_index)
        if row.task_type == "train" and row.state == "done"
    ]
    limit = TAIL_FACTOR * max(done, default=0.0) + TAIL_MARGIN_S
    return min(limit, services.settings.task_time_limit_s / 2)


def read_round_ahead(
    services: Services, run_id: str, round_index: int, round_size: int, into: ReadAhead | None = None
) -> ReadAhead | None:
    """Read the round's stored updates (into `into`) until all its results are in; None when it gave up first.

    On giving up the aggregation request is forgotten, so the worker storing the round's last
    result requests it again; a round that completed meanwhile is still reported complete.
    """
    ahead = into if into is not None else ReadAhead()
    began = time.monotonic()
    limit_s = _tail_limit_s(services, run_id, round_index)
    request = aggregate_key(run_id, round_index)
    renew_every_s = services.settings.heartbeat_ttl_s / 3
    queues = _served_queues()  # once, not on every poll
    seen, run_checked, renewed = -1, began, began
    outcomes: list[Row[Any]] = []
    folded = False
    while True:
        stored = count_done(services.store, run_id, round_index)
        if stored >= round_size:
            return ahead  # what is left is read as the aggregation sums
        fresh = stored != seen
        if fresh:
            seen = stored
            outcomes = _read_new(services, run_id, round_index, ahead)
        # Nothing more leads until new results come in, once a look folded none.
        folded = (fresh or folded) and ahead.early is not None and ahead.early.advance(outcomes, ahead.take)
        now = time.monotonic()
        if now - renewed >= renew_every_s:
            # While this aggregator waits, the round's last result must not request a second one.
            services.ledger.renew_request(request, within_s=2 * services.settings.heartbeat_ttl_s)
            renewed = now
        give_up = now - began > limit_s or any(services.ledger.queue_length(queue) for queue in queues)
        if not give_up and now - run_checked >= RUN_CHECK_S:
            give_up, run_checked = services.store.get_run(run_id).state != "running", now
        if give_up:
            services.ledger.forget_request(request)
            # A last result stored before the request was forgotten found it still set: take the round now.
            if count_done(services.store, run_id, round_index) >= round_size:
                return ahead
            log.info("run %s round %d: tail not over after %.1f s; slot given back", run_id, round_index, now - began)
            return None
        if not folded:
            time.sleep(POLL_S)


def _read_new(services: Services, run_id: str, round_index: int, ahead: ReadAhead) -> list[Row[Any]]:
    """Read the updates stored since the last look, while the read-ahead stays under its memory cap; the round's
    results as they stand."""
    fresh: dict[str, BlobRef] = {}  # a pack's summed update is one key for several rows
    budget = READ_AHEAD_MAX_BYTES - ahead.nbytes
    outcomes = round_outcomes(services.store, run_id, round_index)
    for task in outcomes:
        key = task.update_key
        if task.state != "done" or not key or key in ahead.read or key in fresh:
            continue
        if task.update_nbytes > budget:
            break
        budget -= task.update_nbytes
        fresh[key] = BlobRef(key=key, sha256=task.update_sha256, nbytes=task.update_nbytes)
    refs_in_order = list(fresh.values())
    chunk = blobs_per_read(refs_in_order)
    for start in range(0, len(refs_in_order), chunk):
        refs = refs_in_order[start : start + chunk]
        # Decoded now too (or mapped from shared memory): the idle slot's time, not the round's.
        for ref, state in zip(refs, get_states(services.blobs, refs), strict=True):
            ahead.hold(ref, state)
    return outcomes
