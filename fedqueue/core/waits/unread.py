"""A follower says when its run's tasks wait on a queue that no worker reads, and when one reads it again.

A run whose workers never started (or all stopped) otherwise waits in silence. The follower looks at its
kind's queues every few seconds (fedqueue.core.broker.readers: what waits there, which workers read it); a queue
with messages waiting and no reader for FEDQUEUE_NO_WORKER_S is named in one line, said again only when
the set of such queues changes, and one line says when a worker reads them again.

A broker at its maxmemory refuses the workers' renewals of their marks, which then run out: its workers are
not gone, they wait for room with their tasks (the broker's watch, fedqueue.core.waits.room, says so). While `full`
says so, no queue counts as unread, and a queue's wait starts again once the broker has room.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from fedqueue.core import jobs
from fedqueue.core.broker.readers import QueueLook, looker
from fedqueue.core.services import Services

log = logging.getLogger(__name__)

LOOK_EVERY_S = 2.0


class UnreadQueues:
    """Watches a run's queues for ones nobody reads.

    `queues` gives the run's queues (full names; asked once, at the first look); `look` counts what waits on
    them and who reads them (it raises while the broker is down: the caller runs `check` through its broker
    watch); `say` takes each line; `clock` is monotonic seconds; `full` tells whether the broker is at its
    maxmemory now (its workers' marks then run out while they wait for room).
    """

    def __init__(
        self,
        run_id: str,
        queues: Callable[[], Sequence[str]],
        look: Callable[[Sequence[str]], list[QueueLook]],
        after_s: float,
        say: Callable[[str], object] = log.warning,
        clock: Callable[[], float] = time.monotonic,
        full: Callable[[], bool] = lambda: False,
    ) -> None:
        self.run_id = run_id
        self.after_s = after_s
        self._queues = queues
        self._names: Sequence[str] | None = None
        self._look = look
        self._say = say
        self._clock = clock
        self._full = full
        self._unread_since: dict[str, float] = {}
        self._said: list[str] = []
        self._next_look = 0.0

    @classmethod
    def of(
        cls,
        services: Services,
        run_id: str,
        say: Callable[[str], object] | None = None,
        full: Callable[[], bool] = lambda: False,
    ) -> UnreadQueues | None:
        """A watch on the queues of this run's kind (and the control queue) on the services' broker; None without
        one. `full`: whether the broker is at its maxmemory now (fedqueue.core.waits.room)."""
        settings = services.settings
        if not settings.broker_url:
            return None

        def queues() -> list[str]:
            kind = jobs.kinds().get(services.store.get_run(run_id).kind)
            suffixes = [jobs.CONTROL_QUEUE, *(kind.queues if kind is not None else ())]
            return [settings.queue(suffix) for suffix in suffixes]

        look = looker(settings.broker_url, settings.key_prefix)
        return cls(run_id, queues, look, settings.no_worker_s, say or log.warning, full=full)

    def check(self) -> None:
        """Look at the queues when a look is due, and say what changed."""
        now = self._clock()
        if now < self._next_look:
            return
        self._next_look = now + LOOK_EVERY_S
        if self._full():
            self._unread_since = {}  # the marks cannot be renewed: the wait is counted again once there is room
            return
        if self._names is None:
            self._names = list(self._queues())
        looks = {seen.queue: seen for seen in self._look(self._names)}
        unread = {queue for queue, seen in looks.items() if seen.waiting and not seen.readers}
        self._unread_since = {queue: self._unread_since.get(queue, now) for queue in unread}
        overdue = sorted(queue for queue, since in self._unread_since.items() if now - since >= self.after_s)
        if overdue == self._said:
            return
        if overdue:
            self._say(f"no worker reads {_queues(overdue)}: start `fedqueue worker`")
        else:
            read = [queue for queue in self._said if looks[queue].readers]
            if read:  # else its messages went without a reader (the run ended): nothing to say
                self._say(f"a worker reads {_queues(read)} again: run {self.run_id} goes on")
        self._said = overdue


def _queues(names: list[str]) -> str:
    return f"queue {names[0]}" if len(names) == 1 else f"queues {', '.join(names)}"
