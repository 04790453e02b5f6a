"""Cancelling a run of any kind: its state becomes `cancelled`, for good.

A cancelled run is over as a finished or failed one is, and nothing takes it up again: repair passes,
worker launchers and `fedqueue resume` leave runs that are not running alone, and a job kind that
reopens ended runs (an LLM job submitted again) refuses a cancelled one. What it stored stays as it was.

Its tasks stop reaching the work: messages for a cancelled run are not enqueued (`unless_cancelled`
wraps every process's enqueuer), and a worker that takes one skips it (fedqueue.queue.tasks). A task
already running finishes and stores its outcome whole; whatever would follow from it is dropped there.
The queued messages themselves are removed by whoever cancels (fedqueue.queue.purge), else skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fedqueue.core.services import Enqueue
from fedqueue.store import Store

log = logging.getLogger(__name__)

CANCELLED = "cancelled"


def cancel_run(store: Store, run_id: str, reason: str) -> str:
    """Mark a running run cancelled; the state it was in: "running" when this call cancelled it, else the
    state it had already ended in (cancelled, finished, failed). NotFound for an unknown id."""
    state = store.get_run(run_id).state
    if state != "running":
        return state
    if store.finish_run(run_id, CANCELLED, reason):
        log.warning("run %s cancelled (%s)", run_id, reason)
        return "running"
    return store.get_run(run_id).state  # it ended meanwhile, on its own


def is_cancelled(store: Store, run_id: str) -> bool:
    return store.run_state(run_id) == CANCELLED


def run_of(message: Any) -> str:
    """The run a task message belongs to ("" for a message that names none)."""
    return str(getattr(message, "run_id", "") or "")


def unless_cancelled(enqueue: Enqueue, store: Store) -> Enqueue:
    """An enqueuer that drops the messages of cancelled runs (one look at the store per run in a call)."""

    def enqueue_live(messages: Sequence[Any]) -> None:
        runs = {run_of(message) for message in messages} - {""}
        try:
            cancelled = {run_id for run_id in runs if is_cancelled(store, run_id)}
        except Exception as err:  # noqa: BLE001 - a store that refuses the look: send them, a worker skips them
            log.info("cancelled runs not looked up (%s); tasks sent", err)
            cancelled = set()
        if cancelled:
            log.info("run %s cancelled: its new tasks are not enqueued", ", ".join(sorted(cancelled)))
            messages = [message for message in messages if run_of(message) not in cancelled]
        enqueue(messages)

    return enqueue_live
