"""How full the broker's Redis is, against its `maxmemory`: whether a blob of some size still fits under a
high-water mark that leaves the rest to Celery's messages, the ledger and replies in flight.

Read from `INFO memory` (CONFIG GET may be disabled on managed Redis); a reading is reused briefly, with the
bytes this process put since added to it, so a burst of puts costs one round trip.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis

# Blobs may fill Redis up to this share of maxmemory: the rest is for Celery's own writes (which must never
# meet an out-of-memory refusal), the ledger, and the reply buffers of blobs being read.
HIGH_WATER = 0.5
# A blob read in one round trip is at most this share of maxmemory: its reply sits in Redis's memory too.
READ_SHARE = 1 / 16
LIMITED_READING_S = 0.2  # how long a reading of a limited Redis is reused (with this process's puts added)
UNLIMITED_READING_S = 10.0  # how long "no maxmemory" is believed before asking again


@dataclass(frozen=True)
class MemoryReading:
    used: int  # bytes, as Redis counts them against maxmemory
    limit: int  # maxmemory in bytes; 0: unlimited


def read_memory(client: redis.Redis) -> MemoryReading:
    info = client.info("memory")
    return MemoryReading(used=int(info.get("used_memory", 0)), limit=int(info.get("maxmemory", 0)))


class BrokerMemory:
    """This process's view of the broker's memory; shared by threads."""

    def __init__(self, client: redis.Redis, high_water: float = HIGH_WATER) -> None:
        self._client = client
        self._high_water = high_water
        self._lock = threading.Lock()
        self._reading: MemoryReading | None = None
        self._read_at = 0.0
        self._added = 0  # bytes put since the reading

    def _current(self) -> MemoryReading:
        now = time.monotonic()
        reading = self._reading
        if reading is not None:
            reuse_s = LIMITED_READING_S if reading.limit else UNLIMITED_READING_S
            if now - self._read_at < reuse_s:
                return MemoryReading(reading.used + self._added, reading.limit)
        reading = read_memory(self._client)
        self._reading, self._read_at, self._added = reading, now, 0
        return reading

    def limit(self) -> int:
        """maxmemory in bytes (0: unlimited), as last read."""
        with self._lock:
            return self._current().limit

    def reserve(self, nbytes: int) -> bool:
        """Whether a blob of `nbytes` fits under the high-water mark; if so it is counted as put."""
        with self._lock:
            reading = self._current()
            if not reading.limit:
                return True
            if reading.used + nbytes > reading.limit * self._high_water:
                return False
            self._added += nbytes
            return True

    def forget(self) -> None:
        """The next question reads Redis again (a write was refused: the reading was wrong)."""
        with self._lock:
            self._reading = None

    def read_bytes(self) -> int:
        """The most bytes of blobs to ask for in one round trip (0: no bound)."""
        limit = self.limit()
        return int(limit * READ_SHARE) if limit else 0
