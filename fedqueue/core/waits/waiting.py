"""What a run waits for while its broker or store is out: one line for `fedqueue status` and its follower.

Two sources, since either service may be the one that failed: a note in Redis that a worker writes when
one of its tasks meets an outage (a full disk under the store, a store that refuses connections), and the
broker's own memory, read here (a Redis at its `maxmemory` refuses writes, notes included).
"""

from __future__ import annotations

import contextlib

import redis

from fedqueue.core.broker import keys
from fedqueue.core.broker.broker_memory import MemoryReading, read_memory
from fedqueue.core.services import Services

NOTE_KEEP_S = 90  # a note outlives the longest pause between a waiting task's tries (30 s), and not much more
FULL_SHARE = 0.95  # a broker this close to its maxmemory refuses writes soon, if not already

MIB = 2**20


def note_waiting(services: Services, run_id: str, fault: str) -> None:
    """A worker's task met an outage: say so where the run's readers look (best effort: Redis may be the one out)."""
    with contextlib.suppress(Exception):
        services.ledger.put_note(keys.waiting(services.settings.key_prefix, run_id), f"{fault}; waiting", NOTE_KEEP_S)


def waiting_for(client: redis.Redis, prefix: str, run_id: str) -> str | None:
    """The outage a run's workers wait for now, in one line, or None (also when the broker does not answer)."""
    try:
        full = broker_full(client)
        if full is not None:
            return full
        note = client.get(keys.waiting(prefix, run_id))
    except redis.RedisError:
        return None
    return note.decode() if isinstance(note, bytes) else None


def full_reading(client: redis.Redis) -> MemoryReading | None:
    """The broker's memory when it is at its limit (or close enough to refuse writes soon), else None."""
    memory = read_memory(client)
    return memory if memory.limit and memory.used >= memory.limit * FULL_SHARE else None


def broker_full(client: redis.Redis) -> str | None:
    """'broker out of memory: maxmemory 64 MB, used 63.9 MB; waiting' when Redis is at its limit, else None."""
    memory = full_reading(client)
    if memory is None:
        return None
    return f"broker out of memory: maxmemory {memory.limit / MIB:.0f} MB, used {memory.used / MIB:.1f} MB; waiting"
