"""A follower says when its broker is at its maxmemory, and when it has room again.

A Redis filled by something else refuses the writes of Celery and of the ledger; the workers wait for room
with their tasks (fedqueue.queue.redis_transport) and the run stands still, while PING still answers: the
broker watch (fedqueue.core.waits.outage) sees nothing wrong. The follower reads the broker's memory every few
seconds and says in one line what the run waits for, and in one line when room was made.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from fedqueue.config import Settings
from fedqueue.core.waits.waiting import MIB, full_reading

log = logging.getLogger(__name__)

LOOK_EVERY_S = 2.0


class BrokerRoom:
    """Watches the broker's memory for a run. `read` gives (maxmemory, used) in bytes when the broker is at its
    limit, else None (it raises while the broker is down: the caller runs `check` through its broker watch)."""

    def __init__(
        self,
        run_id: str,
        read: Callable[[], tuple[int, int] | None],
        say: Callable[[str], object] = log.warning,
        clock: Callable[[], float] = time.monotonic,
        close: Callable[[], object] = lambda: None,
    ) -> None:
        self.run_id = run_id
        self.close = close
        self._read = read
        self._say = say
        self._clock = clock
        self._full_since: float | None = None
        self._next_look = 0.0

    @classmethod
    def of(
        cls,
        settings: Settings,
        run_id: str,
        say: Callable[[str], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> BrokerRoom | None:
        """A watch on the broker of these settings (connected at its first look); None without a broker."""
        url = settings.broker_url
        if not url:
            return None
        clients: list[redis.Redis] = []

        def read() -> tuple[int, int] | None:
            if not clients:
                clients.append(redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=10))
            memory = full_reading(clients[0])
            return None if memory is None else (memory.limit, memory.used)

        def close() -> None:
            for client in clients:
                client.close()

        return cls(run_id, read, say or log.warning, clock, close)

    @property
    def full(self) -> bool:
        """The broker was at its limit at the last look (and has not had room since)."""
        return self._full_since is not None

    def check(self) -> None:
        """Look at the broker's memory when a look is due, and say when it fills or has room again."""
        now = self._clock()
        if now < self._next_look:
            return
        self._next_look = now + LOOK_EVERY_S
        full = self._read()
        if full is not None and self._full_since is None:
            self._full_since = now
            limit, used = full
            self._say(
                f"broker out of memory (maxmemory {limit / MIB:.0f} MB, used {used / MIB:.1f} MB): its tasks wait"
                " for room; the workers keep them"
            )
        elif full is None and self._full_since is not None:
            self._say(f"broker has room again after {now - self._full_since:.0f} s: run {self.run_id} goes on")
            self._full_since = None
