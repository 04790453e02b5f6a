"""Workers say they are ready on a Redis list; their launcher blocks on that list instead of pinging.

A worker is ready once it consumes and its warm-up is done: the launcher returns then,
and the next task runs at full speed. Tasks sent earlier are not lost: they wait on the
queue, or run beside the warm-up.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import redis

from fedqueue.config import Settings
from fedqueue.core.broker import keys

# Set by the launcher in each worker's environment: the list its workers push their names onto.
READY_KEY_ENV = "FEDQUEUE_READY_KEY"
READY_KEY_TTL_S = 3600
# How often a waiting launcher looks at its processes between blocking reads.
CHECK_EVERY_S = 0.5


def new_ready_key(settings: Settings) -> str:
    return keys.ready(settings.key_prefix, uuid.uuid4().hex[:12])


def _client(settings: Settings) -> redis.Redis:
    assert settings.broker_url, "readiness needs the broker"
    return redis.Redis.from_url(settings.broker_url, socket_connect_timeout=3, socket_timeout=CHECK_EVERY_S + 5)


def announce_ready(settings: Settings, key: str, hostname: str) -> None:
    client = _client(settings)
    try:
        with client.pipeline(transaction=True) as pipe:
            pipe.rpush(key, hostname)
            pipe.expire(key, READY_KEY_TTL_S)
            pipe.execute()
    finally:
        client.close()


def wait_for_names(
    settings: Settings, key: str, names: set[str], deadline: float, check: Callable[[], None]
) -> set[str]:
    """Block until every name (the part of a hostname before '@') announced itself, or the deadline.

    `check` runs between reads (it raises when a worker process died); returns the names still missing.
    """
    missing = set(names)
    client = _client(settings)
    try:
        while missing and time.monotonic() < deadline:
            check()
            item = client.blpop([key], timeout=CHECK_EVERY_S)
            if item is not None:
                name = item[1].decode() if isinstance(item[1], bytes) else str(item[1])
                missing.discard(name.split("@")[0])
        return missing
    finally:
        client.close()


def forget(settings: Settings, key: str) -> None:
    client = _client(settings)
    try:
        client.delete(key)
    except redis.RedisError:
        pass  # the broker may be gone already; the key expires on its own
    finally:
        client.close()
