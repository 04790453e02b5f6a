"""Running marks kept alive by one thread per process, however many tasks the process runs."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import redis

log = logging.getLogger(__name__)


class Heartbeats:
    """Refresh the Redis key of every task this process is running, every third of their TTL.

    A mark expires `ttl_s` after its process dies; that is how a scheduler tells a lost
    task from a running one. One long-lived thread beats for all of a worker's slots, so
    a task pays no thread start-up and no extra round trip for its heartbeat.
    """

    def __init__(self, client: redis.Redis, ttl_s: int) -> None:
        self._client = client
        self._ttl_s = ttl_s
        self._marks: dict[str, str] = {}
        # Held while beating, so a mark removed is never written again by a beat already under way.
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, key: str, value: str) -> None:
        """Keep `key` (already set by the caller, with the TTL) alive until `remove`."""
        with self._lock:
            self._marks[key] = value
            if self._thread is None:
                self._thread = threading.Thread(target=self._beat_forever, name="fedqueue-heartbeats", daemon=True)
                self._thread.start()

    def remove(self, key: str) -> None:
        """Stop refreshing `key`; it expires by itself unless the caller deletes it."""
        with self._lock:
            self._marks.pop(key, None)

    @contextlib.contextmanager
    def beating(self, key: str, value: str) -> Iterator[None]:
        self.add(key, value)
        try:
            yield
        finally:
            self.remove(key)

    def _beat_forever(self) -> None:
        while True:  # as long as the process lives: it is a daemon thread
            time.sleep(self._ttl_s / 3)
            with self._lock:
                if not self._marks:
                    continue
                try:
                    with self._client.pipeline(transaction=False) as pipe:
                        for key, value in self._marks.items():
                            pipe.set(key, value, ex=self._ttl_s)
                        pipe.execute()
                except redis.RedisError as err:
                    log.warning("heartbeat not written (%s); tasks may look lost until Redis answers", err)
