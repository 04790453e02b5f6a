"""kombu's Redis transport, with a Redis at its maxmemory counted as a lost connection.

A Redis that is full refuses the consumer's own writes (the unacked hash, the restore mutex) with an
out-of-memory reply. kombu files that reply under channel errors, which Celery treats as fatal: the worker
exits with "Unrecoverable error". As a connection error it is retried like a broker that went away, so
the worker waits for room. Only that reply changes class: Celery's `broker_channel_error_retry` would
retry every reply error, and with it a worker whose broker is gone never finishes its warm stop.
"""

from __future__ import annotations

import redis
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis

from fedqueue.queue.poison import DeadLetteringChannel

ALIAS = "redis"


class Transport(kombu_redis.Transport):
    Channel = DeadLetteringChannel  # raw bytes that are not a message are dead-lettered (fedqueue.queue.poison)
    connection_errors = (*kombu_redis.Transport.connection_errors, redis.exceptions.OutOfMemoryError)


def use_for_redis_urls() -> None:
    """Make `redis://` broker URLs in this process use this transport (kombu picks it by the URL's scheme)."""
    TRANSPORT_ALIASES[ALIAS] = f"{__name__}:Transport"
