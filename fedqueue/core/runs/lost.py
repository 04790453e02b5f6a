"""Which of a job's unfinished tasks are lost, for every kind's repair pass.

A task is lost when it neither stored its outcome nor runs: its worker died holding it,
or Redis restarted and forgot the queue. Lost tasks are enqueued again until their
attempts are used up (max_attempts raised, or max_lost_attempts lost); then the kind stores them
failed, so its job can go on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from fedqueue.core.jobs import TaskMessage
from fedqueue.core.services import Services

T = TypeVar("T", bound=TaskMessage)


@dataclass
class LostTasks(Generic[T]):
    requeue: list[T] = field(default_factory=list)  # marked requeued; the caller enqueues them
    exhausted: list[tuple[T, int, str]] = field(default_factory=list)  # (task, attempts, why): store them failed


def find_lost(
    services: Services,
    tasks: Sequence[T],
    queue: str,
    unstored_now: Callable[[], set[str]],
    *,
    requeue_unstarted: bool = False,
) -> LostTasks[T]:
    """Sort tasks that had no stored outcome into lost (to enqueue again) and exhausted.

    `unstored_now()` re-reads the attempt keys that still have no outcome. Read in this
    order: attempts, then heartbeats, then outcomes. A task seen started and not running has
    either stored its outcome before its heartbeat went, and shows up in the last read, or is lost.
    `requeue_unstarted` (the broker lost its queue, or the tasks were never all enqueued)
    counts tasks that never started as lost too.
    """
    queue_empty = services.ledger.queue_length(queue) == 0  # read before the attempts, as the tasks were listed
    keys = [task.attempt_key for task in tasks]
    attempts = services.ledger.attempts_of(keys)
    running = services.ledger.running_of(keys)
    requeued = services.ledger.requeued_of(keys)
    unstored = unstored_now()
    found: LostTasks[T] = LostTasks()
    for task in tasks:
        key = task.attempt_key
        if key not in unstored or running[key]:
            continue
        tries = attempts[key]
        if requeue_unstarted:
            pass
        elif tries == 0:
            # Never started: waiting its turn on the queue, unless the queue is empty and it
            # stays unstarted (its worker died holding the message).
            if not (queue_empty and services.ledger.stranded_long_enough(key)):
                continue
        elif requeued[key] == tries:
            # Already enqueued again after the last lost attempt: wait for that delivery.
            continue
        if services.ledger.used_up(key, tries):
            found.exhausted.append((task, tries, services.ledger.lost_reason(key, tries)))
            continue
        found.requeue.append(task)
        services.ledger.mark_requeued(key, tries)
    return found
